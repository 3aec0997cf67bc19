"""What the embedded Apache Kafka costs: start to ready, stop, memory, beside a baseline.

    .venv/bin/python bench/broker_bench.py [--repeat 3] [--brokers 1 3]

Baseline, in the same run: a trivial Kafka JVM (`kafka-storage.sh random-uuid`: the
same classpath and JVM, Kafka's classes loaded, nothing served), so the figures carry
over between machines as ratios.
"Ready" is what `lagdoctor broker` waits for before it prints its ready line:
every node answers Metadata and a group offset fetch succeeds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))


def trivial_jvm(libs: Path) -> float:
    from lagdoctor.kafka.broker import java_binary

    started = time.perf_counter()
    subprocess.run([java_binary(), "-cp", f"{libs}/*", "kafka.tools.StorageTool", "random-uuid"],
                   capture_output=True, check=True)
    return time.perf_counter() - started


def one_start(brokers: int) -> dict[str, float]:
    import psutil

    from lagdoctor.kafka.broker import EmbeddedBroker

    broker = EmbeddedBroker(brokers=brokers)
    started = time.perf_counter()
    broker.start()
    ready = time.perf_counter() - started
    rss = sum(psutil.Process(n.proc.pid).memory_info().rss for n in broker.nodes)
    started = time.perf_counter()
    broker.stop()
    return {"ready": ready, "stop": time.perf_counter() - started, "rss": rss}


def main() -> None:
    from lagdoctor.kafka.broker import KAFKA_VERSION, cache_root, kafka_libs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--brokers", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()

    cached = (cache_root() / f"kafka-{KAFKA_VERSION}" / "libs" / ".complete").exists()
    started = time.perf_counter()
    libs = kafka_libs()
    fetch = time.perf_counter() - started
    jars = list(libs.glob("*.jar"))
    size = sum(p.stat().st_size for p in jars)
    print(f"Apache Kafka {KAFKA_VERSION}: {len(jars)} jars, {size / 2**20:.1f} MiB in {libs}")
    print(f"fetch: {'cached (fetched before)' if cached else f'{fetch:.1f} s'}")
    base = statistics.median(trivial_jvm(libs) for _ in range(args.repeat))
    print(f"baseline: a trivial Kafka JVM (kafka-storage random-uuid) {base:.2f} s (median of {args.repeat})")
    print("| nodes | ready (median) | x trivial Kafka JVM | stop | RSS, all nodes |")
    print("|---|---|---|---|---|")
    for brokers in args.brokers:
        runs = [one_start(brokers) for _ in range(args.repeat)]
        ready = statistics.median(r["ready"] for r in runs)
        stop = statistics.median(r["stop"] for r in runs)
        rss = statistics.median(r["rss"] for r in runs)
        print(f"| {brokers} | {ready:.1f} s | {ready / base:.1f}x | {stop:.1f} s | {rss / 2**20:.0f} MiB |",
              flush=True)


if __name__ == "__main__":
    main()
