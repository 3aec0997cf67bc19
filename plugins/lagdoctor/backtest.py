"""Backtest: what a range of stored history would have said, sweep by sweep, to Slack.

The diagnosis of every sweep is one Spark job (spark_jobs/backtest_lag.py, per threshold
set); then each set's findings go, sweep by sweep with `now` at the sweep's end, through
the sweep's own notification decisions (lagdoctor.notify.incidents) against a throwaway
state database and a sender that only records: nothing reaches Slack or the real state.
The report says, per set, what would have been posted; per group, each verdict change,
the flips and the verdicts later corrected, and how long each episode took from its first
sign to the first message naming the cause it settled on; and, beside the first set, what
each other set changes.

Not replayed: lagdoctor's own actions (no action ran in a backtest, so no "own action"
lines and no post-checks), the once-per-cluster "watching" notice, pod and workload
evidence (the Kubernetes API answers for now, not for the past), and the per-partition
status rows of each message (the decisions read the findings' own evidence).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BACKTEST_DAG_ID = "kafka_lag_backtest"
REPORT_FILE = "report.json"
LISTING_FILE = "listing.json"  # the report's counts alone: the lag page lists many without reading each whole
REPORT_HTML = "report.html"
SUMMARY_FILE = "backtest.json"
NO_PROBLEM = ("healthy", "collecting_history")


@dataclass
class ThresholdSet:
    name: str
    thresholds: dict[str, Any] = field(default_factory=dict)


def job_script() -> str:
    from lagdoctor.diagnosis.submit import default_job_script

    return str(Path(default_job_script()).with_name("backtest_lag.py"))


def job_arguments(start: datetime, *, step_minutes: float, sets: Sequence[ThresholdSet], groups: str | None = None,
                  topic: str | None = None, clusters: Sequence[str] | None = None,
                  sweep_ends: Sequence[datetime] | None = None) -> list[str]:
    """The backtest's own arguments, after diagnose_lag's (--snapshots, --output, --as-of, --window-minutes)."""
    args = ["--from", start.isoformat()]
    if sweep_ends:
        args += ["--sweep-ends", ",".join(e.isoformat() for e in sweep_ends)]
    else:
        args += ["--step-minutes", f"{step_minutes:g}"]
    if clusters:
        args += ["--clusters", ",".join(clusters)]
    if groups:
        args += ["--groups", groups]
    if topic:
        args += ["--topic", topic]
    args += ["--sets", json.dumps([{"name": s.name, "thresholds": s.thresholds} for s in sets])]
    return args


def driver_memory(start: datetime, end: datetime) -> str:
    """The job's driver heap: every sweep's partition and group rows are classified at once (a week
    at 200 x 10 ran out of Spark's default 1g), so 1g a day of range and 2g more, at most 8g."""
    days = max(0.0, (end - start).total_seconds() / 86400)
    return f"{min(8, 2 + math.ceil(days))}g"


def run_job(store: str, output: str, start: datetime, end: datetime, *, window_minutes: float, step_minutes: float,
            sets: Sequence[ThresholdSet], master: str | None = None, timeout: float | None = None,
            **scope: Any) -> None:
    """The Spark job through spark-submit; RuntimeError (its one line) when it fails."""
    from lagdoctor.diagnosis.submit import run_diagnosis_process
    from lagdoctor.stages.diagnose import diagnosis_failure_line

    proc = run_diagnosis_process(store, output, end.isoformat(), window_minutes, master or "local[*]",
                                 extra_args=job_arguments(start, step_minutes=step_minutes, sets=sets, **scope),
                                 job_script=job_script(), timeout=timeout, capture=True,
                                 conf={"spark.driver.memory": driver_memory(start, end)})
    if proc.returncode != 0:
        line = diagnosis_failure_line((proc.stderr or "") + (proc.stdout or ""), exit_code=proc.returncode)[1]
        raise RuntimeError(line.replace("diagnosis: ", "backtest: ", 1).replace("diagnose_lag: error: ", ""))


# -- the notification decisions, replayed ---------------------------------------------------


class RecordingSender:
    """A Slack sender that keeps what it is given (nothing leaves this process)."""

    kind = "backtest"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sweep: str | None = None

    def post(self, *, text: str, blocks: Sequence[dict], thread_ts: str | None = None,
             channel: str | None = None):
        from lagdoctor.notify.slack import Posted

        ts = f"{len(self.messages) + 1}.000000"
        self.messages.append({"sweep_end": self.sweep, "ts": ts, "thread_ts": thread_ts,
                              "text": text.split("\n", 1)[0][:300]})
        return Posted(channel="backtest", ts=ts)


@contextlib.contextmanager
def throwaway_state() -> Iterator[Any]:
    """Settings whose state database and spool live in a temporary folder, removed after; the
    state URL of the environment (the real one) is set aside meanwhile."""
    from lagdoctor.settings import Settings
    from lagdoctor.state import STATE_URL_ENV, dispose_engines

    saved = os.environ.get(STATE_URL_ENV)
    with tempfile.TemporaryDirectory(prefix="lagdoctor-backtest-") as tmp:
        os.environ[STATE_URL_ENV] = f"sqlite:///{tmp}/state.db"
        try:
            yield Settings(data_root=tmp, spool_dir=os.path.join(tmp, "spool"))
        finally:
            dispose_engines()
            if saved is None:
                os.environ.pop(STATE_URL_ENV, None)
            else:
                os.environ[STATE_URL_ENV] = saved


def by_sweep(findings: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, list[Mapping[str, Any]]]]:
    """Findings in sweep order (the job writes them so) -> (sweep_end, its findings), one sweep held
    at a time; a finding out of order is one line, not a silently split sweep."""
    last = None
    for sweep_end, found in itertools.groupby(findings, key=lambda f: str(f["sweep_end"])):
        if last is not None and sweep_end <= last:
            raise ValueError(f"backtest findings out of sweep order at {sweep_end} (after {last})")
        last = sweep_end
        yield sweep_end, list(found)


# A finding's decision kept for the report: those that sent something. The others are only counted.
SPOKE = ("posted", "replied", "recovered")


def replay_notifications(findings: Iterable[Mapping[str, Any]], *, runbooks_dir: str | None = None
                         ) -> tuple[list[dict[str, Any]], dict[str, int], list[dict[str, Any]]]:
    """(decisions, counts, messages): each finding that made the sweep's notify step say something,
    with its decision, replayed sweep by sweep with `now` at the sweep's end; how many findings got
    each decision; and each message Slack would have been sent. `findings` is read as it goes."""
    from lagdoctor.contracts import COLLECTING_HISTORY, SWEEP_DAG_ID
    from lagdoctor.notify.formatting import parse_iso
    from lagdoctor.notify.incidents import delivery_batch, findings_without_news, post_or_update_incident
    from lagdoctor.runbooks import choose_actions, load_runbooks

    runbooks = load_runbooks(runbooks_dir)
    sender = RecordingSender()
    decisions: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    with throwaway_state() as settings:
        for sweep_end, found in by_sweep(findings):
            now, run_id, sender.sweep = parse_iso(sweep_end), f"backtest__{sweep_end}", sweep_end
            items = [{"finding": {k: v for k, v in f.items() if k != "sweep_end"},
                      "plan": choose_actions(f, runbooks).as_dict()}
                     for f in found if f.get("diagnosis") != COLLECTING_HISTORY]
            sweeps: dict[tuple, list] = {}
            for item in items:
                sweeps.setdefault(_key(item["finding"]), []).append(item["finding"])
            with delivery_batch(sender=sender, now=now):
                quiet = findings_without_news([i["finding"] for i in items], settings=settings)
                for n, item in enumerate(items):
                    result = quiet.get(n) or post_or_update_incident(
                        item["finding"], item["plan"], run_id=run_id, settings=settings, sender=sender,
                        sweep=sweeps[_key(item["finding"])], now=now, dag_id=SWEEP_DAG_ID, buttons=False)
                    counts[result["decision"]] = counts.get(result["decision"], 0) + 1
                    if result["decision"] not in SPOKE:
                        continue
                    f = item["finding"]
                    decisions.append({"sweep_end": sweep_end, "cluster": f["cluster"], "group_id": f["group_id"],
                                      "topic": f["topic"], "diagnosis": f["diagnosis"],
                                      "provisional": bool(f.get("provisional")), "decision": result["decision"],
                                      "changes": result.get("changes") or []})
    return decisions, counts, sender.messages


def _key(f: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(f.get("cluster")), str(f.get("group_id")), str(f.get("topic"))


# -- the report -----------------------------------------------------------------------------

SAID = ("posted", "replied")


def _verdict(v: list[Mapping[str, Any]]) -> str:
    return " + ".join(f"{x['diagnosis']}{' (deciding)' if x.get('provisional') else ''}" for x in v)


def _seconds(a: str, b: str) -> float:
    from lagdoctor.notify.formatting import parse_iso

    return (parse_iso(b) - parse_iso(a)).total_seconds()


def episodes(timeline: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (cluster, group, topic), each run of sweeps with a problem verdict: when it began, the
    cause it settled on (its last decided problem verdict), and the decided causes it named on the way."""
    out = []
    rows_by: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in timeline:
        rows_by.setdefault(_key(r), []).append(r)
    for key, rows in sorted(rows_by.items()):
        current = None
        for r in sorted(rows, key=lambda r: r["sweep_end"]):
            problems = [v for v in r["verdict"] if v["diagnosis"] not in NO_PROBLEM]
            if not problems:
                if current is not None:
                    current["ended"] = r["sweep_end"]
                    out.append(current)
                    current = None
                continue
            if current is None:
                current = {"cluster": key[0], "group_id": key[1], "topic": key[2], "began": r["sweep_end"],
                           "ended": None, "decided": []}
            for v in problems:
                if not v.get("provisional") and (not current["decided"] or current["decided"][-1] != v["diagnosis"]):
                    current["decided"].append(v["diagnosis"])
        if current is not None:
            out.append(current)
    for e in out:
        e["settled_on"] = e["decided"][-1] if e["decided"] else None
        e["corrected"] = max(0, len(e["decided"]) - 1)
    return out


def set_report(name: str, thresholds: Mapping[str, Any], timeline: list[Mapping[str, Any]],
               decisions: list[Mapping[str, Any]], counts: Mapping[str, int],
               messages: list[Mapping[str, Any]]) -> dict[str, Any]:
    said = [d for d in decisions if d["decision"] in SAID]
    eps = episodes(timeline)
    for e in eps:
        end = e["ended"] or "9999"
        mine = [d for d in said if _key(d) == _key(e) and e["began"] <= d["sweep_end"] < end]
        first = next((d for d in mine if d["diagnosis"] == e["settled_on"] and not d["provisional"]), None)
        e["first_message"] = mine[0]["sweep_end"] if mine else None
        e["first_right_message"] = first["sweep_end"] if first else None
        e["seconds_to_first_right"] = _seconds(e["began"], first["sweep_end"]) if first else None
        named = [d["diagnosis"] for d in mine if not d["provisional"]]
        e["flips"] = sum(1 for a, b in zip(named, named[1:]) if a != b)
    changes: dict[str, int] = {}
    for r in timeline:
        changes[" / ".join(_key(r))] = changes.get(" / ".join(_key(r)), 0) + 1
    times = sorted(e["seconds_to_first_right"] for e in eps if e["seconds_to_first_right"] is not None)
    return {
        "name": name, "thresholds": dict(thresholds),
        "alerts": sum(1 for m in messages if m["thread_ts"] is None),
        "replies": sum(1 for m in messages if m["thread_ts"] is not None),
        "messages": len(messages),
        "decisions": dict(sorted(counts.items())),
        "episodes": len(eps), "flips": sum(e["flips"] for e in eps),
        "corrected": sum(e["corrected"] for e in eps),
        "never_named": sum(1 for e in eps if e["first_right_message"] is None),
        "median_seconds_to_first_right": times[len(times) // 2] if times else None,
        "groups": [{"key": k, "verdict_changes": n} for k, n in sorted(changes.items())],
        "episode_list": eps,
        "timeline": [{**{k: r[k] for k in ("sweep_end", "cluster", "group_id", "topic")},
                      "verdict": _verdict(r["verdict"])} for r in timeline],
        "message_list": messages,
    }


def verdicts_per_sweep(timeline: list[Mapping[str, Any]], sweeps: list[str]) -> dict[tuple, str]:
    """(sweep_end, cluster, group, topic) -> verdict text, each change held until the next."""
    out: dict[tuple, str] = {}
    rows_by: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in timeline:
        rows_by.setdefault(_key(r), []).append(r)
    for key, rows in rows_by.items():
        rows = sorted(rows, key=lambda r: r["sweep_end"])
        i, current = 0, None
        for s in sweeps:
            while i < len(rows) and rows[i]["sweep_end"] <= s:
                current, i = _verdict(rows[i]["verdict"]), i + 1
            if current is not None:
                out[(s, *key)] = current
    return out


# How many groups get a strip, worst first (the rest are in report.json)
MAX_STRIPS = 200


def _tone(verdict: str | None) -> str:
    if not verdict or verdict.startswith("collecting_history"):
        return "none"
    if verdict == "healthy":
        return "ok"
    return "warning" if "(deciding)" in verdict else "critical"


def strips(set_report: Mapping[str, Any], sweeps: list[str]) -> list[dict[str, Any]]:
    """Per (cluster, group, topic) with a verdict change, its segments (same verdict in a row,
    width in sweeps) and the sweeps where a message went out."""
    timeline = [{**r, "verdict": [{"diagnosis": r["verdict"], "provisional": False}]}
                for r in set_report["timeline"]]
    per = verdicts_per_sweep(timeline, sweeps)
    keys = sorted({(r["cluster"], r["group_id"], r["topic"]) for r in set_report["timeline"]})
    said: dict[tuple, list[Mapping[str, Any]]] = {}
    for e in set_report["episode_list"]:
        said.setdefault((e["cluster"], e["group_id"], e["topic"]), []).append(e)
    out = []
    for key in keys:
        segments: list[dict[str, Any]] = []
        for s in sweeps:
            v = per.get((s, *key))
            if segments and segments[-1]["verdict"] == v:
                segments[-1]["sweeps"] += 1
                segments[-1]["to"] = s
            else:
                segments.append({"verdict": v, "tone": _tone(v), "sweeps": 1, "from": s, "to": s})
        changes = sum(1 for _ in segments) - 1
        if changes == 0 and segments and segments[0]["tone"] in ("ok", "none"):
            continue  # healthy throughout: nothing to show
        eps = said.get(key, [])
        out.append({"key": " / ".join(key), "segments": segments, "changes": changes, "episodes": eps})
    out.sort(key=lambda s: (-len(s["episodes"]), -s["changes"], s["key"]))
    return out[:MAX_STRIPS]


def compare(base: Mapping[str, Any], other: Mapping[str, Any], base_timeline, other_timeline,
            sweeps: list[str]) -> dict[str, Any]:
    a, b = verdicts_per_sweep(base_timeline, sweeps), verdicts_per_sweep(other_timeline, sweeps)
    changed = [{"sweep_end": k[0], "cluster": k[1], "group_id": k[2], "topic": k[3],
                base["name"]: a.get(k), other["name"]: b.get(k)}
               for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return {"against": base["name"], "set": other["name"],
            "alerts": other["alerts"] - base["alerts"], "messages": other["messages"] - base["messages"],
            "verdicts_changed": len(changed), "changed": changed}


def build_report(output: str, runbooks_dir: str | None = None) -> dict[str, Any]:
    """Read the job's outputs in `output`, replay each set's notifications, and write report.json."""
    check_complete(output)
    summary = json.loads(Path(output, SUMMARY_FILE).read_text(encoding="utf-8"))
    sweeps = [_iso_z(s) for s in summary["sweeps"]]
    sets, timelines = [], {}
    for s in summary["sets"]:
        timeline = _jsonl(Path(output, f"{s['name']}.timeline.jsonl"))
        with open(Path(output, f"{s['name']}.findings.jsonl"), encoding="utf-8") as fh:
            decisions, counts, messages = replay_notifications(
                (json.loads(line) for line in fh if line.strip()), runbooks_dir=runbooks_dir)
        report = set_report(s["name"], s["thresholds"], timeline, decisions, counts, messages)
        report.update(carry_passes=s["carry_passes"], carry_settled=s["settled"])
        sets.append(report)
        timelines[s["name"]] = timeline
    comparisons = [compare(sets[0], other, timelines[sets[0]["name"]], timelines[other["name"]], sweeps)
                   for other in sets[1:]]
    report = {**{k: summary[k] for k in ("from", "to", "window_minutes", "step_minutes", "groups", "topic",
                                         "clusters")},
              "sweeps": len(sweeps), "sweep_list": sweeps, "first_sweep": sweeps[0] if sweeps else None,
              "last_sweep": sweeps[-1] if sweeps else None, "sets": sets, "comparisons": comparisons,
              "made_at": datetime.now(timezone.utc).isoformat()}
    report["strips"] = {s["name"]: strips(s, sweeps) for s in sets}
    report["text"] = summary_text(report)
    write_report(output, report)
    return report


def write_report(output: str, report: Mapping[str, Any]) -> None:
    """report.json, and listing.json: what the lag page's list of backtests shows of it."""
    listing = {k: report.get(k) for k in ("first_sweep", "last_sweep", "sweeps")}
    listing["sets"] = [{k: s[k] for k in ("name", "alerts", "replies")} for s in report["sets"]]
    Path(output, REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    Path(output, LISTING_FILE).write_text(json.dumps(listing) + "\n", encoding="utf-8")


def check_complete(output: str) -> None:
    """ValueError (one line) unless the job's _SUCCESS is there and names every output, whole."""
    from lagdoctor.contracts import SUCCESS_FILE

    try:
        outputs = json.loads(Path(output, SUCCESS_FILE).read_text(encoding="utf-8"))["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"backtest output {output} is incomplete: no readable {SUCCESS_FILE}") from None
    for name, stats in outputs.items():
        path = Path(output, name)
        if not path.is_file() or path.stat().st_size != stats.get("bytes"):
            raise ValueError(f"backtest output {output} is incomplete: {name} is missing or cut short")


def _iso_z(value: str) -> str:
    from lagdoctor.notify.formatting import parse_iso

    return parse_iso(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def summary_text(report: Mapping[str, Any]) -> str:
    """The report as the CLI prints it."""
    every = "as they ran" if report.get("step_minutes") is None else f"one every {report['step_minutes']:g} min"
    lines = [f"backtest {report['from']} .. {report['to']}: {report['sweeps']} sweeps ({every}), "
             f"{report['window_minutes']:g}-minute window"]
    for s in report["sets"]:
        med = s["median_seconds_to_first_right"]
        lines.append(
            f"  {s['name']}: {s['alerts']} alerts, {s['replies']} replies; {s['episodes']} episodes, "
            f"{s['flips']} flips, {s['corrected']} verdicts corrected, {s['never_named']} never named; "
            f"first right message {'-' if med is None else f'{med / 60:.1f} min'} after the first sign (median)"
            + ("" if s["carry_settled"] else "; the surge carry chain did not settle"))
    for c in report["comparisons"]:
        fewer = -c["alerts"]
        lines.append(f"  {c['set']} against {c['against']}: "
                     f"{abs(fewer)} {'fewer' if fewer >= 0 else 'more'} alerts, "
                     f"{c['verdicts_changed']} verdicts changed")
        for ch in c["changed"][:20]:
            lines.append(f"    {ch['sweep_end'][:16]} {ch['cluster']} / {ch['group_id']} / {ch['topic']}: "
                         f"{ch[c['against']] or '-'} -> {ch[c['set']] or '-'}")
        if len(c["changed"]) > 20:
            lines.append(f"    ... and {len(c['changed']) - 20} more (report.json)")
    return "\n".join(lines)


# -- one call for the CLI and the DAG -------------------------------------------------------

MAX_RANGE_DAYS = 14
BACKTESTS_FOLDER = "backtests"


def parse_time(value: Any, what: str) -> datetime:
    """An ISO-8601 time (naive: UTC) or a datetime; ValueError (one line) otherwise."""
    from lagdoctor.notify.formatting import parse_iso

    parsed = value if isinstance(value, datetime) else parse_iso(str(value).strip()) if value else None
    if parsed is None:
        raise ValueError(f"{what}: not an ISO-8601 time: {value!r}")
    return parsed.replace(tzinfo=timezone.utc) if parsed.tzinfo is None else parsed.astimezone(timezone.utc)


def output_folder(settings: Any, now: datetime) -> str:
    from lagdoctor.settings import join

    return join(settings.data_root, BACKTESTS_FOLDER, now.strftime("%Y%m%dT%H%M%SZ"))


def swept_ends(findings_root: str, start: datetime, end: datetime) -> tuple[list[datetime], list[float]]:
    """The window ends of the sweeps that really ran in [start, end], and the windows they used:
    each complete run folder of the sweep DAG without threshold overrides (an experiment is no
    sweep) whose findings end their window in the range. A run that found no group says nothing."""
    from lagdoctor.contracts import SWEEP_DAG_ID
    from lagdoctor.notify.formatting import parse_iso
    from lagdoctor.runindex import FINDINGS_FILE, RUN_FILE, filesystem, has_overrides, run_completeness

    fs, base = filesystem(findings_root)
    if not fs.exists(base):
        return [], []
    ends: dict[datetime, float] = {}
    for path in sorted(fs.ls(base, detail=False)):
        if not path.rstrip("/").rsplit("/", 1)[-1].startswith(f"{SWEEP_DAG_ID}__"):
            continue  # run_key's readable prefix: another DAG's run, or no run folder
        try:
            with fs.open(f"{path}/{RUN_FILE}", "rt", encoding="utf-8") as fh:
                meta = json.load(fh)
            if meta.get("dag_id") != SWEEP_DAG_ID or has_overrides(meta) or not run_completeness(fs, path).complete:
                continue
            with fs.open(f"{path}/{FINDINGS_FILE}", "rt", encoding="utf-8") as fh:
                first = next((json.loads(line) for line in fh if line.strip()), None)
        except (OSError, ValueError, AttributeError):
            continue  # unreadable or half-written: not a sweep that said anything
        w_start, w_end = (parse_iso((first or {}).get(k)) for k in ("window_start", "window_end"))
        if w_start is not None and w_end is not None and start <= w_end <= end:
            ends[w_end] = (w_end - w_start).total_seconds() / 60
    return sorted(ends), sorted(set(ends.values()))


def run_backtest(*, start: Any, end: Any = None, window_minutes: float | None = 30.0, step_minutes: float = 1.0,
                 overrides: Mapping[str, Any] | str | None = None, groups: str | None = None,
                 topic: str | None = None, clusters: Sequence[str] | None = None, store: str | None = None,
                 output: str | None = None, master: str | None = None, settings: Any = None,
                 now: datetime | None = None, runbooks_dir: str | None = None,
                 sweep_ends: Sequence[datetime] | None = None, as_swept: bool = False) -> tuple[str, dict[str, Any]]:
    """Check the request, run the job (the current thresholds, and `overrides` beside them when
    given), replay the notifications, write report.json and report.html; (output, report).
    `as_swept`: replay the sweeps that really ran in the range (``swept_ends``), at their own
    times and with their window (`window_minutes` None), instead of a schedule every `step_minutes`."""
    from lagdoctor.settings import Settings
    from lagdoctor.stages.params import check_thresholds

    settings = settings or Settings.from_env()
    now = now or datetime.now(timezone.utc)
    start, end = parse_time(start, "from"), parse_time(end or now, "to")
    if end <= start:
        raise ValueError(f"the range ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    if (end - start).total_seconds() > MAX_RANGE_DAYS * 86400:
        raise ValueError(f"the range is longer than {MAX_RANGE_DAYS} days (the store keeps 8)")
    if as_swept:
        sweep_ends, windows = swept_ends(settings.findings_root, start, end)
        if not sweep_ends:
            raise ValueError(f"no sweep of {start.isoformat()} .. {end.isoformat()} is stored in "
                             f"{settings.findings_root}: nothing to replay as swept")
        if window_minutes is None:
            if len(windows) > 1:
                raise ValueError(f"the sweeps of the range used different windows ("
                                 f"{', '.join(f'{w:g}' for w in windows)} min): give the window to replay")
            window_minutes = windows[0]
    window_minutes = 30.0 if window_minutes is None else window_minutes
    if not 0 < float(window_minutes) <= 10080:
        raise ValueError(f"window_minutes: between 1 and 10080, not {window_minutes}")
    if not 0 < float(step_minutes) <= 1440:
        raise ValueError(f"step_minutes: more than 0 and at most 1440, not {step_minutes}")
    if groups:
        from lagdoctor.kafka.group_listing import compile_group_pattern

        compile_group_pattern(groups, what="groups")
    checked = check_thresholds(overrides)
    sets = [ThresholdSet("current")] + ([ThresholdSet("proposed", checked)] if checked else [])
    store = store or settings.snapshots_root
    output = output or output_folder(settings, now)
    from lagdoctor.diagnosis.store_files import is_local_path, local_path

    if not is_local_path(output):
        raise ValueError(f"backtest: the report is written to a local folder, not {output.split('://', 1)[0]}:// "
                         f"(give one as the output)")
    output = local_path(output)
    run_job(store, output, start, end, window_minutes=float(window_minutes), step_minutes=float(step_minutes),
            sets=sets, master=master, groups=groups, topic=topic, clusters=clusters, sweep_ends=sweep_ends)
    report = build_report(output, runbooks_dir=runbooks_dir)
    from lagdoctor.web.backtest_page import write_backtest_html

    write_backtest_html(report, os.path.join(output, REPORT_HTML))
    return output, report
