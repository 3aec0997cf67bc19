"""The owner's pod and workload in words (``evidence["workload"]``, lagdoctor.workloads), for
Slack and the page: what runs the consumer and, when it explains the lag, what happened to it.

Restarts are counted since a sweep last saw the pod's count (at or before the window's start,
else inside it); without such a sighting the total is said as a total. A restart or a rollout is
named with its time against the moment the lag began to grow
(``evidence["lag_onset"]``, the diagnosis job's: a rollout minutes before it is the first
suspect), else against the finding's window (the lag was already up when the window began).
"No Kubernetes API" is said once per run in the log, never in each message.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping

from lagdoctor.notify.evidence import evidence_of
from lagdoctor.notify.formatting import fmt_duration, one_line_id, parse_iso

# How long before a window's start a rollout is still named as a suspect.
ROLLOUT_LOOKBACK = timedelta(minutes=30)
_SAID_ONCE_PER_RUN = ("no Kubernetes API", "the Kubernetes API at ")


def workload_of(finding: Mapping[str, Any]) -> Mapping[str, Any] | None:
    w = evidence_of(finding).get("workload")
    return w if isinstance(w, Mapping) else None


def run_wide_reason(finding: Mapping[str, Any]) -> str | None:
    """Why no member of the finding's run could be traced (no Kubernetes API, or one that did not
    answer): said once per run, never beside each member; None otherwise."""
    w = workload_of(finding)
    why = " ".join(str((w or {}).get("unknown") or "").split())
    return why if w is not None and not w.get("pod") and why.startswith(_SAID_ONCE_PER_RUN) else None


def workload_lines(finding: Mapping[str, Any]) -> tuple[str, str] | None:
    """("known", text) naming the pod, its workload and what explains the lag; ("unknown", why)
    for a member traced to nothing; None when there is nothing to say here."""
    w = workload_of(finding)
    if w is None:
        return None
    if not w.get("pod"):
        why = str(w.get("unknown") or "")
        if not why or why.startswith(_SAID_ONCE_PER_RUN):
            return None
        return "unknown", " ".join(why.split())
    start, end = parse_iso(finding.get("window_start")), parse_iso(finding.get("window_end"))
    onset = parse_iso(evidence_of(finding).get("lag_onset"))
    where = f"pod {one_line_id(w.get('pod'))}"
    if w.get("kind") and w.get("name"):
        where += f" of {one_line_id(w['kind'])} {one_line_id(w.get('namespace'))}/{one_line_id(w['name'])}"
    parts = [where]
    parts += filter(None, (_termination(w, start, end, onset), _rollout(w, start, end, onset), _replicas(w),
                           _autoscalers(w)))
    return "known", "; ".join(parts)


def _when(at: datetime | None, start: datetime | None, end: datetime | None,
          onset: datetime | None = None) -> str | None:
    """"at 03:12:00 UTC, 2m 00s before the lag began" when the onset is known and near; else
    "..., in this window" / "..., 12m 00s before this window"; None when long before."""
    if at is None:
        return None
    stamp = at.strftime("%H:%M:%S UTC")
    if onset is not None and onset - ROLLOUT_LOOKBACK <= at <= (end or onset) + timedelta(minutes=1):
        gap = (onset - at).total_seconds()
        if abs(gap) < 1:
            return f"at {stamp}, as the lag began"
        return f"at {stamp}, {fmt_duration(abs(gap))} {'before' if gap > 0 else 'after'} the lag began"
    if start is None or end is None or start <= at <= end + timedelta(minutes=1):
        return f"at {stamp}, in this window" if start is not None else f"at {stamp}"
    if start - ROLLOUT_LOOKBACK <= at < start:
        return f"at {stamp}, {fmt_duration((start - at).total_seconds())} before this window"
    return None


def _termination(w: Mapping[str, Any], start: datetime | None, end: datetime | None,
                 onset: datetime | None) -> str | None:
    last = w.get("last_termination") if isinstance(w.get("last_termination"), Mapping) else None
    when = _when(parse_iso((last or {}).get("finished_at")), start, end, onset)
    restarts, recent = _restarts(w)
    if last is None or when is None:
        return restarts if recent else None  # restarts lately, their last termination not known or not near
    code = last.get("exit_code")
    reason = one_line_id(last.get("reason"), "terminated") + (f" (exit {code})" if code is not None else "")
    return f"last {reason} {when}" + (f", {restarts}" if restarts else "")


def _restarts(w: Mapping[str, Any]) -> tuple[str | None, int]:
    """("3 restarts in the last 10m 00s (since 03:20:00 UTC)", 3) from the count a sweep saw
    before (lagdoctor.workloads.remember_restarts); ("3 restarts in all", 0) with none: the total,
    never a guess at the window's share; (None, 0) when even the total is unknown."""
    total = w.get("restarts")
    if not isinstance(total, int) or isinstance(total, bool):
        return None, 0
    since = w.get("restarts_since") if isinstance(w.get("restarts_since"), Mapping) else {}
    at, observed, before = parse_iso(since.get("at")), parse_iso(w.get("observed_at")), since.get("restarts")
    if at is None or observed is None or observed <= at or not isinstance(before, int) or not 0 <= before <= total:
        return f"{total} restart{'s' if total != 1 else ''} in all", 0
    n = total - before
    count = f"{n} restart{'s' if n != 1 else ''}" if n else "no restart"
    return f"{count} in the last {fmt_duration((observed - at).total_seconds())} (since {at:%H:%M:%S} UTC)", n


def _rollout(w: Mapping[str, Any], start: datetime | None, end: datetime | None,
             onset: datetime | None) -> str | None:
    when = _when(parse_iso(w.get("rolled_out_at")), start, end, onset)
    return f"{one_line_id(w.get('kind'), 'workload')} rolled out {when}" if when else None


def _replicas(w: Mapping[str, Any]) -> str | None:
    ready, desired = w.get("ready_replicas"), w.get("desired_replicas")
    if isinstance(ready, int) and isinstance(desired, int) and ready < desired:
        return f"{ready} of {desired} replicas ready"
    return None


def _autoscalers(w: Mapping[str, Any]) -> str | None:
    scalers = [a for a in w.get("autoscalers") or [] if isinstance(a, Mapping)]
    if scalers:
        return "scaled by " + ", ".join(
            f"{one_line_id(a.get('kind'))} {one_line_id(a.get('name'))} "
            f"({a.get('min_replicas') if a.get('min_replicas') is not None else '?'}-{a.get('max_replicas')} replicas)"
            for a in scalers)
    if w.get("autoscalers_unknown"):
        return f"autoscalers unknown ({' '.join(str(w['autoscalers_unknown']).split())})"
    return None
