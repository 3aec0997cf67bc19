"""After lagdoctor acts: the next sweeps name its action beside what it explains, and one reply says
whether it worked (lagdoctor.remediation.postcheck; the stage against SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.remediation.postcheck import attribution, post_check

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def executed(action, *, at=T0, plan=None, detail=None, group="orders-processor", message="done", key="k1"):
    return {"action": action, "status": "executed", "ts": at.isoformat(), "cluster": "prod", "group_id": group,
            "topic": "orders", "diagnosis": "producer_surge", "plan": plan or {}, "detail": detail or {},
            "message": message, "idempotency_key": key, "run_id": "manual__1", "dry_run": False}


def finding(rows=(), *, state="STABLE", members=1, partitions=None, group="orders-processor", diagnosis="healthy"):
    parts = [{"partition": p, "member_id": m, "committed_offset": c, "produce_rate": r} for p, m, c, r in rows]
    return {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": [], "diagnosis": diagnosis,
            "severity": "ok", "pattern": "flat", "summary": "s",
            "evidence": {"group_state": state, "group_members": members,
                         "partition_count": partitions if partitions is not None else len(parts), "partitions": parts}}


GROWN = executed("add_partitions", plan={"current": 2, "target": 8}, detail={"partitions": 8},
                 message="grew orders from 2 to 8 partitions")
TWO_OWNED_SIX_NOT = [(0, "m1", 10, 20.0), (1, "m1", 10, 20.0)] + [(p, None, None, 5.0) for p in range(2, 8)]
ALL_OWNED = [(p, "m1" if p < 4 else "m2", 10, 5.0) for p in range(8)]
SKIPPED = executed("skip_poison_pill", detail={"skipped": {"0": 120}}, message="copied 1 record(s)")

# (record, finding, minutes after the action, verdict, in the text, why)
RULES = [
    (GROWN, finding(TWO_OWNED_SIX_NOT), 1, "pending", "partitions 2-7 not yet assigned",
     "5: a minute after: the group has not refreshed its metadata yet; nothing is said"),
    (GROWN, finding(TWO_OWNED_SIX_NOT), 5, "not_yet", "metadata.max.age.ms", "1: seen live: 2-7 unassigned after 2 min"),
    (GROWN, finding(TWO_OWNED_SIX_NOT), 10, "failed", "partitions 2-7 not yet assigned", "6: ten minutes: said once"),
    (GROWN, finding(ALL_OWNED, members=2), 3, "worked", "partitions 2-7 are assigned (2 member(s)) and receive 30.0 msg/s",
     "1: every new partition owned"),
    (executed("restart_consumers"), finding(state="EMPTY", members=0), 10, "failed", "EMPTY with 0 member(s)",
     "2: still nobody consuming"),
    (executed("restart_consumers"), finding(state="STABLE", members=3), 3, "worked", "STABLE again with 3 member(s)",
     "2: back"),
    (executed("scale_consumers", plan={"target_replicas": 4}), finding(members=2, partitions=6), 10, "failed",
     "2 of 4 member(s)", "3: the Deployment scaled, the group did not grow"),
    (executed("scale_consumers", plan={"target_replicas": 8}), finding(members=6, partitions=6), 3, "worked",
     "6 member(s)", "3: one per partition is as far as it goes"),
    (SKIPPED, finding([(0, "m1", 120, 5.0)]), 10, "failed", "partition 0 still at offset 120", "4: still stuck"),
    (SKIPPED, finding([(0, "m1", 350, 5.0)]), 3, "worked", "partition 0 past offset 120 (now 350)", "4: moved on"),
]


@pytest.mark.parametrize("record,current,minutes,verdict,text,why", RULES, ids=[r[5] for r in RULES])
def test_post_check_rules(record, current, minutes, verdict, text, why):
    check = post_check(record, current, T0 + timedelta(minutes=minutes))
    assert check is not None and check.verdict == verdict and text in check.text


def test_no_check_without_evidence_or_for_what_is_not_a_change():
    assert post_check(GROWN, finding([]), T0 + timedelta(minutes=3)) is None  # no rows: cannot say
    assert post_check({**GROWN, "status": "dry_run"}, finding(ALL_OWNED), T0 + timedelta(minutes=3)) is None
    assert post_check(executed("recommend_consumer_config"), finding(), T0 + timedelta(minutes=3)) is None


def test_an_action_is_attributed_while_it_explains_the_finding_and_not_once_it_worked():
    line = attribution(GROWN, finding(TWO_OWNED_SIX_NOT), T0 + timedelta(minutes=3))
    assert line == ("add_partitions by lagdoctor 3 min ago (grew orders from 2 to 8 partitions): partitions 2-7 not "
                    "yet assigned (the group's consumers see new partitions at their next metadata refresh, "
                    "metadata.max.age.ms, default 5 min)")
    assert attribution(GROWN, finding(ALL_OWNED), T0 + timedelta(minutes=3)) is None
    assert attribution(GROWN, finding(TWO_OWNED_SIX_NOT), T0 + timedelta(minutes=31)) is None  # history by then


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    from lagdoctor.settings import Settings

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("AIRFLOW_CONN_SLACK_API_DEFAULT", raising=False)
    return Settings.from_env()


def test_sweeps_after_add_partitions_name_it_and_say_once_whether_it_worked(settings, slack_connection, tmp_path):
    """Seen live: after add_partitions (2 -> 8) was approved, partitions 2-7 stayed unassigned and the next
    sweep raised a second CRITICAL (`partitions 0, 1 hold 100% of the lag`), saying nothing of the change."""
    from lagdoctor.notify import post_or_update_incident
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.stages.notify import post_findings

    surge = {**finding(TWO_OWNED_SIX_NOT[:2], partitions=2, diagnosis="producer_surge"), "severity": "critical",
             "summary": "produce rate rose 6.7x", "evidence": {"lag_total": 40_000, "group_state": "STABLE",
                                                              "group_members": 1, "partition_count": 2}}
    post_or_update_incident(surge, run_id="scheduled__0", settings=settings, now=T0 - timedelta(minutes=5),
                            sweep=[surge])
    ActionLog.from_settings(settings).append(GROWN)
    other_group = executed("restart_consumers", group="billing", key="k2")  # another group's: not this thread's
    ActionLog.from_settings(settings).append(other_group)

    def sweep(minute: int, rows, diagnosis="partition_imbalance", lag=40_000):
        f = {**finding(rows, diagnosis=diagnosis), "severity": "critical" if lag else "ok", "partitions": [0, 1],
             "summary": "partitions 0, 1 hold 100% of the lag"}
        f["evidence"]["lag_total"] = lag
        plans = tmp_path / f"run-{minute}" / "plans.json"
        plans.parent.mkdir()
        plans.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}}]))
        post_findings(str(plans), f"scheduled__{minute}", settings=settings, now=T0 + timedelta(minutes=minute))

    sweep(2, TWO_OWNED_SIX_NOT)
    text = json.dumps(slack_connection.messages, ensure_ascii=False)
    assert "lagdoctor's own action:* add_partitions by lagdoctor 2 min ago" in text
    assert "partitions 2-7 not yet assigned" in text
    assert len([m for m in slack_connection.messages if not m.get("thread_ts")]) == 1  # no second CRITICAL post
    for minute in (6, 10, 11):
        sweep(minute, TWO_OWNED_SIX_NOT)
    checks = [m for m in slack_connection.messages if "Checked:" in json.dumps(m)]
    assert len(checks) == 1 and "add_partitions has not worked 10m" in json.dumps(checks[0], ensure_ascii=False)
    assert checks[0]["thread_ts"] == slack_connection.posts[0].ts
    assert "billing" not in json.dumps(slack_connection.messages)
