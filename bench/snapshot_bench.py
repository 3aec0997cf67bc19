"""Snapshot collection cost: N groups x P partitions on the embedded broker.

Each group commits offsets below --records records on its own topic of P
partitions, so one snapshot has N*P rows, every group lags, and the snapshot
reads the record at the committed offset of each group's 3 most lagging
partitions (issue 10). Prints seconds per snapshot with and without that
fetch, and the admin requests sent, counted by librdkafka itself (statistics
`tx` per broker).

    python bench/snapshot_bench.py [--groups 500] [--partitions 20] [--records 3] [--repeat 3] [--max-in-flight N]

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


def setup(bootstrap: str, groups: int, partitions: int, records: int = 0) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    from lagdoctor.kafka.clients import admin_client, client_config

    admin = admin_client(bootstrap)
    topics = [f"bench-topic-{g:04d}" for g in range(groups)]
    for start in range(0, groups, 100):
        futures = admin.create_topics([NewTopic(t, partitions, 1) for t in topics[start:start + 100]])
        for _, fut in futures.items():
            fut.result()
    if records:
        # lag on every partition, so the snapshot reads the record at each group's 3 most lagging
        producer = Producer(client_config(bootstrap, {"linger.ms": 50}))
        for topic in topics:
            for p in range(partitions):
                for _ in range(records):
                    producer.produce(topic, b"x", partition=p)
            producer.poll(0)
        if producer.flush(120):
            raise RuntimeError("producing the bench records did not finish in 120 s")
    # New partitions settle after create_topics returns: a commit fails with UNKNOWN_TOPIC_OR_PART
    # (seen for 400 of 500 new topics) and ListOffsets with NOT_LEADER_FOR_PARTITION until
    # the broker has made itself their leader. Wait until every partition answers ListOffsets.
    # The collector's own batched ListOffsets (one request for all 10,000 partitions
    # never answered here: librdkafka left its future pending for minutes).
    from lagdoctor.kafka.log_offsets import log_offsets

    deadline = time.monotonic() + 900
    wanted = [(t, p) for t in topics for p in range(partitions)]
    while True:
        errors = log_offsets(admin, wanted, 60.0)[-1]
        if not errors:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(errors)} bench partitions still had no leader after 900 s")
        wanted = sorted(errors)
        time.sleep(1)
    # Commits through the AdminClient, 200 groups in flight: a consumer per group took 25 s for 500.
    # A commit's errors are per partition, in its result, not raised: check them.
    pending = []
    for g, topic in enumerate(topics):
        request = ConsumerGroupTopicPartitions(f"bench-group-{g:04d}", [TopicPartition(topic, p, p % (records + 1))
                                                                      for p in range(partitions)])
        pending.extend(admin.alter_consumer_group_offsets([request], request_timeout=60).values())
        if len(pending) >= 200 or g == groups - 1:
            for fut in pending:
                failed = [tp for tp in fut.result().topic_partitions if tp.error is not None]
                if failed:
                    raise RuntimeError(f"bench commit failed: {failed[0].topic}[{failed[0].partition}] {failed[0].error}")
            pending = []


    # Kafka's group listing and a new topic's leaders settle a moment after the writes:
    # wait, so every snapshot measured sees the whole setup.
    want = {f"bench-group-{g:04d}" for g in range(groups)}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        listed = {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid}
        meta = admin.list_topics(timeout=30).topics
        if want <= listed and all(p.leader >= 0 for t in topics for p in meta[t].partitions.values()):
            return
        time.sleep(1)
    raise RuntimeError("the bench groups were not all listed within 120 s")


class RequestCounter:
    """Requests librdkafka has sent to brokers, from the statistics callback of every client
    built with it (the collector reads groups through a client of its own)."""

    def __init__(self) -> None:
        self.by_client: dict[str, int] = {}

    @property
    def tx(self) -> int:
        return sum(self.by_client.values())

    def __call__(self, stats_json: str) -> None:
        stats = json.loads(stats_json)
        self.by_client[stats.get("name", "")] = sum(
            b.get("tx", 0) for name, b in stats.get("brokers", {}).items() if not name.startswith("GroupCoordinator"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", type=int, default=3,
                        help="records per partition; groups commit below them, so every group lags")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="collect_snapshot's max_in_flight (default: the collector's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from lagdoctor.kafka.broker import EmbeddedBroker
    from lagdoctor.kafka.collector import collect_snapshot
    from lagdoctor.kafka.clients import admin_client

    with EmbeddedBroker() as broker:
        t = time.monotonic()
        setup(broker.bootstrap, args.groups, args.partitions, args.records)
        print(f"setup: {args.groups} groups x {args.partitions} partitions in {time.monotonic() - t:.1f}s", flush=True)
        counter = RequestCounter()
        admin = admin_client(broker.bootstrap, {"stats_cb": counter, "statistics.interval.ms": 100})
        admin.poll(0.3)
        timings, requests, rows, without, records_read = [], [], 0, [], 0
        extra = {"max_in_flight": args.max_in_flight} if args.max_in_flight else {}
        for _ in range(args.repeat):
            # the same snapshot without the record fetch, interleaved: what the fetch adds
            t = time.monotonic()
            collect_snapshot(admin, "bench", "bench-group-.*", datetime.now(timezone.utc), timeout_s=60,
                             record_partitions=0, **extra)
            without.append(time.monotonic() - t)
            admin.poll(0.3)
            before = counter.tx
            t = time.monotonic()
            table = collect_snapshot(admin, "bench", "bench-group-.*", datetime.now(timezone.utc), timeout_s=60,
                                     **extra)
            timings.append(time.monotonic() - t)
            admin.poll(0.3)  # let the statistics callback report the requests just sent
            requests.append(counter.tx - before)
            rows = table.num_rows
            records_read = table.num_rows - table.column("committed_record_offset").null_count
    expected = args.groups * args.partitions
    print(f"rows per snapshot: {rows} (expected {expected})")
    print(f"seconds per snapshot: median {statistics.median(timings):.2f}, "
          f"min {min(timings):.2f}, max {max(timings):.2f} over {args.repeat} runs")
    print(f"without the record fetch: median {statistics.median(without):.2f}, min {min(without):.2f}, "
          f"max {max(without):.2f}; records read at committed offsets: {records_read}")
    print(f"admin requests per snapshot: {statistics.median(requests):.0f} "
          f"({args.groups} groups, {expected} partitions; the group reads, which run in a child process, "
          "and the record consumer's fetches not counted)")
    if rows != expected:  # say why, not just that
        errors = {e for e in table.column("read_error").to_pylist() if e}
        print(f"read errors in the last snapshot ({len(errors)} distinct): {sorted(errors)[:3]}")
    return 0 if rows == expected else 1


if __name__ == "__main__":
    sys.exit(main())
