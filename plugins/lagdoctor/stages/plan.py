"""Plans: each finding with its runbook's actions, the remediation branches, and the approval form per target."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.contracts import NO_PROBLEM_DIAGNOSES
from lagdoctor.settings import Settings, join
from lagdoctor.stages.common import PLANS_FILE, read_plans
from lagdoctor.stages.diagnose import read_findings, read_quarantined

log = logging.getLogger(__name__)


KINDS = ("sweep", "incident")
RUN_FILE = "run.json"


def plan_findings(
    output: str,
    *,
    group_pattern: str | None = None,
    topic: str | None = None,
    runbooks_dir: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    kind: str = "sweep",
    threshold_overrides: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    clusters: list[str] | None = None,
    clusters_unread: list[str] | None = None,
) -> dict[str, Any]:
    """Pair each finding with its runbook plan; write them, and which DAG run
    produced them (run.json: the lag page links back to it; `threshold_overrides`
    keeps an experiment from replacing the sweep's verdict), beside the findings.
    `clusters`/`clusters_unread`: what the run diagnosed, and what it could not
    read (no finding for those: unknown, never healthy).

    Returns a small summary: counts and, per registered action, how many
    findings want it (the branch task reads this).
    """
    import fsspec

    from lagdoctor.kafka.group_listing import compile_group_pattern
    from lagdoctor.runbooks import choose_actions, load_runbooks
    from lagdoctor.workloads import attach_workloads, remember_restarts

    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    # RE2 (linear time): group ids are chosen by clients, the pattern by whoever triggers.
    pattern = compile_group_pattern(group_pattern, what="group_pattern") if group_pattern else None
    findings = [
        f for f in read_findings(output)
        if (pattern is None or pattern.fullmatch(f["group_id"])) and (not topic or f["topic"] == topic)
    ]
    quarantined = read_quarantined(output)
    for entry in quarantined:
        log.warning("quarantined %s: %s (moved to %s)", entry.get("path"), " ".join(str(entry.get("reason")).split()),
                    entry.get("moved_to"))
    runbooks = load_runbooks(runbooks_dir)
    # each owner's pod and workload, before runbooks and Slack read the evidence
    now = now or datetime.now(timezone.utc)
    workloads = attach_workloads(findings)
    restarts_unknown = remember_restarts(findings, now)
    if restarts_unknown:
        workloads["restarts_not_counted"] = restarts_unknown
    planned = [{"finding": f, "plan": choose_actions(f, runbooks).as_dict()} for f in findings]
    plans_path = join(output, PLANS_FILE)
    with fsspec.open(plans_path, "wt") as fh:
        fh.write(json.dumps(planned))  # one write: json.dump makes one per token (7 s at 10,000 findings)
    with fsspec.open(join(output, RUN_FILE), "wt") as fh:
        json.dump({"dag_id": dag_id, "run_id": run_id, "kind": kind,
                   "planned_at": now.isoformat(),
                   "group_pattern": group_pattern, "topic": topic,
                   "threshold_overrides": dict(threshold_overrides or {}),
                   "clusters": list(clusters or []), "clusters_unread": list(clusters_unread or [])}, fh)
    wanted: dict[str, int] = {}
    for item in planned:
        for action in item["plan"]["actions"]:
            wanted[action["action"]] = wanted.get(action["action"], 0) + 1
    by_severity: dict[str, int] = {}
    for f in findings:
        by_severity[f["severity"]] = by_severity.get(f["severity"], 0) + 1
    return {
        "plans": plans_path,
        "output": output,
        "findings": len(findings),
        "problems": sum(1 for f in findings if f["diagnosis"] not in NO_PROBLEM_DIAGNOSES),
        "by_severity": by_severity,
        "actions": wanted,
        "quarantined": len(quarantined),
        "clusters_unread": list(clusters_unread or []),
        "workloads": workloads,
    }


def action_task_id(action: str) -> str:
    return f"remediate_{action}"


def branch_target(action: str, *, approvals: bool = True) -> str:
    """The first task of an action's group: its approval gate, or its run for
    advice-only actions and in a DAG that never waits for a human (the sweep)."""
    from lagdoctor.remediation import get_action

    step = "gate" if approvals and get_action(action).changes_state else "run"
    return f"{action_task_id(action)}.{step}"


def choose_branches(summary: Mapping[str, Any] | None, *, approvals: bool = True) -> list[str]:
    """Branch targets: one remediation group per action some finding's runbook chose;
    none without a plan (the plan task failed)."""
    from lagdoctor.remediation import action_names

    if not summary or not summary.get("plans"):
        return []
    known = set(action_names())
    return [branch_target(a, approvals=approvals)
            for a in sorted(a for a in summary.get("actions", {}) if a in known)]


REJECT_ALL = "Reject all"
APPROVAL_OPTIONS_MAX = 50  # a form with more targets asks for the first 50 (the rest: not approved)


def approval_target_key(finding: Mapping[str, Any]) -> str:
    """One approval choice per group on a cluster and topic (its findings share it)."""
    raw = json.dumps([str(finding.get(k) or "") for k in ("cluster", "group_id", "topic")])
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def approval_targets(action: str, plans_path: str, *, settings: Settings | None = None,
                     now: datetime | None = None) -> list[dict[str, Any]]:
    """Each (group on cluster/topic) the run would apply `action` to, in plan order, with the
    action's own preview (does, target) and `blocked`: why it would not run as things stand
    (a guardrail or the plan), evaluated now, before anybody is asked. `needs_approval`:
    whether this target waits for a human at all (advice, or not configured: no)."""
    from lagdoctor.remediation import needs_approval, preview_action

    targets: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for item in read_plans(plans_path):
        for planned in item["plan"]["actions"]:
            if planned["action"] != action:
                continue
            member = approval_target_key(item["finding"])
            if member in seen:
                continue
            seen.add(member)
            p = preview_action(action, item["finding"], params=planned.get("params") or {},
                               guardrails=planned.get("guardrails") or {}, settings=settings, now=now)
            entry = {"key": member, "members": [member], "shared_by": [[p["group_id"], p["topic"]]],
                     "cluster": p["cluster"],
                     "group_id": p["group_id"], "topic": p["topic"], "does": p["does"], "target": p["target"],
                     "blocked": p["blocked"], "diagnosis": item["finding"].get("diagnosis"),
                     "summary": item["finding"].get("summary"),
                     "needs_approval": needs_approval(action, dry_run=False, guardrails=planned.get("guardrails"))}
            # One line per thing changed: groups whose action changes the same target (a topic, a
            # Deployment) share it, or "approve all" would change it once per group.
            line = _shared_line_key(p["cluster"], p["target"]) if p["target"] else member
            if line not in targets:
                targets[line] = {**entry, "key": line}
                continue
            shared = targets[line]
            shared["members"].append(member)
            shared["shared_by"].append([p["group_id"], p["topic"]])
            if shared["blocked"] and not entry["blocked"]:  # offered when any of its findings may run
                targets[line] = {**entry, "key": line, "members": shared["members"], "shared_by": shared["shared_by"]}
    return list(targets.values())


def _shared_line_key(cluster: Any, target: str) -> str:
    raw = json.dumps(["target", str(cluster or ""), target])
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def approval_needed(action: str, plans_path: str, *, dry_run: bool, settings: Settings | None = None,
                    now: datetime | None = None) -> bool:
    """Whether a human must approve `action` for this run: never on a dry run (dag.test()
    and the demo never wait), and not when the guard blocks every target that needs it:
    nobody is asked to approve what cannot run (the run task then records it blocked)."""
    if dry_run:
        return False
    return any(t["needs_approval"] and not t["blocked"]
               for t in approval_targets(action, plans_path, settings=settings, now=now))


APPROVAL_SUBJECT_MAX = 200


def approval_option(index: int, target: Mapping[str, Any]) -> str:
    """The HITL option (and Slack button) approving one target: numbered, so labels stay
    unique however names are shortened; plain text, one line."""
    from lagdoctor.notify.templates import plain_label

    from lagdoctor.notify.templates import shared_by_text

    shared = shared_by_text(target, limit=2)
    if shared:
        return f"Approve {index}: {plain_label(target['target'], 80)}, one change for {plain_label(shared, 80)}"
    return (f"Approve {index}: {plain_label(target['group_id'], 60)} on {plain_label(target['cluster'], 40)}"
            f" / {plain_label(target['topic'] or '(all)', 60)}")


def approval_form(action: str, plans_path: str, *, settings: Settings | None = None,
                  now: datetime | None = None) -> dict[str, Any]:
    """The approval form: `subject`, `body` (Markdown for the Airflow UI), `options` (one
    "Approve n: ..." per target its guard lets run now, then "Reject all") and `targets`
    (every target, with its `option` or None when blocked now, for the run task and Slack).

    Per target: the concrete change (the action's own describe() of its plan),
    "irreversible" when it is, why it was proposed; a target whose guard blocks it now
    is listed as "blocked now: <why>" and not offered. Every name is escaped for
    Markdown: a group id cannot add a line, a link or emphasis to the form."""
    from lagdoctor.notify.redact import one_line
    from lagdoctor.notify.templates import escape_markdown as md, plain_label, shared_by_text
    from lagdoctor.remediation import get_action

    spec = get_action(action)
    targets = [t for t in approval_targets(action, plans_path, settings=settings, now=now) if t["needs_approval"]]

    def change(t: Mapping[str, Any]) -> str:
        does = one_line(t["does"])
        return does + ("; irreversible" if spec.irreversible and "irreversible" not in does else "")

    offered = 0
    for t in targets:
        t["option"] = None
        if not t["blocked"] and offered < APPROVAL_OPTIONS_MAX:
            offered += 1
            t["option"] = approval_option(offered, t)
    open_targets = [t for t in targets if t["option"]]
    count = len({(t["cluster"], g) for t in open_targets for g, _ in t.get("shared_by") or [[t["group_id"], None]]})
    groups = f"{count} group{'' if count == 1 else 's'}"
    if len(open_targets) == 1:
        t = open_targets[0]
        subject = (f"lagdoctor: {plain_label(change(t), 120)} (group {plain_label(t['group_id'], 60)} "
                   f"on {plain_label(t['cluster'], 40)})?")
    else:
        subject = f"lagdoctor: {action} for {groups}{' (irreversible)' if spec.irreversible else ''}?"
    if len(subject) > APPROVAL_SUBJECT_MAX:
        subject = subject[:APPROVAL_SUBJECT_MAX - 2] + "…?"
    lines = [f"Approve runs `{action}`{' (**irreversible**)' if spec.irreversible else ''} for each group you "
             f"tick, and for no other ({groups} can run now):", ""]
    for t in targets:
        head = f"**{md(t['group_id'])}** on {md(t['cluster'])}, topic {md(t['topic'] or '(all)')}"
        shared = shared_by_text(t)
        if shared:
            head = f"**{md(t['target'])}** on {md(t['cluster'])}, one change for {md(shared)}"
        if t["option"]:
            lines.append(f"- {md(t['option'].split(':', 1)[0])}: {head}: {md(change(t))}")
        else:
            why = (f"**blocked now**: {md(one_line(t['blocked']))}" if t["blocked"]
                   else f"over the form's {APPROVAL_OPTIONS_MAX} choices: ask again in another run")
            lines.append(f"- {head}: {why} (not offered)")
        lines.append(f"  - target: {md(t['target'])}")
        lines.append(f"  - why: {md(one_line(t.get('diagnosis') or ''))}: {md(one_line(t.get('summary') or ''))}")
    if spec.warning:
        lines += ["", f"Effect: {md(spec.warning)}"]
    lines += ["", f"Tick the groups to approve. \"{REJECT_ALL}\" (the default, also on timeout) changes nothing, "
                  "and wins over any ticked group."]
    return {"subject": subject, "body": "\n".join(lines),
            "options": [t["option"] for t in open_targets] + [REJECT_ALL], "targets": targets}


def approved_targets(form: Mapping[str, Any] | None, chosen: list[str] | None) -> set[str]:
    """The target keys a HITL answer approves: the ticked "Approve n" options, none when
    "Reject all" is among them (never more than the approver saw)."""
    chosen = list(chosen or [])
    if not form or REJECT_ALL in chosen:
        return set()
    return {m for t in form.get("targets") or [] if t.get("option") and t["option"] in chosen
            for m in t.get("members") or [t["key"]]}


def not_offered_targets(form: Mapping[str, Any] | None) -> dict[str, str]:
    """Target key -> why the form did not offer it (blocked when asked, or over its limit)."""
    return {m: (t.get("blocked") or f"over the form's {APPROVAL_OPTIONS_MAX} choices: ask again in another run")
            for t in (form or {}).get("targets") or [] if not t.get("option")
            for m in t.get("members") or [t["key"]]}
