"""run_action: the one door every remediation goes through.

Order of checks for a call (a DAG task calls this; nothing else runs actions):

  1. idempotency   a final record for (run, incident, action, dry_run) is returned as is:
                   a retried task neither acts nor logs twice. A ``rejected`` or
                   ``blocked`` one is final only for the approval answer it was
                   decided under (`approval_token`): a re-run approval that says yes
                   is acted on; ``executed``/``noop`` stay final whatever the answer.
  2. guardrails    deny/allow lists, cooldown, hourly cap (guardrails.py),
                   also in dry runs so a dry run says what a real run would meet.
  3. prepare       what the action would do (pure).
  4. dry run       stop here: record ``dry_run`` (``blocked`` for an irreversible
                   action the finding already rules out, as a real run would be).
                   A dry run never waits for a human, takes no lease and counts
                   against nothing.
  5. approval      irreversible actions (and those the config or runbook marks)
                   need ``approved=True``: ``None`` records ``awaiting_approval``
                   (the DAG then asks through a HITL ApprovalOperator and calls
                   again), ``False`` records ``rejected``.
  6. resolve       read live state, fix absolute targets.
  7. claim         ONE transaction in the state database: take the lease on the
                   action's target, check idempotency and the guardrails again,
                   record ``started``. Another run holding the lease gets
                   ``blocked`` ("another run (<run id>) is acting on <target>");
                   from here on the attempt counts against cooldown and cap.
  8. apply         ``executed`` / ``noop``; a failure is ``failed`` with a one-line,
                   secret-free reason and re-raised as RemediationFailed so the
                   task fails and Airflow may retry it (a retry of the same run
                   resumes the ``started`` plan: same restartedAt, same offset).
                   The outcome is written and the lease released together.

Claims are serialized (SQLite: BEGIN IMMEDIATE; PostgreSQL: a transaction-level
advisory lock), so N runs on N workers cannot all pass the hourly cap. A
worker that dies after 7 leaves ``started`` without an outcome: it keeps
counting, and its lease keeps other runs off the target for
``lease_minutes``.

Remediation never notifies: the returned record (a small JSON-able dict) is what
the DAG hands to ``lagdoctor.notify.post_action_result``.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import sqlalchemy as sa

from lagdoctor.notify.redact import one_line, secret_values
from lagdoctor.remediation.actions import ActionBlocked, ActionContext, OutcomeUnknown
from lagdoctor.remediation.audit import FINAL_STATUSES, ActionLog
from lagdoctor.remediation.config import RemediationConfig
from lagdoctor.remediation.guardrails import check_guardrails, group_target
from lagdoctor.remediation.registry import get_action
from lagdoctor.state import leases

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key (a bigint) serializing claims across workers: "lagdclai".
CLAIM_LOCK_ID = 0x6C61_6764_636C_6169


class RemediationFailed(RuntimeError):
    """An action failed while changing something; the message is one safe line."""


def idempotency_key(run_id: str, finding: Mapping[str, Any], action: str) -> str:
    incident = [finding.get(k, "") for k in ("cluster", "group_id", "topic", "diagnosis")]
    raw = json.dumps([run_id, incident, action], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


# Outcomes that hold only for the approval answer they were decided under.
APPROVAL_BOUND = frozenset({"rejected", "blocked"})


def approval_token(approval: Mapping[str, Any] | None) -> str | None:
    """Which answer of the approval task a record was decided under: the task's try and
    when it was answered (None: nobody answered)."""
    if not approval:
        return None
    return json.dumps([approval.get("try"), approval.get("at")])


def _decided(records: list[dict[str, Any]], token: str | None) -> tuple[dict[str, Any] | None,
                                                                        dict[str, Any] | None]:
    """(the final record a call under approval `token` returns, else the `started` attempt it
    resumes) from one key's records, oldest first. A rejected/blocked record from another
    answer ends its attempt but is not this call's answer."""
    for r in reversed(records):
        status = r.get("status")
        if status in FINAL_STATUSES and (status not in APPROVAL_BOUND
                                         or approval_token(r.get("approval")) == token):
            return r, None
    last_final = max((i for i, r in enumerate(records) if r.get("status") in FINAL_STATUSES), default=-1)
    started = next((r for r in reversed(records[last_final + 1:]) if r.get("status") == "started"), None)
    return None, started


def lease_key(target: str) -> str:
    return f"remediation: {target}"[:768]


def needs_approval(name: str, *, dry_run: bool, config: RemediationConfig | None = None,
                   guardrails: Mapping[str, Any] | None = None) -> bool:
    """Whether a DAG must put an ApprovalOperator before this action. Never in a dry run."""
    if dry_run:
        return False
    action = get_action(name)
    if not action.changes_state:
        return False
    config = config or RemediationConfig.from_env()
    return bool(action.requires_approval or name in config.require_approval
                or (guardrails or {}).get("require_approval"))


def preview_action(
    name: str,
    finding: Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None = None,
    guardrails: Mapping[str, Any] | None = None,
    settings: Any = None,
    config: RemediationConfig | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """What approving ``name`` for this finding would do, for the approval form:
    ``does`` (the action's describe() of its prepared plan), ``target``,
    ``irreversible``, ``warning``, and ``blocked``: why it would not run as things
    stand (a guardrail or the plan itself), else None. Reads the audit log for
    the guardrails; never touches the cluster or Kubernetes."""
    action = get_action(name)
    config = config or RemediationConfig.from_env()
    now = now or datetime.now(timezone.utc)
    ctx = ActionContext(finding=finding, config=config, params=dict(params or {}), now=now, kafka_config=dict)
    target = action.target(ctx) or group_target(ctx.cluster, ctx.group_id, name)
    out = {"action": name, "cluster": ctx.cluster, "group_id": ctx.group_id, "topic": ctx.topic, "target": target,
           "irreversible": action.irreversible, "warning": action.warning, "does": action.summary, "blocked": None}
    # In run_action's order: the guardrails first, then the plan.
    if action.changes_state:
        effective = _effective_config(config, guardrails or {})
        audit = ActionLog.from_settings(settings)
        verdict = check_guardrails(cluster=ctx.cluster, group_id=ctx.group_id, action=name, config=effective,
                                   history=audit.attempts_since(now - _max_window(effective)), now=now, target=target)
        if not verdict.allowed:
            out["blocked"] = f"{verdict.rule}: {verdict.reason}"
    try:
        out["does"] = action.describe(action.prepare(ctx))
    except ActionBlocked as exc:
        out["blocked"] = out["blocked"] or one_line(str(exc))
    if not out["blocked"] and action.changes_state:
        known = action.blocked_by_finding(ctx)
        out["blocked"] = one_line(known) if known else None
    return out


def run_action(
    name: str,
    finding: Mapping[str, Any],
    *,
    run_id: str,
    dry_run: bool = True,
    approved: bool | None = None,
    params: Mapping[str, Any] | None = None,
    guardrails: Mapping[str, Any] | None = None,
    settings: Any = None,
    config: RemediationConfig | None = None,
    now: datetime | None = None,
    kafka_config: Mapping[str, Any] | None = None,
    approval_by: Mapping[str, Any] | None = None,
    not_offered: str | None = None,
) -> dict[str, Any]:
    """Run (or dry-run) one registered action for one finding; returns its audit record.

    `approval_by` ({"by", "at", "chosen", "try"}: who answered the approval task's
    try in Airflow) goes into the record as `approval`. `not_offered`: why the
    approval form did not offer this target (blocked when asked): it is recorded
    `blocked` with that reason, never acted on nor called rejected.

    ``params``/``guardrails`` come from the runbook's plan; ``kafka_config``
    overrides the cluster connection's client config (tests); ``now`` defaults
    to UTC now and also times the lease.
    """
    action = get_action(name)
    config = config or RemediationConfig.from_env()
    now = now or datetime.now(timezone.utc)
    params = dict(params or {})
    guardrails = dict(guardrails or {})
    audit = ActionLog.from_settings(settings)
    key = idempotency_key(run_id, finding, name)

    _kafka: dict[str, Any] = {}

    def resolve_kafka() -> dict[str, Any]:
        if not _kafka:
            if kafka_config is not None:
                _kafka.update(kafka_config)
            else:
                from lagdoctor.remediation.kafka_ops import kafka_config_for

                _kafka.update(kafka_config_for(str(finding.get("cluster"))))
        return _kafka

    ctx = ActionContext(finding=finding, config=config, params=params, now=now, kafka_config=resolve_kafka,
                        idempotency_key=key)
    approval = needs_approval(name, dry_run=False, config=config, guardrails=guardrails)
    target = action.target(ctx) or group_target(ctx.cluster, ctx.group_id, name)
    base = {
        "run_id": run_id, "idempotency_key": key, "action": name,
        "cluster": ctx.cluster, "group_id": ctx.group_id, "topic": ctx.topic,
        "diagnosis": finding.get("diagnosis"), "dry_run": dry_run,
        "irreversible": action.irreversible, "requires_approval": approval and not dry_run,
        "warning": action.warning, "target": target,
        **({"approval": dict(approval_by)} if approval_by else {}),
    }
    effective = _effective_config(config, guardrails)

    def record(status: str, message: str, plan: Mapping[str, Any] | None = None, *,
               conn: sa.Connection | None = None, **extra: Any) -> dict[str, Any]:
        rec = {**base, "ts": now.isoformat(), "status": status, "message": message,
               "plan": dict(plan or {}), **extra}
        audit.append(rec, conn=conn)
        log.info("remediation %s %s for group %s: %s", name, status, ctx.group_id, message)
        return rec

    def guardrail_verdict(conn: sa.Connection | None = None):
        history = audit.attempts_since(now - _max_window(effective), conn=conn)
        return check_guardrails(cluster=ctx.cluster, group_id=ctx.group_id, action=name, config=effective,
                                history=history, now=now, target=target)

    # 1. idempotency
    token = approval_token(approval_by)
    final, started = _decided([r for r in audit.for_key(key) if r.get("dry_run") == dry_run], token)
    if final is not None:
        return final
    if not_offered is not None and action.changes_state and not dry_run:
        # Nobody could approve it: blocked for the form's reason, even when the guard has cleared since.
        return record("blocked", "not offered for approval, blocked when asked: " + one_line(not_offered),
                      rule="not_offered")

    claimed = False
    holder = f"{key}|{run_id}"[:255]  # the lease says which run, and which of its actions, acts
    try:
        # 2. guardrails (advice changes nothing, so it is not rationed). For a
        # real run this is an early answer; the claim checks again under lock.
        if action.changes_state and started is None:
            if not dry_run:
                shared = _done_in_this_run(audit, run_id, name, target, key, now - _max_window(effective))
                if shared is not None:
                    # One change covers every finding on a shared target (a topic, a Deployment):
                    # said, not blocked.
                    same_group = shared.get("group_id") == ctx.group_id
                    whose = f"topic {shared.get('topic')}" if same_group else f"group {shared.get('group_id')}"
                    return record("noop", f"done in this run for {whose}: {target} is shared, its change "
                                          f"covers this {'topic' if same_group else 'group'} too",
                                  rule="shared_target")
            verdict = guardrail_verdict()
            if not dry_run and verdict.rule not in ("deny_list", "allow_list"):
                # Read after the history: a run in flight is named as such, even
                # when its `started` already shows in the cooldown.
                other = audit.db.lease_holder(lease_key(target), now=now)
                if other is not None and other != holder:
                    return record("blocked", "lease: " + _lease_reason(audit, other, target, run_id), rule="lease")
            if not verdict.allowed:
                return record("blocked", f"{verdict.rule}: {verdict.reason}", rule=verdict.rule)

        # 3. prepare
        plan = started["plan"] if started else action.prepare(ctx)
        if not action.changes_state:
            outcome = action.apply(ctx, plan)
            return record(outcome.status, outcome.message, plan, detail=dict(outcome.detail))
        # 4. dry run: an irreversible action the finding already rules out says so, as a real run would
        if dry_run:
            known = action.blocked_by_finding(ctx) if action.irreversible else None
            if known:
                return record("blocked", one_line(known), plan, rule="action")
            return record("dry_run", "would " + action.describe(plan), plan)
        # 5. approval
        if approval and approved is not True:
            # What the finding already shows would block it: said, not proposed nor "rejected"
            # (the approval form did not offer it). An approved one goes on to resolve(),
            # which checks the live state instead.
            known = action.blocked_by_finding(ctx)
            if known:
                return record("blocked", one_line(known), plan, rule="action")
        if approval and approved is None:
            return record("awaiting_approval", "needs approval: " + action.describe(plan), plan)
        if approval and approved is False:
            return record("rejected", "rejected by a human: " + action.describe(plan), plan)
        # 6. resolve
        if started is None:
            plan = action.resolve(ctx, dict(plan))
        # 7. claim: lease, idempotency, guardrails and `started` in one transaction
        with audit.db.transaction() as conn:
            _serialize_claims(audit, conn)
            ttl = timedelta(minutes=config.lease_minutes)
            if not audit.db.acquire_lease(lease_key(target), holder, ttl, now=now, conn=conn):
                other = conn.execute(sa.select(leases.c.holder).where(leases.c.key == lease_key(target))).scalar()
                reason = _lease_reason(audit, other or "", target, run_id, conn=conn)
                return record("blocked", f"lease: {reason}", plan, conn=conn, rule="lease")
            claimed = True
            final, own = _decided([r for r in audit.for_key(key, conn=conn) if not r.get("dry_run")], token)
            if final is not None:  # the same run finished meanwhile (a duplicate attempt)
                audit.db.release_lease(lease_key(target), holder, conn=conn)
                claimed = False
                return final
            if own is not None:
                plan = own["plan"]  # resume this run's plan, never a new one
            else:
                verdict = guardrail_verdict(conn)
                if not verdict.allowed:
                    audit.db.release_lease(lease_key(target), holder, conn=conn)
                    claimed = False
                    return record("blocked", f"{verdict.rule}: {verdict.reason}", plan, conn=conn,
                                  rule=verdict.rule)
                record("started", action.describe(plan), plan, conn=conn)
        # 8. apply
        outcome = action.apply(ctx, plan)
        return _finish(audit, target, holder, claimed, record, outcome.status, outcome.message, plan,
                       detail=dict(outcome.detail))
    except ActionBlocked as exc:
        return _finish(audit, target, holder, claimed, record, "blocked",
                       one_line(str(exc), secret_values(_kafka)), rule="action")
    except Exception as exc:
        message = one_line(_describe_error(exc), secret_values(_kafka))
        _finish(audit, target, holder, claimed, record, "failed", message,
                may_have_changed=_may_have_changed(exc))
        raise RemediationFailed(f"{name} failed for group {ctx.group_id}: {message}") from None


def _done_in_this_run(audit: ActionLog, run_id: str, action: str, target: str, key: str,
                      since: datetime) -> dict[str, Any] | None:
    """The record of `action` on `target` this run already executed for another finding (another
    group on the topic, the same group on another topic): one change covers both. None
    otherwise (one in flight is the lease's to judge)."""
    for rec in audit.attempts_since(since):
        if (rec.get("run_id") == run_id and rec.get("action") == action and rec.get("target") == target
                and rec.get("idempotency_key") != key and rec.get("outcome") == "executed"):
            return rec
    return None


def _finish(audit: ActionLog, target: str, holder: str, claimed: bool, record: Any, status: str,
            message: str, plan: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """Write the outcome and give the target back, together."""
    if not claimed:
        return record(status, message, plan, **extra)
    with audit.db.transaction() as conn:
        rec = record(status, message, plan, conn=conn, **extra)
        audit.db.release_lease(lease_key(target), holder, conn=conn)
    return rec


def _effective_config(config: RemediationConfig, guardrails: Mapping[str, Any]) -> RemediationConfig:
    """The config with the runbook's cooldown: runbooks may only lengthen it, never shorten it."""
    if guardrails.get("cooldown_minutes") is None:
        return config
    return replace(config, cooldown_minutes=max(config.cooldown_minutes, float(guardrails["cooldown_minutes"])))


def _serialize_claims(audit: ActionLog, conn: sa.Connection) -> None:
    """One claim at a time across workers: the hourly cap spans every target.
    SQLite's BEGIN IMMEDIATE already holds the database's write lock."""
    if audit.db.dialect == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": CLAIM_LOCK_ID})


def _lease_reason(audit: ActionLog, other: str, target: str, run_id: str,
                  conn: sa.Connection | None = None) -> str:
    """Who holds the target, from the lease holder "<idempotency key>|<run id>"."""
    other_key, _, other_run = other.partition("|")
    if other_run and other_run != run_id:
        return f"another run ({other_run}) is acting on {target}"
    first = next(iter(audit.for_key(other_key, conn=conn)), None) if other_key else None
    if first is not None:
        return (f"another action of this run ({first.get('action')} for group {first.get('group_id')}) "
                f"is acting on {target}")
    return f"another run is acting on {target}"


def _may_have_changed(exc: Exception) -> bool:
    """False only when the failure proves nothing changed: the API answered with a refusal."""
    status = getattr(exc, "status", None)
    return not (isinstance(status, int) and 400 <= status < 500)


def _max_window(config: RemediationConfig) -> timedelta:
    return max(timedelta(hours=1), timedelta(minutes=config.cooldown_minutes))


def _describe_error(exc: Exception) -> str:
    if isinstance(exc, OutcomeUnknown):
        return str(exc)
    # kubernetes' ApiException prints headers and the whole body over many lines.
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason") and hasattr(exc, "body"):
        detail = ""
        try:
            detail = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"Kubernetes API {status} {exc.reason}" + (f": {detail}" if detail else "")
    return f"{type(exc).__name__}: {exc}"
