"""The sweep's diagnosis through `spark-submit`, two checkouts interleaved, beside a trivial spark-submit.

    .venv/bin/python bench/submit_ab.py --before ../wt-before --shape-dir .bench/diagnose/shape-sweep-200-seed-1

Each checkout's own `build_spark_submit_command` builds the command the sweep DAG runs
(`--as-of`, `--window-minutes` from the shape's `_COMPLETE` marker, `--quarantine`,
`local[2]`), so JVM options and confs are each version's. The rounds interleave a
trivial spark-submit (session up, count 1,000 rows, stop), "before" and "after" (this
checkout), so a machine that slows down slows all three. Printed: each run's wall and
CPU (the process tree's, from wait4), the medians and their ratios to the trivial run.
The shapes are bench/diagnose_bench.py's (`--shape sweep` writes them). Figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRIVIAL = ("from pyspark.sql import SparkSession\n"
           "spark = SparkSession.builder.appName('trivial').getOrCreate()\n"
           "assert spark.range(1000).count() == 1000\n"
           "spark.stop()\n")


def command(checkout: Path, store: Path, as_of: str, window: float, work: Path) -> list[str]:
    code = ("import json, sys; from lagdoctor.diagnosis.submit import build_spark_submit_command as build; "
            "a = json.loads(sys.argv[1]); print(json.dumps(build(a['store'], a['out'], as_of=a['as_of'], "
            "window_minutes=a['window'], master='local[2]', extra_args=['--quarantine'], work_dir=a['work'], "
            "job_script=a['script'])))")
    args = {"store": str(store), "out": str(work / "out"), "as_of": as_of, "window": window, "work": str(work),
            "script": str(checkout / "spark_jobs" / "diagnose_lag.py")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(checkout / "plugins")})
    return json.loads(out.stdout)


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{cmd[-1]} failed: {err.decode(errors='replace').strip().splitlines()[-1:]}")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="a checkout of the code before the change")
    ap.add_argument("--shape-dir", type=Path, required=True, help="a shape folder of bench/diagnose_bench.py")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "plugins"))
    from lagdoctor.diagnosis.submit import spark_submit_env

    meta = json.loads((args.shape_dir / "_COMPLETE").read_text())
    store = next(args.shape_dir.glob("cluster=*"))
    work = Path(tempfile.mkdtemp(prefix="lagdoctor-submit-ab-"))
    trivial = work / "trivial.py"
    trivial.write_text(TRIVIAL)
    sides = {}
    for label, checkout in (("before", args.before.resolve()), ("after", ROOT)):
        (work / label).mkdir()
        sides[label] = (checkout, command(checkout, store, meta["as_of"], float(meta["window_minutes"]),
                                          work / label))
    print(f"{meta['rows']:,} rows, {args.rounds} rounds; before = {args.before}, after = {ROOT}")
    results: dict[str, list[tuple[float, float]]] = {"trivial": [], "before": [], "after": []}
    for _ in range(args.rounds):
        for label in results:
            env = spark_submit_env(master="local[2]")
            if label == "trivial":
                cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false", str(trivial)]
            else:
                checkout, cmd = sides[label]
                subprocess.run(["rm", "-rf", str(work / label / "out")], check=True)
                env["PYTHONPATH"] = str(checkout / "plugins")
            wall, cpu = run(cmd, env)
            results[label].append((wall, cpu))
            print(f"  {label:8s} wall {wall:6.1f} s  cpu {cpu:6.1f} s  load {os.getloadavg()[0]:.1f}", flush=True)
    base_wall = statistics.median(w for w, _ in results["trivial"])
    base_cpu = statistics.median(c for _, c in results["trivial"])
    for label, runs in results.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"median {label:8s} {wall / base_wall:5.2f}x a trivial spark-submit ({wall:5.1f} s), "
              f"CPU {cpu / base_cpu:5.2f}x ({cpu:5.1f} s)")


if __name__ == "__main__":
    main()
