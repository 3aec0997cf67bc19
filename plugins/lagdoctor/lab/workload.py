"""Known Kafka workloads for tests and the demo: topics, exact record counts, commits,
steady producers and consumers that are slow, stuck, evicted or killed on purpose.

`ConsumerProcess` runs a consumer in its own OS process, so a crash is a real
process killed with SIGKILL (no LeaveGroup: the group notices only when the
session times out).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lagdoctor.kafka.clients import admin_client, client_config
from lagdoctor.lab.rates import RateSegment


def create_topic(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 10.0,
                 replication_factor: int = 1, config: Mapping[str, str] | None = None) -> None:
    """Create `topic`; `replication_factor` 3 on a three-node cluster lets its leaders move when a node dies.
    `config` holds topic settings, e.g. {"retention.ms": "-1"} for records stamped at a fixed past time."""
    from confluent_kafka.admin import NewTopic

    admin = admin_client(bootstrap)
    new = NewTopic(topic, partitions, replication_factor, config=dict(config or {}))
    futures = admin.create_topics([new], request_timeout=timeout_s)
    for _, fut in futures.items():
        fut.result()


def produce_counts(
    bootstrap: str, topic: str, counts: Mapping[int, int], *, value: bytes = b"x", exact: bool = True
) -> None:
    """Produce counts[p] records to each partition p and wait until all are acknowledged.

    `exact`: idempotent, so a retried batch is never written twice and the log
    end offsets grow by exactly the counts.
    """
    from confluent_kafka import Producer

    extra: dict[str, Any] = {"linger.ms": 5, "acks": "all", "enable.idempotence": exact}
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
    """A consumer that commits what it processed itself and whose death the group
    notices within 6 s (the default session timeout is 45 s). A KIP-848 consumer
    (group.protocol=consumer) takes its timeouts from the broker and refuses them."""
    timeouts: dict[str, Any] = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    if extra.get("group.protocol") == "consumer":
        timeouts = {}
    return client_config(
        bootstrap,
        {
            "group.id": group_id,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **timeouts,
            **extra,
        },
    )


class SteadyProducer:
    """Produces `rate_per_partition` records/s to every listed partition in a thread
    (`rate` may change while it runs); records are batched as any producer's.

    A starved thread catches up by a second at most, so on a slow machine the
    rate achieved falls short of the design: `segments()` says what each rate
    set actually reached, for `rate_shortfall` to compare."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], rate_per_partition: float, *,
                 stamp: bool = False) -> None:
        import threading
        import time

        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        # `stamp`: each record's value is its send time (b"t=<epoch ms>") and its timestamp
        # the same ms, so a reader can check time lag against the producer's own clock.
        self.stamp = stamp
        self._lock = threading.Lock()
        self._rate = rate_per_partition
        self._segments: list[RateSegment] = []
        self._segment_start = time.monotonic()
        self._segment_sent = 0  # records per partition since the rate was last set
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{topic}", daemon=True)

    @property
    def rate(self) -> float:
        return self._rate

    @rate.setter
    def rate(self, value: float) -> None:
        import time

        with self._lock:
            self._close_segment(time.monotonic())
            self._rate = value

    def _close_segment(self, now: float) -> None:
        self._segments.append(RateSegment(self._rate, now - self._segment_start, self._segment_sent))
        self._segment_start, self._segment_sent = now, 0

    def segments(self) -> list["RateSegment"]:
        """Each rate this producer was given, with how long it ran and what it sent; the current one last."""
        import time

        with self._lock:
            return [*self._segments,
                    RateSegment(self._rate, time.monotonic() - self._segment_start, self._segment_sent)]

    def start(self) -> "SteadyProducer":
        import time

        with self._lock:
            self._segment_start = time.monotonic()
        self._thread.start()
        return self

    def _send(self, producer: Any, due: int) -> None:
        import time

        for p in self.partitions:
            for _ in range(due):
                if self.stamp:
                    ms = int(time.time() * 1000)
                    producer.produce(self.topic, value=b"t=%d" % ms, partition=p, timestamp=ms)
                else:
                    producer.produce(self.topic, value=b"event", partition=p)

    def _run(self) -> None:
        import time

        from confluent_kafka import Producer

        producer = Producer(client_config(self.bootstrap, {"linger.ms": 5}))
        tick = 0.1
        owed = 0.0  # records per partition due but not yet produced (fractional rates add up)
        last = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                rate = self._rate
                # A thread starved on a busy machine catches up, but by a second at most.
                owed = min(owed + rate * (now - last), max(1.0, rate))
                last = now
                due = int(owed)
                owed -= due
                self._send(producer, due)
                with self._lock:
                    self._segment_sent += due
                producer.poll(0)
                self._stop.wait(tick)
        finally:
            producer.flush(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


BATCH_DRAIN_S = 3.0  # a batch consumer drains for this long at most before it sleeps again


class ThrottledConsumer:
    """A group member that keeps up on every partition but those in `max_rate`,
    which it processes at most that many records per second (a slow owner),
    and those in `stuck_at`, where it cannot get past one offset (a poison
    message its handler fails on, while the member stays alive).

    Records it does not process are not committed: the consumer seeks back to
    the first of them and pauses the partition until the budget refills (or
    for good, when stuck), so the committed offset moves exactly as described.

    `batch_processing_s`: every batch takes this long to handle; longer than
    max.poll.interval.ms (set it through `config`) gets the member evicted
    from the group, and it rejoins on its next poll: a rebalance loop. A
    commit the group refuses (evicted, or mid-rebalance) is dropped, as a
    real consumer's would be: the records are read again by the next owner.

    `on_revoke(partitions)` runs on the consumer's thread before it gives up
    partitions, as a handler that commits or flushes state there does: the
    member rejoins only once it returns.

    `onset_at` (epoch seconds): `max_rate`, `stuck_at` and `batch_processing_s`
    apply only from then on, so an incident starts at a known time after a
    healthy history; a `stuck_at` offset of -1 is the first record read after it.
    `assign`: the consumer takes every partition of the topic with assign() and
    commits under the group id, outside the group protocol (the group has no
    members), as Flink, Spark and custom consumers do.
    `batch_every_s`: a batch consumer: once caught up, it commits and pauses
    every partition for this long, so its lag is a sawtooth of equal teeth.
    """

    def __init__(self, bootstrap: str, group_id: str, topic: str, *, client_id: str,
                 max_rate: Mapping[int, float] | None = None,
                 stuck_at: Mapping[int, int] | None = None,
                 batch_processing_s: float = 0.0,
                 config: Mapping[str, Any] | None = None,
                 on_revoke: Callable[[list[int]], None] | None = None,
                 onset_at: float | None = None,
                 assign: bool = False,
                 batch_every_s: float = 0.0) -> None:
        import threading

        self.bootstrap, self.group_id, self.topic, self.client_id = bootstrap, group_id, topic, client_id
        self.max_rate = dict(max_rate or {})
        self.stuck_at = dict(stuck_at or {})
        self.batch_processing_s = batch_processing_s
        self.config = dict(config or {})
        self.on_revoke = on_revoke
        self.onset_at = onset_at
        self.assign = assign
        self.batch_every_s = batch_every_s
        self.assigned = threading.Event()
        self.failed_commits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"consume-{group_id}", daemon=True)

    def start(self) -> "ThrottledConsumer":
        self._thread.start()
        return self

    def _run(self) -> None:
        import time

        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(live_consumer_config(self.bootstrap, self.group_id, self.client_id, **self.config))
        if self.assign:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            owned = [TopicPartition(self.topic, p) for p in sorted(meta.partitions)]
            committed = {tp.partition: tp.offset for tp in consumer.committed(owned, timeout=10)}
            consumer.assign([TopicPartition(self.topic, tp.partition,
                                            committed[tp.partition] if committed[tp.partition] >= 0 else -2)
                             for tp in owned])  # -2: OFFSET_BEGINNING when nothing was committed
            self.assigned.set()
        else:
            callbacks: dict[str, Any] = {"on_assign": lambda c, parts: self.assigned.set()}
            if self.on_revoke is not None:
                callbacks["on_revoke"] = lambda c, parts: self.on_revoke([tp.partition for tp in parts])
            consumer.subscribe([self.topic], **callbacks)
        started, applied = self.onset_at is None, False
        max_rate, stuck_at, batch_processing_s = {}, {}, 0.0
        # A token bucket per throttled partition, at most a second deep: capacity
        # left unused while traffic was light is not banked for a later surge.
        tokens: dict[int, float] = {}
        last = time.monotonic()
        paused: set[int] = set()
        stuck: set[int] = set()
        batch_until = 0.0  # a batch consumer's pause ends then (monotonic)
        drain_started = time.monotonic()
        since_commit = False

        def budget(p: int) -> float:
            return tokens[p]

        def resumable(p: int) -> bool:
            # Half a second's budget: each resume costs a fetch round trip, which
            # a resume per record would pay so often the rate fell well below max_rate.
            return budget(p) >= max(1.0, max_rate[p] / 2)

        try:
            while not self._stop.is_set():
                if not started and time.time() >= self.onset_at:
                    started = True
                if started and not applied:
                    applied = True
                    max_rate, stuck_at = dict(self.max_rate), dict(self.stuck_at)
                    batch_processing_s = self.batch_processing_s
                    tokens = {p: 0.0 for p in max_rate}
                now = time.monotonic()
                for p, rate in max_rate.items():
                    tokens[p] = min(tokens[p] + rate * (now - last), max(1.0, rate))
                last = now
                refilled = [p for p in paused - stuck if p not in max_rate or resumable(p)]
                if refilled and now >= batch_until:
                    if batch_until:
                        drain_started, batch_until = now, 0.0
                    consumer.resume([TopicPartition(self.topic, p) for p in refilled])
                    paused.difference_update(refilled)
                processed: dict[int, int] = {}
                batch = consumer.consume(500, timeout=0.1)
                if batch_processing_s and any(not m.error() for m in batch):
                    self._stop.wait(batch_processing_s)
                # caught up (or as good as: records keep arriving): after this batch, sleep
                batch_done = bool(self.batch_every_s and since_commit
                                  and (not batch or now - drain_started > BATCH_DRAIN_S))
                for msg in batch:
                    if msg.error():
                        continue
                    p = msg.partition()
                    if p in paused:
                        continue
                    if stuck_at.get(p) == -1:
                        stuck_at[p] = msg.offset()
                    if p in stuck_at and msg.offset() >= stuck_at[p]:
                        consumer.seek(TopicPartition(self.topic, p, stuck_at[p]))
                        consumer.pause([TopicPartition(self.topic, p)])
                        paused.add(p)
                        stuck.add(p)
                        continue
                    if p in max_rate:
                        if budget(p) < 1:
                            consumer.seek(TopicPartition(self.topic, p, msg.offset()))
                            consumer.pause([TopicPartition(self.topic, p)])
                            paused.add(p)
                            continue
                        tokens[p] -= 1
                    processed[p] = msg.offset() + 1
                if processed:
                    since_commit = True
                    try:
                        consumer.commit(
                            offsets=[TopicPartition(self.topic, p, o) for p, o in processed.items()],
                            asynchronous=False,
                        )
                    except KafkaException:
                        # The coordinator is moving (a broker died or restarts) or the member
                        # was evicted: as a real consumer does, carry on; the next commit covers these.
                        self.failed_commits += 1
                if batch_done:
                    owned = consumer.assignment()
                    consumer.pause(owned)
                    paused.update(tp.partition for tp in owned)
                    batch_until, since_commit = time.monotonic() + self.batch_every_s, False
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def run_consumer(bootstrap: str, group_id: str, topic: str, assigned: Any = None, **options: Any) -> None:
    """A ThrottledConsumer as a process's whole job, until SIGTERM (a clean close that
    leaves the group) or its parent's death; `assigned` (an Event) is set once it has
    partitions. `options` are ThrottledConsumer's keyword arguments."""
    import os
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches every process; the parent stops us
    parent = os.getppid()
    consumer = ThrottledConsumer(bootstrap, group_id, topic, **options).start()
    try:
        while not stop.wait(0.5):
            if assigned is not None and consumer.assigned.is_set():
                assigned.set()
            if os.getppid() != parent or not consumer._thread.is_alive():
                break  # orphaned, or the consumer failed
    finally:
        consumer.stop()


class ConsumerProcess:
    """A ThrottledConsumer in its own OS process (same arguments), one group member.

    kill() is a crash: SIGKILL, no LeaveGroup, so the group keeps the member
    until its session times out. stop() closes it cleanly.
    """

    def __init__(self, bootstrap: str, group_id: str, topic: str, *, client_id: str, **options: Any) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # fork would copy the parent's librdkafka threads
        self.group_id, self.client_id = group_id, client_id
        self.assigned = ctx.Event()
        self._proc = ctx.Process(target=run_consumer, args=(bootstrap, group_id, topic, self.assigned),
                                 kwargs={"client_id": client_id, **options}, name=f"consume-{client_id}",
                                 daemon=True)

    def start(self) -> "ConsumerProcess":
        self._proc.start()
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.is_alive()

    def kill(self) -> None:
        import os
        import signal

        if self._proc.is_alive():
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.join(10)

    def stop(self, timeout_s: float = 15.0) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout_s)
        if self._proc.is_alive():
            self.kill()
