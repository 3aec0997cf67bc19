"""The action interface: what every action implements (the registry is remediation.registry).

An action is a class with a ``name`` and three steps, so the runner can keep
dry runs, approvals, guardrails and retries in one place:

  prepare(ctx)            pure: what it would do, from the finding, the config
                          and the runbook's params. Runs in dry runs too.
  resolve(ctx, plan)      real runs only: read live state and fix absolute
                          targets (replicas = 5, offset 41 -> 42). The runner
                          stores the result before ``apply`` so a retried task
                          repeats the same absolute change instead of a new one.
  apply(ctx, plan)        make the change; idempotent for the same plan.

Raise ``ActionBlocked`` from any step when the action must not go ahead, and
``OutcomeUnknown`` from ``apply`` when a request went out but its answer did
not come back (the change may have been made; it counts as if it had).
``target(ctx)`` names what the action changes: runs acting on one target are
serialized by a lease and share its cooldown.
This module imports no client library: they are imported inside the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, ClassVar, Mapping

from lagdoctor.remediation.config import RemediationConfig


class ActionBlocked(Exception):
    """The action must not run; the message says why (one line, no secret)."""


class OutcomeUnknown(RuntimeError):
    """A change was sent but no answer came back: it may have been applied (one line, no secret)."""


@dataclass(frozen=True)
class Outcome:
    status: str  # "executed" or "noop"
    message: str
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ActionContext:
    finding: Mapping[str, Any]
    config: RemediationConfig
    params: Mapping[str, Any]
    now: datetime
    # Lazily built clients' inputs: resolved only when a real run needs them.
    kafka_config: Callable[[], dict[str, Any]]
    idempotency_key: str = ""  # the runner's key for this (run, incident, action): what a change is marked with

    @property
    def cluster(self) -> str:
        return str(self.finding.get("cluster", ""))

    @property
    def group_id(self) -> str:
        return str(self.finding.get("group_id", ""))

    @property
    def topic(self) -> str:
        return str(self.finding.get("topic", ""))

    @property
    def evidence(self) -> Mapping[str, Any]:
        ev = self.finding.get("evidence")
        return ev if isinstance(ev, Mapping) else {}


class Action:
    name: ClassVar[str]
    summary: ClassVar[str]
    irreversible: ClassVar[bool] = False
    changes_state: ClassVar[bool] = True  # False: advice only, no guardrail or approval
    warning: ClassVar[str] = ""
    params: ClassVar[Mapping[str, type | tuple[type, ...]]] = {}  # runbook params it accepts

    @property
    def requires_approval(self) -> bool:
        return self.irreversible

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        return {}

    def describe(self, plan: Mapping[str, Any]) -> str:
        """One line: what the action does or would do with this plan."""
        return self.summary

    def target(self, ctx: ActionContext) -> str | None:
        """What this action changes, as people name it; None: the group itself (per action)."""
        return None

    def resolve(self, ctx: ActionContext, plan: dict[str, Any]) -> dict[str, Any]:
        return plan

    def blocked_by_finding(self, ctx: ActionContext) -> str | None:
        """Why the run would block it, already plain from the finding (the group's state at
        the window's end), so the approval form says "blocked now" instead of asking;
        resolve() still checks live state. None: nothing known blocks it."""
        return None

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        raise NotImplementedError
