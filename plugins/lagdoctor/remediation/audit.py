"""The remediation audit log: the ``action_log`` table of lagdoctor's state database.

Every decision is appended (dry run, blocked, awaiting approval, started,
executed, failed...), so the log answers "what did lagdoctor do to this group
and why", on every worker alike. Each row keeps the record's JSON as it was
returned to the DAG, plus indexed columns for the questions asked of it.

Guardrails read it back through ``attempts_since``: a real change counts
against cooldowns and the hourly cap from the moment its ``started`` record is
written, and keeps counting unless its outcome proves nothing changed. Dry
runs never count.

Retention (``prune_action_log``) deletes an idempotency key's records once its
newest record is older than both the retention and the longest guardrail
window (``guardrail_window``): nothing older can count against a cooldown or
the cap, and a key's history goes whole, so a retry never sees half of it.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, Iterable, Iterator

import sqlalchemy as sa

from lagdoctor.state import StateDB, action_log, as_utc, state_db

log = logging.getLogger(__name__)

# Statuses a record can have. ``started`` is written just before a real change
# so that a retried task reuses the same plan (same restartedAt, same offset).
STATUSES = (
    "dry_run",
    "blocked",
    "awaiting_approval",
    "rejected",
    "started",
    "executed",
    "noop",
    "failed",
    "recommended",
)
# A record with one of these ends its idempotency key: a retry returns it.
FINAL_STATUSES = frozenset({"dry_run", "blocked", "rejected", "executed", "noop", "recommended"})
# Outcomes of a started attempt that prove it changed nothing: it does not count.
NOTHING_CHANGED = frozenset({"noop", "blocked"})
_OUTCOMES = frozenset({"executed", "noop", "blocked", "failed"})


def _jsonable(record: dict[str, Any]) -> dict[str, Any]:
    # As the JSONL log did: anything not JSON (a datetime in a plan) becomes its text.
    return json.loads(json.dumps(record, sort_keys=True, default=str))


def _ts(record: dict[str, Any]) -> datetime:
    return as_utc(datetime.fromisoformat(str(record["ts"])))


class ActionLog:
    """Append-only rows in ``action_log``; every method may join a caller's transaction (``conn``)."""

    def __init__(self, db: StateDB) -> None:
        self.db = db

    @classmethod
    def from_settings(cls, settings: Any = None) -> "ActionLog":
        return cls(state_db(settings))

    def _read(self, stmt: Any, conn: sa.Connection | None) -> list[dict[str, Any]]:
        stmt = stmt.order_by(action_log.c.id)
        if conn is not None:
            return [dict(r) for r in conn.execute(stmt).scalars()]
        with self.db.engine.connect() as c:
            return [dict(r) for r in c.execute(stmt).scalars()]

    def append(self, record: dict[str, Any], *, conn: sa.Connection | None = None) -> None:
        if conn is None:
            with self.db.transaction() as c:
                return self.append(record, conn=c)
        data = _jsonable(record)
        conn.execute(sa.insert(action_log).values(
            ts=_ts(data),
            idempotency_key=str(data["idempotency_key"]),
            run_id=str(data.get("run_id", ""))[:255],
            action=str(data.get("action", "")),
            cluster=str(data.get("cluster", ""))[:255],
            group_id=str(data.get("group_id", ""))[:512],
            topic=str(data.get("topic", ""))[:512],
            target=(str(data["target"])[:512] if data.get("target") else None),
            status=str(data["status"]),
            dry_run=bool(data.get("dry_run")),
            record=data,
        ))

    def prune(self, before: datetime, *, conn: sa.Connection | None = None) -> int:
        """Delete the records of every idempotency key whose newest record is older
        than ``before``; returns how many rows went."""
        if conn is None:
            with self.db.transaction() as c:
                return self.prune(before, conn=c)
        recent = sa.select(action_log.c.idempotency_key).where(action_log.c.ts >= before)
        result = conn.execute(sa.delete(action_log).where(action_log.c.ts < before,
                                                          action_log.c.idempotency_key.not_in(recent)))
        return int(result.rowcount or 0)

    def records(self, *, conn: sa.Connection | None = None) -> Iterator[dict[str, Any]]:
        """Every record, oldest first."""
        yield from self._read(sa.select(action_log.c.record), conn)

    def for_key(self, idempotency_key: str, *, conn: sa.Connection | None = None) -> list[dict[str, Any]]:
        return self._read(sa.select(action_log.c.record).where(action_log.c.idempotency_key == idempotency_key),
                          conn)

    def executed_since(self, since: datetime, *, conn: sa.Connection | None = None) -> list[dict[str, Any]]:
        """``executed`` records at or after ``since``."""
        return self._read(sa.select(action_log.c.record).where(
            action_log.c.status == "executed", action_log.c.ts >= since), conn)

    def attempts_since(self, since: datetime, *, conn: sa.Connection | None = None) -> list[dict[str, Any]]:
        """Real changes that count against cooldowns and the hourly cap: one per
        idempotency key with a record at or after ``since``.

        Counted: an ``executed`` record; a ``started`` one with no outcome yet
        (in flight, or its worker died: it may have acted); a ``started`` one
        whose outcome is ``failed`` unless the failure proves nothing changed
        (a timed-out patch may have landed). Not counted: ``noop``/``blocked``
        outcomes and dry runs. Each returned record is the latest ``started``
        or ``executed`` one of its key, with ``outcome`` (the status that
        decided, ``started`` while unresolved).
        """
        rows = self._read(sa.select(action_log.c.record).where(
            action_log.c.dry_run.is_(False),
            action_log.c.status.in_(("started", *_OUTCOMES)),
            action_log.c.ts >= since,
        ), conn)
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_key[r["idempotency_key"]].append(r)
        counted = []
        for records in by_key.values():
            executed = [r for r in records if r["status"] == "executed"]
            if executed:
                counted.append({**executed[-1], "outcome": "executed"})
                continue
            started = [i for i, r in enumerate(records) if r["status"] == "started"]
            if not started:
                continue
            last = started[-1]
            outcome = next((r for r in records[last + 1:] if r["status"] in _OUTCOMES), None)
            if outcome is None:
                counted.append({**records[last], "outcome": "started"})
            elif outcome["status"] == "failed" and outcome.get("may_have_changed", True):
                counted.append({**records[last], "outcome": "failed"})
        return counted


def guardrail_window(config: Any = None, runbooks: Iterable[Any] | None = None) -> timedelta:
    """How far back any guardrail looks: the hourly cap's hour, the configured
    cooldown, or a runbook's longer one (runbooks may only lengthen it).

    ``config`` defaults to RemediationConfig.from_env(), ``runbooks`` to the
    loaded runbooks; a record older than this can no longer block an action.
    """
    from lagdoctor.remediation.config import RemediationConfig

    config = config if config is not None else RemediationConfig.from_env()
    if runbooks is None:
        from lagdoctor.runbooks import load_runbooks

        runbooks = load_runbooks()
    minutes = [60.0, float(config.cooldown_minutes)]
    minutes += [float(a.guardrails["cooldown_minutes"]) for rb in runbooks for a in rb.actions
                if a.guardrails.get("cooldown_minutes") is not None]
    return timedelta(minutes=max(minutes))


def prune_action_log(keep_days: float, now: datetime, *, settings: Any = None, db: StateDB | None = None,
                     window: timedelta | None = None) -> int:
    """Retention for the action log: delete the records of keys whose newest record is
    older than ``keep_days`` and than the longest guardrail ``window`` (default:
    ``guardrail_window()``). An unresolved ``started`` or a failure that may have
    changed something counts for guardrails only inside that window, so it stays
    at least that long. Returns how many rows went."""
    window = window if window is not None else guardrail_window()
    cutoff = as_utc(now) - max(timedelta(days=keep_days), window)
    deleted = ActionLog(db or state_db(settings)).prune(cutoff)
    if deleted:
        log.info("retention: %d action log record(s) before %s removed", deleted, cutoff.isoformat())
    return deleted
