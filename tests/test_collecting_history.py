"""Issue 29, item 1: too little history is its own verdict.

Seen live at a fresh deployment's first sweep: groups seen once read healthy ("0.0 msg/s consumed
of 0.0 produced" at lag 5,811), and a crashed group "0.0 msg/s arriving" while 50 msg/s arrived,
its partitions OK. A group with fewer snapshots than the rules need is collecting_history
(classify's rule case 28) in findings.jsonl, partition status, Slack, the page, the API and the
metrics; only a crash, which needs no rate, is called from one snapshot.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.settings import Settings
from tests.fixtures.slack import slack_connection, slack_server  # noqa: F401
from tests.test_diagnosis_transforms import frame, run_findings, snap  # noqa: F401  (frame: a fixture)

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
    # an assign() consumer has no members either: posted now, decided once its commits can show
    assert (f["provisional"], f["deciding_between"], f["decided_by"], f["samples_needed"]) == (
        True, ["crashed_consumer", "healthy"], "2026-11-21T12:02:00Z", 2)
    assert {(r["status"], r["collecting_history"]) for r in status} == {("OK", True)}


@pytest.mark.spark
def test_a_memberless_group_whose_commit_moved_between_its_two_snapshots_is_collecting_not_crashed(frame):
    """The live lab's first sweep (two samples 10 s apart) called an assign() consumer crashed,
    then "recovered" it a minute later: its commit had moved between the samples."""
    rows = [snap(t, p, 1_000 + 20 * t, 998 + 20 * t, group="flink-job", state="EMPTY", members=0, member=None)
            for t in (0, 10) for p in range(2)]
    (f,) = run_findings(frame(rows))
    assert (f["diagnosis"], f["severity"]) == ("collecting_history", "ok")
    # the next snapshot comes with the next sweep, not 10 s later
    assert f["summary"].startswith("collecting history (2 of 3 snapshots; decides at 12:01 UTC)")
    assert f["evidence"]["decides_at"] == "2026-11-21T12:01:10Z"


# -- Slack: one notice for a new deployment, nothing per collecting group -------------------

NOW = datetime(2026, 11, 21, 3, 15, 5, tzinfo=timezone.utc)


def collecting_finding(group, *, cluster="prod", topic="orders", decides_at="2026-11-21T03:17:05Z", seen=1):
    return {"cluster": cluster, "group_id": group, "topic": topic, "partitions": [],
            "diagnosis": "collecting_history", "pattern": "flat", "severity": "ok",
            "summary": f"collecting history ({seen} of 3 snapshots; decides at 03:17 UTC): lag 5,811 across 4 "
                       "partitions; group STABLE, 4 live members",
            "evidence": {"lag": 5811, "snapshots_seen": seen, "snapshots_needed": 3, "decides_at": decides_at,
                         "group_state": "STABLE", "group_members": 4, "data_complete": True},
            "window_start": "2026-11-21T02:45:05Z", "window_end": "2026-11-21T03:15:05Z"}


def problem_finding(group="orders-processor", diagnosis="slow_consumer"):
    return {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": [0, 1],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": "warning", "summary": "lag climbs",
            "evidence": {"lag_total": 5000, "lag": 5000, "data_complete": True},
            "window_start": "2026-11-21T02:45:05Z", "window_end": "2026-11-21T03:15:05Z"}


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    return Settings.from_env()


def write_plans(tmp_path, run, findings):
    plans = tmp_path / run / "plans.json"
    plans.parent.mkdir()
    plans.write_text(json.dumps([{"finding": f, "plan": {"actions": [], "next_steps": []}} for f in findings]))
    return str(plans)


def test_a_new_deployment_posts_one_watching_notice_and_nothing_per_group(settings, slack_connection, tmp_path):
    from lagdoctor.notify.threads import ThreadStore
    from lagdoctor.stages.notify import post_findings

    server = slack_connection
    groups = [f"group-{i:02d}" for i in range(12)]
    first = [collecting_finding(g) for g in groups]
    summary = post_findings(write_plans(tmp_path, "run-1", first), "run-1", settings=settings)
    assert summary == {"collecting": 12}
    (notice,) = server.messages
    text = notice["blocks"][0]["text"]["text"]
    assert "watching 12 consumer groups on cluster `prod`" in text
    assert "`group-00`" in text and "`group-09`" in text and "group-10" not in text and "and 2 more" in text
    assert "First verdicts at 03:17 UTC, once each group has 3 snapshots" in text
    assert not list(ThreadStore().all())
    # the next sweep, still collecting: nothing at all
    second = [collecting_finding(g, seen=2) for g in groups]
    post_findings(write_plans(tmp_path, "run-2", second), "run-2", settings=settings)
    assert len(server.messages) == 1 and not list(ThreadStore().all())


def test_the_watching_notice_says_which_groups_were_posted_as_possibly_crashed():
    from lagdoctor.notify.render import render_watching_notice

    crashed = {**collecting_finding("payments"), "diagnosis": "crashed_consumer", "severity": "warning",
               "provisional": True, "deciding_between": ["crashed_consumer", "healthy"]}
    msg = render_watching_notice("prod", [collecting_finding("orders-processor"), crashed])
    text = msg["blocks"][0]["text"]["text"]
    assert "watching 2 consumer groups" in text and "`orders-processor`, `payments`." in text
    assert "Posted now, in its own thread: 1 group with lag and no live member, possibly crashed" in text
    assert msg["text"] == "lagdoctor is watching 2 consumer group(s) on cluster prod; first verdicts at 03:17 UTC"


def test_a_deployment_with_decided_groups_is_not_new(settings, slack_connection, tmp_path):
    from lagdoctor.stages.notify import post_findings

    server = slack_connection
    found = [collecting_finding("newcomer"), problem_finding()]
    post_findings(write_plans(tmp_path, "run-1", found), "run-1", settings=settings)
    assert len(server.messages) == 1 and "watching" not in server.messages[0]["text"]  # the problem's thread only


def test_a_collecting_finding_never_closes_an_open_thread_as_recovered(settings, slack_connection):
    from lagdoctor.notify import post_or_update_incident
    from lagdoctor.notify.threads import ThreadStore

    server = slack_connection
    assert post_or_update_incident(problem_finding(), None, run_id="run-1", now=NOW)["decision"] == "posted"
    # history lost to a gap longer than the window: the group collects again
    result = post_or_update_incident(collecting_finding("orders-processor"), None, run_id="run-2",
                                     now=NOW + timedelta(minutes=40))
    assert result["decision"] == "collecting" and result["threads"] == []
    assert len(server.messages) == 1  # no recovery reply, no new thread
    (state,) = ThreadStore().all()
    assert state.status == "open" and state.key.diagnosis == "slow_consumer"


def test_an_incident_run_counts_collecting_groups_apart_from_problems_and_healthy():
    from lagdoctor.notify.render import render_run_header

    msg = render_run_header([collecting_finding("a"), collecting_finding("b")], scope="prod / .*", run_id="r")
    assert msg["text"] == "Incident run for prod / .*: 0 problem(s), 0 healthy, 2 collecting history (group, topic) pair(s)"
    body = json.dumps(msg["blocks"])
    assert "still collecting history, no verdict" in body and "keeps up" not in body


# -- the page, the JSON API, the metrics ---------------------------------------------------

def _collecting_root(tmp_path):
    """Two sweeps: orders-processor was a problem, then its history restarted (collecting);
    payments is seen once."""
    from tests.fixtures.web import write_run

    findings_root = tmp_path / "findings"

    def rows(group, collecting, status="OK"):
        return [{"cluster": "prod", "group_id": group, "topic": "orders", "partition": p, "status": status,
                 "lag": 1452, "time_lag_seconds": None, "consume_rate": None if collecting else 40.0,
                 "produce_rate": None if collecting else 50.0, "complete": 0.333 if collecting else 1.0,
                 "collecting_history": collecting} for p in range(4)]

    write_run(findings_root, "run-1", [problem_finding()], rows("orders-processor", False, "WARN"),
              dag_id="kafka_lag_health_sweep", run_id="run-1", planned_at=NOW - timedelta(minutes=40))
    write_run(findings_root, "run-2", [collecting_finding("orders-processor"), collecting_finding("payments")],
              rows("orders-processor", True) + rows("payments", True),
              dag_id="kafka_lag_health_sweep", run_id="run-2", planned_at=NOW)
    return tmp_path


def test_the_page_and_api_say_collecting_history_never_healthy_or_ok(tmp_path):
    import re

    from tests.test_web_app import client_for

    client = client_for(_collecting_root(tmp_path), clock=lambda: NOW)
    html = client.get("/").text
    card = html[html.index('data-group="payments"'):]
    card = card[:card.index("</details>")]
    assert '<span class="badge collecting">collecting history</span>' in card
    assert "collecting history (1 of 3 snapshots; decides at 03:17 UTC)" in card
    assert ">healthy<" not in card and ">OK<" not in card
    assert card.count('<span class="status collecting">collecting history</span>') == 4
    assert re.search(r'data-count="collecting">2<', html) and re.search(r'data-count="ok">0<', html)
    findings = client.get("/api/findings").json()["findings"]
    assert {(f["group_id"], f["diagnosis"], f["evidence"]["decides_at"]) for f in findings} == {
        ("orders-processor", "collecting_history", "2026-11-21T03:17:05Z"),
        ("payments", "collecting_history", "2026-11-21T03:17:05Z")}
    # the group view's timeline: the problem is not "recovered" by a run without a verdict
    group = client.get("/group/prod/orders-processor").text
    assert 'data-kind="first_seen"' in group and 'data-kind="recovered"' not in group


def test_the_metrics_say_collecting_history_never_ok_nor_a_severity(tmp_path):
    from lagdoctor.metrics import render_metrics
    from tests.test_metrics import only, parse_exposition, series

    samples = parse_exposition(render_metrics(str(_collecting_root(tmp_path) / "findings")))
    due = datetime(2026, 11, 21, 3, 17, 5, tzinfo=timezone.utc).timestamp()
    assert only(samples, "lagdoctor_collecting_history", group="payments", topic="orders") == due
    assert set(series(samples, "lagdoctor_partition_status", group="payments")) == {0.0}  # unknown, not 1 OK
    assert only(samples, "lagdoctor_group_status", group="payments") == 0.0
    assert series(samples, "lagdoctor_group_severity", group="payments") == []
    assert series(samples, "lagdoctor_finding", group="payments") == []
    assert only(samples, "kafka_consumergroup_group_topic_sum_lag", group="payments") == 4 * 1452  # a fact: kept
