"""How the live incident lab (bench/incident_lab.py) scores what a sweep said about
one played workload. Pure: sweeps in, numbers out; no clock, no broker.

- A sweep has *enough samples* for an incident once the window holds at least
  `min_snapshots` samples taken after its onset, spanning `min_seconds` from it
  (the stall rule's own need: no rule can tell a stall sooner).
- A finding is *right* when it names the expected cause, decided (not
  provisional), on the expected partitions; *provisional* when it is still
  deciding and the truth is among its candidates.
- A *flip* is a sweep after the first right one that no longer says it.
- A *wrong post* is a sweep, before the first right one, that posted to Slack
  a wrong non-healthy cause for the group, or "still deciding" between causes
  none of which is the truth (on a negative: any problem at all).
- The *right Slack message* is the first message of a sweep whose finding is
  right that names the expected cause.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES


@dataclass
class Sweep:
    n: int
    started: float  # epoch seconds
    samples: list[float]  # epoch seconds of this sweep's own samples
    posted: float  # when post_findings returned
    findings: dict[str, list[dict[str, Any]]]  # by group id
    statuses: list[dict[str, Any]]  # partition_status rows of the played groups
    messages: dict[str, list[str]]  # by group id: Slack messages this sweep sent about it
    last_sample: dict[tuple[str, int], tuple[int, float]]  # (topic, partition) -> (committed, snapshot ts)


@dataclass
class Score:
    first_sweep_right: bool | None  # None: no sweep had enough samples after onset
    first_sweep_verdict: str
    first_after_onset_verdict: str  # the first sweep with any sample after onset, enough or not
    onset_to_slack_s: float | None  # None: never posted right
    sweep_interval_s: float
    flips: int
    wrong_posts: int
    provisional_sweeps: int
    critical: int  # non-healthy critical findings after the warm-up
    warning: int


def decided(finding: dict[str, Any]) -> bool:
    return not finding.get("provisional")


def verdict(findings: list[dict[str, Any]], expect: str, partitions: tuple[int, ...] = ()) -> str:
    """'right', 'provisional', 'wrong' or 'none' (nothing but healthy, or collecting history, said)."""
    from lagdoctor.notify.threads import held_until_decided

    problems = [f for f in findings if f["diagnosis"] not in NO_PROBLEM_DIAGNOSES]
    for f in problems:
        if f["diagnosis"] == expect and decided(f) and set(partitions) <= set(f["partitions"]):
            return "right"
    if any(not decided(f) and expect in (f.get("deciding_between") or [f["diagnosis"]]) for f in problems):
        return "provisional"
    if any(not held_until_decided(f) for f in problems):
        return "wrong"  # a wrong cause, or "still deciding" between causes that are not the truth
    return "none"  # (a young rise held until decided, threads rule 12, is not said)


def heard(findings: Iterable[Mapping[str, Any]]) -> set[str]:
    """What Slack hears of a group's findings in one sweep: each diagnosis, with "?" when provisional; a
    young rise held until decided (threads rule 12) and collecting history say nothing; nothing at all is
    {"healthy"}. (bench/accuracy_bench.py --latency and its test count sweeps by this.)"""
    from lagdoctor.notify.threads import held_until_decided

    return {f["diagnosis"] + ("?" if f.get("provisional") else "") for f in findings
            if not held_until_decided(f) and f["diagnosis"] != COLLECTING_HISTORY} or {"healthy"}


def enough_samples(sample_times: list[float], onset: float, min_snapshots: int, min_seconds: float) -> bool:
    after = sorted(t for t in sample_times if t >= onset)
    return len(after) >= min_snapshots and after[-1] - onset >= min_seconds


def score(sweeps: list[Sweep], group: str, expect: str, partitions: tuple[int, ...], onset: float,
          warmup_end: float, *, min_snapshots: int, min_seconds: float) -> Score:
    seen: list[float] = []
    first_verdict: str | None = None
    first_after: str | None = None
    names = (expect, expect.replace("_", " "))
    right_seen, flips, wrong_posts, provisional, slack_s = False, 0, 0, 0, None
    for s in sweeps:
        seen += s.samples
        if not s.samples or s.samples[-1] < onset:
            continue
        v = verdict(s.findings.get(group, []), expect, partitions)
        first_after = first_after or v
        if first_verdict is None and enough_samples(seen, onset, min_snapshots, min_seconds):
            first_verdict = v
        provisional += v == "provisional"
        if v == "right":
            if slack_s is None and any(n in m for m in s.messages.get(group, []) for n in names):
                slack_s = s.posted - onset
            right_seen = True
        elif right_seen:
            flips += 1  # wrong, provisional again or nothing: the answer moved after it was right
        elif v == "wrong" and s.messages.get(group):
            wrong_posts += 1
    critical = warning = 0
    for s in sweeps:
        if s.samples and s.samples[0] >= warmup_end:
            for f in s.findings.get(group, []):
                critical += f["diagnosis"] not in NO_PROBLEM_DIAGNOSES and f["severity"] == "critical"
                warning += f["diagnosis"] not in NO_PROBLEM_DIAGNOSES and f["severity"] == "warning"
    starts = [s.started for s in sweeps]
    interval = statistics.median([b - a for a, b in zip(starts, starts[1:])]) if len(starts) > 1 else float("nan")
    return Score(None if first_verdict is None else first_verdict == "right", first_verdict or "",
                 first_after or "", slack_s, interval, flips, wrong_posts, provisional, critical, warning)
