"""Benchmark the diagnosis job: simulated snapshot histories through spark-submit.

    .venv/bin/python bench/diagnose_bench.py                 # 1M and 10M rows, local[2]
    .venv/bin/python bench/diagnose_bench.py --rows 1000000 --master 'local[*]'

For each size: simulate the history once (cached under .bench/diagnose/, which
git ignores), run spark_jobs/diagnose_lag.py with spark-submit, and print wall
seconds, rows/s and the peak resident memory of the whole process tree (JVM +
Python workers). A run on an empty store first measures the fixed cost (JVM
start, session, writing empty outputs) so the rest can be read as data work.
Target: 10M rows in <= 90 s with local[2] on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))  # run from a checkout without installing


def tree_rss_bytes(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak tree RSS bytes, stderr) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return proc.returncode, wall, peak, err


def ensure_history(root: Path, rows: int, seed: int) -> Path:
    from lagdoctor.sim import write_benchmark_history

    path = root / f"rows-{rows}-seed-{seed}"
    marker = path / "_COMPLETE"
    if marker.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    written = write_benchmark_history(str(path), rows=rows, seed=seed)
    marker.write_text(str(written))
    print(f"  simulated {written:,} rows in {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return path


def main(argv=None) -> int:
    from lagdoctor.diagnosis.submit import build_spark_submit_command, spark_submit_env

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / ".bench" / "diagnose"))
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--shuffle-partitions", default="8")
    args = parser.parse_args(argv)

    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.memory": args.driver_memory,
        "spark.sql.shuffle.partitions": args.shuffle_partitions,
    }
    env = spark_submit_env(master=args.master)
    out_root = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    results = []
    try:
        empty = root / "empty"
        empty.mkdir(exist_ok=True)
        cases = [("empty (fixed cost)", 0, empty)]
        for rows in args.rows:
            cases.append((f"{rows:,} rows", rows, ensure_history(root, rows, args.seed)))
        for label, rows, path in cases:
            cmd = build_spark_submit_command(str(path), str(out_root / label.split()[0]), master=args.master,
                                             conf=conf)
            code, wall, peak, err = run_measured(cmd, env)
            if code != 0:
                print(f"{label}: job failed ({code}): {err.strip()[-500:]}", file=sys.stderr)
                return 1
            findings = sum(1 for _ in open(out_root / label.split()[0] / "findings.jsonl"))
            results.append((label, rows, wall, peak, findings))
            rate = f"{rows / wall:>12,.0f}" if rows else f"{'-':>12}"
            print(f"{label:>22}: {wall:7.1f} s wall  {rate} rows/s  peak RSS {peak / 2**30:5.2f} GiB  "
                  f"{findings} findings", flush=True)
    finally:
        shutil.rmtree(out_root, ignore_errors=True)

    fixed = results[0][2]
    print(f"\nmaster={args.master} cpus={os.cpu_count()} driver-memory={args.driver_memory}")
    print("| input | wall s | rows/s | rows/s beyond fixed cost | peak RSS |")
    print("|---|---|---|---|---|")
    for label, rows, wall, peak, _ in results:
        beyond = f"{rows / (wall - fixed):,.0f}" if rows and wall > fixed else "-"
        rate = f"{rows / wall:,.0f}" if rows else "-"
        print(f"| {label} | {wall:.1f} | {rate} | {beyond} | {peak / 2**30:.2f} GiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
