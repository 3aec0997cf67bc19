"""The classifier against the simulator, on seeds it was never tuned on.

    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py                  # the holdout seeds
    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py --tuning         # the tuning seeds
    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py --seeds 101,102 --groups 2 --wrong
    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py --latency --sweep 300,3,10   # onset -> right finding

Writes lagdoctor.lab.sim's conditions (every scenario under every condition:
the sweep's one-minute cadence and the 5-minute one, diurnal traffic, hot keys, multi-topic groups, 1 to 128
partitions, 1 and 50k msg/s, 15 s to 5 min cadences with missed sweeps, mixed
causes, and the seeds' shapes: the case study, surges with the onset early or
late, a staircase of stuck records, growing and level waves) for each seed, runs the job's own transforms (partition_features,
group_features, findings, as spark_jobs/diagnose_lag.py does) on local[2], and
prints per-diagnosis accuracy (exact set per (group, topic)), false alarms,
pattern agreement, a per-condition breakdown and the time-lag error against
the simulator's truth (median and p90, in and beyond the window, record
timestamp vs interpolation).

Thresholds were tuned on TUNING_SEEDS only; report HOLDOUT_SEEDS. Issue 20's
one-minute sweep was chosen on TUNING_SEEDS and reported on LATE_HOLDOUT_SEEDS,
never looked at before; issue 29's rules for it (rule cases 29-34) were made on
TUNING_SEEDS and reported on all three sets, NEW_HOLDOUT_SEEDS run only then.

--latency: each cause with an onset (and look-alikes that must stay healthy)
simulated under a sweep cadence (--sweep EVERY,SAMPLES,APART; default the DAG's),
the history cut at the end of every sweep from one before onset to 15 minutes
after, each cut diagnosed as that sweep's 30-minute window: the time from onset to
the first sweep that names exactly the true set (decided), wrong causes named
before it, flips (sweeps after it that no longer name exactly the true set),
problems named on healthy groups (alarms: what Slack hears) and page wrong: the
sweeps whose lag page shows a cause's group healthy after onset, before it is named
(of those sweeps), or a healthy group with a problem (held ones too; of its sweeps).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

TUNING_SEEDS = (101, 102, 103)
HOLDOUT_SEEDS = (9001, 9002, 9003, 9004, 9005)
LATE_HOLDOUT_SEEDS = (9011, 9012, 9013)  # issue 20: first run after the choice was made
NEW_HOLDOUT_SEEDS = (9021, 9022, 9023)  # issue 29: first run after the one-minute rules (cases 29-34) were made


def run(seeds, groups: int, conditions=None, overrides=None, show_wrong: bool = False) -> dict:
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.session import start_spark
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.diagnosis.thresholds import Thresholds
    from lagdoctor.lab.sim import score, score_text, write_conditions

    th = Thresholds.from_overrides(overrides or {})
    with tempfile.TemporaryDirectory(prefix="lagdoctor-accuracy-") as tmp:
        t0 = time.monotonic()
        labels = []
        for seed in seeds:  # one cluster per seed: the group names repeat across seeds
            labels += write_conditions(os.path.join(tmp, f"seed-{seed}"), seed=seed, n_groups_per_case=groups,
                                       conditions=conditions, cluster=f"sim{seed}")
        t1 = time.monotonic()
        spark = start_spark("lagdoctor-accuracy", master="local[2]",
                            extra_conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"})
        df = read_snapshots(spark, tmp)
        pf = partition_features(df, th).cache()
        gf = group_features(group_series(df, pf), th)
        found = [r.asDict() for r in findings(pf, gf, th).select("cluster", "group_id", "topic", "diagnosis",
                                                                 "pattern").collect()]
        parts = [r.asDict() for r in pf.select("cluster", "group_id", "topic", "partition",
                                               "time_lag_seconds").collect()]
        t2 = time.monotonic()
    result = score(labels, found, parts)
    print(f"seeds {','.join(map(str, seeds))}, {groups} groups per case: {len(labels)} (group, topic) units, "
          f"simulated in {t1 - t0:.1f} s, diagnosed in {t2 - t1:.1f} s")
    print(score_text(result))
    if show_wrong:
        for w in result["wrong"]:
            print("  wrong:", *w)
        for (truth, got), count in result["pattern_confusion"].most_common():
            print(f"  pattern {truth} read as {got}: {count}")
    return result


# -- time to the first right finding after onset (issue 20) ---------------------------------------

# Causes with an onset the simulator places, and look-alikes that must stay healthy at every cut.
LATENCY_SCENARIOS = ("producer_surge", "producer_surge_late", "partition_imbalance_hot_key", "crashed_consumer_mid_window",
                     "stalled_consumer", "rebalance_loop_staircase", "healthy_steady", "healthy_batch_committer",
                     "healthy_absorbed_burst", "healthy_single_rebalance")
WARMUP_S, AFTER_S, WINDOW_S = 1800.0, 900.0, 1800.0


def latency_table(seed: int, groups: int, sweep: tuple[float, int, float], scenarios=LATENCY_SCENARIOS,
                  warmup_s: float = WARMUP_S):
    """Each scenario's group under sweeps of `sweep` (every s, samples, s apart), its cause
    starting at a random phase of a sweep after `warmup_s` of history (a short one: a fresh deployment); the history cut at the end of each
    sweep from one before onset to AFTER_S after it, each cut its own cluster (a sweep's window)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from lagdoctor.lab.sim import DEFAULT_START, SCENARIOS, simulate_group

    rng = np.random.default_rng(seed)
    every = sweep[0]
    tables, cuts = [], []
    for name in scenarios:
        for k in range(groups):
            onset = warmup_s + float(rng.uniform(0, every))
            group = f"{name}-{k}"
            table, _ = simulate_group(rng, name, "sim", group, f"events-{k}", DEFAULT_START, cadence="sweep", sweep=sweep,
                                      window_seconds=warmup_s + AFTER_S, onset=onset, optional_columns=True,
                                      fractional_capacity=True)
            t = (pc.cast(table["snapshot_ts"], pa.int64()).to_numpy() / 1e6) - DEFAULT_START.timestamp()
            sweeps = np.unique(np.floor(t / every))
            ends = sorted({float(t[np.floor(t / every) == j].max()) for j in sweeps})
            ends = [e for e in ends if onset - every <= e <= onset + AFTER_S]
            for j, end in enumerate(ends):
                cluster = f"s{seed}-{group}-{j}"
                part = table.filter(pa.array((t <= end) & (t >= end - WINDOW_S)))
                tables.append(part.set_column(part.schema.get_field_index("cluster"), "cluster",
                                              pa.array([cluster] * part.num_rows, pa.string())))
                cuts.append({"cluster": cluster, "group_id": group, "scenario": name, "seed": seed,
                             "truth": set(SCENARIOS[name].diagnoses) or {"healthy"}, "after_onset": end - onset})
    return pa.concat_tables(tables), cuts


def latency(seeds, groups: int, sweep: tuple[float, int, float], overrides=None, show: bool = False,
            scenarios=LATENCY_SCENARIOS, warmup_s: float = WARMUP_S) -> dict:
    """Per scenario: the time from onset to the end of the first sweep whose window gets the
    exact true set (median, max; 'never' within AFTER_S), and wrong findings before it; for
    the healthy ones, cuts with any problem named."""
    import collections
    import statistics

    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.session import start_spark
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.diagnosis.thresholds import Thresholds
    from lagdoctor.lab.scoring import heard
    from lagdoctor.lab.sim import write_table

    th = Thresholds.from_overrides(overrides or {})
    with tempfile.TemporaryDirectory(prefix="lagdoctor-latency-") as tmp:
        cuts = []
        for seed in seeds:
            table, c = latency_table(seed, groups, sweep, scenarios, warmup_s)
            cuts += c
            for cluster in sorted({x["cluster"] for x in c}):
                import pyarrow.compute as pc

                write_table(table.filter(pc.equal(table["cluster"], cluster)), tmp, cluster)
        spark = start_spark("lagdoctor-latency", master="local[2]",
                            extra_conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"})
        df = read_snapshots(spark, tmp)
        pf = partition_features(df, th).cache()
        gf = group_features(group_series(df, pf), th)
        by_cut = collections.defaultdict(list)
        for r in findings(pf, gf, th).select("cluster", "diagnosis", "provisional", "deciding_between").collect():
            by_cut[r["cluster"]].append(r.asDict())
        got = {c["cluster"]: heard(by_cut[c["cluster"]]) for c in cuts}  # what Slack hears
        # what the lag page shows: "healthy" alone, though held findings and collecting history say more
        page_healthy = {c["cluster"] for c in cuts
                        if by_cut[c["cluster"]] and all(f["diagnosis"] == "healthy" for f in by_cut[c["cluster"]])}
        page_problem = {c["cluster"] for c in cuts
                        if any(f["diagnosis"] not in ("healthy", "collecting_history") for f in by_cut[c["cluster"]])}
    by_unit = collections.defaultdict(list)
    for c in cuts:
        by_unit[(c["seed"], c["scenario"], c["group_id"])].append(c)
    out: dict = collections.defaultdict(lambda: {"times": [], "never": 0, "wrong": 0, "flips": 0, "alarms": 0,
                                                 "cuts": 0, "page_wrong": 0, "before_right": 0})
    for (seed, name, _), units in by_unit.items():
        row = out[name]
        units.sort(key=lambda c: c["after_onset"])
        right_at = None
        for c in units:
            seen = got[c["cluster"]]
            row["cuts"] += 1
            if c["truth"] == {"healthy"}:
                row["alarms"] += seen != {"healthy"}
                row["page_wrong"] += c["cluster"] in page_problem  # held findings too
                continue
            if c["after_onset"] >= 0 and right_at is None and seen != c["truth"]:  # it runs, not yet named
                row["before_right"] += 1
                row["page_wrong"] += c["cluster"] in page_healthy
            if c["after_onset"] < 0:
                row["alarms"] += seen != {"healthy"}
            elif right_at is None and seen == c["truth"]:
                right_at = c["after_onset"]
            elif right_at is not None and seen != c["truth"]:
                row["flips"] += 1  # the answer moved after it was right
            elif right_at is None and seen - c["truth"] - {"healthy"} and not all(d.endswith("?") for d in seen - c["truth"]):
                row["wrong"] += 1  # a decided wrong cause before the first right one
        if show:
            print(f"  {seed} {name}: " + ", ".join(f"{c['after_onset']:.0f}s {'+'.join(sorted(got[c['cluster']]))}"
                                                   for c in units))
        if c["truth"] != {"healthy"}:
            if right_at is None:
                row["never"] += 1
            else:
                row["times"].append(right_at)
    print(f"sweep every {sweep[0]:g} s, {sweep[1]} samples {sweep[2]:g} s apart, onset after {warmup_s:g} s of history; seeds {','.join(map(str, seeds))}, "
          f"{groups} groups per scenario; overrides {overrides or {}}")
    print(f"  {'scenario':30s} {'groups':>6s} {'median s':>9s} {'max s':>7s} {'never':>5s} {'wrong':>5s} {'flips':>5s} "
          f"{'alarms':>6s} {'page wrong':>10s}")
    for name in scenarios:
        r = out[name]
        med = f"{statistics.median(r['times']):9.0f}" if r["times"] else f"{'-':>9s}"
        mx = f"{max(r['times']):7.0f}" if r["times"] else f"{'-':>7s}"
        print(f"  {name:30s} {len(r['times']) + r['never']:6d} {med} {mx} {r['never']:5d} {r['wrong']:5d} "
              f"{r['flips']:5d} {r['alarms']:3d}/{r['cuts']} {r['page_wrong']:5d}/{r['cuts'] if name.startswith('healthy') else r['before_right']}")
    return dict(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", help="comma-separated (default: the holdout seeds)")
    parser.add_argument("--tuning", action="store_true", help="the tuning seeds")
    parser.add_argument("--groups", type=int, default=3, help="groups per (condition, scenario)")
    parser.add_argument("--conditions", help="comma-separated condition names (default: all); "
                                             "with --latency, scenario names")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a Thresholds override")
    parser.add_argument("--wrong", action="store_true", help="list every unit the engine got wrong")
    parser.add_argument("--latency", action="store_true",
                        help="time from onset to the first right finding, sweep by sweep (instead of accuracy)")
    parser.add_argument("--sweep", metavar="EVERY,SAMPLES,APART",
                        help="the sweep's cadence for --latency and the sweep_1min condition (default: the DAG's)")
    parser.add_argument("--warmup", type=float, default=WARMUP_S, metavar="SECONDS",
                        help=f"with --latency, the history before the onset (default {WARMUP_S:g}; 120: a fresh deployment)")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(TUNING_SEEDS if args.tuning else HOLDOUT_SEEDS)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    conditions = args.conditions.split(",") if args.conditions else None
    from lagdoctor.lab import sim

    if args.sweep:
        every, samples, apart = args.sweep.split(",")
        shape = (float(every), int(samples), float(apart))
        sim._sweep_shape = lambda: shape
    if args.latency:
        latency(seeds, args.groups, sim._sweep_shape(), overrides, args.wrong, conditions or LATENCY_SCENARIOS,
                args.warmup)
        return 0
    run(seeds, args.groups, conditions, overrides, args.wrong)
    return 0


if __name__ == "__main__":
    sys.exit(main())
