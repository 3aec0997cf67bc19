"""Issue 33: the backtest's notification replay, its report, its page and its bad input (no Spark here;
tests/test_backtest_replay.py and tests/test_backtest_job.py run the job)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from lagdoctor import backtest as bt
from lagdoctor.cli import main as cli_main

T0 = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)


def iso(minute: int) -> str:
    return (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def finding(minute: int, diagnosis: str, *, severity: str = "critical", lag: int = 50_000, provisional=False,
            group: str = "orders", **kw) -> dict:
    return {"sweep_end": iso(minute), "cluster": "prod", "group_id": group, "topic": "orders.v1", "partitions": [0, 1],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": "ok" if diagnosis == "healthy" else severity,
            "summary": f"lag {lag}", "evidence": {"lag_total": lag}, "provisional": provisional,
            "deciding_between": ["slow_consumer", "producer_surge"] if provisional else [],
            "window_start": iso(minute - 30), "window_end": iso(minute), **kw}


def test_an_episode_replayed_sweep_by_sweep_is_one_alert_then_silence_then_one_recovery(monkeypatch, tmp_path):
    """What the sweep would have sent: the post, nothing while nothing changes, the recovery; and the
    real state database (the environment's) is never touched."""
    real = tmp_path / "real-state.db"
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", f"sqlite:///{real}")
    found = ([finding(m, "healthy") for m in range(0, 3)] + [finding(m, "slow_consumer") for m in range(3, 12)]
             + [finding(m, "healthy") for m in range(12, 15)])
    decisions, counts, messages = bt.replay_notifications(iter(found))  # read as it goes

    assert [(m["sweep_end"], m["thread_ts"] is None) for m in messages] == [(iso(3), True), (iso(12), False)]
    assert "Recovered" in messages[1]["text"] or "recovered" in messages[1]["text"].lower()
    assert [(d["sweep_end"], d["decision"]) for d in decisions] == [(iso(3), "posted"), (iso(12), "recovered")]
    assert sum(counts.values()) == len(found) and counts["posted"] == 1 and counts["recovered"] == 1
    assert not real.exists(), "the backtest wrote to the real state database"
    assert os.environ["LAGDOCTOR_STATE_URL"] == f"sqlite:///{real}"


def test_findings_out_of_sweep_order_are_refused_in_one_line_not_replayed_as_two_sweeps():
    found = [finding(0, "slow_consumer"), finding(1, "slow_consumer"), finding(0, "slow_consumer", group="b")]
    with pytest.raises(ValueError, match="out of sweep order at 2026-11-21T09:00:00.000000Z"):
        bt.replay_notifications(found)


def test_a_lag_that_doubles_is_a_reply_and_a_new_cause_in_the_same_episode_is_a_flip():
    found = ([finding(m, "slow_consumer", lag=50_000) for m in range(0, 4)]
             + [finding(m, "slow_consumer", lag=200_000) for m in range(4, 25)]
             + [finding(m, "stalled_consumer", lag=300_000) for m in range(25, 28)])
    decisions, counts, messages = bt.replay_notifications(found)
    timeline = [{"sweep_end": iso(0), "cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                 "verdict": [{"diagnosis": "slow_consumer", "severity": "critical", "provisional": False}]},
                {"sweep_end": iso(25), "cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                 "verdict": [{"diagnosis": "stalled_consumer", "severity": "critical", "provisional": False}]}]
    report = bt.set_report("current", {}, timeline, decisions, counts, messages)

    assert report["alerts"] == 1
    assert report["replies"] >= 2  # the lag quadrupled (after the quarter hour), then the cause changed
    (episode,) = report["episode_list"]
    assert episode["settled_on"] == "stalled_consumer" and episode["corrected"] == 1 and episode["flips"] == 1
    assert episode["seconds_to_first_right"] == 25 * 60


def test_a_provisional_start_then_its_decision_counts_the_time_to_the_decided_message():
    found = ([finding(m, "healthy") for m in range(0, 2)]
             + [finding(m, "slow_consumer", provisional=True) for m in range(2, 4)]
             + [finding(m, "slow_consumer") for m in range(4, 8)])
    decisions, counts, messages = bt.replay_notifications(found)
    timeline = [{"sweep_end": iso(0), "cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                 "verdict": [{"diagnosis": "healthy", "severity": "ok", "provisional": False}]},
                {"sweep_end": iso(2), "cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                 "verdict": [{"diagnosis": "slow_consumer", "severity": "critical", "provisional": True}]},
                {"sweep_end": iso(4), "cluster": "prod", "group_id": "orders", "topic": "orders.v1",
                 "verdict": [{"diagnosis": "slow_consumer", "severity": "critical", "provisional": False}]}]
    report = bt.set_report("current", {}, timeline, decisions, counts, messages)
    (episode,) = report["episode_list"]
    assert episode["began"] == iso(2) and episode["first_right_message"] == iso(4)
    assert episode["seconds_to_first_right"] == 120 and episode["flips"] == 0 and episode["corrected"] == 0


def test_the_comparison_names_each_sweep_whose_verdict_the_other_set_changes():
    sweeps = [iso(m) for m in range(4)]
    row = lambda m, d: {"sweep_end": iso(m), "cluster": "c", "group_id": "g", "topic": "t",  # noqa: E731
                        "verdict": [{"diagnosis": d, "severity": "critical", "provisional": False}]}
    base = {"name": "current", "alerts": 3, "messages": 5}
    other = {"name": "proposed", "alerts": 1, "messages": 2}
    c = bt.compare(base, other, [row(0, "healthy"), row(2, "rebalance_loop")], [row(0, "healthy")], sweeps)
    assert c["alerts"] == -2 and c["verdicts_changed"] == 2
    assert [(x["sweep_end"], x["current"], x["proposed"]) for x in c["changed"]] == [
        (iso(2), "rebalance_loop", "healthy"), (iso(3), "rebalance_loop", "healthy")]


@pytest.mark.parametrize("argv, line", [
    (["--from", "yesterday"], "from: not an ISO-8601 time: 'yesterday'"),
    (["--from", "2026-11-21T10:00:00Z", "--to", "2026-11-21T09:00:00Z"], "ends (2026-11-21T09:00:00+00:00) before"),
    (["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-21T00:00:00Z"], "longer than 14 days"),
    (["--from", "2026-11-21T09:00:00Z", "--set", "warning-lag"], "--set takes NAME=VALUE"),
    (["--from", "2026-11-21T09:00:00Z", "--set", "warn_lag=5"], "thresholds.warn_lag: unknown threshold"),
    (["--from", "2026-11-21T09:00:00Z", "--set", "warning_lag=-5"], "thresholds.warning_lag"),
    (["--from", "2026-11-21T09:00:00Z", "--groups", "(orders"], "groups"),
    (["--from", "2026-11-21T09:00:00Z", "--snapshots", "/nonexistent/store"], "does not exist: /nonexistent/store"),
])
def test_bad_input_is_one_line_and_nothing_is_written(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path))
    code = cli_main(["backtest", "--to", "2026-11-21T10:00:00Z", *argv] if "--to" not in argv else ["backtest", *argv])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("lagdoctor: error: ") and err.count("\n") == 1
    assert line in err
    assert not (tmp_path / "backtests").exists() or not any((tmp_path / "backtests").iterdir())


def test_an_incomplete_output_is_refused_in_one_line(tmp_path):
    (tmp_path / "backtest.json").write_text("{}")
    with pytest.raises(ValueError, match="incomplete: no readable _SUCCESS"):
        bt.build_report(str(tmp_path))
    (tmp_path / "_SUCCESS").write_text(json.dumps({"outputs": {"backtest.json": {"bytes": 99}}}))
    with pytest.raises(ValueError, match="backtest.json is missing or cut short"):
        bt.build_report(str(tmp_path))


def leave_run(findings_root, dag_id: str, run_id: str, minute: int, *, window: int = 30, overrides=None,
              complete: bool = True, groups: int = 1) -> None:
    """A run folder as the sweep leaves it: the job's outputs, _SUCCESS, then run.json."""
    from lagdoctor.stages.common import run_key

    run = findings_root / run_key(run_id, dag_id)
    run.mkdir(parents=True)
    rows = [finding(minute, "healthy", group=f"g{n}", window_start=iso(minute - window)) for n in range(groups)]
    text = "".join(json.dumps({k: v for k, v in r.items() if k != "sweep_end"}) + "\n" for r in rows)
    (run / "findings.jsonl").write_text(text)
    (run / "partition_status.jsonl").write_text("")
    if complete:
        (run / "_SUCCESS").write_text(json.dumps({"outputs": {"findings.jsonl": {"bytes": len(text.encode())},
                                                              "partition_status.jsonl": {"bytes": 0}}}))
    else:
        (run / "_WRITING").write_text("")
    (run / "run.json").write_text(json.dumps({"dag_id": dag_id, "run_id": run_id, "kind": "sweep",
                                              "planned_at": iso(minute + 1), "threshold_overrides": overrides or {}}))


def test_as_swept_replays_the_times_of_the_sweeps_that_ran_and_nothing_else(tmp_path):
    """The ends of complete sweep runs without overrides, in the range; incident runs, experiments,
    a run still writing, a run with no group and one outside the range are not sweeps to replay."""
    root = tmp_path / "findings"
    for minute in (0, 5, 11, 16):
        leave_run(root, "kafka_lag_health_sweep", f"scheduled__{minute}", minute)
    leave_run(root, "kafka_lag_health_sweep", "scheduled__40", 40)  # after the range
    leave_run(root, "kafka_lag_health_sweep", "manual__7", 7, overrides={"warning_lag": 5})
    leave_run(root, "kafka_lag_health_sweep", "scheduled__8", 8, complete=False)
    leave_run(root, "kafka_lag_health_sweep", "scheduled__9", 9, groups=0)
    leave_run(root, "kafka_lag_incident", "manual__6", 6)
    (root / "_runindex.json").write_text("{}")
    ends, windows = bt.swept_ends(str(root), T0, T0 + timedelta(minutes=20))
    assert ends == [T0 + timedelta(minutes=m) for m in (0, 5, 11, 16)] and windows == [30.0]
    assert bt.swept_ends(str(tmp_path / "nothing-here"), T0, T0 + timedelta(minutes=20)) == ([], [])


def test_as_swept_says_in_one_line_when_there_is_no_sweep_or_the_windows_differ(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path))
    argv = ["backtest", "--as-swept", "--from", iso(0), "--to", iso(20)]
    assert cli_main(argv) == 1
    assert "no sweep of 2026-11-21T09:00:00+00:00 .. 2026-11-21T09:20:00+00:00 is stored in" in capsys.readouterr().err
    leave_run(tmp_path / "findings", "kafka_lag_health_sweep", "scheduled__1", 1, window=30)
    leave_run(tmp_path / "findings", "kafka_lag_health_sweep", "scheduled__2", 2, window=10)
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the sweeps of the range used different windows (10, 30 min)" in err
    assert not (tmp_path / "backtests").exists()


def report_in(root, name="20261121T100000Z") -> dict:
    from lagdoctor.web.backtest_page import write_backtest_html

    sweeps = [iso(m) for m in range(6)]
    timeline = [{"sweep_end": iso(0), "cluster": "prod", "group_id": "<b>orders</b>", "topic": "t",
                 "verdict": "healthy"},
                {"sweep_end": iso(2), "cluster": "prod", "group_id": "<b>orders</b>", "topic": "t",
                 "verdict": "slow_consumer"}]
    s = {"name": "current", "thresholds": {}, "alerts": 1, "replies": 0, "messages": 1, "episodes": 1, "flips": 0,
         "corrected": 0, "never_named": 0, "median_seconds_to_first_right": 0.0, "timeline": timeline,
         "episode_list": [{"cluster": "prod", "group_id": "<b>orders</b>", "topic": "t", "began": iso(2),
                           "settled_on": "slow_consumer", "seconds_to_first_right": 0.0, "flips": 0,
                           "corrected": 0}], "carry_settled": True, "decisions": {}}
    report = {"from": iso(0), "to": iso(5), "window_minutes": 30.0, "step_minutes": 1.0, "groups": None,
              "topic": None, "clusters": None, "sweeps": 6, "sweep_list": sweeps, "first_sweep": sweeps[0],
              "last_sweep": sweeps[-1], "sets": [s], "comparisons": [], "made_at": iso(10)}
    report["strips"] = {"current": bt.strips(s, sweeps)}
    report["text"] = bt.summary_text(report)
    folder = root / "backtests" / name
    folder.mkdir(parents=True)
    bt.write_report(str(folder), report)
    write_backtest_html(report, str(folder / bt.REPORT_HTML))
    return report


def test_the_summary_says_how_the_sweeps_were_chosen(tmp_path):
    report = report_in(tmp_path)
    assert report["text"].splitlines()[0].endswith("6 sweeps (one every 1 min), 30-minute window")
    assert bt.summary_text({**report, "step_minutes": None}).splitlines()[0].endswith("6 sweeps (as they ran), "
                                                                                      "30-minute window")


def test_the_lag_page_lists_backtests_and_shows_each_report_with_its_timeline(tmp_path):
    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader

    report_in(tmp_path)
    app = create_app(lambda: Settings(data_root=str(tmp_path)))
    readable = {"kafka_lag_backtest"}
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: dag_id in readable)
    client = TestClient(app)

    listing = client.get("/backtests")
    assert listing.status_code == 200 and 'href="backtests/20261121T100000Z"' in listing.text
    assert "current: 1 alerts, 0 replies" in listing.text
    page = client.get("/backtests/20261121T100000Z")
    assert page.status_code == 200 and 'class="strip"' in page.text
    assert '<span class="ok" style="flex-grow:2"' in page.text and '<span class="critical" style="flex-grow:4"' in page.text
    assert "<b>orders</b>" not in page.text and "&lt;b&gt;orders&lt;/b&gt;" in page.text
    assert client.get("/backtests/..%2F..%2Fetc").status_code == 404
    assert client.get("/backtests/nope").status_code == 404
    readable.clear()  # a user who may not read the backtest DAG sees none of it
    assert client.get("/backtests").status_code == 404
    assert client.get("/backtests/20261121T100000Z").status_code == 404
