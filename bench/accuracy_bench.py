"""The classifier against the simulator, on seeds it was never tuned on.

    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py                  # the holdout seeds
    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py --tuning         # the tuning seeds
    PYTHONPATH=plugins .venv/bin/python bench/accuracy_bench.py --seeds 101,102 --groups 2 --wrong

Writes lagdoctor.lab.sim's conditions (every scenario under every condition:
sweep cadence, diurnal traffic, hot keys, multi-topic groups, 1 to 128
partitions, 1 and 50k msg/s, 15 s to 5 min cadences with missed sweeps, mixed
causes, and the seeds' shapes: the case study, surges with the onset early or
late, a staircase of stuck records, growing and level waves) for each seed, runs the job's own transforms (partition_features,
group_features, findings, as spark_jobs/diagnose_lag.py does) on local[2], and
prints per-diagnosis accuracy (exact set per (group, topic)), false alarms,
pattern agreement, a per-condition breakdown and the time-lag error against
the simulator's truth (median and p90, in and beyond the window, record
timestamp vs interpolation).

Thresholds were tuned on TUNING_SEEDS only; report HOLDOUT_SEEDS.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

TUNING_SEEDS = (101, 102, 103)
HOLDOUT_SEEDS = (9001, 9002, 9003, 9004, 9005)


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", help="comma-separated (default: the holdout seeds)")
    parser.add_argument("--tuning", action="store_true", help="the tuning seeds")
    parser.add_argument("--groups", type=int, default=3, help="groups per (condition, scenario)")
    parser.add_argument("--conditions", help="comma-separated condition names (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a Thresholds override")
    parser.add_argument("--wrong", action="store_true", help="list every unit the engine got wrong")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else list(TUNING_SEEDS if args.tuning else HOLDOUT_SEEDS)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    conditions = args.conditions.split(",") if args.conditions else None
    run(seeds, args.groups, conditions, overrides, args.wrong)
    return 0


if __name__ == "__main__":
    sys.exit(main())
