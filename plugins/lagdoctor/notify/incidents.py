"""The coordinator: one finding -> post, reply, recovery or nothing, in its thread.

DAG tasks and callbacks call the public functions here. Each one decides and
writes the thread state and queues its Slack message in one transaction of
the state database (lagdoctor.state), with the incident's (cluster, group,
topic) locked, so two runs on two workers cannot open two threads for one
incident. Then it delivers everything pending in the outbox, oldest first
(outbox.py). Each returns a small JSON-able summary (safe for XCom) with
``undelivered`` (messages still waiting) and ``delivery_error`` (one line or
None), and never raises for a Slack delivery failure: the message waits and
goes out with the next call; the caller decides whether the task fails.

When the state database cannot be reached, the call is kept in the local spool
(spool.py) with decision ``"spooled"`` and replayed, once, by the next call
that reaches it; every call replays what waits there before its own work.
"""

from __future__ import annotations

import contextvars
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping

import sqlalchemy as sa

from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES
from lagdoctor.notify import outbox, render, spool
from lagdoctor.notify.interactive import lift_acknowledgement, quiet_reason
from lagdoctor.notify.redact import one_line
from lagdoctor.notify.slack import Sender, slack_sender
from lagdoctor.notify.templates import escape_mrkdwn
from lagdoctor.notify.threads import (
    HEALTHY,
    IncidentKey,
    ThreadState,
    ThreadStore,
    data_complete,
    decide,
    decide_healthy,
    held_until_decided,
    provisional_thread_for,
    remember,
    reply_target,
    superseded_threads,
    thread_to_join,
)

log = logging.getLogger(__name__)

RECENT_FAILURES = 50  # (run, task) pairs a DAG's failure thread remembers, to count each failure once


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc)


def _settings(settings: Any):
    from lagdoctor.settings import Settings

    return settings or Settings.from_env()


def _state_db(settings: Any):
    from lagdoctor.state import state_db

    return state_db(settings)


# Set inside delivery_batch() once Slack failed (the failed delivery's result): the batch's
# later messages are queued without another round of retries (each costs seconds while Slack
# is down, or more of a rate limit).
_batch_failure: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "slack_batch_failure", default=None)
# The batch's one budget for waiting out Slack's rate limits (outbox.RATE_LIMIT_BUDGET_S).
_batch_budget: contextvars.ContextVar[outbox.WaitBudget | None] = contextvars.ContextVar(
    "slack_batch_budget", default=None)


# Likewise once the state database was found unreachable: the batch's later
# calls go to the spool without waiting for another connect timeout each.
_batch_state_down: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("state_batch_down",
                                                                                     default=None)


@dataclass
class DeliveryBatch:
    """What one delivery_batch() resolves once and owes at its end.

    ``delivery``: the summary of the one outbox delivery made as the batch ended (None before,
    and when the state database was found down: its calls' spool summaries say it then)."""

    settings_arg: Any = None
    settings: Any = None
    db: Any = None
    replayed: int | None = None  # spooled calls replayed at the batch's first call (None: not yet)
    delivery_due: bool = False
    sender: Sender | None = None
    now: datetime | None = None
    finishes: list[tuple[dict[str, Any], Any]] = field(default_factory=list)
    delivery: dict[str, Any] | None = None


_batch: contextvars.ContextVar[DeliveryBatch | None] = contextvars.ContextVar("notify_batch", default=None)


@contextmanager
def delivery_batch(*, sender: Sender | None = None, now: datetime | None = None) -> Iterator[DeliveryBatch]:
    """A task posting many messages: the state database and the Slack client are resolved once, each
    call queues in its own transaction, and the outbox is delivered once, as the batch ends (the
    result in ``DeliveryBatch.delivery``). After a delivery failure nothing is retried until the
    batch ends (the next run delivers it). Rate limits are waited out within one budget for the
    whole batch."""
    batch = DeliveryBatch(sender=sender, now=now)
    current = _batch.set(batch)
    token = _batch_failure.set([])
    down = _batch_state_down.set([])
    budget = _batch_budget.set(outbox.WaitBudget())
    failed = True
    try:
        yield batch
        failed = False
    finally:
        try:
            _finish_batch(batch)
        except Exception as exc:
            if not failed:
                raise
            # the body's own error is what the task reports; what was queued waits in the outbox
            log.error("Slack: delivery after a failed batch: %s", one_line(exc))
        finally:
            _batch_budget.reset(budget)
            _batch_state_down.reset(down)
            _batch_failure.reset(token)
            _batch.reset(current)


def _finish_batch(batch: DeliveryBatch) -> None:
    from lagdoctor.state import is_unavailable

    if not batch.delivery_due or _batch_state_down.get():
        return  # nothing was queued, or it all waits in the spool (its calls said so)
    batch.delivery = _deliver(batch.db, batch.settings, batch.sender, batch.now)
    for result, finish in batch.finishes:
        result.update({k: v for k, v in batch.delivery.items() if k in ("undelivered", "delivery_error")})
        try:
            result.update(finish(batch.db))
        except Exception as exc:
            if not is_unavailable(exc):
                raise


def note_state_unavailable(line: str) -> None:
    """Inside delivery_batch(): a caller found the state database unreachable, so the batch's calls go
    to the spool at once instead of each waiting out another connect timeout."""
    down = _batch_state_down.get()
    if down is not None and not down:
        down.append(line)


def _deliver(db, settings: Any, sender: Sender | None, now: datetime | None) -> dict[str, Any]:
    """Send what is pending; a broken Slack setup is reported like an outage, never raised.

    The database lost after the messages were queued: they wait in the outbox,
    how many is unknown (``undelivered`` None, never 0)."""
    from lagdoctor.state import is_unavailable, unavailable_line

    try:
        return _deliver_now(db, settings, sender, now)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        line = f"{unavailable_line(exc)}; queued messages wait in the outbox"
        log.warning("Slack: %s", line)
        return {"undelivered": None, "delivery_error": line}


def _deliver_now(db, settings: Any, sender: Sender | None, now: datetime | None) -> dict[str, Any]:
    failed = _batch_failure.get()
    if failed:
        return {**failed[0], "undelivered": outbox.pending_count(db)}
    if not outbox.pending_count(db):
        return {"undelivered": 0, "delivery_error": None}  # no Slack client to resolve (an Airflow lookup)
    try:
        sender = sender or slack_sender(settings=settings)
    except Exception as exc:  # noqa: BLE001 - e.g. a malformed slack_api_default connection
        result = {"undelivered": outbox.pending_count(db), "delivery_error": one_line(exc)}
    else:
        result = outbox.deliver_pending(db, sender, now=now, budget=_batch_budget.get()).summary()
    if result["delivery_error"]:
        if failed is not None:
            failed.append(result)
        # A batch's rate limit is said once, by its task, with the final count (stages.notify).
        if not (failed is not None and result.get("rate_limited")):
            log.warning("Slack: %d message(s) wait in the outbox: %s", result["undelivered"],
                        result["delivery_error"])
    return result


SWEEP_DAG_ID, INCIDENT_DAG_ID = "kafka_lag_health_sweep", "kafka_lag_incident"  # contract 5


def _dag_id(dag_id: str | None, default: str) -> str:
    """The DAG whose run a message links to: given, else the running task's, else ``default``."""
    if dag_id:
        return dag_id
    try:
        from airflow.sdk import get_current_context

        return str(get_current_context()["dag"].dag_id)
    except Exception:  # outside a task (tests, the CLI)
        return default


def _buttons(buttons: bool | None) -> bool:
    from lagdoctor.notify.interactive import buttons_enabled

    return buttons_enabled() if buttons is None else buttons


def _thread_anchor(state: ThreadState) -> str:
    return str(state.root_message_id if state.root_message_id is not None else state.thread_ts)


# -- incidents -----------------------------------------------------------------------


def post_or_update_incident(
    finding: Mapping[str, Any],
    plan: Mapping[str, Any] | None = None,
    *,
    run_id: str,
    sender: Sender | None = None,
    settings: Any = None,
    now: datetime | None = None,
    dag_id: str | None = None,
    buttons: bool | None = None,
    sweep: list[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Post a new incident thread, reply when it changed, or close it on recovery.

    ``plan`` is ``lagdoctor.runbooks.Plan.as_dict()`` for this finding (next
    steps and proposed actions); ``None`` posts without them.
    Returns ``{"decision": "posted"|"replied"|"quiet"|"recovered"|"incomplete"|"unchanged"|"healthy"|"spooled",
    "threads": [...], "undelivered": int | None, "delivery_error": str | None}``;
    "spooled": the state database was unreachable, the call waits in the spool
    (spool.py); ``undelivered`` None: some wait in the outbox, how many is unknown.
    "incomplete" is a healthy finding on incomplete data (rule 6): nothing closed;
    "quiet" is a change left unsaid because the thread was acknowledged or snoozed; "held" a young
    rise, a burst or a surge's start, said once decided (threads rule 12).
    ``dag_id`` (default: the running task's DAG) is linked; ``buttons`` (default:
    when enabled, lagdoctor.notify.interactive) adds Acknowledge / Snooze.
    ``sweep``: every finding of this sweep for the same (cluster, group, topic), so a provisional
    thread another of them lands in is not closed as superseded (threads rule 8); None: this one alone.
    """
    args = {"finding": dict(finding), "plan": dict(plan) if plan is not None else None, "run_id": run_id,
            "now": _now(now).isoformat(), "dag_id": _dag_id(dag_id, SWEEP_DAG_ID), "buttons": _buttons(buttons),
            "sweep": [{k: f.get(k) for k in ("cluster", "group_id", "topic", "diagnosis")} for f in sweep]
            if sweep is not None else None}
    return _call("incident", args, settings=settings, sender=sender, now=now, spooled={"threads": []})


def _incident_in(db, conn, *, finding: Mapping[str, Any], plan: Mapping[str, Any] | None, run_id: str, now: str,
                 dag_id: str, buttons: bool,
                 sweep: list[Mapping[str, Any]] | None = None) -> tuple[dict[str, Any], Any]:
    store = ThreadStore(db)
    key = IncidentKey.of(finding)
    at = datetime.fromisoformat(now)
    outbox.lock_key(db, conn, key.lock_name())
    if finding.get("diagnosis") == COLLECTING_HISTORY:
        # threads rule 11: no verdict yet: opens no thread, is no recovery; "collecting"
        return {"decision": "collecting", "threads": []}, None
    if held_until_decided(finding):
        # threads rule 12: a burst or a surge's start: nothing said, no thread opened, moved or closed
        return {"decision": "held", "threads": []}, None
    if finding.get("diagnosis") == HEALTHY:
        result, keys = _on_healthy(db, conn, store, finding, run_id=run_id, now=at)
    else:
        result, keys = _on_problem(db, conn, store, finding, plan, run_id=run_id, now=at,
                                   dag_id=dag_id, buttons=buttons, sweep=sweep)

    def threads(db) -> dict[str, Any]:
        # After delivery, so they carry the Slack ts of a thread just posted.
        return {"threads": [_thread_ref(s) for s in (store.get(k) for k in keys) if s is not None]}

    return result, threads


def _incident_is_stale(db, conn, *, finding: Mapping[str, Any], run_id: str, now: str,
                       **_call_args: Any) -> str | None:
    """A replayed finding that came after its (cluster, group, topic) was last judged: None; one
    that came before (another worker already applied a newer run's): why it is stale. Compared
    by the calls' own ``now``, which every thread write stores as its ``updated_at``; so a stale
    "Recovered" never closes a thread critical again, nor a stale problem reopen a recovered one."""
    from lagdoctor.state import as_utc, incident_threads as t

    key = IncidentKey.of(finding)
    outbox.lock_key(db, conn, key.lock_name())  # the lock the call itself takes: no newer write slips in
    newest = conn.execute(sa.select(t.c.diagnosis, t.c.status, t.c.updated_at, t.c.data)
                          .where(t.c.cluster == key.cluster, t.c.group_id == key.group_id, t.c.topic == key.topic)
                          .order_by(t.c.updated_at.desc()).limit(1)).first()
    made = datetime.fromisoformat(now)
    if newest is None or as_utc(newest.updated_at) <= made:
        return None
    by = newest.data.get("last_run_id") if isinstance(newest.data, dict) else None
    return (f"run {run_id}'s {key.diagnosis} finding for {key.cluster} / {key.group_id} / {key.topic}, made at "
            f"{made.isoformat()}, is older than its {newest.status} {newest.diagnosis} thread, updated at "
            f"{as_utc(newest.updated_at).isoformat()} by run {by or '?'}")


def _on_healthy(db, conn, store: ThreadStore, finding: Mapping[str, Any], *, run_id: str,
                now: datetime) -> tuple[dict[str, Any], list[IncidentKey]]:
    complete = data_complete(finding)
    stamp = now.isoformat()
    key = IncidentKey.of(finding)
    open_threads = store.open_threads(key.cluster, key.group_id, key.topic, conn=conn)
    if not open_threads:
        return {"decision": "healthy" if complete else "incomplete", "replied": 0}, []
    replied = 0
    recovered_anchors: set[str] = set()  # threads told already (rule 10: causes may share one)
    for state in sorted(open_threads, key=lambda s: s.opened_at or ""):
        decision = decide_healthy(finding, state)
        if decision.kind == "recover":
            if _thread_anchor(state) not in recovered_anchors:  # rule 10: causes sharing a thread, one reply
                recovered_anchors.add(_thread_anchor(state))
                opened = datetime.fromisoformat(state.opened_at) if state.opened_at else None
                duration = (now - opened).total_seconds() if opened else None
                msg = render.render_recovery(finding, diagnosis=state.key.diagnosis, duration_seconds=duration)
                outbox.queue_message(db, conn,
                                     dedupe_key=f"incident:{state.key.digest()}:{_thread_anchor(state)}:recovered",
                                     text=msg["text"], blocks=msg["blocks"], now=now, **reply_target(state))
            state.status, state.closed_at, state.replies = "closed", stamp, state.replies + 1
            remember(state, finding, run_id=run_id, now=stamp)
        elif decision.kind == "incomplete":
            if quiet_reason(conn, state, finding, now) or _thread_anchor(state) in recovered_anchors:
                continue
            recovered_anchors.add(_thread_anchor(state))  # said once per thread, too
            msg = render.render_data_incomplete(finding, state.key.diagnosis)
            outbox.queue_message(
                db, conn, dedupe_key=f"incident:{state.key.digest()}:{_thread_anchor(state)}:incomplete:{run_id}",
                text=msg["text"], blocks=msg["blocks"], now=now, **reply_target(state))
            # Not remember(): what the thread last said about the problem still stands.
            state.data_incomplete, state.replies, state.updated_at = True, state.replies + 1, stamp
            replied += 1
        else:
            continue
        store.save(state, conn=conn)
    return {"decision": "recovered" if complete else "incomplete", "replied": replied}, [s.key for s in open_threads]


def _on_problem(db, conn, store: ThreadStore, finding: Mapping[str, Any], plan: Mapping[str, Any] | None, *,
                run_id: str, now: datetime, dag_id: str | None = None, buttons: bool = False,
                sweep: list[Mapping[str, Any]] | None = None) -> tuple[dict[str, Any], list[IncidentKey]]:
    key = IncidentKey.of(finding)
    open_before = store.open_threads(key.cluster, key.group_id, key.topic, conn=conn)
    result, keys = _on_own_thread(db, conn, store, finding, plan, open_before, run_id=run_id, now=now,
                                  dag_id=dag_id, buttons=buttons, sweep=sweep)
    # after the finding's own message, so a closing reply never points at a thread not posted yet
    result["superseded"] = _close_superseded(db, conn, store, finding, superseded_threads(finding, open_before, sweep),
                                             own_thread=result["decision"] != "posted", run_id=run_id, now=now)
    return result, keys


def _join_thread(db, conn, store: ThreadStore, finding: Mapping[str, Any], plan: Mapping[str, Any] | None,
                 thread: ThreadState, still_open: bool, *, run_id: str, now: datetime, dag_id: str | None,
                 controls: str | None) -> tuple[dict[str, Any], list[IncidentKey]]:
    """Rule 10: the finding's cause replies in the (cluster, group, topic)'s open thread: re-keyed to it
    when the thread's cause is gone, sharing the thread beside it when not."""
    stamp, key, was = now.isoformat(), IncidentKey.of(finding), thread.key.diagnosis
    msg = render.render_cause_change(finding, was, plan, still_open=still_open, run_id=run_id, dag_id=dag_id,
                                     controls=controls)
    outbox.queue_message(db, conn, dedupe_key=f"incident:{key.digest()}:{_thread_anchor(thread)}:joined:{run_id}",
                         text=msg["text"], blocks=msg["blocks"], now=now, **reply_target(thread))
    if still_open:
        state = ThreadState(key=key, channel=thread.channel, thread_ts=thread.thread_ts, opened_at=stamp,
                            root_message_id=thread.root_message_id)
    else:
        # what was said of an action stays said: another cause's actions are news when their words differ
        # (the noise lab heard "scale_consumers blocked: no Deployment mapped" again after the cause changed)
        state = store.rekey(thread, key.diagnosis, conn=conn)
    state.replies += 1
    store.save(remember(state, finding, run_id=run_id, now=stamp, opened=still_open), conn=conn)
    return {"decision": "replied", "changes": [f"cause {was} → {key.diagnosis}"], "decided": False,
            "undecided": False, "joined": was}, [key]


def _on_own_thread(db, conn, store: ThreadStore, finding: Mapping[str, Any], plan: Mapping[str, Any] | None,
                   open_before: list[ThreadState], *, run_id: str, now: datetime, dag_id: str | None,
                   buttons: bool, sweep: list[Mapping[str, Any]] | None = None
                   ) -> tuple[dict[str, Any], list[IncidentKey]]:
    stamp = now.isoformat()
    key = IncidentKey.of(finding)
    state = store.get(key, conn=conn)
    if state is None or state.status != "open":
        # rule 7: a provisional thread whose candidates include this cause carries on
        adopted = provisional_thread_for(finding, open_before)
        if adopted is not None:
            state = store.rekey(adopted, key.diagnosis, conn=conn)
        else:
            joined = thread_to_join(finding, open_before, sweep)
            if joined is not None:  # rule 10: one incident, one top-level message
                return _join_thread(db, conn, store, finding, plan, *joined, run_id=run_id, now=now,
                                    dag_id=dag_id, controls=key.digest() if buttons else None)
    decision = decide(finding, state, run_id=run_id, now=now)
    if decision.kind == "nothing":
        if state is not None and state.status == "open" and state.provisional and state.decided_by is None \
                and finding.get("provisional") is True and finding.get("decided_by"):
            # a thread stored before rule 9: from now on its promise is known (nothing is said)
            state.decided_by = str(finding["decided_by"])
            store.save(state, conn=conn)
        return {"decision": "unchanged"}, [key] if state else []
    controls = key.digest() if buttons else None
    if decision.kind == "post":
        msg = render.render_incident(finding, plan, run_id=run_id, dag_id=dag_id, controls=controls)
        root = outbox.queue_message(db, conn, dedupe_key=f"incident:{key.digest()}:post:{run_id}",
                                    text=msg["text"], blocks=msg["blocks"], now=now)
        state = ThreadState(key=key, channel="", thread_ts="", opened_at=stamp, root_message_id=root)
        result = "posted"
    else:
        assert state is not None
        # the first post promised the decision: an acknowledgement or snooze does not hold it back
        quiet = None if decision.kind in ("decided", "undecided") else quiet_reason(conn, state, finding, now)
        if quiet:
            # Remembered, not said: the next reply (after the snooze, or a new severity) compares with now.
            store.save(remember(state, finding, run_id=run_id, now=stamp), conn=conn)
            return {"decision": "quiet", "reason": quiet, "changes": list(decision.changes)}, [key]
        lift_acknowledgement(conn, state, finding)
        if decision.kind == "decided":
            msg = render.render_decided(finding, state.deciding_between, plan, run_id=run_id, dag_id=dag_id,
                                        controls=controls)
        elif decision.kind == "undecided":
            msg = render.render_still_undecided(finding, state.decided_by, decision.changes)
        else:
            msg = render.render_update(finding, decision.changes, run_id=run_id, dag_id=dag_id, controls=controls)
        outbox.queue_message(db, conn, dedupe_key=f"incident:{key.digest()}:{_thread_anchor(state)}:reply:{run_id}",
                             text=msg["text"], blocks=msg["blocks"], now=now, **reply_target(state))
        state.replies += 1
        result = "replied"
    store.save(remember(state, finding, run_id=run_id, now=stamp, opened=decision.kind == "post",
                        promised=decision.kind == "undecided"), conn=conn)
    return {"decision": result, "changes": list(decision.changes), "decided": decision.kind == "decided",
            "undecided": decision.kind == "undecided"}, [key]


def _close_superseded(db, conn, store: ThreadStore, finding: Mapping[str, Any], threads: list[ThreadState], *,
                      own_thread: bool, run_id: str, now: datetime) -> list[str]:
    """Rule 8: close each provisional thread the finding did not land in, with one reply saying what
    it became and where that is followed (``own_thread``: a thread that was open already, else the
    one this finding just posted). Not held back by an acknowledgement or snooze: it ends a promise."""
    stamp = now.isoformat()
    existing = store.get(IncidentKey.of(finding), conn=conn) if own_thread else None
    opened = datetime.fromisoformat(existing.opened_at) if existing and existing.opened_at else None
    for state in threads:
        msg = render.render_superseded(finding, state.deciding_between, existing=own_thread, existing_since=opened)
        outbox.queue_message(db, conn, dedupe_key=f"incident:{state.key.digest()}:{_thread_anchor(state)}:superseded",
                             text=msg["text"], blocks=msg["blocks"], now=now, **reply_target(state))
        state.status, state.closed_at, state.replies = "closed", stamp, state.replies + 1
        state.last_run_id, state.updated_at = run_id, stamp
        store.save(state, conn=conn)
    return [s.key.diagnosis for s in threads]


def post_incident_run(
    items: list[Mapping[str, Any]],
    *,
    run_id: str,
    scope: str,
    sender: Sender | None = None,
    settings: Any = None,
    now: datetime | None = None,
    dag_id: str | None = None,
    buttons: bool | None = None,
) -> dict[str, Any]:
    """A manual incident run: one Slack thread for the whole run.

    ``items`` are ``{"finding", "plan"}`` pairs. The first call posts a header
    naming the scope and every finding; each problem then goes into that thread
    in full. The run's action results and its failure reply there; sweeps keep
    their own incident threads and never reply in it. Retrying the task posts
    nothing twice.
    """
    problems = sum(1 for i in items if i["finding"].get("diagnosis") not in NO_PROBLEM_DIAGNOSES)
    args = {"items": [dict(i) for i in items], "run_id": run_id, "scope": scope, "now": _now(now).isoformat(),
            "dag_id": _dag_id(dag_id, INCIDENT_DAG_ID), "buttons": _buttons(buttons)}
    return _call("incident_run", args, settings=settings, sender=sender, now=now,
                 spooled={"thread_ts": None, "problems": problems, "findings": len(items)})


def _incident_run_in(db, conn, *, items: list[Mapping[str, Any]], run_id: str, scope: str, now: str,
                     dag_id: str, buttons: bool) -> tuple[dict[str, Any], Any]:
    at = datetime.fromisoformat(now)
    problems = [i for i in items if i["finding"].get("diagnosis") not in NO_PROBLEM_DIAGNOSES]
    outbox.lock_key(db, conn, f"run:{run_id}")
    # Sorted, so two runs over overlapping groups take the locks in one order (no deadlock).
    for name in sorted({IncidentKey.of(i["finding"]).lock_name() for i in problems}):
        outbox.lock_key(db, conn, name)
    run = _run_thread(conn, run_id)
    if run is None:
        msg = render.render_run_header([i["finding"] for i in items], scope=scope, run_id=run_id, dag_id=dag_id)
        root = outbox.queue_message(db, conn, dedupe_key=f"run:{run_id}:header", text=msg["text"],
                                    blocks=msg["blocks"], now=at)
        run = {"root_message_id": root, "posted": []}
    root = int(run["root_message_id"])
    for item in problems:
        finding = item["finding"]
        key = IncidentKey.of(finding)
        if key.digest() in run["posted"]:
            continue
        msg = render.render_incident(finding, item.get("plan"), run_id=run_id, dag_id=dag_id,
                                     controls=key.digest() if buttons else None)
        outbox.queue_message(db, conn, dedupe_key=f"run:{run_id}:{key.digest()}", text=msg["text"],
                             blocks=msg["blocks"], parent_id=root, now=at)
        # The run's thread is the run's: the incident's own thread (a sweep's) is neither taken
        # over nor opened here, so a sweep's replies never land among the run's.
        run["posted"] = [*run["posted"], key.digest()]
    _save_run_thread(db, conn, run_id, run, at)

    def thread_ts(db) -> dict[str, Any]:
        with db.engine.connect() as c:
            sent = outbox.message_ts(c, root)
        return {"thread_ts": sent[1] if sent else None}

    return {"decision": "posted", "problems": len(problems), "findings": len(items)}, thread_ts


def post_action_result(
    record: Mapping[str, Any], *, sender: Sender | None = None, settings: Any = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Reply with a remediation record (from ``run_action``) in its incident's thread.

    Each (idempotency key, status) is queued once, so a retried task does not
    repeat it; a proposal, dry run, block or recommendation (SAY_ONCE_STATUSES) is
    said once per incident thread, and again only when what it says changes
    (``action_signature``). Without a thread (none was ever posted) it goes top-level.
    """
    args = {"record": dict(record), "now": _now(now).isoformat()}
    return _call("action_result", args, settings=settings, sender=sender, now=now, spooled={"threads": []})


# What a sweep says again every minute unless held back: a proposal, a dry run, a block or advice.
# Each is said once per incident thread, and again only when what it says changes.
SAY_ONCE_STATUSES = frozenset({"dry_run", "blocked", "recommended", "awaiting_approval"})
_RUN_IDS_AND_TIMES = re.compile(r"\b(?:scheduled|manual|backfill|asset_triggered)__\S+|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?")


def action_signature(record: Mapping[str, Any]) -> str | None:
    """What a say-once record says, minus what moves every sweep (run ids, times; a guardrail's clock
    and counts: "cooldown ends in 12 min", "4 actions in the last hour", who holds the lease; the
    numbers of advice that follows the rates).
    None for an outcome (executed, noop, failed, rejected), which is said once per attempt."""
    status = str(record.get("status", ""))
    if status not in SAY_ONCE_STATUSES:
        return None
    rule = str(record.get("rule") or "")
    message = _RUN_IDS_AND_TIMES.sub("<>", str(record.get("message") or ""))
    if status == "blocked":
        message = "" if rule == "lease" else re.sub(r"\d+", "#", message)
    elif status == "recommended":  # advice whose numbers follow the rates is the same advice
        message = re.sub(r"\d+", "#", message)
    return f"{status}|{rule}|{message}"


def _action_result_in(db, conn, *, record: Mapping[str, Any], now: str) -> tuple[dict[str, Any], Any]:
    store = ThreadStore(db)
    key = IncidentKey(str(record.get("cluster", "")), str(record.get("group_id", "")),
                      str(record.get("topic", "")), str(record.get("diagnosis", "")))
    marker = f"{record.get('idempotency_key')}:{record.get('status')}"
    action, signature = str(record.get("action", "")), action_signature(record)
    outbox.lock_key(db, conn, key.lock_name())
    run_id = str(record.get("run_id") or "")
    run = _run_thread(conn, run_id) if run_id else None
    if run is not None:
        said = _reply_once_in_run(db, conn, run_id, run, marker, render.render_action_result(record),
                                  datetime.fromisoformat(now))
        return {"decision": "replied" if said else "unchanged", "threads": []}, None
    state = _action_thread(store, conn, key)
    if state is not None and marker in state.posted_actions:
        decision = "unchanged"
    elif state is not None and signature is not None and state.said_actions.get(action) == signature:
        log.info("%s for group %s: %s, as already said in its thread", action, key.group_id, record.get("status"))
        decision = "unchanged"
    else:
        msg = render.render_action_result(record)
        target = reply_target(state) if state is not None else {}
        outbox.queue_message(db, conn, dedupe_key=f"action:{marker}", text=msg["text"], blocks=msg["blocks"],
                             now=datetime.fromisoformat(now), **target)
        if state is not None:
            state.posted_actions.append(marker)
            if signature is not None:
                state.said_actions[action] = signature
            else:  # an outcome: what was proposed before it is news again afterwards
                state.said_actions.pop(action, None)
            state.replies += 1
            store.save(state, conn=conn)
        decision = "replied" if state is not None else "posted"

    def threads(db) -> dict[str, Any]:
        found = store.get(key)
        return {"threads": [_thread_ref(found)] if found is not None else []}

    return {"decision": decision}, threads


def post_action_check(record: Mapping[str, Any], verdict: str, text: str, *, after_seconds: float,
                      sender: Sender | None = None, settings: Any = None,
                      now: datetime | None = None) -> dict[str, Any]:
    """Reply once in an executed action's thread whether it did what it was for (``verdict`` "worked" or
    "failed", lagdoctor.remediation.postcheck): once per action, whatever later sweeps see."""
    args = {"record": dict(record), "verdict": verdict, "text": text, "after_seconds": after_seconds,
            "now": _now(now).isoformat()}
    return _call("action_check", args, settings=settings, sender=sender, now=now, spooled={"threads": []})


def _action_check_in(db, conn, *, record: Mapping[str, Any], verdict: str, text: str, after_seconds: float,
                     now: str) -> tuple[dict[str, Any], Any]:
    store = ThreadStore(db)
    key = IncidentKey(str(record.get("cluster", "")), str(record.get("group_id", "")),
                      str(record.get("topic", "")), str(record.get("diagnosis", "")))
    marker = f"{record.get('idempotency_key')}:check"
    outbox.lock_key(db, conn, key.lock_name())
    run_id = str(record.get("run_id") or "")
    run = _run_thread(conn, run_id) if run_id else None
    msg = render.render_action_check(record, verdict, text, after_seconds=after_seconds)
    at = datetime.fromisoformat(now)
    if run is not None:
        if not _reply_once_in_run(db, conn, run_id, run, marker, msg, at):
            return {"decision": "unchanged", "_quiet": True}, None
        return {"decision": "replied", "verdict": verdict}, None
    state = _action_thread(store, conn, key)
    if state is not None and marker in state.posted_actions:
        return {"decision": "unchanged", "_quiet": True}, None
    target = reply_target(state) if state is not None else {}
    outbox.queue_message(db, conn, dedupe_key=f"action:{marker}", text=msg["text"], blocks=msg["blocks"], now=at,
                         **target)
    if state is not None:
        state.posted_actions.append(marker)
        state.replies += 1
        store.save(state, conn=conn)
    return {"decision": "replied" if target else "posted", "verdict": verdict}, None


def _action_thread(store: ThreadStore, conn, key: IncidentKey) -> ThreadState | None:
    """The thread an action's record replies in: its incident key's, else (the cause re-keyed since,
    threads rule 10) the open thread of its (cluster, group, topic) opened first."""
    state = store.get(key, conn=conn)
    if state is not None:
        return state
    open_now = store.open_threads(key.cluster, key.group_id, key.topic, conn=conn)
    return min(open_now, key=lambda s: s.opened_at or "") if open_now else None


def _run_thread(conn, run_id: str) -> dict[str, Any] | None:
    """The thread of a manual incident run (run_threads), or None for a sweep's run."""
    from lagdoctor.state import run_threads

    row = conn.execute(sa.select(run_threads.c.data).where(run_threads.c.run_key == run_id)).first()
    return dict(row.data) if row is not None and isinstance(row.data, dict) else None


def _save_run_thread(db, conn, run_id: str, data: Mapping[str, Any], at: datetime) -> None:
    from lagdoctor.state import run_threads

    values = {"run_key": run_id, "data": dict(data), "updated_at": at}
    if not db.insert_ignore(conn, run_threads, values, ("run_key",)):
        conn.execute(sa.update(run_threads).where(run_threads.c.run_key == run_id)
                     .values(data=dict(data), updated_at=at))


def _reply_once_in_run(db, conn, run_id: str, run: dict[str, Any], marker: str, msg: Mapping[str, Any],
                       at: datetime) -> bool:
    """Queue ``msg`` in a manual incident run's thread once per ``marker`` (an action's attempt and
    status, or its check); False when the thread already has it."""
    if marker in (run.get("actions") or []):
        return False
    outbox.queue_message(db, conn, dedupe_key=f"action:{marker}", text=msg["text"], blocks=msg["blocks"],
                         parent_id=int(run["root_message_id"]), now=at)
    run["actions"] = [*(run.get("actions") or []), marker]
    _save_run_thread(db, conn, run_id, run, at)
    return True


def post_notice(
    message: str | Mapping[str, Any], *, dedupe_key: str, settings: Any = None, sender: Sender | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A top-level notice (e.g. a quarantined file), queued once per ``dedupe_key``.

    A ``str`` is plain text (escaped for Slack); a ``{"text", "blocks"}`` dict
    is sent as rendered."""
    if isinstance(message, Mapping):
        text, blocks = str(message.get("text", "")), list(message.get("blocks") or [])
    else:
        text = escape_mrkdwn(" ".join(str(message).split()))
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    args = {"dedupe_key": dedupe_key, "text": text, "blocks": blocks, "now": _now(now).isoformat()}
    return _call("notice", args, settings=settings, sender=sender, now=now)


def _notice_in(db, conn, *, dedupe_key: str, text: str, blocks: list[Any], now: str) -> tuple[dict[str, Any], Any]:
    outbox.queue_message(db, conn, dedupe_key=f"notice:{dedupe_key}", text=text, blocks=blocks,
                         now=datetime.fromisoformat(now))
    return {"decision": "queued"}, None


def deliver_pending(settings: Any = None, *, sender: Sender | None = None,
                    now: datetime | None = None) -> dict[str, Any]:
    """Send whatever waits: the spool (replayed first) and the outbox (e.g. first
    thing in a run, after a Slack or state database outage)."""
    from lagdoctor.state import is_unavailable, unavailable_line

    settings = _settings(settings)
    try:
        db = _state_db(settings)
        spool.replay_spool(db, settings, _HANDLERS, _STALE)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        return {"undelivered": spool.spooled_count(settings) or None, "delivery_error": unavailable_line(exc)}
    return _deliver(db, settings, sender, now)


def _batch_db(settings_arg: Any, settings: Any):
    """The state database: the batch's, resolved once per batch (each resolution may ask Airflow for
    a connection), else resolved now."""
    batch = _batch.get()
    if batch is not None and batch.db is not None and batch.settings_arg is settings_arg:
        return batch.db
    db = _state_db(settings)
    if batch is not None and batch.db is None:
        batch.settings_arg, batch.settings, batch.db = settings_arg, settings, db
    return db


def batch_state_db(settings: Any = None):
    """The state database of the running delivery_batch() (resolved once for the batch), else of ``settings``."""
    return _batch_db(settings, _resolved_settings(settings))


def _replay(db, settings: Any) -> int:
    """Replay the spool: once per batch (a call spooled meanwhile means the database is down and the
    batch's later calls spool too), at every call outside one."""
    batch = _batch.get()
    if batch is None or batch.db is not db:
        return spool.replay_spool(db, settings, _HANDLERS, _STALE)
    if batch.replayed is None:
        batch.replayed = spool.replay_spool(db, settings, _HANDLERS, _STALE)
        batch.delivery_due = batch.delivery_due or batch.replayed > 0
        return batch.replayed
    return 0


def _resolved_settings(settings: Any) -> Any:
    batch = _batch.get()
    if batch is not None and batch.db is not None and batch.settings_arg is settings:
        return batch.settings
    return _settings(settings)


def findings_without_news(findings: list[Mapping[str, Any]], *, settings: Any = None) -> dict[int, dict[str, Any]]:
    """The findings of a sweep that cannot change anything in Slack, found with one query: index ->
    what post_or_update_incident would return for it, so the caller need not make that call (a
    transaction, a lock) for each of them. They are a ``collecting_history`` finding (threads
    rule 11), a held one (rule 12), and a ``healthy`` one, complete or not, of a (cluster, group,
    topic) with no open thread: nothing to recover (rule 5), nothing to say incomplete (rule 6).
    An open thread of any kind (decided, provisional, sharing causes, its first message still in
    the outbox) keeps its key's healthy findings out of this. The spool is replayed first, so a
    thread a spooled call opens counts. The state database unreachable: only rules 11 and 12
    (the healthy findings go their own way, to the spool)."""
    from lagdoctor.state import incident_threads as t, is_unavailable, unavailable_line

    quiet: dict[int, dict[str, Any]] = {}
    healthy: list[int] = []
    for i, f in enumerate(findings):
        if f.get("diagnosis") == COLLECTING_HISTORY:
            quiet[i] = {"decision": "collecting", "threads": []}
        elif held_until_decided(f):
            quiet[i] = {"decision": "held", "threads": []}
        elif f.get("diagnosis") == HEALTHY:
            healthy.append(i)
    if not healthy or _batch_state_down.get():
        return quiet
    resolved = _resolved_settings(settings)
    try:
        db = _batch_db(settings, resolved)
        _replay(db, resolved)
        with db.engine.connect() as conn:
            open_keys = {tuple(row) for row in conn.execute(
                sa.select(t.c.cluster, t.c.group_id, t.c.topic).where(t.c.status == "open").distinct())}
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        note_state_unavailable(unavailable_line(exc))
        return quiet
    batch = _batch.get()
    if batch is not None:
        batch.delivery_due = True  # what earlier runs left in the outbox goes out with this one
    for i in healthy:
        key = IncidentKey.of(findings[i])
        if (key.cluster, key.group_id, key.topic) not in open_keys:
            quiet[i] = {"decision": "healthy" if data_complete(findings[i]) else "incomplete", "replied": 0,
                        "threads": []}
    return quiet


def _call(kind: str, args: dict[str, Any], *, settings: Any, sender: Sender | None, now: datetime | None,
          spooled: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replay the spool, run one coordinator call in a transaction, deliver (inside
    delivery_batch(): once, as the batch ends).

    The state database unreachable before the call committed: the call goes to
    the spool (decision "spooled"), replayed once by a later call."""
    from lagdoctor.state import is_unavailable, unavailable_line

    resolved = _resolved_settings(settings)
    down = _batch_state_down.get()
    if down:
        return _spool(kind, args, resolved, down[0], spooled)
    try:
        db = _batch_db(settings, resolved)
        replayed = _replay(db, resolved)
        with db.transaction() as conn:
            result, finish = _HANDLERS[kind](db, conn, **args)
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        line = unavailable_line(exc)
        if down is not None:
            down.append(line)
        return _spool(kind, args, resolved, line, spooled)
    if result.pop("_quiet", False) and not replayed:
        # Nothing new to say (e.g. no failure thread to close): no delivery round.
        return {**result, "undelivered": 0, "delivery_error": None}
    batch = _batch.get()
    if batch is not None and batch.db is db:
        # Delivered once as the batch ends; this result is completed then.
        batch.delivery_due = True
        batch.sender, batch.now = batch.sender or sender, batch.now or now
        if finish is not None:
            batch.finishes.append((result, finish))
        return result
    result.update(_deliver(db, resolved, sender, now))
    if finish is not None:
        try:
            result.update(finish(db))
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            result.update({k: v for k, v in (spooled or {}).items() if k not in result})
    return result


def _spool(kind: str, args: Mapping[str, Any], settings: Any, line: str,
           extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """Keep the call in the spool; what the task is told."""
    path = spool.spool_call(settings, kind, args, reason=line)
    waiting = spool.spooled_count(settings)
    error = (f"{line}; {waiting} notification(s) kept in the spool {path.parent}, "
             f"sent once the state database is back")
    log.warning("Slack: %s", error)
    return {"decision": "spooled", **(extra or {}), "undelivered": waiting, "delivery_error": error}


# -- failures: one thread per DAG ------------------------------------------------------


def _context_ids(context: Mapping[str, Any]) -> tuple[str, str, str]:
    ti = context.get("ti") or context.get("task_instance")
    dag_run = context.get("dag_run")
    dag_id = (getattr(context.get("dag"), "dag_id", None) or getattr(ti, "dag_id", None)
              or getattr(dag_run, "dag_id", None) or "?")
    run_id = context.get("run_id") or getattr(ti, "run_id", None) or getattr(dag_run, "run_id", None) or "-"
    task_id = str(getattr(ti, "task_id", "-"))
    map_index = getattr(ti, "map_index", None)
    if isinstance(map_index, int) and map_index >= 0:
        # A mapped instance (one cluster's snapshot): named as the grid names it, `snapshot[kafka_eu]`.
        task_id = f"{task_id}[{getattr(ti, 'rendered_map_index', None) or map_index}]"
    return str(dag_id), task_id, str(run_id)


def _failure_signature(task_id: str, reason: str, run_id: str) -> str:
    """What makes a failure new: the task and the reason, minus the run's own id
    and numbers (durations, ports, counts), so one outage stays one story."""
    return task_id + "|" + re.sub(r"\d+", "#", reason.replace(run_id, "<run>"))


def _load_failure(db, conn, dag_id: str) -> dict[str, Any] | None:
    from lagdoctor.state import failure_threads

    row = conn.execute(sa.select(failure_threads.c.data).where(failure_threads.c.dag_id == dag_id)).first()
    return dict(row.data) if row is not None else None


def _save_failure(db, conn, dag_id: str, data: dict[str, Any], at: datetime) -> None:
    from lagdoctor.state import failure_threads

    values = {"dag_id": dag_id, "data": data, "updated_at": at}
    if not db.insert_ignore(conn, failure_threads, values, ("dag_id",)):
        conn.execute(sa.update(failure_threads).where(failure_threads.c.dag_id == dag_id)
                     .values(data=data, updated_at=at))


def notify_failure(context: Mapping[str, Any], *, settings: Any = None, sender: Sender | None = None,
                   now: datetime | None = None) -> dict[str, Any]:
    """``on_failure_callback``: one Slack thread per DAG while it keeps failing.

    The first failure posts; a later one replies only when the failing task or
    the reason changed, and otherwise is counted. Never raises: a notification
    problem must not mask the failure it reports.
    """
    try:
        return _notify_failure(context, settings=settings, sender=sender, now=now)
    except Exception as err:  # noqa: BLE001
        log.error("could not queue the failure notification: %s", one_line(err))
        return {"decision": "error", "undelivered": 0, "delivery_error": one_line(err)}


def _notify_failure(context: Mapping[str, Any], *, settings: Any, sender: Sender | None,
                    now: datetime | None) -> dict[str, Any]:
    dag_id, task_id, run_id = _context_ids(context)
    exc = context.get("exception")
    args = {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "reason": one_line(exc) if exc else "",
            "now": _now(now).isoformat()}
    result = _call("failure", args, settings=settings, sender=sender, now=now,
                   spooled={"failed_runs": None, "repeats": None})
    if result["decision"] == "spooled":
        log.error("the failure notification waits in the spool: %s", result["delivery_error"])
    return result


def _failure_in(db, conn, *, dag_id: str, task_id: str, run_id: str, reason: str,
                now: str) -> tuple[dict[str, Any], Any]:
    at = datetime.fromisoformat(now)
    signature = _failure_signature(task_id, reason, run_id)
    outbox.lock_key(db, conn, f"failure:{dag_id}")
    data = _load_failure(db, conn, dag_id)
    msg = render.render_failure(dag_id=dag_id, task_id=task_id, run_id=run_id, reason=reason)
    if data is None or data.get("status") != "open":
        root = outbox.queue_message(db, conn, dedupe_key=f"failure:{dag_id}:{run_id}:{task_id}:open",
                                    text=msg["text"], blocks=msg["blocks"], now=at)
        data = {"status": "open", "root_message_id": root, "opened_at": at.isoformat(), "signature": signature,
                "signatures": [signature], "failed_runs": 1, "recent_runs": [run_id],
                "seen": [f"{run_id}/{task_id}"], "repeats": 0, "replies": 0,
                "pending": (data or {}).get("pending") or {}}
        decision = "posted"
    elif f"{run_id}/{task_id}" in data["seen"]:
        decision = "unchanged"  # the same failure reported twice (a re-run callback)
    else:
        # Bounded: an outage over a weekend is hundreds of runs; a count says enough.
        data["seen"] = [*data["seen"], f"{run_id}/{task_id}"][-RECENT_FAILURES:]
        if run_id not in data["recent_runs"]:
            data["recent_runs"] = [*data["recent_runs"], run_id][-RECENT_FAILURES:]
            data["failed_runs"] += 1
        # Every failure this thread already told, not only the last: two clusters
        # down at once alternate each run, and must not reply every run.
        told = data.get("signatures") or [data["signature"]]
        if signature in told:
            data["repeats"] += 1
            decision = "unchanged"
        else:
            runs = data["failed_runs"]
            msg["blocks"] = [*msg["blocks"], {"type": "context", "elements": [
                {"type": "mrkdwn", "text": f"Failing differently now; {runs} failed run(s) since this thread opened."}]}]
            outbox.queue_message(db, conn, dedupe_key=f"failure:{dag_id}:{data['root_message_id']}:{run_id}:{task_id}",
                                 text=msg["text"], blocks=msg["blocks"], parent_id=data["root_message_id"], now=at)
            data["signature"], data["replies"] = signature, data["replies"] + 1
            data["signatures"] = [*told, signature][-RECENT_FAILURES:]
            decision = "replied"
    data["state_at"] = at.isoformat()  # what a replayed older call is compared with (_failure_is_stale)
    _save_failure(db, conn, dag_id, data, at)
    return {"decision": decision, "failed_runs": data["failed_runs"], "repeats": data["repeats"]}, None


def _failure_is_stale(db, conn, *, dag_id: str, run_id: str, now: str, **_call_args: Any) -> str | None:
    """Like _incident_is_stale, for a DAG's failure thread: a replayed failure or recovery made before
    the thread's last failure or recovery (``state_at``; a task's recorded reason is not one) is stale,
    so a stale recovery never closes a thread failing again, nor a stale failure reopen a recovered one."""
    outbox.lock_key(db, conn, f"failure:{dag_id}")
    if _run_thread(conn, run_id) is not None:
        return None  # a manual run's failure goes in that run's own thread, which no other run changes
    data = _load_failure(db, conn, dag_id) or {}
    made, newest = datetime.fromisoformat(now), data.get("state_at")
    if not newest or datetime.fromisoformat(newest) <= made:
        return None
    return (f"run {run_id}'s {'recovery' if 'task_id' not in _call_args else 'failure'} of DAG {dag_id}, made at "
            f"{made.isoformat()}, is older than its {data.get('status')} failure thread, updated at {newest}")


def _callback(what: str, call: Any) -> dict[str, Any]:
    """An Airflow callback's body: never raises, since a notification problem must not mask the
    failure (or success) it reports; a call kept in the spool says so in the log."""
    try:
        result = call()
    except Exception as err:  # noqa: BLE001
        log.error("could not %s: %s", what, one_line(err))
        return {"decision": "error", "undelivered": 0, "delivery_error": one_line(err)}
    if result.get("decision") == "spooled":
        log.error("the %s waits in the spool: %s", what, result["delivery_error"])
    return result


def record_task_failure(context: Mapping[str, Any], *, settings: Any = None,
                        now: datetime | None = None) -> dict[str, Any]:
    """Task-level ``on_failure_callback``: remember why the task failed and say nothing yet. The run
    may still succeed (a task whose failure it tolerates) or wait for a human; ``notify_run_failed``
    says it once the run has failed. Never raises."""
    def call() -> dict[str, Any]:
        dag_id, task_id, run_id = _context_ids(context)
        exc = context.get("exception")
        args = {"dag_id": dag_id, "task_id": task_id, "run_id": run_id, "reason": one_line(exc) if exc else "",
                "now": _now(now).isoformat()}
        return _call("task_failed", args, settings=settings, sender=None, now=now)

    return _callback("record the task failure", call)


def _task_failed_in(db, conn, *, dag_id: str, task_id: str, run_id: str, reason: str,
                    now: str) -> tuple[dict[str, Any], Any]:
    at = datetime.fromisoformat(now)
    outbox.lock_key(db, conn, f"failure:{dag_id}")
    data = _load_failure(db, conn, dag_id) or {"status": "none"}
    pending = dict(data.get("pending") or {})
    failed = [f for f in pending.get(run_id, []) if f[0] != task_id]
    pending[run_id] = [*failed, [task_id, reason]]
    data["pending"] = dict(list(pending.items())[-RECENT_FAILURES:])  # runs that never ended are bounded
    _save_failure(db, conn, dag_id, data, at)
    return {"decision": "recorded", "_quiet": True}, None


def notify_run_failed(context: Mapping[str, Any], *, settings: Any = None, sender: Sender | None = None,
                      now: datetime | None = None) -> dict[str, Any]:
    """DAG-level ``on_failure_callback``: the run has failed. Said once, with the first task that
    failed for good and its reason (``record_task_failure``): in the run's own thread when it has one
    (a manual incident run), else in the DAG's failure thread (``notify_failure``'s rules). Never raises."""
    def call() -> dict[str, Any]:
        dag_id, task_id, run_id = _context_ids(context)
        args = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id,
                "reason": str(context.get("reason") or ""), "now": _now(now).isoformat()}
        return _call("run_failed", args, settings=settings, sender=sender, now=now,
                     spooled={"failed_runs": None, "repeats": None})

    return _callback("queue the failure notification", call)


def _run_failed_in(db, conn, *, dag_id: str, run_id: str, task_id: str, reason: str,
                   now: str) -> tuple[dict[str, Any], Any]:
    at = datetime.fromisoformat(now)
    outbox.lock_key(db, conn, f"failure:{dag_id}")
    data = _load_failure(db, conn, dag_id)
    recorded = list(((data or {}).get("pending") or {}).get(run_id) or [])
    if recorded:
        data["pending"] = {k: v for k, v in data["pending"].items() if k != run_id}
        _save_failure(db, conn, dag_id, data, at)
        task_id, reason = recorded[0]
        if len(recorded) > 1:
            reason += f" (also failed: {', '.join(t for t, _ in recorded[1:])})"
    elif reason:
        reason = f"the run failed ({reason})"
    run = _run_thread(conn, run_id)
    if run is None:
        return _failure_in(db, conn, dag_id=dag_id, task_id=task_id, run_id=run_id, reason=reason, now=now)
    msg = render.render_failure(dag_id=dag_id, task_id=task_id, run_id=run_id, reason=reason)
    outbox.queue_message(db, conn, dedupe_key=f"failure:{dag_id}:{run_id}:run", text=msg["text"],
                         blocks=msg["blocks"], parent_id=int(run["root_message_id"]), now=at)
    return {"decision": "replied", "failed_runs": None, "repeats": None}, None


def notify_recovery(context: Mapping[str, Any], *, settings: Any = None, sender: Sender | None = None,
                    now: datetime | None = None) -> dict[str, Any]:
    """DAG-level ``on_success_callback``: close the DAG's failure thread with one reply.

    Nothing is sent when no failure thread is open. Never raises."""
    try:
        dag_id, _task_id, run_id = _context_ids(context)
        args = {"dag_id": dag_id, "run_id": run_id, "now": _now(now).isoformat()}
        result = _call("recovery", args, settings=settings, sender=sender, now=now, spooled={"failed_runs": None})
        if result["decision"] == "spooled":
            log.error("the recovery notification waits in the spool: %s", result["delivery_error"])
        return result
    except Exception as err:  # noqa: BLE001
        log.error("could not queue the recovery notification: %s", one_line(err))
        return {"decision": "error", "undelivered": 0, "delivery_error": one_line(err)}


def _recovery_in(db, conn, *, dag_id: str, run_id: str, now: str) -> tuple[dict[str, Any], Any]:
    at = datetime.fromisoformat(now)
    outbox.lock_key(db, conn, f"failure:{dag_id}")
    data = _load_failure(db, conn, dag_id)
    if data is not None and run_id in (data.get("pending") or {}):
        data["pending"] = {k: v for k, v in data["pending"].items() if k != run_id}
        _save_failure(db, conn, dag_id, data, at)
    if data is None or data.get("status") != "open":
        return {"decision": "unchanged", "_quiet": True}, None
    msg = render.render_failure_recovery(dag_id=dag_id, run_id=run_id, failed_runs=data["failed_runs"])
    outbox.queue_message(db, conn, dedupe_key=f"failure:{dag_id}:{data['root_message_id']}:recovered",
                         text=msg["text"], blocks=msg["blocks"], parent_id=data["root_message_id"], now=at)
    data.update(status="closed", closed_at=at.isoformat(), replies=data["replies"] + 1, state_at=at.isoformat())
    _save_failure(db, conn, dag_id, data, at)
    return {"decision": "recovered", "failed_runs": data["failed_runs"]}, None


def _thread_ref(state: ThreadState) -> dict[str, Any]:
    return {"diagnosis": state.key.diagnosis, "channel": state.channel, "thread_ts": state.thread_ts,
            "status": state.status}


# What a spooled call of each kind replays through: the same code as a live call.
_HANDLERS = {
    "incident": _incident_in,
    "incident_run": _incident_run_in,
    "action_result": _action_result_in,
    "action_check": _action_check_in,
    "notice": _notice_in,
    "failure": _failure_in,
    "task_failed": _task_failed_in,
    "run_failed": _run_failed_in,
    "recovery": _recovery_in,
}

# A replayed call of these kinds is dropped when its thread holds a newer state (spool.replay_spool).
_STALE = {"incident": _incident_is_stale, "failure": _failure_is_stale, "run_failed": _failure_is_stale,
          "recovery": _failure_is_stale}
