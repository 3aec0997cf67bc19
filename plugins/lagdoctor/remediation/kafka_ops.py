"""Kafka actions: skip a poison pill, add partitions. Both are irreversible.

confluent-kafka is imported inside the functions. The cluster's client config
comes from its Airflow ``kafka`` connection (contract 5) through the
apache-kafka provider's hook (``kafka_config_for``), so SASL, OAuth and MSK IAM
work as they do for collection. AdminClient calls use the futures-map idiom;
every client is closed when done. A group's state and committed offsets are read
in a child process, as the collector reads them (``read_group``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from lagdoctor.remediation.actions import Action, ActionBlocked, ActionContext, Outcome

log = logging.getLogger(__name__)
TIMEOUT_S = 15
DEFAULT_KAFKA_CONN_ID = "kafka_default"  # the provider's default connection (contract 5)


def kafka_config_for(conn_id: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The librdkafka config for a cluster, built as the apache-kafka provider builds it.

    The provider's hook reads the ``kafka`` connection's extra, resolves
    callbacks named there (``oauth_cb``... within ``[apache_kafka]
    callback_allowlist``) and adds the managed-OAuth token callback (Amazon
    MSK IAM, Google Managed Kafka): the same clients collection gets. With
    no ``kafka_default`` connection, ``KAFKA_BOOTSTRAP_SERVERS`` is used.
    """
    import os

    from lagdoctor.connections import connection_exists
    from lagdoctor.kafka.clients import BOOTSTRAP_ENV

    if not connection_exists(conn_id):
        env = os.environ if environ is None else environ
        if conn_id == DEFAULT_KAFKA_CONN_ID and env.get(BOOTSTRAP_ENV):
            return {"bootstrap.servers": env[BOOTSTRAP_ENV].strip()}
        hint = f", and {BOOTSTRAP_ENV} is not set" if conn_id == DEFAULT_KAFKA_CONN_ID else ""
        raise ActionBlocked(f"no Airflow connection {conn_id!r} of type kafka{hint}")
    try:
        return _provider_config_hook()(kafka_config_id=conn_id).get_conn
    except ValueError as exc:  # no bootstrap.servers, a callback outside the allowlist
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "bootstrap.servers" in message:
            message = "no bootstrap.servers in its extra"
        raise ActionBlocked(f"connection {conn_id!r}: {message}") from None


_HOOK: Any = None


def _provider_config_hook() -> Any:
    """A KafkaBaseHook whose "client" is the config the provider would build it from."""
    global _HOOK
    if _HOOK is None:
        from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook

        class ProviderKafkaConfig(KafkaBaseHook):
            def _get_client(self, config: dict[str, Any]) -> dict[str, Any]:
                return dict(config)

        _HOOK = ProviderKafkaConfig
    return _HOOK


def _client_config(config: Mapping[str, Any]) -> dict[str, Any]:
    # Route librdkafka's own log lines through Python logging, not raw stderr.
    return {**config, "logger": log}


@contextlib.contextmanager
def admin_client(config: Mapping[str, Any]) -> Iterator[Any]:
    from confluent_kafka.admin import AdminClient

    with AdminClient(_client_config(config)) as admin:
        yield admin


def _wait(futures: Mapping[Any, Any]) -> dict[Any, Any]:
    """Futures-map idiom: every future's result, the first error raised."""
    return {key: fut.result(timeout=TIMEOUT_S) for key, fut in futures.items()}


@dataclass(frozen=True)
class GroupRead:
    state: str  # contract 1's name: EMPTY, STABLE, ...
    members: int | None  # None: the broker named no members for an active group
    committed: dict[int, int | None]  # partition -> committed offset, None: no commit

    def require_empty(self) -> None:
        # kafka-consumer-groups.sh --reset-offsets refuses active groups: a live
        # member would overwrite the new offset with its own next commit.
        if self.state != "EMPTY":
            count = "an unknown number of" if self.members is None else self.members
            raise ActionBlocked(f"group is {self.state} with {count} member(s), not EMPTY: stop its consumers first")


def read_group(config: Mapping[str, Any], group_id: str, topic: str, partitions: list[int]) -> GroupRead:
    """The group's state, members and committed offsets on ``partitions``.

    Read in a child process by the collector's reader (lagdoctor.kafka.group_reads):
    librdkafka's OffsetFetch SIGSEGVs the reading process when a broker restart
    moves the coordinator (issue 5040), which here would kill the task mid-action.
    Any failed read, the child's crash included, raises ActionBlocked before
    anything is changed: unknown is never "no commit".
    """
    from lagdoctor.kafka.group_reads import IsolatedReader, read_groups
    from lagdoctor.kafka.request_window import RequestWindow

    with contextlib.ExitStack() as stack:
        reader: Any = IsolatedReader.of(config)
        if reader is None:  # a config a child cannot get (an OAuth closure): read here, as the collector does
            reader = stack.enter_context(admin_client(config))
        described, commits = read_groups(reader, [group_id], TIMEOUT_S, RequestWindow(4, TIMEOUT_S))
    description, read = described[group_id], commits[group_id]
    failed = read.error or description.error
    if failed:
        raise ActionBlocked(f"cannot read group {group_id}, nothing was changed: {failed}")
    committed: dict[int, int | None] = {}
    for p in partitions:
        error = read.partition_errors.get((topic, p))
        if error:
            raise ActionBlocked(
                f"partition {p}: cannot read the committed offset ({error.removeprefix('committed offsets: ')})")
        # The group's whole OffsetFetch names committed partitions only: absent is no commit.
        committed[p] = read.commits.get((topic, p))
    return GroupRead(description.state, description.members, committed)


def _stuck_partitions(ctx: ActionContext) -> list[int]:
    parts = [p for p in ctx.finding.get("partitions") or [] if isinstance(p, int)]
    if not parts:
        raise ActionBlocked("the finding names no stuck partition")
    return sorted(set(parts))


_RECORD_FIELDS = ("offset", "timestamp", "key_sha256", "size", "headers")


def _record_text(record: Any, offsets: Mapping[str, Any]) -> str:
    """"p0@120: key #3fa9..., 2,048 bytes, headers a,b, produced T", when the record the
    collector saw is still the one at the offset to skip; "" otherwise."""
    if not isinstance(record, Mapping) or record.get("offset") is None:
        return ""
    p = record.get("partition")
    at = offsets.get(str(p))
    if at is not None and at != record["offset"]:
        return ""  # the group moved since the snapshot: that record is not the one skipped
    parts = [f"key #{record['key_sha256']}" if record.get("key_sha256") else "no key"]
    if isinstance(record.get("size"), int):
        parts.append(f"{record['size']:,} bytes")
    if record.get("headers"):
        parts.append("headers " + ",".join(str(h) for h in record["headers"]))
    if record.get("timestamp"):
        parts.append(f"produced {record['timestamp']}")
    return f"p{p}@{record['offset']}: " + ", ".join(parts)


class SkipPoisonPill(Action):
    name = "skip_poison_pill"
    summary = "copy the record at the stuck offset to a dead-letter topic and commit past it"
    irreversible = True
    warning = ("The group will never process the skipped record; it is kept in the dead-letter "
               "topic. Runs only while the group is EMPTY (stop the consumers first).")
    params = {"dead_letter_topic": str}

    def blocked_by_finding(self, ctx: ActionContext) -> str | None:
        state = ctx.evidence.get("group_state")
        if state and state != "EMPTY":
            members = ctx.evidence.get("group_members")
            count = "an unknown number of" if members is None else members
            return (f"group was {state} with {count} member(s) at the window's end, not EMPTY: "
                    "stop its consumers first, then run the incident again")
        return None

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        # EMPTY is this action's proof that nobody consumes. A consumer that assign()s its
        # partitions never joins the group, so its group is always EMPTY: no proof at all,
        # and it would overwrite the new offset with its own next commit.
        if ctx.evidence.get("membership") == "outside":
            raise ActionBlocked(
                "the group is consumed outside the group protocol (it commits without members: assign()), so "
                "EMPTY does not show its consumer stopped; stop that consumer and move its offset by hand")
        # Case 21: no record is stuck; a producer's open transaction holds the group. Skipping
        # commits past a record the group would still not be allowed to read.
        blocked = ctx.evidence.get("transaction_blocked_partitions")
        if blocked:
            raise ActionBlocked(
                f"an open transaction holds partition(s) {', '.join(str(p) for p in blocked)}: the group waits for it, "
                "no record is stuck; end the transaction (kafka-transactions.sh find-hanging, then abort)")
        template = str(ctx.params.get("dead_letter_topic") or ctx.config.dead_letter_topic)
        rows = {r.get("partition"): r for r in ctx.evidence.get("partitions") or [] if isinstance(r, Mapping)}
        parts = _stuck_partitions(ctx)
        plan = {
            "topic": ctx.topic,
            "dead_letter_topic": template.format(topic=ctx.topic, group=ctx.group_id),
            "partitions": parts,
            "observed_offsets": {str(p): rows.get(p, {}).get("committed_offset") for p in parts},
        }
        # What the collector saw at the stuck offset (never the payload): the approver
        # sees what would be moved.
        record, focus = ctx.evidence.get("committed_record"), ctx.evidence.get("partition")
        if isinstance(record, Mapping) and record.get("offset") is not None and focus in parts:
            plan["stuck_record"] = {"partition": focus, **{k: record.get(k) for k in _RECORD_FIELDS}}
        return plan

    def describe(self, plan: Mapping[str, Any]) -> str:
        """e.g. "copy the record at payments p0@120 to payments.dlq and commit offset 121 (group must be EMPTY)"."""
        offsets = plan.get("from_offsets") or plan.get("observed_offsets") or {}
        known = [offsets.get(str(p)) for p in plan["partitions"]]
        at = ", ".join(f"p{p}@{'?' if o is None else o}" for p, o in zip(plan["partitions"], known))
        where = f"{plan['topic']} {at}" if plan.get("topic") else at  # plans written before the topic was kept
        many = len(known) > 1
        commit = (f"commit offset{'s' if many else ''} {', '.join(str(o + 1) for o in known)}"
                  if None not in known else "commit offset +1")
        text = (f"copy the record{'s' if many else ''} at {where} to {plan['dead_letter_topic']} and {commit} "
                "(group must be EMPTY)")
        seen = _record_text(plan.get("stuck_record"), offsets)
        return f"{text}; the record: {seen}" if seen else text

    def resolve(self, ctx: ActionContext, plan: dict[str, Any]) -> dict[str, Any]:
        group = read_group(ctx.kafka_config(), ctx.group_id, ctx.topic, plan["partitions"])
        group.require_empty()
        missing = [p for p, o in group.committed.items() if o is None]
        if missing:
            raise ActionBlocked(f"no committed offset on partition(s) {missing}: nothing to skip")
        return {**plan, "from_offsets": {str(p): o for p, o in group.committed.items()}}

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        config = ctx.kafka_config()
        topic, dlt = ctx.topic, plan["dead_letter_topic"]
        from_offsets = {int(p): int(o) for p, o in plan["from_offsets"].items()}
        # What was approved is the record at the offset the finding showed: if the group is
        # elsewhere now, the record at its position is not the one a person agreed to skip.
        for p, seen in (plan.get("observed_offsets") or {}).items():
            if seen is None or int(p) not in from_offsets:
                continue
            if from_offsets[int(p)] == int(seen) + 1:
                from_offsets[int(p)] = int(seen)  # skipped by an earlier attempt: said below
            elif from_offsets[int(p)] != int(seen):
                raise ActionBlocked(f"partition {p} is at offset {from_offsets[int(p)]}, not {seen} as approved: "
                                    "the record approved for skipping is no longer the group's next")
        # Copy and commit are one Kafka transaction, so a retry never copies twice. Starting it
        # before the group is read settles every earlier attempt first: a commit one sent
        # completes, a dead worker's open transaction (its copy) aborts.
        with _transactional_producer(config, _transactional_id(ctx.group_id, topic, from_offsets)) as producer:
            group = read_group(config, ctx.group_id, topic, sorted(from_offsets))
            group.require_empty()
            now = group.committed
            todo = {}
            for p, start in from_offsets.items():
                if now[p] == start + 1:
                    continue  # done by an earlier attempt
                if now[p] != start:
                    raise ActionBlocked(f"partition {p} moved from offset {start} to {now[p]} since the plan")
                todo[p] = start
            if not todo:
                return Outcome("noop", "already skipped by an earlier attempt", {"skipped": {}})
            producer.begin_transaction()
            try:
                copied = _copy_records(config, producer, topic, todo, dlt, ctx.group_id, ctx.idempotency_key)
                _commit_past(config, producer, ctx.group_id, topic, todo)
            except Exception:
                # Nothing shows: read_committed readers never see an aborted copy.
                with contextlib.suppress(Exception):
                    producer.abort_transaction(TIMEOUT_S)
                raise
        where = ", ".join(f"p{p}: {o} -> {o + 1}" for p, o in sorted(todo.items()))
        return Outcome("executed", f"copied {len(copied)} record(s) to {dlt}; committed {where}",
                       {"skipped": {str(p): o for p, o in todo.items()}, "dead_letter_topic": dlt})


def _transactional_id(group_id: str, topic: str, offsets: Mapping[int, int]) -> str:
    """One per skip (this group past these records), whichever run or retry attempts it: each
    attempt fences the ones before it, a zombie worker included."""
    raw = json.dumps([group_id, topic, sorted(offsets.items())], separators=(",", ":"))
    return "lagdoctor-skip-poison-pill-" + hashlib.sha256(raw.encode()).hexdigest()[:24]


@contextlib.contextmanager
def _transactional_producer(config: Mapping[str, Any], transactional_id: str) -> Iterator[Any]:
    """A producer whose init_transactions ends any earlier producer's transaction with this id."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer(_client_config({**config, "transactional.id": transactional_id,
                                        "enable.idempotence": True, "acks": "all"}))
    try:
        try:
            producer.init_transactions(TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0]
            if error.retriable():  # e.g. the transaction coordinator loading: a task retry may pass
                raise RuntimeError(f"cannot start the dead-letter transaction: {error.str()}") from None
            raise ActionBlocked(f"cannot start the dead-letter transaction {transactional_id}, nothing was "
                                f"changed: {error.str()}") from None
        yield producer
    finally:
        producer.close()


def _commit_past(config: Mapping[str, Any], producer: Any, group_id: str, topic: str,
                 offsets: Mapping[int, int]) -> None:
    """Commit the group's offset to one past each skipped record in the producer's open
    transaction (which holds the copies), then commit the transaction."""
    from confluent_kafka import Consumer, TopicPartition

    # Never subscribes: it only names the group. An offset commit from outside the group
    # (no member id, generation -1) is accepted only while the group is EMPTY.
    group = Consumer(_client_config({**config, "group.id": group_id, "enable.auto.commit": False,
                                     "isolation.level": "read_committed"}))
    try:
        positions = [TopicPartition(topic, p, o + 1) for p, o in sorted(offsets.items())]
        producer.send_offsets_to_transaction(positions, group.consumer_group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)
        # The group's offsets change when the commit's markers land, a moment later. A
        # read_committed read waits for them (KIP-447): once done, everyone reads the new offset.
        group.committed([TopicPartition(topic, p) for p in sorted(offsets)], TIMEOUT_S)
    finally:
        group.close()


def _copy_records(config: Mapping[str, Any], producer: Any, topic: str, offsets: Mapping[int, int],
                  dlt: str, group_id: str, idempotency_key: str) -> list[tuple[int, int]]:
    """Read each record at (partition, offset) and produce it, with its origin, to ``dlt`` in the
    producer's open transaction."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    reader = Consumer(_client_config({
        **config,
        # Its own group id, never the stuck group's: reading must not join it.
        "group.id": f"lagdoctor-dlq-reader-{group_id}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    }))
    copied: list[tuple[int, int]] = []
    try:
        for partition, offset in sorted(offsets.items()):
            reader.assign([TopicPartition(topic, partition, offset)])
            msg = reader.poll(TIMEOUT_S)
            if msg is None or msg.error() is not None or msg.offset() != offset:
                why = "timeout" if msg is None else (msg.error().str() if msg.error() else f"got offset {msg.offset()}")
                raise ActionBlocked(f"cannot read the record at partition {partition} offset {offset} ({why})")
            headers = list(msg.headers() or []) + [
                ("lagdoctor.original.topic", topic.encode()),
                ("lagdoctor.original.partition", str(partition).encode()),
                ("lagdoctor.original.offset", str(offset).encode()),
                ("lagdoctor.group", group_id.encode()),
                ("lagdoctor.idempotency_key", idempotency_key.encode()),
            ]
            errors: list[Any] = []
            producer.produce(dlt, value=msg.value(), key=msg.key(), headers=headers,
                             on_delivery=lambda err, _m: errors.append(err) if err else None)
            if producer.flush(TIMEOUT_S) > 0:
                raise RuntimeError(f"dead-letter produce to {dlt} timed out")
            if errors:
                raise KafkaException(errors[0])
            copied.append((partition, offset))
    finally:
        reader.close()
    return copied


def topic_metadata(admin: Any, topic: str) -> Any:
    """The topic's metadata, None when it does not exist. Metadata for all topics: a request
    naming the topic lets a cluster with auto.create.topics.enable re-create a deleted topic
    (seen live: add_partitions then grew the new, empty one)."""
    return admin.list_topics(timeout=TIMEOUT_S).topics.get(topic)


class AddPartitions(Action):
    name = "add_partitions"
    summary = "add partitions to the topic (CreatePartitions)"
    irreversible = True
    warning = ("Irreversible: partitions can never be removed. Keyed records start landing on new "
               "partitions (per-key order breaks across the change) and every group on the topic rebalances.")
    params = {"add": int, "total": int}

    def target(self, ctx: ActionContext) -> str | None:
        """The topic, not the group: a surge on a shared topic makes every group on it critical, and
        per-group cooldowns and leases grew a 12-partition topic to 18, 24 and 30 on "approve all"."""
        return f"topic {ctx.topic} on {ctx.cluster}"

    def blocked_by_finding(self, ctx: ActionContext) -> str | None:
        """The runbook's order: more partitions help only a group that already has a consumer on each
        partition; below that, scaling consumers is the cheaper, reversible step."""
        members, partitions = ctx.evidence.get("group_members"), ctx.evidence.get("partition_count")
        if not isinstance(members, int) or not isinstance(partitions, int) or members >= partitions:
            return None
        if members == 0:
            return (f"the group has no live consumer on its {partitions} partitions: more partitions cannot help "
                    "until it consumes again (restart it first)")
        return (f"the group has {members} consumer(s) for {partitions} partitions: scale consumers first (up to "
                f"{partitions}); more partitions help only once every partition has its own consumer")

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        total, add = ctx.params.get("total"), ctx.params.get("add")
        if total is None and add is None:
            add = ctx.evidence.get("partition_count")  # default: double the partitions
        if total is None and not add:
            raise ActionBlocked("set params.add or params.total: current partition count unknown")
        return {"topic": ctx.topic, "total": total, "add": add}

    def describe(self, plan: Mapping[str, Any]) -> str:
        if plan.get("current") is not None:
            return f"grow {plan['topic']} from {plan['current']} to {plan['target']} partitions (irreversible)"
        what = f"to {plan['total']}" if plan.get("total") else f"by {plan['add']}"
        return f"grow {plan['topic']} {what} partitions (irreversible; the group rebalances)"

    def resolve(self, ctx: ActionContext, plan: dict[str, Any]) -> dict[str, Any]:
        with admin_client(ctx.kafka_config()) as admin:
            meta = topic_metadata(admin, ctx.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ActionBlocked(f"topic {ctx.topic!r} not found")
        current = len(meta.partitions)
        target = int(plan["total"]) if plan.get("total") else current + int(plan["add"])
        return {**plan, "current": current, "target": target}

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        from confluent_kafka.admin import NewPartitions

        with admin_client(ctx.kafka_config()) as admin:
            meta = topic_metadata(admin, ctx.topic)
            have = len(meta.partitions) if meta is not None and meta.partitions else 0
            if have >= plan["target"]:
                return Outcome("noop", f"{ctx.topic} already has {have} partitions", {"partitions": have})
            _wait(admin.create_partitions([NewPartitions(ctx.topic, int(plan["target"]))],
                                          request_timeout=TIMEOUT_S))
        return Outcome("executed", f"grew {ctx.topic} from {have} to {plan['target']} partitions",
                       {"partitions": plan["target"]})
