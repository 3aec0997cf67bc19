"""Backtest cost (issue 33) beside one sweep's diagnosis, measured in the same run.

A store of one-minute sweeps (one snapshot a minute) of --groups x --partitions is
written once (cached under --root); then, through spark-submit on local[*]:
  sweep     the diagnosis of the last sweep's window (30 min), as the sweep DAG runs it
  backtest  every sweep of the last --hours, one a minute, in one job (the current thresholds)
  replay    the notification decisions of the backtest's findings, sweep by sweep
and the ratio backtest / sweep (goal for a day: under 10).

    python bench/backtest_bench.py                       # a day at 200 x 10
    python bench/backtest_bench.py --hours 168           # a week
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins"))
sys.path.insert(0, str(ROOT / "bench"))

END = datetime(2026, 11, 21, 0, 0, tzinfo=timezone.utc)


def ensure_store(root: Path, groups: int, partitions: int, hours: float) -> Path:
    import numpy as np
    import pyarrow as pa

    from diagnose_bench import _shape_tables
    from lagdoctor.lab.sim import write_table

    store = root / f"store-{groups}x{partitions}-{hours:g}h"
    if (store / "_done").exists():
        return store
    shutil.rmtree(store, ignore_errors=True)
    minutes = int(hours * 60) + 31
    rounds = [(END - timedelta(minutes=minutes - 1 - k), np.ones(groups, dtype=bool)) for k in range(minutes)]
    tables = [t for _, t in _shape_tables(np.random.default_rng(1), groups, [partitions] * groups, rounds, "bench")]
    write_table(pa.concat_tables(tables), str(store), "bench")
    (store / "_done").write_text("")
    return store


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--root", default=str(ROOT / ".bench" / "backtest"))
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    from lagdoctor import backtest as bt
    from lagdoctor.diagnosis.submit import run_diagnosis_process

    root = Path(args.root)
    started = time.monotonic()
    store = ensure_store(root, args.groups, args.partitions, args.hours)
    print(f"store: {store} ({time.monotonic() - started:.0f} s to make or find)", flush=True)
    out = root / "out"
    shutil.rmtree(out, ignore_errors=True)

    t = time.monotonic()
    proc = run_diagnosis_process(str(store), str(out / "sweep"), END.isoformat(), 30.0, args.master, capture=True)
    sweep_s = time.monotonic() - t
    assert proc.returncode == 0, proc.stderr[-2000:]

    t = time.monotonic()
    bt.run_job(str(store), str(out / "backtest"), END - timedelta(hours=args.hours), END, window_minutes=30.0,
               step_minutes=1.0, sets=[bt.ThresholdSet("current")], master=args.master)
    job_s = time.monotonic() - t
    t = time.monotonic()
    report = bt.build_report(str(out / "backtest"))
    replay_s = time.monotonic() - t
    s = report["sets"][0]
    print(json.dumps({"groups": args.groups, "partitions": args.partitions, "hours": args.hours,
                      "sweeps": report["sweeps"], "sweep_s": round(sweep_s, 1), "backtest_job_s": round(job_s, 1),
                      "replay_s": round(replay_s, 1), "ratio_job_to_sweep": round(job_s / sweep_s, 1),
                      "ratio_total_to_sweep": round((job_s + replay_s) / sweep_s, 1), "alerts": s["alerts"],
                      "carry_passes": s["carry_passes"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
