"""Remediation: actions registered in code, guarded, dry-run by default, audited.

Task-level API (cheap to import; client libraries load inside the actions):

    action_names()                      branch targets, one per registered action
    needs_approval(name, dry_run=...)   put a HITL ApprovalOperator before it?
    run_action(name, finding, run_id=..., dry_run=True, approved=None, params=..., guardrails=...)
    preview_action(name, finding, ...)  what approving it would do (the approval form's words)
    approval_request(record)            subject/body for the ApprovalOperator
    approved_from_hitl(result)          the ApprovalOperator's XCom -> bool
"""

from lagdoctor.remediation.actions import ActionBlocked
from lagdoctor.remediation.approval import approval_meta, approval_request, approved_from_hitl
from lagdoctor.remediation.config import ConfigError, RemediationConfig
from lagdoctor.remediation.registry import action_names, get_action, registered_actions
from lagdoctor.remediation.runner import (
    RemediationFailed,
    idempotency_key,
    needs_approval,
    preview_action,
    run_action,
)

__all__ = [
    "ActionBlocked", "ConfigError", "RemediationConfig", "RemediationFailed", "action_names",
    "approval_meta", "approval_request", "approved_from_hitl", "get_action", "idempotency_key", "needs_approval",
    "preview_action", "registered_actions", "run_action",
]
