"""Benchmark the diagnosis job: simulated snapshot histories through spark-submit.

    .venv/bin/python bench/diagnose_bench.py                 # 1M and 10M rows, local[2]
    .venv/bin/python bench/diagnose_bench.py --rows 1000000 --master 'local[*]'

For each size: simulate the history once (cached under .bench/diagnose/, which
git ignores), run spark_jobs/diagnose_lag.py with spark-submit, and print wall
seconds, rows/s and the peak resident memory of the whole process tree (JVM +
Python workers). A run on an empty store first measures the fixed cost (JVM
start, session, writing empty outputs) so the rest can be read as data work.
Target: 10M rows in <= 90 s with local[2] on a 2-core machine.

    .venv/bin/python bench/diagnose_bench.py --shape sweep         # 200 and 2,000 groups x 10 partitions
    .venv/bin/python bench/diagnose_bench.py --shape short-series  # ~10M rows, ~37k short series
    .venv/bin/python bench/diagnose_bench.py --shape week          # the sweep window over 30 min vs 7 days of history

--shape writes the store as lagdoctor.store.write_snapshot does (one file per
sample under cluster=/date=), runs the job as the sweep DAG does (the cluster
folder, --as-of the last sample, --window-minutes, --quarantine, no shuffle
setting) and, in the same run, times a single-process DuckDB query of
comparable per-partition features on the same files (the bench extra:
pip install -e '.[bench]'), printing spark/duckdb. Issue 9's targets: sweep
window 200 x 10 <= 20 s, 2,000 x 10 <= 30 s; short series <= 3x DuckDB.
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
from datetime import datetime, timedelta, timezone
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
    from lagdoctor.lab.sim import write_benchmark_history

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


# -- shapes users have (issue 9): the sweep's window, many short series ----------------------

SWEEP_START = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


def _shape_tables(rng, n_groups, partitions, sample_rounds, cluster):
    """Yield (sample time, pyarrow table in contract 1's schema) per sample.

    `partitions[g]` partitions per group; `sample_rounds` is a list of
    (datetime, active group mask). Offsets grow at per-partition produce and
    consume rates, so lag and rates vary across partitions."""
    import numpy as np
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    schema = snapshot_arrow_schema()
    part_group = np.repeat(np.arange(n_groups), partitions)
    part_no = np.concatenate([np.arange(p) for p in partitions]).astype(np.int32)
    n_parts = len(part_group)
    produce = rng.uniform(1, 500, n_parts)
    consume = produce * rng.uniform(0.5, 1.2, n_parts)
    base = rng.integers(0, 10**9, n_parts)
    group_names = pa.array([f"group-{g:06d}" for g in range(n_groups)])
    topic_names = pa.array([f"topic-{g % 997:03d}" for g in range(n_groups)])
    members = pa.array([f"consumer-{g:06d}" for g in range(n_groups)])
    t0 = sample_rounds[0][0]
    for ts, active in sample_rounds:
        rows = np.flatnonzero(active[part_group])
        g = part_group[rows]
        secs = (ts - t0).total_seconds()
        end = base[rows] + (produce[rows] * secs).astype(np.int64) + 1_000
        committed = np.minimum(end, base[rows] + (consume[rows] * secs).astype(np.int64))
        n = len(rows)
        columns = {
            "snapshot_ts": pa.array(np.full(n, int(ts.timestamp() * 1e6), dtype="int64")).cast(
                pa.timestamp("us", tz="UTC")),
            "cluster": pa.array(np.full(n, cluster, dtype=object), pa.string()),
            "group_id": group_names.take(pa.array(g)),
            "group_state": pa.array(np.full(n, "STABLE", dtype=object), pa.string()),
            "topic": topic_names.take(pa.array(g)),
            "partition": pa.array(part_no[rows]),
            "log_start_offset": pa.array(base[rows]),
            "log_end_offset": pa.array(end),
            "committed_offset": pa.array(committed),
            "lag": pa.array(end - committed),
            "member_id": members.take(pa.array(g)),
            "client_id": members.take(pa.array(g)),
            "host": pa.array(np.full(n, "/10.0.0.1", dtype=object), pa.string()),
            "group_members": pa.array(np.ones(n, dtype=np.int32)),
        }
        yield ts, pa.Table.from_pydict(columns, schema=schema)


def ensure_shape(root: Path, shape: str, groups: int, seed: int) -> tuple[Path, datetime, float, int]:
    """Write (once) a store tree for `shape` as lagdoctor.store.write_snapshot does.

    Returns (the cluster= folder the DAG passes, as-of, window minutes, rows)."""
    import json

    import numpy as np

    from lagdoctor.store import write_snapshot

    cluster = "bench"
    path = root / f"shape-{shape}-{groups}-seed-{seed}"
    marker = path / "_COMPLETE"
    if marker.exists():
        meta = json.loads(marker.read_text())
        return (path / f"cluster={cluster}", datetime.fromisoformat(meta["as_of"]), meta["window_minutes"],
                meta["rows"])
    shutil.rmtree(path, ignore_errors=True)
    t_gen = time.perf_counter()
    rng = np.random.default_rng(seed)
    if shape in ("sweep", "week"):
        # the sweep's history: 3 samples 10 s apart every 5 minutes; 30 minutes of it
        # (18 samples), or a week of it (6,048 files) with the same 30-minute window
        partitions = np.full(groups, 10)
        sweeps = 6 if shape == "sweep" else 12 * 24 * 7
        times = [SWEEP_START + timedelta(minutes=5 * r, seconds=10 * s) for r in range(sweeps) for s in range(3)]
        rounds = [(t, np.ones(groups, dtype=bool)) for t in times]
        window = 30.0
    else:
        # many short series: 3-12 partitions (mostly few), 30-60 samples each, one sample a minute
        partitions = np.clip(3 + rng.poisson(3, groups), 3, 12)
        length = rng.integers(30, 61, groups)
        n_samples = 120
        first = rng.integers(0, n_samples - length + 1)
        times = [SWEEP_START + timedelta(minutes=i) for i in range(n_samples)]
        rounds = [(t, (first <= i) & (i < first + length)) for i, t in enumerate(times)]
        window = float(n_samples)
    rows = 0
    for ts, table in _shape_tables(rng, groups, partitions, rounds, cluster):
        write_snapshot(table, str(path), cluster, ts)
        rows += table.num_rows
    as_of = times[-1]
    marker.write_text(json.dumps({"as_of": as_of.isoformat(), "window_minutes": window, "rows": rows}))
    print(f"  wrote {rows:,} rows ({groups:,} groups, {len(times)} samples) in "
          f"{time.perf_counter() - t_gen:.1f} s -> {path}", flush=True)
    return path / f"cluster={cluster}", as_of, window, rows


DUCKDB_FEATURES = """
SELECT cluster, group_id, topic, "partition",
       count(*) AS snapshots,
       min(snapshot_ts) AS first_ts,
       max(snapshot_ts) AS last_ts,
       arg_max(lag, snapshot_ts) AS lag_end,
       (arg_max(log_end_offset, snapshot_ts) - arg_min(log_end_offset, snapshot_ts))
         / nullif(epoch(max(snapshot_ts)) - epoch(min(snapshot_ts)), 0) AS produce_rate,
       (arg_max(committed_offset, snapshot_ts) - arg_min(committed_offset, snapshot_ts))
         / nullif(epoch(max(snapshot_ts)) - epoch(min(snapshot_ts)), 0) AS consume_rate
FROM read_parquet(?, hive_partitioning = false)
WHERE snapshot_ts > ? AND snapshot_ts <= ?
GROUP BY ALL
"""


def duckdb_baseline(store: Path, as_of: datetime, window_minutes: float) -> tuple[float, int] | None:
    """(wall seconds, partition rows) of the per-partition features in one DuckDB process, or None."""
    try:
        import duckdb
    except ImportError:
        print("  duckdb baseline skipped: install the bench extra (pip install -e '.[bench]')", flush=True)
        return None
    start = time.perf_counter()
    con = duckdb.connect()
    table = con.execute(DUCKDB_FEATURES, [str(store / "**" / "*.parquet"),
                                          as_of - timedelta(minutes=window_minutes), as_of]).fetchnumpy()
    rows = len(table["snapshots"])
    con.close()
    return time.perf_counter() - start, rows


def run_shapes(args, conf_base, env) -> int:
    from lagdoctor.diagnosis.submit import build_spark_submit_command

    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    conf = dict(conf_base)
    if args.shuffle_partitions_given:
        conf["spark.sql.shuffle.partitions"] = args.shuffle_partitions
    cases = []
    if args.shape == "sweep":
        cases = [("sweep", g) for g in args.groups or [200, 2_000]]
    elif args.shape == "week":
        # the same 30-minute window over 30 minutes and over 7 days of stored history
        cases = [(shape, g) for g in args.groups or [200] for shape in ("sweep", "week")]
    else:
        cases = [("short-series", g) for g in args.groups or [37_000]]
    results = []
    out_root = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    try:
        for shape, groups in cases:
            store, as_of, window, rows = ensure_shape(root, shape, groups, args.seed)
            out = out_root / f"{shape}-{groups}"
            # as the DAG does: the cluster= folder, --as-of the last sample, the window, --quarantine
            cmd = build_spark_submit_command(str(store), str(out), as_of=as_of.isoformat(),
                                             window_minutes=window, master=args.master, conf=conf,
                                             extra_args=["--quarantine"])
            code, wall, peak, err = run_measured(cmd, env)
            if code != 0:
                print(f"{shape} {groups}: job failed ({code}): {err.strip()[-500:]}", file=sys.stderr)
                return 1
            statuses = sum(1 for _ in open(out / "partition_status.jsonl"))
            base = duckdb_baseline(store, as_of, window)
            label = f"{shape} {groups:,} groups"
            line = (f"{label:>28}: {rows:>11,} rows  spark {wall:6.1f} s  peak RSS {peak / 2**30:4.2f} GiB  "
                    f"{statuses:,} partition statuses")
            if base:
                line += f"  duckdb {base[0]:5.2f} s ({base[1]:,} partitions)  spark/duckdb {wall / base[0]:5.1f}x"
            print(line, flush=True)
            results.append((label, rows, wall, peak, base))
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    print(f"\nmaster={args.master} cpus={os.cpu_count()} driver-memory={args.driver_memory} "
          f"shuffle partitions={'job default' if not args.shuffle_partitions_given else args.shuffle_partitions}")
    print("| shape | rows | spark wall s | duckdb wall s | spark/duckdb | peak RSS |")
    print("|---|---|---|---|---|---|")
    for label, rows, wall, peak, base in results:
        duck = f"{base[0]:.2f}" if base else "-"
        ratio = f"{wall / base[0]:.1f}x" if base else "-"
        print(f"| {label} | {rows:,} | {wall:.1f} | {duck} | {ratio} | {peak / 2**30:.2f} GiB |")
    return 0


def main(argv=None) -> int:
    from lagdoctor.diagnosis.submit import build_spark_submit_command, spark_submit_env

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / ".bench" / "diagnose"))
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--shuffle-partitions", default=None,
                        help="spark.sql.shuffle.partitions to pass (rows runs: 8 unless given; "
                             "--shape runs: nothing unless given, as the DAG passes nothing)")
    parser.add_argument("--shape", choices=["sweep", "week", "short-series"], default=None,
                        help="sweep: the sweep's 30-minute window of G groups x 10 partitions (G = 200, 2,000); "
                             "short-series: ~10M rows of ~37k groups with 30-60 samples each; "
                             "both also timed through DuckDB on the same files")
    parser.add_argument("--groups", type=int, nargs="+", default=None, help="group counts for --shape")
    args = parser.parse_args(argv)
    args.shuffle_partitions_given = args.shuffle_partitions is not None
    if args.shuffle_partitions is None:
        args.shuffle_partitions = "8"

    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.memory": args.driver_memory,
        "spark.sql.shuffle.partitions": args.shuffle_partitions,
    }
    env = spark_submit_env(master=args.master)
    if args.shape:
        return run_shapes(args, {k: v for k, v in conf.items() if k != "spark.sql.shuffle.partitions"}, env)
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
