"""Snapshot collection cost: N groups x P partitions on the embedded broker.

Each group commits offsets on its own topic of P partitions, so one snapshot
has N*P rows. Prints seconds per snapshot and the broker requests sent,
counted by librdkafka itself (statistics `tx` per broker).

    python bench/snapshot_bench.py [--groups 500] [--partitions 20] [--repeat 3] [--max-in-flight N]

Target (issue #2): <= 5 s for 500 x 20 on the 2-core reference machine.
bench/scale_bench.py measures 10,000 groups x 20 partitions (issue 9).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from datetime import datetime, timezone


def setup(bootstrap: str, groups: int, partitions: int) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import NewTopic

    from lagdoctor.kafka_clients import admin_client

    admin = admin_client(bootstrap)
    topics = [f"bench-topic-{g:04d}" for g in range(groups)]
    for start in range(0, groups, 100):
        futures = admin.create_topics([NewTopic(t, partitions, 1) for t in topics[start:start + 100]])
        for _, fut in futures.items():
            fut.result()
    # Commits through the AdminClient, 200 groups in flight: a consumer per group took 25 s for 500.
    pending = []
    for g, topic in enumerate(topics):
        request = ConsumerGroupTopicPartitions(f"bench-group-{g:04d}", [TopicPartition(topic, p, 0)
                                                                      for p in range(partitions)])
        pending.extend(admin.alter_consumer_group_offsets([request], request_timeout=60).values())
        if len(pending) >= 200 or g == groups - 1:
            for fut in pending:
                fut.result()
            pending = []


class RequestCounter:
    """Total requests librdkafka has sent to brokers, from its statistics callback."""

    def __init__(self) -> None:
        self.tx = 0

    def __call__(self, stats_json: str) -> None:
        stats = json.loads(stats_json)
        self.tx = sum(b.get("tx", 0) for name, b in stats.get("brokers", {}).items() if not name.startswith("GroupCoordinator"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="collect_snapshot's max_in_flight (default: the collector's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from lagdoctor.broker import EmbeddedBroker
    from lagdoctor.collector import collect_snapshot
    from lagdoctor.kafka_clients import admin_client

    with EmbeddedBroker() as broker:
        t = time.monotonic()
        setup(broker.bootstrap, args.groups, args.partitions)
        print(f"setup: {args.groups} groups x {args.partitions} partitions in {time.monotonic() - t:.1f}s", flush=True)
        counter = RequestCounter()
        admin = admin_client(broker.bootstrap, {"stats_cb": counter, "statistics.interval.ms": 100})
        admin.poll(0.3)
        timings, requests, rows = [], [], 0
        extra = {"max_in_flight": args.max_in_flight} if args.max_in_flight else {}
        for _ in range(args.repeat):
            before = counter.tx
            t = time.monotonic()
            table = collect_snapshot(admin, "bench", "bench-group-.*", datetime.now(timezone.utc), timeout_s=60,
                                     **extra)
            timings.append(time.monotonic() - t)
            admin.poll(0.3)  # let the statistics callback report the requests just sent
            requests.append(counter.tx - before)
            rows = table.num_rows
    expected = args.groups * args.partitions
    print(f"rows per snapshot: {rows} (expected {expected})")
    print(f"seconds per snapshot: median {statistics.median(timings):.2f}, "
          f"min {min(timings):.2f}, max {max(timings):.2f} over {args.repeat} runs")
    print(f"broker requests per snapshot: {statistics.median(requests):.0f} "
          f"({args.groups} groups, {expected} partitions)")
    return 0 if rows == expected else 1


if __name__ == "__main__":
    sys.exit(main())
