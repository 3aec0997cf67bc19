"""What a human sees when an action waits for approval (HITL ApprovalOperator).

The DAG builds the operator; this module gives it its words and reads its answer::

    ApprovalOperator(task_id=..., **approval_request(record))   # subject, body
    run_action(..., approved=approved_from_hitl(ti.xcom_pull(task_ids=...)))
"""

from __future__ import annotations

from typing import Any, Mapping

APPROVE = "Approve"  # ApprovalOperator.APPROVE, without importing the provider here


def approval_request(record: Mapping[str, Any]) -> dict[str, str]:
    """``subject`` and ``body`` (Markdown, shown in the Airflow UI) for an ``awaiting_approval`` record."""
    from lagdoctor.notify.render import render_approval_request

    return render_approval_request(record)


def approved_from_hitl(result: Mapping[str, Any] | None) -> bool | None:
    """The ApprovalOperator's return value -> True / False; None when nobody answered."""
    if not result:
        return None
    chosen = result.get("chosen_options") or []
    return APPROVE in chosen


def approval_meta(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Who answered the ApprovalOperator and when, for the action log (the lag page's
    timeline shows it); None when nobody answered (a timeout takes the default)."""
    if not result:
        return None
    who = result.get("responded_by_user")
    if isinstance(who, Mapping):
        who = who.get("name") or who.get("id")
    at = result.get("responded_at")
    if who is None and at is None:
        return None
    return {"by": None if who is None else str(who),
            "at": at.isoformat() if hasattr(at, "isoformat") else (None if at is None else str(at)),
            "chosen": list(result.get("chosen_options") or []),
            # which try of the approval task answered: a re-run approval is a new answer
            **({"try": int(result["approval_try"])} if isinstance(result.get("approval_try"), int) else {})}
