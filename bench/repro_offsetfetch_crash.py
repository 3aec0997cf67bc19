"""Reproduces the librdkafka crash that kills a process during a broker rolling restart.

librdkafka (2.16.0, and master as of 2026-07) handles an AdminClient's
ListConsumerGroupOffsets answer whose group-level error asks for a coordinator
refresh (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, ...) by calling
rd_kafka_cgrp_op(rk->rk_cgrp, ..., RD_KAFKA_OP_COORD_QUERY): an AdminClient has
no consumer group handle, rk_cgrp is NULL, and the rdk:main thread dies with
SIGSEGV (librdkafka issue 5040). Native stack of the crash seen in
tests/test_cluster_faults.py:

    rd_kafka_cgrp_op                       (rkcg NULL, err 16 NOT_COORDINATOR)
    rd_kafka_handle_OffsetFetch
    rd_kafka_ListConsumerGroupOffsetsResponse_parse
    rd_kafka_admin_worker
    rd_kafka_admin_handle_response
    rd_kafka_buf_callback / rd_kafka_op_handle_std / rd_kafka_q_serve
    rd_kafka_thread_main                   ("rdk:main")

Here, deterministically: a three-node cluster, one group; a child process's
AdminClient reads the group's offsets (its coordinator is now cached), the
coordinator node is restarted (the group moves to another node), and the same
AdminClient reads the offsets again: the cached ex-coordinator answers
NOT_COORDINATOR and the child dies with SIGSEGV (exit code -11).

    PYTHONPATH=plugins python bench/repro_offsetfetch_crash.py
"""

from __future__ import annotations

import multiprocessing as mp
import time


def probe(bootstrap: str, group: str, q, rolled) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions

    from lagdoctor.kafka.clients import admin_client

    admin = admin_client(bootstrap)
    coordinator = admin.describe_consumer_groups([group])[group].result(10).coordinator.id
    admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(10)
    q.put(coordinator)
    rolled.wait(180)
    for _ in range(5):
        try:
            result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(15)
            print(f"after the roll: {len(result.topic_partitions)} partitions read", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"after the roll: {exc}", flush=True)
        time.sleep(0.5)


def main() -> None:
    from lagdoctor.kafka.broker import EmbeddedBroker
    from lagdoctor.kafka.clients import admin_client
    from lagdoctor.lab.workload import commit_offsets, create_topic

    with EmbeddedBroker(brokers=3) as broker:
        create_topic(broker.bootstrap, "t", 3, replication_factor=3)
        for attempt in range(30):
            try:
                commit_offsets(broker.bootstrap, "g", "t", {0: 0, 1: 0, 2: 0})
                break
            except Exception:  # noqa: BLE001 - a fresh cluster's offsets topic
                time.sleep(1)
        ctx = mp.get_context("spawn")
        q, rolled = ctx.Queue(), ctx.Event()
        child = ctx.Process(target=probe, args=(broker.bootstrap, "g", q, rolled))
        child.start()
        coordinator = q.get(timeout=60)
        started = time.monotonic()
        broker.restart_node(coordinator)
        admin = admin_client(broker.bootstrap)
        while True:
            md = admin.list_topics(timeout=5)
            if len(md.brokers) == 3 and all(len(p.isrs) == 3 for p in md.topics["__consumer_offsets"].partitions.values()):
                break
            time.sleep(0.5)
        now = admin.describe_consumer_groups(["g"])["g"].result(10).coordinator.id
        print(f"coordinator {coordinator} restarted in {time.monotonic() - started:.1f} s; now {now}", flush=True)
        rolled.set()
        child.join(120)
        print(f"child exit code {child.exitcode} ({'SIGSEGV: the crash' if child.exitcode == -11 else 'no crash'})")


if __name__ == "__main__":
    main()
