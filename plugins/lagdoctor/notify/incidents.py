"""The coordinator: one finding -> post, reply, recovery or nothing, in its thread.

DAG tasks call these three functions; each returns a small JSON-able summary
(safe for XCom) and is safe to retry within one run.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Mapping

from lagdoctor.notify import render
from lagdoctor.notify.slack import Sender, slack_sender
from lagdoctor.notify.threads import HEALTHY, IncidentKey, ThreadState, ThreadStore, decide, remember

log = logging.getLogger(__name__)


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(timezone.utc)


def post_or_update_incident(
    finding: Mapping[str, Any],
    plan: Mapping[str, Any] | None = None,
    *,
    run_id: str,
    sender: Sender | None = None,
    settings: Any = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Post a new incident thread, reply when it changed, or close it on recovery.

    ``plan`` is ``lagdoctor.runbooks.Plan.as_dict()`` for this finding (next
    steps and proposed actions); ``None`` posts without them.
    Returns ``{"decision": "posted"|"replied"|"recovered"|"unchanged"|"healthy", "threads": [...]}``.
    """
    from lagdoctor.settings import Settings

    settings = settings or Settings.from_env()
    store = ThreadStore(settings.incidents_root)
    stamp = _now(now).isoformat()
    key = IncidentKey.of(finding)

    if finding.get("diagnosis") == HEALTHY:
        open_threads = store.open_threads(key.cluster, key.group_id, key.topic)
        if not open_threads:
            return {"decision": "healthy", "threads": []}
        sender = sender or slack_sender(settings=settings)
        for state in open_threads:
            opened = datetime.fromisoformat(state.opened_at) if state.opened_at else None
            duration = (_now(now) - opened).total_seconds() if opened else None
            msg = render.render_recovery(finding, diagnosis=state.key.diagnosis, duration_seconds=duration)
            sender.post(text=msg["text"], blocks=msg["blocks"], thread_ts=state.thread_ts, channel=state.channel)
            state.status, state.closed_at, state.replies = "closed", stamp, state.replies + 1
            remember(state, finding, run_id=run_id, now=stamp)
            store.save(state)
        return {"decision": "recovered", "threads": [_thread_ref(s) for s in open_threads]}

    state = store.get(key)
    decision = decide(finding, state, run_id=run_id)
    if decision.kind == "nothing":
        return {"decision": "unchanged", "threads": [_thread_ref(state)] if state else []}
    sender = sender or slack_sender(settings=settings)
    if decision.kind == "post":
        msg = render.render_incident(finding, plan, run_id=run_id)
        posted = sender.post(text=msg["text"], blocks=msg["blocks"])
        state = ThreadState(key=key, channel=posted.channel, thread_ts=posted.ts, opened_at=stamp)
        result = "posted"
    else:
        assert state is not None
        msg = render.render_update(finding, decision.changes, run_id=run_id)
        sender.post(text=msg["text"], blocks=msg["blocks"], thread_ts=state.thread_ts, channel=state.channel)
        state.replies += 1
        result = "replied"
    store.save(remember(state, finding, run_id=run_id, now=stamp))
    return {"decision": result, "threads": [_thread_ref(state)], "changes": list(decision.changes)}


def post_incident_run(
    items: list[Mapping[str, Any]],
    *,
    run_id: str,
    scope: str,
    sender: Sender | None = None,
    settings: Any = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A manual incident run: one Slack thread for the whole run.

    ``items`` are ``{"finding", "plan"}`` pairs. The first call posts a header
    naming the scope and every finding; each problem then goes into that thread
    in full, and becomes its incident key's thread, so action results and later
    sweeps reply there too. Retrying the task posts nothing twice.
    """
    import json

    from lagdoctor.settings import Settings

    settings = settings or Settings.from_env()
    store = ThreadStore(settings.incidents_root)
    runs = ThreadStore(f"{settings.incidents_root.rstrip('/')}/runs").root
    run_file = runs / f"{_safe_name(run_id)}.json"
    stamp = _now(now).isoformat()
    state = json.loads(run_file.read_text()) if run_file.exists() else None
    problems = [i for i in items if i["finding"].get("diagnosis") != HEALTHY]
    if state is None:
        sender = sender or slack_sender(settings=settings)
        msg = render.render_run_header([i["finding"] for i in items], scope=scope, run_id=run_id)
        posted = sender.post(text=msg["text"], blocks=msg["blocks"])
        state = {"channel": posted.channel, "thread_ts": posted.ts, "posted": []}
        _write_json(run_file, state)
    for item in problems:
        finding = item["finding"]
        key = IncidentKey.of(finding)
        marker = key.filename()
        if marker in state["posted"]:
            continue
        sender = sender or slack_sender(settings=settings)
        msg = render.render_incident(finding, item.get("plan"), run_id=run_id)
        sender.post(text=msg["text"], blocks=msg["blocks"], thread_ts=state["thread_ts"], channel=state["channel"])
        thread = ThreadState(key=key, channel=state["channel"], thread_ts=state["thread_ts"], opened_at=stamp)
        store.save(remember(thread, finding, run_id=run_id, now=stamp))
        state["posted"].append(marker)
        _write_json(run_file, state)
    return {"decision": "posted", "thread_ts": state["thread_ts"], "problems": len(problems),
            "findings": len(items)}


def _safe_name(value: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", value).strip("_") or "_"


def _write_json(path, data: Mapping[str, Any]) -> None:
    import json
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def post_action_result(
    record: Mapping[str, Any], *, sender: Sender | None = None, settings: Any = None,
) -> dict[str, Any]:
    """Reply with a remediation record (from ``run_action``) in its incident's thread.

    Each (idempotency key, status) is posted once, so a retried task does not
    repeat it. Without a thread (none was ever posted) it goes top-level.
    """
    from lagdoctor.settings import Settings

    settings = settings or Settings.from_env()
    store = ThreadStore(settings.incidents_root)
    key = IncidentKey(str(record.get("cluster", "")), str(record.get("group_id", "")),
                      str(record.get("topic", "")), str(record.get("diagnosis", "")))
    state = store.get(key)
    marker = f"{record.get('idempotency_key')}:{record.get('status')}"
    if state is not None and marker in state.posted_actions:
        return {"decision": "unchanged", "threads": [_thread_ref(state)]}
    sender = sender or slack_sender(settings=settings)
    msg = render.render_action_result(record)
    if state is None:
        sender.post(text=msg["text"], blocks=msg["blocks"])
        return {"decision": "posted", "threads": []}
    sender.post(text=msg["text"], blocks=msg["blocks"], thread_ts=state.thread_ts, channel=state.channel)
    state.posted_actions.append(marker)
    state.replies += 1
    store.save(state)
    return {"decision": "replied", "threads": [_thread_ref(state)]}


def notify_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback``: tell Slack through the provider's SlackNotifier.

    Without a Slack connection the message goes to the outbox instead; a
    failing notification is logged, never raised (it must not mask the failure).
    """
    from lagdoctor.notify.redact import one_line
    from lagdoctor.notify.slack import DEFAULT_CONN_ID, connection_exists, default_channel, retry_handlers

    ti = context.get("ti") or context.get("task_instance")
    dag_id = getattr(context.get("dag"), "dag_id", None) or getattr(ti, "dag_id", "?")
    exc = context.get("exception")
    msg = render.render_failure(dag_id=str(dag_id), task_id=str(getattr(ti, "task_id", "-")),
                                run_id=str(context.get("run_id") or getattr(ti, "run_id", "-")),
                                reason=one_line(exc) if exc else "")
    try:
        if connection_exists(DEFAULT_CONN_ID):
            from airflow.providers.slack.notifications.slack import SlackNotifier

            SlackNotifier(slack_conn_id=DEFAULT_CONN_ID, channel=default_channel(), text=msg["text"],
                          blocks=msg["blocks"], retry_handlers=retry_handlers()).notify(context)
        else:
            slack_sender().post(text=msg["text"], blocks=msg["blocks"])
    except Exception as err:  # noqa: BLE001
        log.error("could not send the failure notification: %s", one_line(err))


def _thread_ref(state: ThreadState) -> dict[str, Any]:
    return {"diagnosis": state.key.diagnosis, "channel": state.channel, "thread_ts": state.thread_ts,
            "status": state.status}
