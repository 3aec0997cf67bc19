"""Slack buttons: approve (per target) / reject a waiting HITL task, Acknowledge, Snooze 1 h.

What a click does lives here (lagdoctor.web.slack_actions only verifies and
parses the HTTP request):

    buttons_enabled()            a public base URL and a signing secret: render buttons at all?
    verify_signature(...)        Slack's v0 scheme, 5-minute window, constant-time compare
    first_seen(db, keys, now)    replay guard (signature, and the click itself)
    handle_click(click, ...)     act once, audit, post who did what in the thread
    quiet_reason(conn, state, finding, now)   the coordinator asks before an update reply

Buttons carry only ids: an approval's row id and its random nonce
(``slack_approvals``, see `approval_ref`) or an incident key's digest. Nothing secret is ever put in a block, a log line or
a reply; the signing secret is read per request and never logged.

Who may click what: Approve / Reject only the Slack users (U…) and user
groups (S…) LAGDOCTOR_SLACK_APPROVERS names for the approval's DAG and the
cluster of every target it offers (any answer completes the task and rejects
what it does not approve; see `approver_rules`), and only when the answer can
be recorded in Airflow as that person (airflow_api: HITLClient.acts_as);
Acknowledge and Snooze anyone who sees the message (Slack only delivers clicks
from the channel's members).
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

from lagdoctor.notify.buttons import ACK, APPROVE, APPROVE_ALL, REJECT, REJECT_ALL, SNOOZE_ACTION
from lagdoctor.notify.redact import one_line
from lagdoctor.notify.render import approval_target_label
from lagdoctor.notify.templates import code_safe, escape_mrkdwn, mrkdwn_value
from lagdoctor.notify.threads import ThreadState, reply_target

log = logging.getLogger(__name__)

URL_PREFIX = "/lagdoctor-slack"  # beside /lagdoctor: a mount at /lagdoctor would not reach below it
ACTIONS_PATH = "/actions"
SIGNING_SECRET_ENV = "LAGDOCTOR_SLACK_SIGNING_SECRET"
SIGNING_SECRET_EXTRA = "signing_secret"
APPROVERS_ENV = "LAGDOCTOR_SLACK_APPROVERS"
SIGNATURE_WINDOW_S = 300
SNOOZE = timedelta(hours=1)
SEEN_KEEP = timedelta(minutes=10)  # longer than the window: an older replay fails the timestamp check

APPROVAL_ACTIONS = {APPROVE: "Approve", REJECT: "Reject"}
WAITING, APPROVED, REJECTED = "waiting", "approved", "rejected"
ANSWERING, SUPERSEDED = "answering", "superseded"
CLAIM_STALE = timedelta(minutes=2)  # a claim whose click died mid-call (Airflow's call times out in 10 s)
STALE_BUTTON = "This button no longer matches a waiting approval; nothing was done. Answer in Airflow."


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


@dataclass(frozen=True)
class ApproverRule:
    """Slack users/groups who may answer approvals of DAGs matching `dags` for clusters
    matching `clusters` (fnmatch patterns; "*" everywhere)."""
    dags: tuple[str, ...]
    clusters: tuple[str, ...]
    users: frozenset[str]
    groups: frozenset[str]

    def covers(self, dag_id: str, cluster: str) -> bool:
        from fnmatch import fnmatchcase

        return (any(fnmatchcase(dag_id, p) for p in self.dags)
                and any(fnmatchcase(cluster, p) for p in self.clusters))


def _ids(tokens: Iterable[Any]) -> tuple[frozenset[str], frozenset[str]]:
    ids = [str(t).strip() for t in tokens if str(t).strip()]
    return (frozenset(i for i in ids if i[0] in "UW"), frozenset(i for i in ids if i[0] == "S"))


def approver_rules(environ: Mapping[str, str] | None = None) -> list[ApproverRule]:
    """LAGDOCTOR_SLACK_APPROVERS, either form:

    - ``U123,S0ONCALL``: these approve for every DAG and cluster (as before);
    - JSON, a list of ``{"dags": ["kafka_lag_incident"], "clusters": ["kafka_prod*"],
      "approvers": ["U123", "S0ONCALL"]}`` (patterns fnmatch-style; a missing
      "dags"/"clusters" means every one).

    A malformed JSON value grants nobody (said in the log, never guessed)."""
    env = os.environ if environ is None else environ
    raw = (env.get(APPROVERS_ENV) or "").strip()
    if not raw.startswith("["):
        users, groups = _ids(raw.split(","))
        return [ApproverRule(("*",), ("*",), users, groups)] if users or groups else []
    try:
        data = json.loads(raw)
        rules = []
        for entry in data:
            def patterns(name: str) -> tuple[str, ...]:
                value = entry.get(name, ["*"])
                value = [value] if isinstance(value, str) else value
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"{name}: expected a list of patterns")
                return tuple(value)

            approvers_ = entry.get("approvers")
            if not isinstance(approvers_, list):
                raise ValueError("approvers: expected a list of Slack user/group ids")
            rules.append(ApproverRule(patterns("dags"), patterns("clusters"), *_ids(approvers_)))
        return rules
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("%s: unusable (%s); nobody may approve from Slack", APPROVERS_ENV, one_line(str(exc)))
        return []


def approvers(environ: Mapping[str, str] | None = None, *, dag_id: str = "*",
              cluster: str = "*") -> tuple[frozenset[str], frozenset[str]]:
    """(user ids, user-group ids) allowed to answer approvals of `dag_id` for `cluster`."""
    rules = [r for r in approver_rules(environ) if r.covers(dag_id, cluster)]
    return (frozenset().union(*(r.users for r in rules)), frozenset().union(*(r.groups for r in rules)))


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

def approval_ref(row: Mapping[str, Any]) -> str:
    """What an approval's buttons carry: "<row id>.<nonce>". The id finds the row, the nonce
    proves the button was posted for that row and not for an earlier one with the same id."""
    return f"{int(row['id'])}.{row['nonce']}"


def parse_approval_ref(value: str) -> tuple[int, str]:
    """(row id, nonce) from a button value "<id>.<nonce>[:<target>]"; (-1, "") when malformed."""
    ref = value.partition(":")[0]
    id_text, _, nonce = ref.partition(".")
    try:
        return int(id_text), nonce
    except ValueError:
        return -1, ""


def shown_value(value: str) -> str:
    """A button value for a log line or the audit: an approval's nonce left out."""
    ref, sep, which = value.partition(":")
    return ref.partition(".")[0] + sep + which


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
        """The first action of a ``block_actions`` payload; None for anything else,
        a field of the wrong JSON type included (a list for ``user``, say)."""
        def obj(value: Any) -> Mapping[str, Any] | None:
            return value if isinstance(value, Mapping) else ({} if value is None else None)

        def text(value: Any) -> str | None:
            return value if isinstance(value, str) else ("" if value is None else None)

        actions = payload.get("actions") if isinstance(payload, Mapping) else None
        if payload.get("type") != "block_actions" or not isinstance(actions, list) or not actions:
            return None
        action, user = obj(actions[0]), obj(payload.get("user"))
        container, message, channel = obj(payload.get("container")), obj(payload.get("message")), \
            obj(payload.get("channel"))
        if None in (action, user, container, message, channel):
            return None
        fields = {"user_id": text(user.get("id")), "user_name": text(user.get("username") or user.get("name")),
                  "action_id": text(action.get("action_id")), "value": text(action.get("value")),
                  "action_ts": text(action.get("action_ts")),
                  "channel_id": text(channel.get("id") or container.get("channel_id")),
                  "message_ts": text(container.get("message_ts") or message.get("ts")),
                  "thread_ts": text(container.get("thread_ts") or message.get("thread_ts"))}
        if any(v is None for v in fields.values()):
            return None
        for optional in ("channel_id", "message_ts", "thread_ts"):
            fields[optional] = fields[optional] or None
        return cls(**fields)

    def replay_key(self) -> str:
        return f"click:{self.user_id}:{self.action_id}:{self.value}:{self.action_ts}"


@dataclass
class Outcome:
    outcome: str  # done | already | refused | superseded | failed | unknown_target
    ephemeral: str | None = None  # what only the clicker sees
    posted: str | None = None  # what the thread sees


def _when(value: datetime | None) -> str:
    value = _utc(value)
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "-"


def _audit(db, conn, click: Click, action: str, outcome: str, detail: str | None, now: datetime) -> None:
    from lagdoctor.state import slack_interactions

    conn.execute(sa.insert(slack_interactions).values(
        at=now, user_id=click.user_id[:64], user_name=click.user_name[:255] or None, action=action[:64],
        target=shown_value(click.value)[:255], outcome=outcome, detail=(detail or None) and detail[:1000]))


def _is_approver(click: Click, environ: Mapping[str, str] | None,
                 group_members: Callable[[str], Iterable[str]], *, dag_id: str = "*",
                 clusters: Iterable[str] = ("*",)) -> bool:
    """Whether the clicker may answer for `dag_id` on every one of `clusters`."""
    members: dict[str, bool] = {}

    def in_group(group: str) -> bool:
        if group not in members:
            try:
                members[group] = click.user_id in set(group_members(group))
            except Exception as exc:  # a group Slack will not list: fail closed for that group
                log.warning("Slack: cannot list user group %s: %s", group, one_line(exc))
                members[group] = False
        return members[group]

    for cluster in list(clusters) or ["*"]:
        users, groups = approvers(environ, dag_id=dag_id, cluster=cluster)
        if click.user_id not in users and not any(in_group(g) for g in sorted(groups)):
            return False
    return True


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
            posted = (f":eyes: *Acknowledged* by {mrkdwn_value(click.who)}: no more updates in this thread "
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
            posted = (f":zzz: *Snoozed* by {mrkdwn_value(click.who)} until {_when(until)}: no updates in this "
                      "thread until then. A recovery is still posted.")
        values.update(root_message_id=state.root_message_id, updated_at=now)
        if row is None:
            conn.execute(sa.delete(c).where(c.c.key_digest == click.value))
            conn.execute(sa.insert(c).values(key_digest=click.value, **values))
        else:
            conn.execute(sa.update(c).where(c.c.key_digest == click.value).values(**values))
        outbox.queue_message(db, conn, dedupe_key=f"click:{action}:{click.value}:{state.root_message_id}:{now.isoformat()}",
                             text=posted, blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": posted}}],
                             now=now, **reply_target(state))
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

def _chosen(click: Click, row: Mapping[str, Any]) -> tuple[list[str], list[Mapping[str, Any]]] | None:
    """(the HITL options this click answers with, the targets it approves); None for a
    button value this row does not know. Legacy rows (no targets): Approve / Reject."""
    targets = row.get("targets")
    if targets is None:
        return [APPROVAL_ACTIONS[click.action_id]], []
    offered = [t for t in targets if t.get("option")]
    if click.action_id == REJECT:
        return [REJECT_ALL], []
    _, _, which = click.value.partition(":")
    if which == APPROVE_ALL:
        picked = offered
    else:
        picked = [t for t in offered if str(t["option"]).split(":", 1)[0] == f"Approve {which}"]
    return ([str(t["option"]) for t in picked], picked) if picked else None


def _approval_click(click: Click, *, db, now: datetime, hitl: Any,
                    group_members: Callable[[str], Iterable[str]], environ: Mapping[str, str] | None) -> Outcome:
    """Claim, commit, call Airflow, then record: no transaction (no SQLite write lock)
    is held across the HTTP call; a second click meanwhile finds the claim."""
    from lagdoctor.notify import outbox
    from lagdoctor.notify.airflow_api import airflow_users
    from lagdoctor.state import slack_approvals as a

    action = "approve" if click.action_id == APPROVE else "reject"
    approval_id, nonce = parse_approval_ref(click.value)

    def audited(outcome: str, detail: str | None, text: str | None, posted: str | None = None) -> Outcome:
        with db.transaction() as conn:
            _audit(db, conn, click, action, outcome, detail, now)
        return Outcome(outcome, text, posted)

    with db.engine.connect() as conn:
        found = conn.execute(sa.select(a).where(a.c.id == approval_id)).mappings().first()
        # A newer try of the same task asked again: this message's buttons are history,
        # whatever was answered on it ("already approved" would credit the old answer).
        newer = found is not None and conn.execute(sa.select(a.c.id).where(
            a.c.dag_id == found["dag_id"], a.c.run_id == found["run_id"], a.c.task_id == found["task_id"],
            a.c.map_index == found["map_index"], a.c.try_number > found["try_number"]).limit(1)).first() is not None
    row = dict(found) if found is not None else None
    # The id alone may name another, current approval (ids restart in a recreated database):
    # the button must carry this row's nonce. Nothing about the row is said otherwise.
    if row is None or not nonce or not hmac.compare_digest(str(row.get("nonce") or "").encode(), nonce.encode()):
        log.warning("Slack: %s by %s with a button matching no waiting approval", action, click.who)
        return audited("unknown_target", "no approval matches this button (id or nonce)", STALE_BUTTON)
    if newer:
        row["status"] = SUPERSEDED
    picked = _chosen(click, row)
    # Who may answer: approvers of this DAG for every cluster the answer touches. Any answer
    # completes the task, and so rejects every offered target not approved: it touches them all.
    # Slack's user-group lookups happen here, outside any transaction.
    offered = [t for t in (row.get("targets") or []) if t.get("option")]
    clusters = sorted({str(t.get("cluster") or "") for t in offered}) or ["*"]
    if not _is_approver(click, environ, group_members, dag_id=row["dag_id"], clusters=clusters):
        mine = sorted({str(t.get("cluster") or "") for t in (picked[1] if picked else [])})
        if mine and _is_approver(click, environ, group_members, dag_id=row["dag_id"], clusters=mine):
            others = [c for c in clusters if c not in mine]
            log.warning("Slack: %s refused for %s (would reject targets on %s, not theirs)", action, click.who,
                        ", ".join(others))
            return audited("refused", f"would reject targets on {', '.join(others)}, not an approver there "
                                      f"({APPROVERS_ENV})",
                           f"Approving only these would reject the other groups on {', '.join(others)}, which you "
                           f"are not an approver for ({APPROVERS_ENV}): answer in Airflow; nothing was done.")
        log.warning("Slack: %s refused for %s (not an approver for %s on %s)", action, click.who, row["dag_id"],
                    ", ".join(clusters))
        return audited("refused", f"not an approver for DAG {row['dag_id']} on {', '.join(clusters)} "
                                  f"({APPROVERS_ENV})",
                       f"You are not an approver for {row['dag_id']} on {', '.join(clusters)} "
                       f"({APPROVERS_ENV}); nothing was done.")
    if row["status"] == SUPERSEDED:
        return audited("superseded", "a newer request replaced it",
                       "Superseded by a newer request for this task (it was cleared and runs again): "
                       "answer the newest message; nothing was done.")
    if picked is None:
        return audited("unknown_target", f"no such choice {shown_value(click.value)!r}",
                       "lagdoctor knows no such choice for this approval; nothing was done.")
    if hitl is None:
        return audited("failed", "no Airflow API client",
                       "lagdoctor cannot reach Airflow's API from here; answer in Airflow.")
    airflow_user = airflow_users(environ).get(click.user_id)
    if not hitl.acts_as(airflow_user):
        why = ("is mapped to no Airflow user" if not airflow_user
               else f"maps to Airflow user {airflow_user}, not the service identity lagdoctor answers as")
        return audited("refused", f"cannot answer as this user in Airflow: Slack user {why}",
                       f"Airflow cannot record this answer as you (your Slack user {why}); "
                       "answer in Airflow instead. Nothing was done.")
    options, approved = picked
    # 1. claim (committed at once)
    with db.transaction() as conn:
        outbox.lock_key(db, conn, f"approval:{approval_id}")
        current = dict(db.lock_row(conn, a, a.c.id == approval_id)[0])
        claimed_at = _utc(current.get("claimed_at"))
        if current["status"] == ANSWERING and claimed_at is not None and now - claimed_at < CLAIM_STALE:
            text = f"Being answered by {current['claimed_by']} right now; nothing more was done."
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        if current["status"] == SUPERSEDED:
            _audit(db, conn, click, action, "superseded", "a newer request replaced it", now)
            return Outcome("superseded", "Superseded by a newer request for this task; nothing was done.")
        if current["status"] not in (WAITING, ANSWERING):
            text = _already(current)
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        conn.execute(sa.update(a).where(a.c.id == approval_id)
                     .values(status=ANSWERING, claimed_by=click.who, claimed_at=now))
    # 2. the call, with no transaction open
    answer = hitl.respond(row["dag_id"], row["run_id"], row["task_id"], row["map_index"], options,
                          responder=airflow_user or click.who)
    # 3. record
    with db.transaction() as conn:
        outbox.lock_key(db, conn, f"approval:{approval_id}")
        if not answer.answered and not answer.conflict:
            conn.execute(sa.update(a).where(a.c.id == approval_id, a.c.status == ANSWERING,
                                            a.c.claimed_by == click.who)
                         .values(status=WAITING, claimed_by=None, claimed_at=None))
            _audit(db, conn, click, action, "failed", answer.error, now)
            return Outcome("failed", f"Airflow did not take the answer: {answer.error}. Nothing was recorded; "
                                     "try again, or answer in Airflow.")
        if answer.conflict and not answer.chosen_options:
            conn.execute(sa.update(a).where(a.c.id == approval_id, a.c.status == ANSWERING)
                         .values(status=WAITING, claimed_by=None, claimed_at=None))
            text = "Already answered in Airflow; nothing more was done."
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        chosen = list(answer.chosen_options)
        status = APPROVED if any(o == "Approve" or o.startswith("Approve ") for o in chosen) \
            and REJECT_ALL not in chosen else REJECTED
        # Ours: the Slack user; Airflow names whom it recorded.
        by = click.who if answer.answered else (answer.responded_by or "someone in Airflow")
        recorded_as = answer.responded_by or airflow_user
        at = answer.responded_at or now
        conn.execute(sa.update(a).where(a.c.id == approval_id).values(
            status=status, answered_by=by, answered_at=at, airflow_user=recorded_as, chosen=chosen,
            claimed_by=None, claimed_at=None))
        if answer.conflict:  # answered in the Airflow UI (or by another API client) first
            text = _already({"status": status, "answered_by": by, "answered_at": at}) + " (answered in Airflow)"
            _audit(db, conn, click, action, "already", text, now)
            return Outcome("already", text)
        posted = _answer_text(click, row, status, approved, recorded_as)
        outbox.queue_message(db, conn, dedupe_key=f"approval:{approval_id}:{status}", text=posted,
                             blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": posted}}],
                             parent_id=row["message_id"], now=now)
        _audit(db, conn, click, action, "done", f"{status} as {by} (Airflow: {recorded_as or '-'}): "
                                                f"{', '.join(chosen)}", now)
    return Outcome("done", None, posted)


def _answer_text(click: Click, row: Mapping[str, Any], status: str, approved: list[Mapping[str, Any]],
                 recorded_as: str | None) -> str:
    """The thread's line: who answered (Slack and Airflow), and which targets go ahead."""
    verb = ":white_check_mark: *Approved*" if status == APPROVED else ":no_entry_sign: *Rejected*"
    if row.get("targets") is None:
        what = "goes ahead" if status == APPROVED else "is skipped"
    elif status == APPROVED:
        offered = [t for t in row["targets"] if t.get("option")]
        names = ", ".join(approval_target_label(t) if len(t.get("shared_by") or []) > 1 else
                          f"`{escape_mrkdwn(code_safe(t.get('group_id')))}` on {mrkdwn_value(t.get('cluster'))}"
                          for t in approved[:10]) + (f" and {len(approved) - 10} more" if len(approved) > 10 else "")
        rest = len(offered) - len(approved)
        what = f"goes ahead for {names}" + (f"; the other {rest} are rejected" if rest else "")
    else:
        what = "is rejected for every group"
    return (f"{verb} by {mrkdwn_value(click.who)} in Slack: `{escape_mrkdwn(code_safe(row['task_id']))}` of run "
            f"`{escape_mrkdwn(code_safe(row['run_id']))}` {what}. Airflow records the answer as "
            f"{mrkdwn_value(recorded_as or click.who)}.")


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
