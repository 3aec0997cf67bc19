"""Issue 29, item 1: too little history is its own verdict.

Seen live at a fresh deployment's first sweep: groups seen once read healthy ("0.0 msg/s consumed
of 0.0 produced" at lag 5,811), and a crashed group "0.0 msg/s arriving" while 50 msg/s arrived,
its partitions OK. A group with fewer snapshots than the rules need is collecting_history
(classify's rule case 28) in findings.jsonl, partition status, Slack, the page, the API and the
metrics; only a crash, which needs no rate, is called from one snapshot.
"""

from __future__ import annotations

import pytest

from tests.test_diagnosis_transforms import T0, frame, run_findings, snap  # noqa: F401  (frame: a fixture)

RATE_FIELDS = ("produce_rate", "consume_rate", "partition_produce_rate", "partition_consume_rate",
               "early_produce_rate", "late_produce_rate", "baseline_produce_rate", "baseline_consume_rate")


def lagging(n, *, group="orders-processor", state="STABLE", members=4, member="consumer-1-aaa"):
    """`n` snapshots a minute apart of 4 partitions: 50 msg/s arrive on each, 40 are consumed;
    lag 1,452 + 600 a minute per partition (5,811 in all at the first: the live lab's)."""
    rows = []
    for k in range(n):
        for p in range(4):
            leo = 100_000 + 3_000 * k
            committed = leo - 1_452 - (3 if p == 0 else 0) - 600 * k
            rows.append(snap(60 * k, p, leo, committed, group=group, state=state, members=members,
                             member=member))
    return rows


def keeping_up(n, group="billing"):
    return [snap(60 * k, p, 10_000 + 3_000 * k, 10_000 + 3_000 * k - 5, group=group)
            for k in range(n) for p in range(2)]


# -- the diagnosis job's transforms (Spark) -------------------------------------------------

@pytest.mark.spark
def test_one_snapshot_of_a_lagging_group_is_collecting_history_never_healthy_nor_a_rate(frame):
    found, status = run_findings(frame(lagging(1)), with_status=True)
    (f,) = found
    assert f["diagnosis"] == "collecting_history" and f["severity"] == "ok"
    assert f["summary"] == ("collecting history (1 of 3 snapshots; decides at 12:02 UTC): lag 5,811 across "
                            "4 partitions; group STABLE, 4 live members")
    ev = f["evidence"]
    assert (ev["snapshots_seen"], ev["snapshots_needed"], ev["decides_at"]) == (1, 3, "2026-11-21T12:02:00Z")
    assert (ev["lag"], ev["group_state"], ev["group_members"]) == (5_811, "STABLE", 4)
    assert {k: ev[k] for k in RATE_FIELDS} == dict.fromkeys(RATE_FIELDS)  # unknown, never 0.0
    assert "msg/s" not in f["summary"] and "healthy" not in f["summary"]
    # partition status keeps Burrow's answer (one observation: OK) and says it is short
    assert {(r["status"], r["collecting_history"], r["complete"], r["consume_rate"], r["produce_rate"])
            for r in status} == {("OK", True, 0.333, None, None)}


@pytest.mark.spark
def test_two_snapshots_still_collect_and_say_when_the_third_is_due(frame):
    found, status = run_findings(frame(lagging(2)), with_status=True)
    (f,) = found
    assert f["diagnosis"] == "collecting_history"
    assert f["summary"].startswith("collecting history (2 of 3 snapshots; decides at 12:02 UTC): lag 8,211 ")
    assert f["evidence"]["decides_at"] == "2026-11-21T12:02:00Z"
    # two snapshots hold a rate: measured, not guessed
    assert (f["evidence"]["produce_rate"], f["evidence"]["consume_rate"]) == (200.0, 160.0)
    assert {(r["collecting_history"], r["complete"], r["produce_rate"]) for r in status} == {(True, 0.667, 50.0)}


@pytest.mark.spark
def test_the_third_snapshot_gives_the_ordinary_verdict(frame):
    lag_found, lag_status = run_findings(frame(lagging(3)), with_status=True)
    assert {f["diagnosis"] for f in lag_found} & {"collecting_history", "healthy"} == set()
    assert all(f["evidence"]["decides_at"] is None for f in lag_found)
    assert {(r["collecting_history"], r["complete"]) for r in lag_status} == {(False, 1.0)}
    (ok,) = run_findings(frame(keeping_up(3)))
    assert ok["diagnosis"] == "healthy"
    assert ok["summary"] == "consumers keep up: lag 10 across 2 partitions, 100 msg/s consumed of 100 produced"


@pytest.mark.spark
def test_a_group_caught_up_on_one_snapshot_is_collecting_not_healthy(frame):
    (f,) = run_findings(frame(keeping_up(1)))
    assert (f["diagnosis"], f["severity"]) == ("collecting_history", "ok")


@pytest.mark.spark
def test_an_empty_group_with_lag_on_one_snapshot_is_crashed_with_its_rate_unknown(frame):
    rows = lagging(1, group="payments", state="EMPTY", members=0, member=None)
    found, status = run_findings(frame(rows), with_status=True)
    (f,) = found
    assert (f["diagnosis"], f["severity"]) == ("crashed_consumer", "warning")
    assert f["summary"] == ("group is EMPTY with 0 live members; lag 5,811, rate unknown: 1 snapshot, "
                            "nobody consuming")
    assert f["evidence"]["produce_rate"] is None and f["evidence"]["decides_at"] == "2026-11-21T12:02:00Z"
    assert {(r["status"], r["collecting_history"]) for r in status} == {("OK", True)}
