"""One consumer group's incident across runs: what the group view's timeline shows.

    timeline = group_timeline(findings_root, "prod", "orders", index=index, can_read_dag=can_read,
                              actions=read_actions(settings, "prod", "orders"), now=now)

Runs come from the run index (lagdoctor.runindex): its run.json copies date
and filter them without opening a folder, and only the newest MAX_RUNS that
may look at the group are read, each for the group's lines of findings.jsonl
only (the page says how far back that reaches). Runs with threshold overrides
are left out: they are experiments, not the group's history.

Events, oldest first:
  - first seen: the earliest run read with a non-healthy finding;
  - changed: a later run's problems (topic, diagnosis, severity) differ;
  - recovered: the first healthy run after a problem (and "seen again" after that); a run
    still collecting history (issue 29) is no verdict, and read past;
  - actions: the action log's records for the group (lagdoctor.state's
    ``action_log``, read-only): what, dry run or executed or blocked, and who
    approved it and when where the record says so.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES
from lagdoctor.notify.formatting import fmt_duration
from lagdoctor.web.data import (
    SEVERITY_RANK,
    Run,
    _fs,
    _run_of_folder,
    _run_of_meta,
    current_index,
    finding_key,
    parse_ts,
)

log = logging.getLogger(__name__)

MAX_RUNS = 288  # runs the group view reads back: a day of 5-minute sweeps, nearly 5 hours of 1-minute ones
MAX_READ_BYTES = 256 * 2**20  # and no more findings.jsonl than this (a sweep of 10,000 groups is ~15 MB)
MAX_ACTIONS = 500  # newest action-log rows read for one group
MAX_MESSAGE = 300  # an action's message is one line on the page

# Statuses of the action log (lagdoctor.remediation.audit) as a person reads them.
ACTION_WORDS = {
    "dry_run": "dry run", "blocked": "blocked", "awaiting_approval": "waiting for approval",
    "rejected": "rejected", "executed": "executed", "noop": "nothing to do", "failed": "failed",
    "recommended": "recommended",
}


@dataclass(frozen=True)
class Problem:
    topic: str
    diagnosis: str
    severity: str

    @property
    def text(self) -> str:
        return f"{self.diagnosis.replace('_', ' ')} on {self.topic}"


@dataclass
class RunLook:
    """What one run said about the group (every topic it looked at)."""

    run: Run
    findings: list[dict[str, Any]]

    @property
    def problems(self) -> tuple[Problem, ...]:
        found = {Problem(str(f.get("topic", "")), str(f.get("diagnosis") or ""), str(f.get("severity") or "ok"))
                 for f in self.findings if f.get("diagnosis") not in NO_PROBLEM_DIAGNOSES}
        return tuple(sorted(found, key=lambda p: (-SEVERITY_RANK.get(p.severity, 0), p.topic, p.diagnosis)))

    @property
    def collecting(self) -> bool:
        """No verdict in this run (issue 29): every finding collects history. Neither a problem
        nor a recovery: the timeline reads past it."""
        return bool(self.findings) and all(f.get("diagnosis") == COLLECTING_HISTORY for f in self.findings)

    @property
    def severity(self) -> str:
        return max((f.get("severity") or "ok" for f in self.findings), key=lambda s: SEVERITY_RANK.get(s, 0),
                   default="ok")

    @property
    def summary(self) -> str:
        worst = sorted(self.findings, key=lambda f: -SEVERITY_RANK.get(f.get("severity") or "ok", 0))
        return str(worst[0].get("summary") or "") if worst else ""


@dataclass(frozen=True)
class Event:
    at: datetime
    kind: str  # first_seen | changed | recovered | seen_again | action | approval
    title: str
    detail: str = ""
    severity: str | None = None
    run: Run | None = None
    who: str | None = None  # the approver, for an approval


@dataclass
class Timeline:
    events: list[Event]
    looks: list[RunLook]  # oldest first
    runs_read: int
    runs_total: int  # runs that may look at the group (the index's, readable, no overrides)
    not_read: int = 0  # run folders the index has not read yet
    actions_note: str = ""  # why actions are missing, "" when the log was read
    ongoing_since: datetime | None = None  # the open problem's start, None when healthy now
    ongoing_for: str = ""  # how long until ``now``, "" without one

    @property
    def truncated(self) -> bool:
        return self.runs_total > self.runs_read

    @property
    def since(self) -> datetime | None:
        return self.looks[0].run.planned_at if self.looks else None


def problems_text(problems: Iterable[Problem]) -> str:
    return ", ".join(f"{p.severity} {p.text}" for p in problems)


# ------------------------------------------------------------------ runs

@lru_cache(maxsize=256)
def _run_pattern(pattern: str):
    """A run's --groups pattern (RE2, full match), or None when it does not compile."""
    try:
        import re2

        options = re2.Options()
        options.log_errors = False
        return re2.compile(pattern, options)
    except Exception:
        return None


def _pattern_admits(pattern: str | None, group_id: str) -> bool:
    """Whether a run's --groups pattern could cover the group; True when unsure (read rather than hide)."""
    compiled = _run_pattern(pattern) if pattern else None
    return compiled is None or compiled.fullmatch(group_id) is not None


def _findings_size(signature: Any) -> int:
    """findings.jsonl's size from the index's signature of a run ([[name, size, time], ...]); 0 when unknown."""
    from lagdoctor.contracts import FINDINGS_FILE

    for entry in signature or ():
        if entry and entry[0] == FINDINGS_FILE and isinstance(entry[1], int):
            return entry[1]
    return 0


def group_runs(findings_root: str, cluster: str, group_id: str, *, index=None,
               can_read_dag: Callable[[str | None], bool] = lambda dag_id: True) -> list[tuple[Run, Any]]:
    """Every run that may hold a finding of the group, newest first, with its files'
    signature from the index (None for a provisional folder); from the index alone."""
    index = index if index is not None else current_index(findings_root)
    fs, base = _fs(findings_root)
    out = []
    for name in set(index.runs) | set(index.provisional):
        if name not in index.folders:
            continue  # gone since it was folded
        meta = index.meta(name)
        run = (_run_of_meta(findings_root, name, meta) if meta is not None
               else _run_of_folder(fs, findings_root, f"{base}/{name}", name))
        if run is None or run.has_overrides or not can_read_dag(run.dag_id):
            continue
        if not _pattern_admits(run.group_pattern, group_id):
            continue
        out.append((run, index.runs[name]["sig"] if meta is not None else None))
    out.sort(key=lambda item: (item[0].planned_at, item[0].run_key), reverse=True)
    return out


# A group's lines of a finished run never change: keyed by the files' signature.
_LINES: dict[tuple, list[dict[str, Any]]] = {}
_LINES_LOCK = threading.Lock()
_LINES_MAX = 8192


def _needle(group_id: str) -> str | None:
    """Text every line of the group holds, to skip other groups' lines unparsed;
    None where JSON writers may escape the id differently."""
    ok = group_id and all(" " <= c <= "~" and c not in '"\\/' for c in group_id)
    return f'"{group_id}"' if ok else None


def read_group_findings(run: Run, signature: Any, cluster: str, group_id: str) -> list[dict[str, Any]]:
    """The group's findings in one run (findings.jsonl only: small, whatever the run's size)."""
    from lagdoctor.contracts import FINDINGS_FILE

    fs, _ = _fs(run.path)
    path = f"{run.path}/{FINDINGS_FILE}"
    if signature is None:
        try:
            info = fs.info(path)
        except FileNotFoundError:
            return []
        signature = (info.get("size"), str(info.get("mtime") or info.get("LastModified") or ""))
    key = (run.path, json.dumps(signature, default=str), cluster, group_id)
    with _LINES_LOCK:
        cached = _LINES.get(key)
    if cached is not None:
        return cached
    needle = _needle(group_id)
    found = []
    with fs.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip() or (needle is not None and needle not in line):
                continue
            f = json.loads(line)
            if finding_key(f)[:2] == (cluster, group_id):
                found.append(f)
    with _LINES_LOCK:
        if len(_LINES) >= _LINES_MAX:
            _LINES.clear()
        _LINES[key] = found
    return found


def group_looks(findings_root: str, cluster: str, group_id: str, *, index=None,
                can_read_dag: Callable[[str | None], bool] = lambda dag_id: True,
                max_runs: int = MAX_RUNS, max_bytes: int = MAX_READ_BYTES) -> tuple[list[RunLook], int, int]:
    """(the newest runs' views of the group, oldest first; runs read; runs that could have been).
    Reads at most ``max_runs`` runs and, past the first, ``max_bytes`` of findings."""
    runs = group_runs(findings_root, cluster, group_id, index=index, can_read_dag=can_read_dag)
    looks = []
    read_bytes = read = 0
    for run, signature in runs[:max_runs]:
        read_bytes += _findings_size(signature)
        if read and read_bytes > max_bytes:
            break
        read += 1
        try:
            findings = read_group_findings(run, signature, cluster, group_id)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable run %s: %s", run.path, exc)
            continue
        if findings:
            looks.append(RunLook(run, findings))
    looks.reverse()
    return looks, read, len(runs)


# ------------------------------------------------------------------ actions

def read_actions(settings, cluster: str, group_id: str, *, limit: int = MAX_ACTIONS) -> list[dict[str, Any]]:
    """The group's newest action-log records, oldest first. Read-only: a SQLite state
    file that does not exist yet is no action, and is not created.

    Where a record does not name its approver, the answer to the run's approval
    task recorded by Slack's buttons (``slack_approvals``, when this state module
    has it) rides along as ``approval``: {"by", "at", "status"}.
    """
    import sqlalchemy as sa

    from lagdoctor import state
    from lagdoctor.state import action_log, engine_for, state_url

    url = state_url(settings)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        from pathlib import Path

        if not Path(url.database).exists():
            return []
    engine = engine_for(url)
    stmt = (sa.select(action_log.c.record)
            .where(action_log.c.cluster == cluster[:255], action_log.c.group_id == group_id[:512])
            .order_by(action_log.c.ts.desc(), action_log.c.id.desc()).limit(limit))
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(stmt).scalars() if isinstance(r, Mapping)]
        approvals = getattr(state, "slack_approvals", None)
        asked = sorted({str(r.get("run_id")) for r in rows if r.get("status") == "awaiting_approval"})
        answers: dict[tuple[str, str], dict[str, Any]] = {}
        if approvals is not None and asked:
            found = conn.execute(sa.select(approvals.c.run_id, approvals.c.task_id, approvals.c.status,
                                           approvals.c.answered_by, approvals.c.answered_at)
                                 .where(approvals.c.run_id.in_(asked[:500]),
                                        approvals.c.status.in_(("approved", "rejected")))
                                 # oldest try first: a re-run approval's answer replaces the earlier one
                                 .order_by(approvals.c.try_number, approvals.c.id))
            for run_id, task_id, status, by, at in found:
                # The approval task sits in the action's group, "remediate_<action>" (stages.plan.action_task_id).
                answers[(run_id, str(task_id).split(".")[0])] = {
                    "by": by, "at": at.isoformat() if isinstance(at, datetime) else at, "status": status}
    for r in rows:
        answer = answers.get((str(r.get("run_id")), f"remediate_{r.get('action')}"))
        if answer and approval_of(r) is None:
            r["approval"] = answer
    rows.reverse()
    return rows


def _who(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("name") or value.get("id")
    return " ".join(str(value).split()) or None if value else None


def approval_of(record: Mapping[str, Any]) -> tuple[str | None, datetime | None] | None:
    """(who, when) a human answered this action, when the record says; None when it does not.
    Reads the HITL response's names too (responded_by_user, responded_at)."""
    nested = record.get("approval") if isinstance(record.get("approval"), Mapping) else {}
    who = next((_who(v) for v in (record.get("approved_by"), record.get("rejected_by"),
                                  nested.get("by"), nested.get("responded_by"), nested.get("responded_by_user"),
                                  record.get("responded_by_user"), record.get("responded_by")) if _who(v)), None)
    when = next((parse_ts(v) for v in (record.get("approved_at"), record.get("rejected_at"), nested.get("at"),
                                       nested.get("responded_at"), record.get("responded_at")) if parse_ts(v)), None)
    return (who, when) if who or when else None


def _one_line(text: Any) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def action_events(records: Iterable[Mapping[str, Any]]) -> list[Event]:
    """One event per decision (``started`` is folded into its outcome), and one per
    human answer: approved or rejected, by whom and when where the log says."""
    events: list[Event] = []
    asked: set[str] = set()
    answered: set[str] = set()
    for rec in records:
        status = str(rec.get("status") or "")
        key = str(rec.get("idempotency_key") or "")
        at = parse_ts(rec.get("ts"))
        if at is None:
            continue
        action = str(rec.get("action") or "action")
        if status == "awaiting_approval":
            asked.add(key)
        human = approval_of(rec)
        decided = status in ("started", "executed", "failed", "noop") and key in asked
        if key not in answered and (human or status == "rejected" or decided):
            answered.add(key)
            who, when = human or (None, None)
            nested = rec.get("approval") if isinstance(rec.get("approval"), Mapping) else {}
            verb = "rejected" if status == "rejected" or nested.get("status") == "rejected" else "approved"
            events.append(Event(when or at, "approval", f"{action} {verb}",
                                f"by {who}" if who else "by a person the action log does not name",
                                who=who))
        if status == "started":
            continue
        word = ACTION_WORDS.get(status, status or "?")
        dry = " (dry run)" if rec.get("dry_run") and status != "dry_run" else ""
        events.append(Event(at, "action", f"{action}: {word}{dry}", _one_line(rec.get("message")),
                            severity={"failed": "critical", "blocked": "warning"}.get(status)))
    return events


def visible_actions(records: Iterable[Mapping[str, Any]], readable_run_ids: set[str],
                    can_read_dag: Callable[[str | None], bool]) -> list[Mapping[str, Any]]:
    """Records of runs the caller may read; a caller who may read every DAG sees them all."""
    if can_read_dag(None):
        return list(records)
    return [r for r in records if str(r.get("run_id") or "") in readable_run_ids]


# ------------------------------------------------------------------ the timeline

def run_events(looks: list[RunLook], *, oldest_is_first: bool = True) -> list[Event]:
    """Changes of the group's problems from run to run (``looks`` oldest first)."""
    events: list[Event] = []
    before: tuple[Problem, ...] | None = None
    seen = False
    for look in looks:
        if look.collecting:
            continue  # no verdict: a problem before it is not recovered by it
        now = look.problems
        if now and not before:
            kind = "seen_again" if seen else "first_seen"
            title = "seen again" if seen else "first seen"
            if not seen and before is None and not oldest_is_first:
                title += " (in the oldest run read)"
            events.append(Event(look.run.planned_at, kind, title, problems_text(now), look.severity, look.run))
            seen = True
        elif now and now != before:
            events.append(Event(look.run.planned_at, "changed", "changed",
                                f"{problems_text(now)} (was {problems_text(before or ())})", look.severity, look.run))
        elif not now and before:
            started = next(e.at for e in reversed(events) if e.kind in ("first_seen", "seen_again"))
            events.append(Event(look.run.planned_at, "recovered", "recovered",
                                f"healthy again after {fmt_duration((look.run.planned_at - started).total_seconds())}",
                                "ok", look.run))
        before = now
    return events


def group_timeline(findings_root: str, cluster: str, group_id: str, *, index=None,
                   can_read_dag: Callable[[str | None], bool] = lambda dag_id: True,
                   actions: Iterable[Mapping[str, Any]] | Callable[[], Iterable[Mapping[str, Any]]] = (),
                   max_runs: int = MAX_RUNS, max_bytes: int = MAX_READ_BYTES,
                   now: datetime | None = None) -> Timeline:
    """The group's timeline: run events and action-log events, oldest first.

    ``actions`` are the group's records (``read_actions``), or a callable
    returning them; one that raises leaves the actions out and says why.
    """
    index = index if index is not None else current_index(findings_root)
    looks, read, total = group_looks(findings_root, cluster, group_id, index=index, can_read_dag=can_read_dag,
                                     max_runs=max_runs, max_bytes=max_bytes)
    events = run_events(looks, oldest_is_first=read >= total)
    note = ""
    try:
        records = list(actions() if callable(actions) else actions)
    except Exception as exc:  # the state database is optional to the page: say so, show the rest
        log.warning("action log not read for group %s: %s", group_id, exc)
        records = []
        note = "The action log could not be read: " + _one_line(str(exc).splitlines()[0] if str(exc) else exc)
    readable = {str(look.run.run_id) for look in looks if look.run.run_id}
    readable |= {str(m.get("run_id")) for name, rec in index.runs.items()
                 if (m := rec.get("meta") or {}).get("run_id") and can_read_dag(m.get("dag_id"))}
    events += action_events(visible_actions(records, readable, can_read_dag))
    order = {"first_seen": 0, "seen_again": 0, "changed": 0, "recovered": 0, "action": 1, "approval": 1}
    events.sort(key=lambda e: (e.at, order.get(e.kind, 2)))
    ongoing = None
    if looks and looks[-1].problems:
        ongoing = next((e.at for e in reversed(events) if e.kind in ("first_seen", "seen_again")), None)
    ongoing_for = ""
    if ongoing is not None and now is not None:
        ongoing_for = fmt_duration((now - ongoing).total_seconds())
    return Timeline(events, looks, read, total, not_read=index.not_read, actions_note=note, ongoing_since=ongoing,
                    ongoing_for=ongoing_for)
