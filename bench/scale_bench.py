"""Issue 9's scale figure: 10,000 groups x 20 partitions, snapshot and diagnosis, on this machine.

    .venv/bin/python bench/scale_bench.py                         # 10,000 x 20, everything
    .venv/bin/python bench/scale_bench.py --groups 1000 --skip-diagnosis
    .venv/bin/python bench/scale_bench.py --skip-snapshot         # the diagnosis part only

Shape: topics of P partitions, each read by --groups-per-topic groups (default
10, so 10,000 groups read 1,000 topics: 20,000 partitions, 200,000 snapshot
rows), the way several services consume the same topics. Every partition holds
--records records and every group has committed on every partition.

Snapshot: the embedded Apache Kafka on a free loopback port; setup creates the
topics, produces, and commits each group's offsets with AdminClient
alter_consumer_group_offsets, a bounded number of requests in flight. Then a
fresh process (so its peak RSS is the collector's, not the setup's) times
`collect_snapshot` --repeat times, counting broker requests as
bench/snapshot_bench.py does (librdkafka's statistics `tx`).

Diagnosis: the sweep's 30-minute window for G x P (18 samples, 3 samples 10 s
apart every 5 minutes) written as lagdoctor.store.write_snapshot does, with
bench/diagnose_bench.py's generator; then `spark-submit spark_jobs/diagnose_lag.py`
as the sweep DAG runs it (local[2], driver memory 4g, the cluster= folder,
--as-of, --window-minutes 30, --quarantine), and diagnose_bench's DuckDB
baseline of per-partition features on the same files.

Targets (issue 9): snapshot <= 30 s, diagnosis <= 90 s for 10,000 x 20.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))

SNAPSHOT_TARGET_S = 30.0
DIAGNOSIS_TARGET_S = 90.0
GROUP_PREFIX = "scale-group-"


def topic_of(group: int, groups_per_topic: int) -> str:
    return f"scale-topic-{group // groups_per_topic:05d}"


def setup(bootstrap: str, groups: int, partitions: int, groups_per_topic: int, records: int,
          in_flight: int) -> dict[str, float]:
    """Create topics, produce, commit every group's offsets; seconds per step."""
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    from lagdoctor.kafka.clients import admin_client, client_config

    admin = admin_client(bootstrap)
    topics = sorted({topic_of(g, groups_per_topic) for g in range(groups)})
    took: dict[str, float] = {}

    t = time.perf_counter()
    for start in range(0, len(topics), 100):
        futures = admin.create_topics([NewTopic(name, partitions, 1) for name in topics[start:start + 100]],
                                      request_timeout=60)
        for _, fut in futures.items():
            fut.result()
    # created is not yet known to the broker that serves the commits: wait until its metadata lists them all
    deadline = time.monotonic() + 300
    while True:
        known = set(admin.list_topics(timeout=60).topics)
        missing = [name for name in topics if name not in known]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} of {len(topics)} bench topics still unknown to the broker after 300 s")
        time.sleep(1)
    took["create topics"] = time.perf_counter() - t

    t = time.perf_counter()
    if records:
        # Batched: one record per request would take minutes.
        producer = Producer(client_config(bootstrap, {"linger.ms": 50}))
        for name in topics:
            for p in range(partitions):
                for _ in range(records):
                    producer.produce(name, b"x", partition=p)
            producer.poll(0)
        # a fresh broker elects 20,000 partitions' leaders slowly: give it time in proportion
        budget = max(120, len(topics) * partitions // 20)
        if producer.flush(budget):
            raise RuntimeError(f"producing the bench records did not finish in {budget} s")
    took["produce"] = time.perf_counter() - t

    t = time.perf_counter()

    def commit(group_numbers: list[int]) -> list[int]:
        """The groups whose commit failed on some partition (a whole group is retried)."""
        failed, pending = [], []

        def settle() -> None:
            for g, fut in pending:
                if any(tp.error is not None for tp in fut.result().topic_partitions):
                    failed.append(g)
            pending.clear()

        for g in group_numbers:
            # Commits spread over 0..records so lag differs between groups.
            offsets = [TopicPartition(topic_of(g, groups_per_topic), p, (g + p) % (records + 1))
                       for p in range(partitions)]
            request = ConsumerGroupTopicPartitions(f"{GROUP_PREFIX}{g:05d}", offsets)
            pending.extend((g, fut) for fut in admin.alter_consumer_group_offsets([request], request_timeout=60).values())
            if len(pending) >= in_flight:
                settle()
        settle()
        return failed

    failed = commit(list(range(groups)))
    for _ in range(5):  # a partition the coordinator does not know yet: again, a little later
        if not failed:
            break
        time.sleep(2)
        failed = commit(failed)
    if failed:
        raise RuntimeError(f"{len(failed)} of {groups} bench groups could not commit their offsets "
                           f"(first: {GROUP_PREFIX}{failed[0]:05d})")
    took["commit offsets"] = time.perf_counter() - t
    return took


def measure_snapshot(bootstrap: str, repeat: int, profile: bool, extra: dict) -> dict:
    """Run in a fresh process: `repeat` timed snapshots; peak RSS is this process's."""
    from snapshot_bench import RequestCounter

    from lagdoctor.kafka.collector import collect_snapshot
    from lagdoctor.kafka.clients import admin_client

    counter = RequestCounter()
    admin = admin_client(bootstrap, {"stats_cb": counter, "statistics.interval.ms": 100})
    admin.poll(0.3)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    timings, requests, rows, read_errors = [], [], 0, 0
    without_records, records_read, record_errors = [], 0, 0
    for _ in range(repeat):
        # the same snapshot without the record fetch, interleaved: what the fetch adds
        t = time.perf_counter()
        collect_snapshot(admin, "bench", f"{GROUP_PREFIX}.*", datetime.now(timezone.utc), timeout_s=60,
                         bootstrap=bootstrap, record_partitions=0, **extra)
        without_records.append(time.perf_counter() - t)
        admin.poll(0.3)
        before = counter.tx
        t = time.perf_counter()
        table = collect_snapshot(admin, "bench", f"{GROUP_PREFIX}.*", datetime.now(timezone.utc),
                                 timeout_s=60, bootstrap=bootstrap, **extra)
        timings.append(time.perf_counter() - t)
        admin.poll(0.3)  # let the statistics callback report the requests just sent
        requests.append(counter.tx - before)
        rows = table.num_rows
        read_errors = table.num_rows - table.column("read_error").null_count
        records_read = table.num_rows - table.column("committed_record_offset").null_count
        record_errors = table.num_rows - table.column("committed_record_error").null_count
        del table
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        collect_snapshot(admin, "bench", f"{GROUP_PREFIX}.*", datetime.now(timezone.utc), timeout_s=60,
                         bootstrap=bootstrap, **extra)
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return {"timings": timings, "requests": requests, "rows": rows, "read_errors": read_errors,
            "without_records": without_records, "records_read": records_read, "record_errors": record_errors,
            "rss_before": rss_before, "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def run_snapshot(args) -> dict:
    import psutil

    from lagdoctor.kafka.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        t = time.perf_counter()
        steps = setup(broker.bootstrap, args.groups, args.partitions, args.groups_per_topic, args.records,
                      args.setup_in_flight)
        setup_s = time.perf_counter() - t
        detail = ", ".join(f"{k} {v:.1f} s" for k, v in steps.items())
        print(f"setup: {args.groups:,} groups x {args.partitions} partitions on "
              f"{-(-args.groups // args.groups_per_topic):,} topics in {setup_s:.1f} s ({detail})", flush=True)
        cmd = [sys.executable, __file__, "--measure-snapshot", broker.bootstrap, "--repeat", str(args.repeat)]
        if args.profile:
            cmd.append("--profile")
        if args.max_in_flight is not None:
            cmd += ["--max-in-flight", str(args.max_in_flight)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"snapshot measurement failed ({proc.returncode})")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["broker_rss"] = psutil.Process(broker.nodes[0].proc.pid).memory_info().rss
    result["setup_s"] = setup_s
    timings = result["timings"]
    expected = args.groups * args.partitions
    print(f"snapshot: {result['rows']:,} rows (expected {expected:,}), {result['read_errors']} with read errors; "
          f"median {statistics.median(timings):.2f} s, min {min(timings):.2f}, max {max(timings):.2f} "
          f"over {len(timings)}; {statistics.median(result['requests']):.0f} broker requests; "
          f"peak RSS {result['rss_peak'] / 2**20:.0f} MiB (after imports {result['rss_before'] / 2**20:.0f} MiB); "
          f"broker RSS {result['broker_rss'] / 2**20:.0f} MiB", flush=True)
    if result["rows"] != expected:
        raise SystemExit(f"snapshot has {result['rows']} rows, expected {expected}")
    return result


def ensure_window(root: Path, groups: int, partitions: int, seed: int) -> tuple[Path, datetime, int, float]:
    """The sweep's 30-minute window (18 samples) for groups x partitions, written once (cached)."""
    import numpy as np
    from diagnose_bench import SWEEP_START, _shape_tables

    from lagdoctor.store import write_snapshot

    cluster = "bench"
    path = root / f"sweep-{groups}x{partitions}-seed-{seed}"
    marker = path / "_COMPLETE"
    times = [SWEEP_START + timedelta(minutes=5 * r, seconds=10 * s) for r in range(6) for s in range(3)]
    if marker.exists():
        return path / f"cluster={cluster}", times[-1], int(marker.read_text()), 0.0
    shutil.rmtree(path, ignore_errors=True)
    t = time.perf_counter()
    rng = np.random.default_rng(seed)
    rounds = [(ts, np.ones(groups, dtype=bool)) for ts in times]
    rows = 0
    for ts, table in _shape_tables(rng, groups, np.full(groups, partitions), rounds, cluster):
        write_snapshot(table, str(path), cluster, ts)
        rows += table.num_rows
    marker.write_text(str(rows))
    took = time.perf_counter() - t
    print(f"  wrote {rows:,} rows ({len(times)} samples) in {took:.1f} s -> {path}", flush=True)
    return path / f"cluster={cluster}", times[-1], rows, took


def duckdb_baseline(store: Path, as_of: datetime, window_minutes: float) -> tuple[float, int] | None:
    """diagnose_bench's DuckDB query of per-partition features on the same files."""
    from diagnose_bench import duckdb_baseline as baseline

    return baseline(store, as_of, window_minutes)


def run_diagnosis(args) -> dict:
    from diagnose_bench import run_measured

    from lagdoctor.diagnosis.submit import build_spark_submit_command, spark_submit_env

    store, as_of, rows, _ = ensure_window(Path(args.data_dir), args.groups, args.partitions, args.seed)
    conf = {"spark.ui.enabled": "false", "spark.driver.memory": args.driver_memory}
    out = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        # as the sweep DAG runs it: the cluster= folder, --as-of the last sample, the window, --quarantine
        cmd = build_spark_submit_command(str(store), str(out), as_of=as_of.isoformat(), window_minutes=30.0,
                                         master=args.master, conf=conf, extra_args=["--quarantine"])
        code, wall, peak, err = run_measured(cmd, spark_submit_env(master=args.master))
        if code != 0:
            raise SystemExit(f"diagnosis failed ({code}): {err.strip()[-800:]}")
        statuses = sum(1 for _ in open(out / "partition_status.jsonl"))
        findings = sum(1 for _ in open(out / "findings.jsonl"))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    base = duckdb_baseline(store, as_of, 30.0)
    print(f"diagnosis: {rows:,} rows, spark-submit {wall:.1f} s, peak RSS {peak / 2**30:.2f} GiB, "
          f"{statuses:,} partition statuses, {findings:,} findings"
          + (f"; duckdb {base[0]:.2f} s ({base[1]:,} partitions)" if base else ""), flush=True)
    return {"rows": rows, "wall": wall, "peak": peak, "duckdb": base}


def print_table(args, snap: dict | None, diag: dict | None) -> None:
    shape = f"{args.groups:,} groups x {args.partitions} partitions"
    print(f"\n{shape}, {args.groups_per_topic} groups per topic; cpus={os.cpu_count()} master={args.master}")
    print("| figure | measured | target (issue 9, 10,000 x 20) |")
    print("|---|---|---|")
    if snap:
        t = snap["timings"]
        print(f"| setup (topics, produce, commits) | {snap['setup_s']:.1f} s | - |")
        print(f"| snapshot, median of {len(t)} (min / max) | {statistics.median(t):.2f} s "
              f"({min(t):.2f} / {max(t):.2f}) | <= {SNAPSHOT_TARGET_S:.0f} s |")
        w = snap["without_records"]
        print(f"| same snapshot without the record fetch (record_partitions=0) | {statistics.median(w):.2f} s "
              f"({min(w):.2f} / {max(w):.2f}) | - |")
        print(f"| records read at committed offsets / not read | {snap['records_read']:,} / "
              f"{snap['record_errors']:,} | - |")
        print(f"| snapshot rows / admin requests (the record consumer's fetches not counted) | "
              f"{snap['rows']:,} / {statistics.median(snap['requests']):.0f} | - |")
        print(f"| snapshot peak RSS (collector process) | {snap['rss_peak'] / 2**20:.0f} MiB | - |")
        print(f"| broker RSS (Apache Kafka JVM) | {snap['broker_rss'] / 2**20:.0f} MiB | - |")
    if diag:
        print(f"| diagnosis, spark-submit wall ({diag['rows']:,} rows) | {diag['wall']:.1f} s "
              f"| <= {DIAGNOSIS_TARGET_S:.0f} s |")
        print(f"| diagnosis peak RSS (JVM + Python workers) | {diag['peak'] / 2**30:.2f} GiB | - |")
        if diag["duckdb"]:
            print(f"| DuckDB per-partition features, same files | {diag['duckdb'][0]:.2f} s | - |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--groups-per-topic", type=int, default=10)
    parser.add_argument("--records", type=int, default=3, help="records produced per partition")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--setup-in-flight", type=int, default=500,
                        help="offset commit requests in flight during setup")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="collect_snapshot's max_in_flight (default: the collector's)")
    parser.add_argument("--profile", action="store_true", help="cProfile one more snapshot, to stderr")
    parser.add_argument("--skip-snapshot", action="store_true")
    parser.add_argument("--skip-diagnosis", action="store_true")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / ".bench" / "scale"))
    parser.add_argument("--measure-snapshot", metavar="BOOTSTRAP", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    if args.measure_snapshot:
        extra = {"max_in_flight": args.max_in_flight} if args.max_in_flight is not None else {}
        print(json.dumps(measure_snapshot(args.measure_snapshot, args.repeat, args.profile, extra)))
        return 0
    snap = None if args.skip_snapshot else run_snapshot(args)
    diag = None if args.skip_diagnosis else run_diagnosis(args)
    print_table(args, snap, diag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
