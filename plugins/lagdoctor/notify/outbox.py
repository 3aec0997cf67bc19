"""The durable Slack outbox: queue in the state database, deliver in order, once.

Every message is first a row of ``slack_messages`` (lagdoctor.state), queued
in the same transaction as the thread state it belongs to, under a dedupe key
so a retried task or a re-run queues nothing twice. ``deliver_pending`` then
sends the pending rows in id order through a sender (lagdoctor.notify.slack):

  - one worker at a time: delivery runs under the lease ``slack-outbox``, so two
    workers never send the same row. Rows are claimed one at a time: right
    before each send one transaction renews the lease and reads the oldest row
    still pending, so a worker that stalled past the lease (and whose rows
    another worker sent meanwhile) never sends from a stale list. No
    transaction or lock is held across the Slack call;
  - in order: the first failure stops delivery (the row keeps its attempts and a
    one-line ``last_error``), so nothing overtakes a message that did not go out;
  - rate limits: a 429 is waited out (its Retry-After) and the same row sent
    again, while the task's budget of RATE_LIMIT_BUDGET_S lasts (shared by a
    delivery batch); past it, delivery stops as for any failure, and the result
    says ``rate_limited`` so the task need not fail for it;
  - threads: a reply queued before its parent had a Slack ts names the parent
    row (``parent_id``) and takes the parent's ts and channel when it is sent;
  - a message Slack itself refuses (``invalid_blocks``, ``msg_too_long``: no retry
    can fix it) is marked ``rejected`` and logged, so it cannot block the queue
    forever; its replies then go top-level.

The one gap, at-least-once: a message Slack accepted whose response was lost
(a timeout after Slack posted it, a crash before the row is marked sent) stays
pending and is sent again by the next delivery.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

import sqlalchemy as sa

from lagdoctor.notify.redact import one_line
from lagdoctor.notify.slack import PLACE_ERRORS
from lagdoctor.state import StateDB, slack_messages, utcnow

log = logging.getLogger(__name__)

PENDING, SENT, REJECTED = "pending", "sent", "rejected"
OUTBOX_LEASE = "slack-outbox"
# Renewed before every message; a worker that died frees the outbox after this long.
# Longer than one send can take (slack-sdk's retries, a 30 s client timeout) or one
# Retry-After wait (at most RATE_LIMIT_BUDGET_S), so a live worker never loses it mid-send.
LEASE_TTL = timedelta(minutes=5)
# How long a caller waits for another worker's delivery to finish before giving up.
LEASE_WAIT_S = 45.0
# Seconds a task may spend waiting out Slack's Retry-After: the sweep runs every minute, and
# one that overruns makes the next skip. What is left waits, in order, for the next run.
RATE_LIMIT_BUDGET_S = 15.0


_sleep = time.sleep  # how a Retry-After is waited out (tests record it instead)


@dataclass
class WaitBudget:
    """What is left of a task's RATE_LIMIT_BUDGET_S (one per delivery batch)."""

    seconds: float = RATE_LIMIT_BUDGET_S


@dataclass(frozen=True)
class Delivery:
    sent: int
    undelivered: int
    error: str | None  # one line, no secret; None when everything pending went out
    rate_limited: bool = False  # stopped only because Slack's Retry-After outlasted the budget

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"undelivered": self.undelivered, "delivery_error": self.error}
        if self.rate_limited:
            out["rate_limited"] = True
        return out


def lock_key(db: StateDB, conn: sa.Connection, key: str) -> None:
    """Serialize check-then-act on `key` until the transaction ends.

    SQLite's IMMEDIATE transaction already holds the database's write lock; on
    PostgreSQL a transaction-scoped advisory lock covers keys that have no row
    yet (a row lock cannot lock a row that does not exist)."""
    if db.dialect == "postgresql":
        digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": digest})


def queue_message(
    db: StateDB,
    conn: sa.Connection,
    *,
    dedupe_key: str,
    text: str,
    blocks: Sequence[Mapping[str, Any]],
    parent_id: int | None = None,
    thread_ts: str | None = None,
    channel: str | None = None,
    now: datetime | None = None,
) -> int:
    """Queue one message within the caller's transaction; the row id (the existing
    row's when `dedupe_key` was queued before: nothing is queued twice)."""
    values = {"dedupe_key": dedupe_key[:512], "channel": channel, "parent_id": parent_id,
              "thread_ts": thread_ts or None, "text": text, "blocks": list(blocks), "status": PENDING,
              "attempts": 0, "created_at": now or utcnow()}
    db.insert_ignore(conn, slack_messages, values, ("dedupe_key",))
    return int(conn.execute(sa.select(slack_messages.c.id)
                            .where(slack_messages.c.dedupe_key == values["dedupe_key"])).scalar_one())


def message_ts(conn: sa.Connection, message_id: int | None) -> tuple[str, str] | None:
    """(channel, ts) Slack gave a sent message, or None while it waits."""
    if message_id is None:
        return None
    row = conn.execute(sa.select(slack_messages.c.sent_channel, slack_messages.c.ts)
                       .where(slack_messages.c.id == message_id, slack_messages.c.status == SENT)).first()
    return (str(row.sent_channel), str(row.ts)) if row is not None else None


def pending_count(db: StateDB) -> int:
    with db.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(slack_messages)
                                .where(slack_messages.c.status == PENDING)).scalar_one())


def pending_messages(db: StateDB) -> list[dict[str, Any]]:
    """What waits, oldest first (for the demo and for people debugging an outage)."""
    with db.engine.connect() as conn:
        rows = conn.execute(sa.select(slack_messages).where(slack_messages.c.status == PENDING)
                            .order_by(slack_messages.c.id)).mappings().all()
    return [dict(r) for r in rows]


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def deliver_pending(db: StateDB, sender: Any, *, now: datetime | None = None,
                    wait_s: float = LEASE_WAIT_S, budget: WaitBudget | None = None) -> Delivery:
    """Send every pending message in id order; stop at the first failure.

    A rate limit is waited out (its Retry-After) while `budget` lasts (default: a
    fresh RATE_LIMIT_BUDGET_S). Never raises for a delivery failure: the result
    says how many wait and why.
    """
    if not pending_count(db):
        return Delivery(0, 0, None)  # one read, not a lease taken and given back, when nothing waits
    budget = budget if budget is not None else WaitBudget()
    holder = _holder()
    deadline = time.monotonic() + wait_s
    # The lease runs on the real clock whatever `now` the caller passes: other
    # workers judge its expiry by theirs.
    while not db.acquire_lease(OUTBOX_LEASE, holder, LEASE_TTL):
        if time.monotonic() >= deadline:
            waiting = pending_count(db)
            error = (f"Slack outbox busy: another worker is delivering ({waiting} message(s) pending)"
                     if waiting else None)
            return Delivery(0, waiting, error)
        time.sleep(0.2)
    sent, error, rate_limited = 0, None, False
    try:
        while error is None:
            claimed, row = _claim_next(db, holder)
            if not claimed:
                # Our lease ran out and another worker took over: it sends the rest.
                error = "Slack outbox: another worker took over delivery"
                break
            if row is None:
                break
            error, retry_after = _send_one(db, sender, row, now=now)
            if retry_after is not None:
                if retry_after <= budget.seconds:
                    # at least 1 s each: a Slack answering "Retry-After: 0" forever cannot keep the task
                    budget.seconds = max(0.0, budget.seconds - max(retry_after, 1.0))
                    log.info("Slack rate limit: waiting %g s (Retry-After) to send message %s", retry_after,
                             row["id"])
                    _sleep(retry_after)
                    error = None
                    continue  # the same row, still first in line
                rate_limited = True
                error = (f"rate limited: Slack asked to wait {retry_after:g} s, more than the {budget.seconds:g} s "
                         f"left of this task's {RATE_LIMIT_BUDGET_S:g} s budget")
            elif error is None:
                sent += 1
    finally:
        db.release_lease(OUTBOX_LEASE, holder)
    return Delivery(sent, pending_count(db), error, rate_limited)


def _claim_next(db: StateDB, holder: str) -> tuple[bool, dict[str, Any] | None]:
    """(lease still ours, the oldest pending row or None), read in one transaction
    with the lease renewed; committed before the row is sent."""
    with db.transaction() as conn:
        if not db.acquire_lease(OUTBOX_LEASE, holder, LEASE_TTL, conn=conn):
            return False, None
        row = conn.execute(sa.select(slack_messages).where(slack_messages.c.status == PENDING)
                           .order_by(slack_messages.c.id).limit(1)).mappings().first()
    return True, dict(row) if row is not None else None


def _send_one(db: StateDB, sender: Any, row: dict[str, Any], *,
              now: datetime | None) -> tuple[str | None, float | None]:
    """Send one row and record the outcome: (the error line when it did not go out,
    Slack's Retry-After when that was a rate limit)."""
    channel, thread_ts = row["channel"], row["thread_ts"]
    if row["parent_id"] is not None and not thread_ts:
        with db.engine.connect() as conn:
            parent = conn.execute(sa.select(slack_messages.c.status, slack_messages.c.ts,
                                            slack_messages.c.sent_channel)
                                  .where(slack_messages.c.id == row["parent_id"])).first()
        if parent is not None and parent.status == SENT:
            channel, thread_ts = parent.sent_channel, parent.ts
        elif parent is not None and parent.status == PENDING:
            # Ids follow queueing order, so this only happens if the parent was queued later: wait.
            return f"message {row['id']} waits for its parent message {row['parent_id']}", None
        # A rejected or missing parent: the reply goes top-level rather than nowhere.
    try:
        posted = sender.post(text=row["text"], blocks=row["blocks"] or [], thread_ts=thread_ts, channel=channel)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the row pending, never lost
        error = one_line(exc)
        if getattr(exc, "reason", None) in PLACE_ERRORS and (thread_ts or row["channel"]):
            # The thread's channel is gone or closed to us: a reply that waits for it
            # would hold every later message back. Send it top-level instead.
            log.warning("Slack: message %s cannot go to its thread (%s); sending it top-level", row["id"], error)
            with db.transaction() as conn:
                conn.execute(sa.update(slack_messages).where(slack_messages.c.id == row["id"]).values(
                    channel=None, thread_ts=None, parent_id=None, last_error=error,
                    attempts=slack_messages.c.attempts + 1))
            return _send_one(db, sender, {**row, "channel": None, "thread_ts": None, "parent_id": None}, now=now)
        retry_after = getattr(exc, "retry_after", None)
        rejected = bool(getattr(exc, "rejected", False))
        with db.transaction() as conn:
            conn.execute(sa.update(slack_messages).where(slack_messages.c.id == row["id"]).values(
                attempts=slack_messages.c.attempts + 1, last_error=error,
                status=REJECTED if rejected else PENDING))
        if rejected:
            log.error("Slack rejected message %s (not retried): %s", row["id"], error)
            return None, None
        if retry_after is not None:
            return error, float(retry_after)  # the caller waits or stops, and says which
        log.warning("Slack delivery stopped at message %s: %s", row["id"], error)
        return error, None
    with db.transaction() as conn:
        # Still pending: a worker that took over after a stall may have sent and recorded it already.
        conn.execute(sa.update(slack_messages).where(slack_messages.c.id == row["id"],
                                                     slack_messages.c.status == PENDING).values(
            status=SENT, ts=posted.ts, sent_channel=posted.channel, attempts=slack_messages.c.attempts + 1,
            last_error=None, sent_at=now or utcnow()))
    return None, None
