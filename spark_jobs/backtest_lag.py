"""Backtest job: every sweep a time range would have had, replayed through the diagnosis in one job.

    spark-submit [--py-files lagdoctor.zip] spark_jobs/backtest_lag.py \\
        --snapshots PATH --output PATH --from ISO-8601 --as-of ISO-8601 --window-minutes N \\
        [--step-minutes N | --sweep-ends ISO[,ISO...]] [--clusters NAME[,NAME...]] [--groups REGEX] \\
        [--topic NAME] [--sets JSON] [--warning-lag N ...]   (every field of Thresholds)

A sweep ends every --step-minutes from --from to --as-of (or at each of
--sweep-ends: the ends real runs had) and reads the --window-minutes before
its end, as the sweep DAG does; the carry chain runs from sweep to sweep
(lagdoctor.diagnosis.replay). --sets is a JSON list of {"name", "thresholds"}:
each set is replayed in the same session (default: one set, "current", of the
threshold arguments). Per set, <output>/ gets:
  <name>.findings.jsonl  every finding, with its sweep_end, of each (cluster, group,
                  topic) that had a problem in some sweep (what Slack could hear)
  <name>.timeline.jsonl  per (cluster, group, topic), each sweep where its verdict changed
and <output>/backtest.json (the range, the sweeps, each set's carry passes),
then _SUCCESS last. Exit codes and failure lines are diagnose_lag.py's (open_session, failure_exit).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT = 0, 1, 2, 3
SUMMARY_FILE = "backtest.json"
FINDINGS_FILE = "findings.jsonl"
TIMELINE_FILE = "timeline.jsonl"
MAX_SWEEPS = 20_160  # two weeks of one-minute sweeps


def parse_args(argv):
    from lagdoctor.diagnosis.thresholds import Thresholds

    parser = argparse.ArgumentParser(prog="backtest_lag", description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", required=True, metavar="PATH")
    parser.add_argument("--output", required=True, metavar="PATH")
    parser.add_argument("--from", dest="start", required=True, metavar="ISO-8601")
    parser.add_argument("--as-of", required=True, metavar="ISO-8601", help="the range's end")
    parser.add_argument("--window-minutes", type=float, required=True, metavar="N")
    parser.add_argument("--step-minutes", type=float, default=1.0, metavar="N")
    parser.add_argument("--sweep-ends", default=None, metavar="ISO[,ISO...]")
    parser.add_argument("--clusters", default=None, metavar="NAME[,NAME...]")
    parser.add_argument("--groups", default=None, metavar="REGEX")
    parser.add_argument("--topic", default=None, metavar="NAME")
    parser.add_argument("--sets", default=None, metavar="JSON")
    for f in fields(Thresholds):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None, dest=f.name)
    args = parser.parse_args(argv)
    given = {n: getattr(args, n) for n in Thresholds.field_names() if getattr(args, n) is not None}
    return args, given


def threshold_sets(raw: str | None, given: dict) -> list[tuple[str, object, dict]]:
    """[(name, Thresholds, overrides)]; ValueError (one line) for a bad --sets."""
    from lagdoctor.diagnosis.thresholds import Thresholds

    if raw is None:
        return [("current", Thresholds.from_overrides(given), given)]
    try:
        sets = json.loads(raw)
    except ValueError:
        raise ValueError("--sets is not JSON") from None
    if not isinstance(sets, list) or not sets or not all(isinstance(s, dict) for s in sets):
        raise ValueError('--sets: expected a list of {"name": ..., "thresholds": {...}}')
    out, names = [], set()
    for s in sets:
        name = str(s.get("name") or "")
        if not name or not name.replace("-", "").replace("_", "").isalnum() or name in names:
            raise ValueError(f"--sets: each set needs a distinct name of letters, digits, - and _ (got {name!r})")
        names.add(name)
        overrides = {**given, **dict(s.get("thresholds") or {})}
        out.append((name, Thresholds.from_overrides(overrides), overrides))
    return out


def main(argv=None) -> int:
    from datetime import datetime, timezone

    from diagnose_lag import absolute, die_with_parent, fail, failure_exit, open_session, use_spark_s3_access

    from lagdoctor.diagnosis.input_errors import SnapshotInputError
    from lagdoctor.diagnosis.replay import sweep_ends
    from lagdoctor.diagnosis.snapshots import compile_groups, parse_clusters
    from lagdoctor.diagnosis.store_files import check_input_path
    from lagdoctor.diagnosis.window import parse_as_of

    args, given = parse_args(argv)
    die_with_parent()
    try:
        check_input_path(args.snapshots)
        start, end = parse_as_of(args.start), parse_as_of(args.as_of)
        if args.window_minutes <= 0:
            raise ValueError(f"--window-minutes must be more than 0, not {args.window_minutes:g}")
        if args.sweep_ends:
            ends = sorted({parse_as_of(e) for e in args.sweep_ends.split(",") if e.strip()})
        else:
            ends = sweep_ends(start, end, args.step_minutes)
        if len(ends) > MAX_SWEEPS:
            raise ValueError(f"{len(ends):,} sweeps: at most {MAX_SWEEPS:,} in one backtest (a longer step, "
                             f"or a shorter range)")
        sets = threshold_sets(args.sets, given)
        groups = compile_groups(args.groups) if args.groups is not None else None
        clusters = parse_clusters(args.clusters)
    except (SnapshotInputError, ValueError) as exc:
        return fail(EXIT_USAGE, str(exc))

    from lagdoctor.diagnosis.output import begin_outputs, finish_outputs, print_error_line, write_lines
    from lagdoctor.diagnosis.replay import micros, replay_sets, set_outputs
    from lagdoctor.diagnosis.session import right_size_codegen, right_size_shuffle
    from lagdoctor.diagnosis.snapshots import read_snapshot_store, scope_snapshots
    from lagdoctor.diagnosis.window import WindowBounds

    spark, code = open_session("lagdoctor-backtest")
    if spark is None:
        return code
    output = absolute(args.output)
    now = datetime.now(timezone.utc).isoformat()
    try:
        use_spark_s3_access(spark)
        span = (ends[-1] - ends[0]).total_seconds() / 60 + args.window_minutes if ends else args.window_minutes
        read = read_snapshot_store(spark, absolute(args.snapshots), datetime.now(timezone.utc),
                                   window=WindowBounds(ends[-1] if ends else end, span), clusters=clusters)
        if read.missing_clusters:
            print_error_line(f"backtest_lag: WARNING: no snapshots for cluster(s) {', '.join(read.missing_clusters)} "
                             f"under {args.snapshots}")
        # every sweep's window at once: the shuffle is sized for the copies, not the files
        right_size_shuffle(spark, read.input_bytes * max(1, round(args.window_minutes / max(args.step_minutes, 1e-9))))
        right_size_codegen(spark, read.input_bytes)
        snapshots = scope_snapshots(read.snapshots, groups, args.topic)
        summary = {"from": start.isoformat(), "to": end.isoformat(), "window_minutes": args.window_minutes,
                   "step_minutes": None if args.sweep_ends else args.step_minutes,
                   "sweeps": [e.isoformat() for e in ends], "groups": args.groups, "topic": args.topic,
                   "clusters": clusters, "sets": []}
        ends_us = [micros(e) for e in ends]
        results = replay_sets(spark, snapshots, ends, args.window_minutes, [th for _, th, _ in sets])
        # from here until _SUCCESS every reader skips the folder: a set's findings are written as
        # they are collected, a few sweeps at a time
        begin_outputs(output, now=now)
        written = {}
        for (name, _, overrides), (found, plan) in zip(sets, results):
            lines, timeline_text = set_outputs(found, ends_us) if found is not None else (iter(()), "")
            _, written[f"{name}.{FINDINGS_FILE}"] = write_lines(output, f"{name}.{FINDINGS_FILE}", lines)
            _, written[f"{name}.{TIMELINE_FILE}"] = write_lines(output, f"{name}.{TIMELINE_FILE}", [timeline_text])
            summary["sets"].append({"name": name, "thresholds": overrides, "carry_passes": plan.passes,
                                    "settled": plan.settled})
            if not plan.settled:
                print_error_line(f"backtest_lag: WARNING: set {name}: the surge carry chain did not settle in "
                                 f"{plan.passes} passes; some sweeps after a long surge are judged on their window alone")
        text = json.dumps(summary, indent=1) + "\n"
        _, written[SUMMARY_FILE] = write_lines(output, SUMMARY_FILE, [text])
        finish_outputs(output, written, now=now)
        return EXIT_OK
    except Exception as exc:
        return failure_exit(exc, f"cannot backtest {args.snapshots}")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
