"""Known Kafka workloads for tests and the demo: topics, exact record counts, commits.

Records are produced one per request (`batch.num.messages=1`) because Tansu's
high watermark falls one short per multi-record batch (shared/STACK.md);
against a real cluster the setting is merely slower.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lagdoctor.kafka.clients import admin_client, client_config


def create_topic(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 10.0) -> None:
    from confluent_kafka.admin import NewTopic

    admin = admin_client(bootstrap)
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=timeout_s)
    for _, fut in futures.items():
        fut.result()


def produce_counts(
    bootstrap: str, topic: str, counts: Mapping[int, int], *, value: bytes = b"x", exact: bool = True
) -> None:
    """Produce counts[p] records to each partition p and wait until all are acknowledged."""
    from confluent_kafka import Producer

    extra: dict[str, Any] = {"linger.ms": 0, "acks": "all"}
    if exact:
        extra["batch.num.messages"] = 1
        extra["max.in.flight.requests.per.connection"] = 1
    producer = Producer(client_config(bootstrap, extra))
    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=value, key=str(i).encode(), partition=partition, on_delivery=on_delivery)
            producer.poll(0)
    remaining = producer.flush(30)
    if remaining or errors:
        raise RuntimeError(f"producing to {topic} failed: {remaining} unsent, errors {errors[:3]}")


def commit_offsets(bootstrap: str, group_id: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Commit the given offsets for a group that has no live member (leaves it EMPTY)."""
    import time

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    # A freshly started Kafka answers these until __consumer_offsets is created and loaded.
    retriable = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                 KafkaError.COORDINATOR_NOT_AVAILABLE)
    consumer = Consumer(
        client_config(bootstrap, {"group.id": group_id, "enable.auto.commit": False})
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                consumer.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
                )
                return
            except KafkaException as exc:
                if exc.args[0].code() not in retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()


def live_consumer_config(bootstrap: str, group_id: str, client_id: str, **extra: Any) -> dict[str, Any]:
    """A consumer that joins quickly: Tansu takes ~23 s to finish the first join
    with the default 45 s session timeout, ~3 s with 6 s."""
    return client_config(
        bootstrap,
        {
            "group.id": group_id,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            **extra,
        },
    )


class SteadyProducer:
    """Produces `rate_per_partition` records/s to every listed partition in a thread."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], rate_per_partition: float) -> None:
        import threading

        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.rate = rate_per_partition
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{topic}", daemon=True)

    def start(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def _run(self) -> None:
        import time

        from confluent_kafka import Producer

        producer = Producer(client_config(self.bootstrap, {"linger.ms": 0, "batch.num.messages": 1}))
        tick = 0.1
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                for p in self.partitions:
                    for _ in range(max(1, round(self.rate * tick))):
                        producer.produce(self.topic, value=b"event", partition=p)
                producer.poll(0)
                self._stop.wait(max(0.0, tick - (time.monotonic() - started)))
        finally:
            producer.flush(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


class ThrottledConsumer:
    """A group member that keeps up on every partition but those in `max_rate`,
    which it processes at most that many records per second (a slow owner),
    and those in `stuck_at`, where it cannot get past one offset (a poison
    message its handler fails on, while the member stays alive).

    Records it does not process are not committed: the consumer seeks back to
    the first of them and pauses the partition until the budget refills (or
    for good, when stuck), so the committed offset moves exactly as described.
    """

    def __init__(self, bootstrap: str, group_id: str, topic: str, *, client_id: str,
                 max_rate: Mapping[int, float] | None = None,
                 stuck_at: Mapping[int, int] | None = None) -> None:
        import threading

        self.bootstrap, self.group_id, self.topic, self.client_id = bootstrap, group_id, topic, client_id
        self.max_rate = dict(max_rate or {})
        self.stuck_at = dict(stuck_at or {})
        self.assigned = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consume-{group_id}", daemon=True)

    def start(self) -> "ThrottledConsumer":
        self._thread.start()
        return self

    def _run(self) -> None:
        import time

        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(live_consumer_config(self.bootstrap, self.group_id, self.client_id))
        consumer.subscribe([self.topic], on_assign=lambda c, parts: self.assigned.set())
        started = time.monotonic()
        done = {p: 0 for p in self.max_rate}
        paused: set[int] = set()
        stuck: set[int] = set()

        def budget(p: int) -> float:
            return self.max_rate[p] * (time.monotonic() - started) - done[p]

        try:
            while not self._stop.is_set():
                refilled = [p for p in paused - stuck if budget(p) >= 1]
                if refilled:
                    consumer.resume([TopicPartition(self.topic, p) for p in refilled])
                    paused.difference_update(refilled)
                processed: dict[int, int] = {}
                for msg in consumer.consume(500, timeout=0.1):
                    if msg.error():
                        continue
                    p = msg.partition()
                    if p in paused:
                        continue
                    if p in self.stuck_at and msg.offset() >= self.stuck_at[p]:
                        consumer.seek(TopicPartition(self.topic, p, self.stuck_at[p]))
                        consumer.pause([TopicPartition(self.topic, p)])
                        paused.add(p)
                        stuck.add(p)
                        continue
                    if p in self.max_rate:
                        if budget(p) < 1:
                            consumer.seek(TopicPartition(self.topic, p, msg.offset()))
                            consumer.pause([TopicPartition(self.topic, p)])
                            paused.add(p)
                            continue
                        done[p] += 1
                    processed[p] = msg.offset() + 1
                if processed:
                    consumer.commit(
                        offsets=[TopicPartition(self.topic, p, o) for p, o in processed.items()],
                        asynchronous=False,
                    )
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
