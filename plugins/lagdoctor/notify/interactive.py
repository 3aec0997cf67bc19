"""Slack buttons: Approve / Reject a waiting HITL task, Acknowledge, Snooze 1 h.

What a click does lives here (lagdoctor.web.slack_actions only verifies and
parses the HTTP request):

    buttons_enabled()            a public base URL and a signing secret: render buttons at all?
    verify_signature(...)        Slack's v0 scheme, 5-minute window, constant-time compare
    first_seen(db, keys, now)    replay guard (signature, and the click itself)
    handle_click(click, ...)     act once, audit, post who did what in the thread
    quiet_reason(conn, state, finding, now)   the coordinator asks before an update reply

Buttons carry only ids: an approval's row id (``slack_approvals``) or an
incident key's digest. Nothing secret is ever put in a block, a log line or
a reply; the signing secret is read per request and never logged.

Who may click what: Approve / Reject only the Slack users (U…) and user
groups (S…) in LAGDOCTOR_SLACK_APPROVERS; Acknowledge and Snooze anyone who
sees the message (Slack only delivers clicks from the channel's members).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping

import sqlalchemy as sa

from lagdoctor.notify.redact import one_line
from lagdoctor.notify.templates import escape_mrkdwn

log = logging.getLogger(__name__)

URL_PREFIX = "/lagdoctor-slack"  # beside /lagdoctor: a mount at /lagdoctor would not reach below it
ACTIONS_PATH = "/actions"
SIGNING_SECRET_ENV = "LAGDOCTOR_SLACK_SIGNING_SECRET"
SIGNING_SECRET_EXTRA = "signing_secret"
APPROVERS_ENV = "LAGDOCTOR_SLACK_APPROVERS"
SIGNATURE_WINDOW_S = 300
SNOOZE = timedelta(hours=1)
SEEN_KEEP = timedelta(minutes=10)  # longer than the window: an older replay fails the timestamp check

APPROVE, REJECT, ACK, SNOOZE_ACTION = "lagdoctor.approve", "lagdoctor.reject", "lagdoctor.ack", "lagdoctor.snooze"
APPROVAL_ACTIONS = {APPROVE: "Approve", REJECT: "Reject"}
WAITING, APPROVED, REJECTED = "waiting", "approved", "rejected"


# ---------------------------------------------------------------- configuration

def signing_secret(environ: Mapping[str, str] | None = None, conn_id: str | None = None) -> str | None:
    """The Slack app's signing secret: the Slack connection's extra ``signing_secret``,
    else LAGDOCTOR_SLACK_SIGNING_SECRET; None when neither is set."""
    from lagdoctor.notify.slack import DEFAULT_CONN_ID

    env = os.environ if environ is None else environ
    try:
        from lagdoctor.connections import connection_exists

        conn_id = conn_id or DEFAULT_CONN_ID
        if connection_exists(conn_id):
            from airflow.sdk.bases.hook import BaseHook

            value = (BaseHook.get_connection(conn_id).extra_dejson or {}).get(SIGNING_SECRET_EXTRA)
            if isinstance(value, str) and value.strip():
                return value.strip()
    except Exception as exc:  # a malformed connection: the env may still hold it; never the value
        log.warning("Slack signing secret: cannot read the Slack connection (%s)", type(exc).__name__)
    value = (env.get(SIGNING_SECRET_ENV) or "").strip()
    return value or None


def request_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The URL to enter as the Slack app's Interactivity request URL, or None without a public base URL."""
    from lagdoctor.web.links import airflow_base_url

    base = airflow_base_url(environ)
    return f"{base}{URL_PREFIX}{ACTIONS_PATH}" if base else None


def buttons_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Buttons only where a click can reach us (a public base URL) and be verified (a secret)."""
    return request_url(environ) is not None and signing_secret(environ) is not None


def approvers(environ: Mapping[str, str] | None = None) -> tuple[frozenset[str], frozenset[str]]:
    """(user ids, user-group ids) from LAGDOCTOR_SLACK_APPROVERS; other tokens are ignored."""
    env = os.environ if environ is None else environ
    ids = [t.strip() for t in (env.get(APPROVERS_ENV) or "").split(",") if t.strip()]
    return (frozenset(i for i in ids if i[0] in "UW"), frozenset(i for i in ids if i[0] == "S"))


# ---------------------------------------------------------------- signature and replay

def verify_signature(secret: str | None, timestamp: str | None, body: bytes, signature: str | None, *,
                     now: float) -> str | None:
    """None when the request is Slack's; else why not, in a few words (never the secret)."""
    if not secret:
        return "no signing secret configured"
    if not timestamp or not signature:
        return "missing signature headers"
    try:
        ts = int(timestamp)
    except ValueError:
        return "bad timestamp"
    if abs(now - ts) > SIGNATURE_WINDOW_S:
        return "timestamp outside the 5-minute window"
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return "signature mismatch"
    return None


def first_seen(db, keys: Iterable[str], now: datetime) -> bool:
    """Record these request keys; False when any was seen before (a replay or Slack's retry)."""
    from lagdoctor.state import slack_requests

    hashed = sorted({hashlib.sha256(k.encode()).hexdigest() for k in keys})
    with db.transaction() as conn:
        conn.execute(sa.delete(slack_requests).where(slack_requests.c.received_at < now - SEEN_KEEP))
        fresh = True
        for key in hashed:
            fresh = db.insert_ignore(conn, slack_requests, {"signature": key, "received_at": now},
                                     ("signature",)) and fresh
    return fresh


# ---------------------------------------------------------------- blocks

def _button(text: str, action_id: str, value: str, style: str | None = None,
            confirm: Mapping[str, Any] | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": text},
                              "action_id": action_id, "value": value}
    if style:
        button["style"] = style
    if confirm:
        button["confirm"] = dict(confirm)
    return button


def incident_buttons(key_digest: str) -> dict[str, Any]:
    """Acknowledge and Snooze 1 h for one incident key (the value is its digest only)."""
    return {"type": "actions", "block_id": f"lagdoctor_incident_{key_digest}", "elements": [
        _button("Acknowledge", ACK, key_digest),
        _button("Snooze 1 h", SNOOZE_ACTION, key_digest),
    ]}


def approval_buttons(approval_id: int) -> dict[str, Any]:
    value = str(approval_id)
    confirm = {"title": {"type": "plain_text", "text": "Approve?"},
               "text": {"type": "plain_text", "text": "Airflow runs the action once you approve."},
               "confirm": {"type": "plain_text", "text": "Approve"},
               "deny": {"type": "plain_text", "text": "Cancel"}}
    return {"type": "actions", "block_id": f"lagdoctor_approval_{value}", "elements": [
        _button("Approve", APPROVE, value, "primary", confirm),
        _button("Reject", REJECT, value, "danger"),
    ]}


# ---------------------------------------------------------------- acknowledge / snooze, read by the coordinator

def _utc(value: datetime | None) -> datetime | None:
    from lagdoctor.state import as_utc

    return as_utc(value)


def _controls(conn: sa.Connection, digest: str) -> Mapping[str, Any] | None:
    from lagdoctor.state import incident_controls as c

    return conn.execute(sa.select(c).where(c.c.key_digest == digest)).mappings().first()


def quiet_reason(conn: sa.Connection, state: Any, finding: Mapping[str, Any], now: datetime) -> str | None:
    """Why an update reply in ``state``'s thread stays unsaid ("snoozed", "acknowledged"), or None.

    A snooze silences every update until it ends; an acknowledgement until the
    finding's severity differs from the one acknowledged. Both belong to one
    thread: a new thread for the same key starts loud."""
    row = _controls(conn, state.key.digest())
    if row is None or row["root_message_id"] != state.root_message_id:
        return None
    until = _utc(row["snoozed_until"])
    if until is not None and now < until:
        return "snoozed"
    if row["ack_at"] is not None and row["ack_severity"] == str(finding.get("severity", "")):
        return "acknowledged"
    return None


# ---------------------------------------------------------------- clicks

@dataclass(frozen=True)
class Click:
    user_id: str
    user_name: str
    action_id: str
    value: str
    action_ts: str = ""
    channel_id: str | None = None
    message_ts: str | None = None  # the clicked message
    thread_ts: str | None = None  # its thread, when it is a reply

    @property
    def who(self) -> str:
        """How Airflow and the thread name the clicker: ``slack:U123 (alice)``."""
        name = " ".join(self.user_name.split())[:80]
        return f"slack:{self.user_id} ({name})" if name else f"slack:{self.user_id}"

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> "Click | None":
        """The first action of a ``block_actions`` payload; None for anything else."""
        if payload.get("type") != "block_actions" or not payload.get("actions"):
            return None
        action = payload["actions"][0]
        user = payload.get("user") or {}
        container = payload.get("container") or {}
        message = payload.get("message") or {}
        return cls(user_id=str(user.get("id") or ""), user_name=str(user.get("username") or user.get("name") or ""),
                   action_id=str(action.get("action_id") or ""), value=str(action.get("value") or ""),
                   action_ts=str(action.get("action_ts") or ""),
                   channel_id=(payload.get("channel") or {}).get("id") or container.get("channel_id"),
                   message_ts=container.get("message_ts") or message.get("ts"),
                   thread_ts=container.get("thread_ts") or message.get("thread_ts"))

    def replay_key(self) -> str:
        return f"click:{self.user_id}:{self.action_id}:{self.value}:{self.action_ts}"


@dataclass
class Outcome:
    outcome: str  # done | already | refused | failed | unknown_target
    ephemeral: str | None = None  # what only the clicker sees
    posted: str | None = None  # what the thread sees


def _when(value: datetime | None) -> str:
    value = _utc(value)
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "-"


def _audit(db, conn, click: Click, action: str, outcome: str, detail: str | None, now: datetime) -> None:
    from lagdoctor.state import slack_interactions

    conn.execute(sa.insert(slack_interactions).values(
        at=now, user_id=click.user_id[:64], user_name=click.user_name[:255] or None, action=action[:64],
        target=click.value[:255], outcome=outcome, detail=(detail or None) and detail[:1000]))


def _is_approver(click: Click, environ: Mapping[str, str] | None,
                 group_members: Callable[[str], Iterable[str]]) -> bool:
    users, groups = approvers(environ)
    if click.user_id in users:
        return True
    for group in sorted(groups):
        try:
            if click.user_id in set(group_members(group)):
                return True
        except Exception as exc:  # a group Slack will not list: fail closed for that group
            log.warning("Slack: cannot list user group %s: %s", group, one_line(exc))
    return False


def handle_click(click: Click, *, db, now: datetime, hitl: Any = None,
                 group_members: Callable[[str], Iterable[str]] = lambda _g: (),
                 environ: Mapping[str, str] | None = None) -> Outcome:
    """Act on one verified, first-seen click; every outcome is audited."""
    if click.action_id in APPROVAL_ACTIONS:
        return _approval_click(click, db=db, now=now, hitl=hitl, group_members=group_members, environ=environ)
    if click.action_id in (ACK, SNOOZE_ACTION):
        return _control_click(click, db=db, now=now)
    with db.transaction() as conn:
        _audit(db, conn, click, "unknown", "unknown_target", f"action_id {click.action_id!r}", now)
    return Outcome("unknown_target", "lagdoctor does not know this button; nothing was done.")


# -- acknowledge / snooze

def _open_thread(conn: sa.Connection, digest: str):
    from lagdoctor.notify.threads import ThreadState
    from lagdoctor.state import incident_threads as t

    # Few threads are open at a time; the digest is not a column (the buttons carry only it).
    for data in conn.execute(sa.select(t.c.data).where(t.c.status == "open")).scalars():
        state = ThreadState.from_json(data)
        if state.key.digest() == digest:
            return state
    return None


def _control_click(click: Click, *, db, now: datetime) -> Outcome:
    from lagdoctor.notify import outbox
    from lagdoctor.state import incident_controls as c

    action = "ack" if click.action_id == ACK else "snooze"
    with db.transaction() as conn:
        state = _open_thread(conn, click.value)
        if state is None:
            _audit(db, conn, click, action, "unknown_target", "no open incident thread", now)
            return Outcome("unknown_target", "This incident is closed or unknown to lagdoctor; nothing was done.")
        outbox.lock_key(db, conn, state.key.lock_name())
        row = _controls(conn, click.value)
        if row is not None and row["root_message_id"] != state.root_message_id:
            row = None  # an earlier thread's: this one starts fresh
        values: dict[str, Any]
        if action == "ack":
            if row is not None and row["ack_at"] is not None and row["ack_severity"] == state.severity:
                text = f"Already acknowledged by {row['ack_by']} at {_when(row['ack_at'])}; nothing more was done."
                _audit(db, conn, click, action, "already", text, now)
                return Outcome("already", text)
            values = {"ack_by": click.who, "ack_at": now, "ack_severity": state.severity}
            posted = (f":eyes: *Acknowledged* by {escape_mrkdwn(click.who)}: no more updates in this thread "
                      f"until the severity changes (now {escape_mrkdwn(state.severity or '-')}). "
                      "A recovery is still posted.")
        else:
            until = _utc(row["snoozed_until"]) if row is not None else None
            if until is not None and now < until:
                text = f"Already snoozed by {row['snoozed_by']} until {_when(until)}; nothing more was done."
                _audit(db, conn, click, action, "already", text, now)
                return Outcome("already", text)
            until = now + SNOOZE
            values = {"snoozed_by": click.who, "snoozed_at": now, "snoozed_until": until}
            posted = (f":zzz: *Snoozed* by {escape_mrkdwn(click.who)} until {_when(until)}: no updates in this "
                      "thread until then. A recovery is still posted.")
        values.update(root_message_id=state.root_message_id, updated_at=now)
        if row is None:
            conn.execute(sa.delete(c).where(c.c.key_digest == click.value))
            conn.execute(sa.insert(c).values(key_digest=click.value, **values))
        else:
            conn.execute(sa.update(c).where(c.c.key_digest == click.value).values(**values))
        from lagdoctor.notify.incidents import _reply_target

        outbox.queue_message(db, conn, dedupe_key=f"click:{action}:{click.value}:{state.root_message_id}:{now.isoformat()}",
                             text=posted, blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": posted}}],
                             now=now, **_reply_target(state))
        _audit(db, conn, click, action, "done", None, now)
    return Outcome("done", None, posted)


def lift_acknowledgement(conn: sa.Connection, state: Any, finding: Mapping[str, Any]) -> None:
    """The severity moved away from the acknowledged one: the next acknowledgement is a new one."""
    from lagdoctor.state import incident_controls as c

    row = _controls(conn, state.key.digest())
    if row is not None and row["ack_at"] is not None and row["ack_severity"] != str(finding.get("severity", "")):
        conn.execute(sa.update(c).where(c.c.key_digest == state.key.digest())
                     .values(ack_by=None, ack_at=None, ack_severity=None))


# -- approvals

def _approval_click(click: Click, *, db, now: datetime, hitl: Any,
                    group_members: Callable[[str], Iterable[str]], environ: Mapping[str, str] | None) -> Outcome:
    from lagdoctor.notify import outbox
    from lagdoctor.state import slack_approvals as a

    action = "approve" if click.action_id == APPROVE else "reject"
    option = APPROVAL_ACTIONS[click.action_id]
    try:
        approval_id = int(click.value)
    except ValueError:
        approval_id = -1
    allowed = _is_approver(click, environ, group_members)
    with db.transaction() as conn:
        if not allowed:
            _audit(db, conn, click, action, "refused", "not in " + APPROVERS_ENV, now)
            log.warning("Slack: %s refused for %s (not an approver)", action, click.who)
            return Outcome("refused", "You are not allowed to approve or reject lagdoctor actions "
                                      f"(only the users and groups in {APPROVERS_ENV}); nothing was done.")
        outbox.lock_key(db, conn, f"approval:{approval_id}")
        rows = db.lock_row(conn, a, a.c.id == approval_id)
        if not rows:
            _audit(db, conn, click, action, "unknown_target", "no such approval", now)
            return Outcome("unknown_target", "lagdoctor knows no such approval; nothing was done.")
        row = rows[0]
        if row["status"] != WAITING:
            text = _already(row)
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        if hitl is None:
            _audit(db, conn, click, action, "failed", "no Airflow API client", now)
            return Outcome("failed", "lagdoctor cannot reach Airflow's API from here; answer in Airflow.")
        # Under the row's lock: a second click waits here, then finds the answer above.
        answer = hitl.respond(row["dag_id"], row["run_id"], row["task_id"], row["map_index"], option,
                              responder=click.who)
        if not answer.answered and not answer.conflict:
            _audit(db, conn, click, action, "failed", answer.error, now)
            return Outcome("failed", f"Airflow did not take the answer: {answer.error}. Nothing was recorded; "
                                     "try again, or answer in Airflow.")
        if answer.conflict and not answer.chosen_options:
            text = "Already answered in Airflow; nothing more was done."
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        status = APPROVED if "Approve" in answer.chosen_options else REJECTED
        # Ours: the Slack user (Airflow may name a service identity); else whom Airflow names.
        by = click.who if answer.answered else (answer.responded_by or "someone in Airflow")
        at = answer.responded_at or now
        conn.execute(sa.update(a).where(a.c.id == approval_id).values(status=status, answered_by=by, answered_at=at))
        if answer.conflict:  # answered in the Airflow UI (or by another API client) first
            text = _already({"status": status, "answered_by": by, "answered_at": at}) + " (answered in Airflow)"
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        verb = ":white_check_mark: *Approved*" if status == APPROVED else ":no_entry_sign: *Rejected*"
        what = "goes ahead" if status == APPROVED else "is skipped"
        posted = (f"{verb} by {escape_mrkdwn(click.who)} in Slack: `{escape_mrkdwn(row['task_id'])}` of run "
                  f"`{escape_mrkdwn(row['run_id'])}` {what}. Airflow records the answer from "
                  f"{escape_mrkdwn(answer.responded_by or by)}.")
        outbox.queue_message(db, conn, dedupe_key=f"approval:{approval_id}:{status}", text=posted,
                             blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": posted}}],
                             parent_id=row["message_id"], now=now)
        _audit(db, conn, click, action, "done", f"{status} as {by}", now)
    return Outcome("done", None, posted)


def _already(row: Mapping[str, Any]) -> str:
    return f"Already {row['status']} by {row['answered_by']} at {_when(row['answered_at'])}; nothing more was done."


def approval_row(db, approval_id: int) -> dict[str, Any] | None:
    from lagdoctor.state import slack_approvals as a

    with db.engine.connect() as conn:
        row = conn.execute(sa.select(a).where(a.c.id == approval_id)).mappings().first()
    return dict(row) if row is not None else None


def payload_from_form(body: bytes) -> dict[str, Any] | None:
    """Slack posts ``payload=<json>`` form-encoded; None when it is not that."""
    from urllib.parse import parse_qs

    try:
        values = parse_qs(body.decode("utf-8"), strict_parsing=False)
        payload = json.loads(values["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def utcnow() -> datetime:
    return datetime.now(timezone.utc)
