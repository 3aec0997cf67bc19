"""recommend_consumer_config: consumer settings advice, posted and never applied.

Rules (pure; ``tests/test_remediation.py`` has a table case for each):

  1. A poll loop must finish one batch (max.poll.records x time per record)
     well inside max.poll.interval.ms, or the member is kicked out and the
     group rebalances. Wanted: interval >= headroom x batch time. When it is
     not, propose both fixes: fewer records per poll, or a longer interval.
  2. heartbeat.interval.ms should be at most one third of session.timeout.ms
     (Kafka's own guidance) so two missed heartbeats don't end the session.
  3. A group in a rebalance loop with session.timeout.ms below the Kafka 3.0+
     default (45 s) gets the default back.

Evidence read (all optional): ``processing_ms_per_record`` (observed),
else derived from ``consume_rate`` / ``group_members``; ``consumer_config``
with the group's current ``max.poll.records``, ``max.poll.interval.ms``,
``session.timeout.ms``, ``heartbeat.interval.ms`` (Kafka defaults otherwise).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from lagdoctor.remediation.actions import Action, ActionContext, Outcome

KAFKA_DEFAULTS = {
    "max.poll.records": 500,
    "max.poll.interval.ms": 300_000,
    "session.timeout.ms": 45_000,
    "heartbeat.interval.ms": 3_000,
}


@dataclass(frozen=True)
class Recommendation:
    key: str
    current: int
    recommended: int
    reason: str


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def recommend_consumer_config(
    *,
    per_record_ms: float | None,
    current: Mapping[str, int] | None = None,
    headroom: float = 2.0,
    rebalance_loop: bool = False,
) -> list[Recommendation]:
    cur = {**KAFKA_DEFAULTS, **{k: int(v) for k, v in (current or {}).items() if k in KAFKA_DEFAULTS and v is not None}}
    out: list[Recommendation] = []
    records, interval = cur["max.poll.records"], cur["max.poll.interval.ms"]
    # Rule 1
    if per_record_ms and per_record_ms > 0:
        batch_ms = per_record_ms * records
        if batch_ms * headroom > interval:
            fit = max(1, int(interval / (per_record_ms * headroom)))
            out.append(Recommendation(
                "max.poll.records", records, fit,
                f"a batch of {records} takes ~{batch_ms / 1000:.0f} s at {per_record_ms:g} ms/record; "
                f"{fit} records fit {headroom:g}x inside max.poll.interval.ms",
            ))
            out.append(Recommendation(
                "max.poll.interval.ms", interval, _round_up(batch_ms * headroom, 30_000),
                f"or keep {records} records per poll and allow {headroom:g}x the observed batch time",
            ))
    # Rule 3 (before rule 2: the heartbeat follows the session timeout)
    session = cur["session.timeout.ms"]
    if rebalance_loop and session < KAFKA_DEFAULTS["session.timeout.ms"]:
        out.append(Recommendation(
            "session.timeout.ms", session, KAFKA_DEFAULTS["session.timeout.ms"],
            "short sessions end on a GC pause or slow network; the group rebalances again and again",
        ))
        session = KAFKA_DEFAULTS["session.timeout.ms"]
    # Rule 2
    if cur["heartbeat.interval.ms"] > session // 3:
        out.append(Recommendation(
            "heartbeat.interval.ms", cur["heartbeat.interval.ms"], session // 3,
            "at most one third of session.timeout.ms",
        ))
    return out


def per_record_ms_from_evidence(evidence: Mapping[str, Any]) -> float | None:
    value = evidence.get("processing_ms_per_record")
    if isinstance(value, (int, float)) and value > 0:
        return float(value)
    rate, members = evidence.get("consume_rate"), evidence.get("group_members")
    if isinstance(rate, (int, float)) and rate > 0 and isinstance(members, int) and members > 0:
        # Each member handles rate/members records a second when it is busy all the time.
        return 1000.0 * members / rate
    return None


class RecommendConsumerConfig(Action):
    name = "recommend_consumer_config"
    summary = "recommend consumer poll/session settings (posted, never applied)"
    changes_state = False
    params = {"headroom": (int, float)}

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        ev = ctx.evidence
        recs = recommend_consumer_config(
            per_record_ms=per_record_ms_from_evidence(ev),
            current=ev.get("consumer_config") if isinstance(ev.get("consumer_config"), Mapping) else None,
            headroom=float(ctx.params.get("headroom", ctx.config.poll_headroom)),
            rebalance_loop=ctx.finding.get("diagnosis") == "rebalance_loop",
        )
        return {"recommendations": [asdict(r) for r in recs], "per_record_ms": per_record_ms_from_evidence(ev),
                "config_observed": isinstance(ev.get("consumer_config"), Mapping),
                "rebalance_loop": ctx.finding.get("diagnosis") == "rebalance_loop"}

    def describe(self, plan: Mapping[str, Any]) -> str:
        recs = plan.get("recommendations") or []
        # Plans recorded before these keys read as observed: what they said then stands.
        observed = plan.get("config_observed", True)
        if recs:
            assumed = "" if observed else " (against Kafka's defaults: the broker cannot see the client's settings)"
            return "consider " + ", ".join(f"{r['key']}={r['recommended']} (now {r['current']})" for r in recs) + assumed
        if plan.get("rebalance_loop") and not observed:
            # Seen live: "nothing to change" for a loop whose max.poll.interval.ms (4 s) was below its batch time (6 s).
            ms = plan.get("per_record_ms")
            batch = (f"; at ~{ms:.0f} ms a record, as consumed here, {KAFKA_DEFAULTS['max.poll.records']} records "
                     f"(the default max.poll.records) take ~{ms * KAFKA_DEFAULTS['max.poll.records'] / 1000:.0f} s"
                     if isinstance(ms, (int, float)) and ms > 0 else "")
            return ("consumer config: the broker cannot see the group's client settings, so lagdoctor cannot name "
                    "the wrong one. The rule: max.poll.interval.ms above the time one poll's batch takes "
                    "(max.poll.records x time per record, with 2x headroom), or fewer max.poll.records; "
                    "heartbeat.interval.ms at most a third of session.timeout.ms" + batch)
        return "consumer config: nothing to change from what was observed"

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        return Outcome("recommended", self.describe(plan), plan)
