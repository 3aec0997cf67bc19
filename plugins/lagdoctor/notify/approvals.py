"""An action waiting in Airflow's human-in-the-loop, asked in Slack.

The DAG's ApprovalOperator calls the notifier when its task starts to wait::

    ApprovalOperator(task_id="approve", ..., notifiers=[SlackApprovalNotifier()])

It records the waiting task instance, one row per try (``slack_approvals``: the
buttons carry that row's id, its random nonce and a target's number) and posts the question
in the run's Slack thread: one line per target (blocked ones say why), with a
button per target, "Approve all" and "Reject all" when buttons are enabled (a
public base URL and a signing secret), else with a link to the task's page in
Airflow. The click is answered by lagdoctor.web.slack_actions through Airflow's
own HITL API.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Mapping

import sqlalchemy as sa

from lagdoctor.notify.redact import one_line

log = logging.getLogger(__name__)


def required_actions_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1,
                         environ: Mapping[str, str] | None = None) -> str | None:
    """The Airflow UI's page where the task's question is answered (as HITLOperator links it)."""
    from urllib.parse import quote

    from lagdoctor.web.links import airflow_base_url

    base = airflow_base_url(environ)
    if not base:
        return None
    q = lambda v: quote(str(v), safe="")  # noqa: E731
    return f"{base}/dags/{q(dag_id)}/runs/{q(run_id)}/tasks/{q(task_id)}/required_actions?map_index={int(map_index)}"


def post_approval_request(*, dag_id: str, run_id: str, task_id: str, map_index: int = -1, subject: str,
                          body: str | None = None, settings: Any = None, sender: Any = None,
                          now: datetime | None = None, buttons: bool | None = None, try_number: int = 1,
                          targets: list[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Record the waiting task and post its question once per try (a retried notifier posts
    nothing twice; a cleared and re-run task, a new try, asks again and supersedes the
    older rows, whose buttons then say so).

    `targets` (stages.plan.approval_form's): a button per target offered, "Approve all"
    and "Reject all"; without them Approve / Reject (an ApprovalOperator's two options).
    In the run's thread when the run has one (a manual incident run), else top-level."""
    from lagdoctor.notify import interactive, outbox, render
    from lagdoctor.notify.incidents import _deliver, _now, _settings, _state_db
    from lagdoctor.state import run_threads, slack_approvals as a

    settings = _settings(settings)
    db = _state_db(settings)
    at = _now(now)
    buttons = interactive.buttons_enabled() if buttons is None else buttons
    ti = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": int(map_index)}
    kept = None if targets is None else [
        {k: t.get(k) for k in ("key", "option", "cluster", "group_id", "topic", "blocked", "does")} for t in targets]
    with db.transaction() as conn:
        outbox.lock_key(db, conn, f"approval-request:{dag_id}:{run_id}:{task_id}:{map_index}")
        run = conn.execute(sa.select(run_threads.c.data).where(run_threads.c.run_key == run_id)).first()
        root = run.data.get("root_message_id") if run is not None and isinstance(run.data, dict) else None
        db.insert_ignore(conn, a, {**ti, "try_number": int(try_number), "subject": subject[:2000], "targets": kept,
                                   "status": interactive.WAITING, "message_id": root, "created_at": at},
                         ("dag_id", "run_id", "task_id", "map_index", "try_number"))
        row = conn.execute(sa.select(a).where(*(getattr(a.c, k) == v for k, v in ti.items()),
                                              a.c.try_number == int(try_number))).mappings().one()
        # An older try's question can no longer be answered: its buttons say so.
        conn.execute(sa.update(a).where(*(getattr(a.c, k) == v for k, v in ti.items()),
                                        a.c.try_number < int(try_number),
                                        a.c.status.in_((interactive.WAITING, interactive.ANSWERING)))
                     .values(status=interactive.SUPERSEDED))
        msg = render.render_approval_prompt(subject, body,
                                            approval_id=interactive.approval_ref(row) if buttons else None,
                                            answer_url=required_actions_url(dag_id, run_id, task_id, map_index),
                                            targets=kept, dag_id=dag_id)
        message_id = outbox.queue_message(db, conn, dedupe_key=f"approval:{row['id']}:request", text=msg["text"],
                                          blocks=msg["blocks"], parent_id=root, now=at)
        if root is None and row["message_id"] is None:
            # Top-level question: who answered goes in its own thread.
            conn.execute(sa.update(a).where(a.c.id == row["id"]).values(message_id=message_id))
    return {"approval_id": row["id"], "buttons": buttons, **_deliver(db, settings, sender, now)}


def slack_answer(dag_id: str, run_id: str, task_id: str, map_index: int = -1, *,
                 settings: Any = None) -> dict[str, Any]:
    """Who answered the task's newest try from Slack: {"slack": "slack:U123 (alice)"} (and
    "airflow_user"), or {} (answered in Airflow, or the state database cannot say).
    The action's result message names them."""
    from lagdoctor.notify import interactive
    from lagdoctor.notify.incidents import _settings, _state_db
    from lagdoctor.state import slack_approvals as a

    try:
        db = _state_db(_settings(settings))
        with db.engine.connect() as conn:
            row = conn.execute(sa.select(a.c.status, a.c.answered_by, a.c.airflow_user).where(
                a.c.dag_id == dag_id, a.c.run_id == run_id, a.c.task_id == task_id, a.c.map_index == int(map_index))
                .order_by(a.c.try_number.desc()).limit(1)).first()
    except Exception as exc:  # noqa: BLE001 - the action still runs; only the Slack name is missing
        log.warning("could not read who answered in Slack: %s", one_line(exc))
        return {}
    if row is None or row.status not in (interactive.APPROVED, interactive.REJECTED) or not row.answered_by:
        return {}
    return {"slack": row.answered_by, **({"airflow_user": row.airflow_user} if row.airflow_user else {})}


try:
    from airflow.sdk.bases.notifier import BaseNotifier
except ImportError:  # pragma: no cover - only DAG code uses the notifier
    BaseNotifier = object  # type: ignore[assignment,misc]


class SlackApprovalNotifier(BaseNotifier):  # type: ignore[misc,valid-type]
    """For ``HITLOperator(notifiers=[...])``: ask in Slack when the task starts to wait.

    Never raises: a Slack problem must not fail the approval task (it can
    still be answered in the Airflow UI)."""

    template_fields = ()

    def notify(self, context: Mapping[str, Any]) -> None:
        ti = context["ti"]
        task = context.get("task")
        try:
            result = post_approval_request(
                dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                map_index=ti.map_index if isinstance(ti.map_index, int) else -1,
                try_number=int(getattr(ti, "try_number", None) or 1),
                subject=str(getattr(task, "subject", "") or ti.task_id), body=getattr(task, "body", None),
                targets=getattr(task, "approval_targets", None))
            if result.get("delivery_error"):
                log.warning("Slack approval request queued, not delivered yet: %s", result["delivery_error"])
        except Exception as exc:  # noqa: BLE001
            log.error("could not post the approval request to Slack: %s", one_line(exc))
