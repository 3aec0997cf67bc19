"""The demo's live incidents on a real broker: a killed consumer process empties its
group once its session times out, and a member slower than max.poll.interval.ms
keeps changing its group's owners (what the rebalance_loop rule counts)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone

import pytest

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.kafka.clients import admin_client
from lagdoctor.kafka.collector import collect_snapshot
from lagdoctor.lab.demo import Incident, LOOP_MEMBER, live_incidents, played_against_found, report_shortfalls
from lagdoctor.lab.rates import RateSegment, rate_shortfall
from lagdoctor.lab.workload import ConsumerProcess, SteadyProducer, create_topic

from tests.fixtures.web import lag_data_root  # noqa: F401  (fixture)

broker = pytest.mark.broker


def snapshot(bootstrap: str, group: str) -> list[dict]:
    return collect_snapshot(admin_client(bootstrap), "local", re.escape(group),
                            datetime.now(timezone.utc)).to_pylist()


@broker
def test_a_killed_consumer_process_leaves_its_group_empty_after_its_session_times_out(kafka_bootstrap, unique):
    topic, group = unique("mail"), unique("mailer")
    create_topic(kafka_bootstrap, topic, 2)
    producer = SteadyProducer(kafka_bootstrap, topic, [0, 1], 20).start()
    consumer = ConsumerProcess(kafka_bootstrap, group, topic, client_id="mailer-1").start()
    try:
        assert consumer.assigned.wait(60), "the consumer process never got partitions"
        rows = snapshot(kafka_bootstrap, group)
        assert {(r["group_state"], r["group_members"], r["client_id"]) for r in rows} == {("STABLE", 1, "mailer-1")}

        consumer.kill()
        assert not consumer.alive()
        state, deadline = "STABLE", time.monotonic() + 20  # session.timeout.ms is 6 s
        while state != "EMPTY" and time.monotonic() < deadline:
            time.sleep(0.5)
            rows = snapshot(kafka_bootstrap, group)
            state = rows[0]["group_state"]
        assert state == "EMPTY", "the group kept its killed member"
        assert {r["group_members"] for r in rows} == {0}
        assert {r["member_id"] for r in rows} == {None}
        time.sleep(2)
        assert sum(r["lag"] for r in snapshot(kafka_bootstrap, group)) > sum(r["lag"] for r in rows)
    finally:
        consumer.stop()
        producer.stop()


@broker
def test_the_demo_loop_member_changes_the_owners_at_least_as_often_as_a_loop_needs(kafka_bootstrap, unique):
    topic, group = unique("inventory"), unique("inventory-sync")
    create_topic(kafka_bootstrap, topic, 2)
    producer = SteadyProducer(kafka_bootstrap, topic, [0, 1], 20).start()
    members = [ConsumerProcess(kafka_bootstrap, group, topic, client_id="sync-1").start(),
               ConsumerProcess(kafka_bootstrap, group, topic, client_id="sync-2", **LOOP_MEMBER).start()]
    try:
        assert all(m.assigned.wait(60) for m in members)
        owner_sets, started = [], time.monotonic()
        while time.monotonic() - started < 25:  # the demo samples every 5 s for 60 s
            owner_sets.append(frozenset(r["member_id"] for r in snapshot(kafka_bootstrap, group) if r["member_id"]))
            time.sleep(2.5)
        changes = sum(1 for a, b in zip(owner_sets, owner_sets[1:]) if a and b and a != b)
        assert changes >= Thresholds().rebalance_loop_min
        assert all(m.alive() for m in members), "an evicted member rejoins; it does not die"
    finally:
        for m in members:
            m.stop()
        producer.stop()


def test_the_demo_says_which_incidents_the_sweep_misread():
    findings = [{"group_id": i.group, "diagnosis": i.expect} for i in live_incidents()]
    findings[1] = {**findings[1], "diagnosis": "slow_consumer"}
    lines = played_against_found(live_incidents(), findings)
    assert [ok for _, ok in lines].count(False) == 1
    assert lines[1][0].split()[:2] == ["MISS", "clicks-aggregator"]
    assert "found slow_consumer" in lines[1][0]


class SlowMachineProducer(SteadyProducer):
    """The demo's producer on a machine too slow for it: every record costs 20 ms of CPU it does not get."""

    def _send(self, producer, due: int) -> None:
        for p in self.partitions:
            for _ in range(due):
                producer.produce(self.topic, value=b"event", partition=p)
                time.sleep(0.02)


@broker
def test_a_workload_short_of_its_design_is_printed_and_shown_on_the_page_not_called_healthy(
        kafka_bootstrap, unique, lag_data_root, capsys):
    """11 of a designed 150 msg/s: the surge never happened. The demo says so, and the lag page says the
    group's verdict does not test the incident instead of showing a plain "consumers keep up"."""
    from fastapi.testclient import TestClient

    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader
    from tests.fixtures.web import allow_all

    topic = unique("clicks")
    create_topic(kafka_bootstrap, topic, 2)
    # "billing" is a seeded group whose latest finding is healthy: the page would otherwise call it fine
    incident = Incident(topic, "billing", "producer surge", "producer_surge", "rates", 2, 150)
    incident.producer = SlowMachineProducer(kafka_bootstrap, topic, [0, 1], 150).start()
    try:
        time.sleep(7)
        shortfalls = report_shortfalls([incident], str(lag_data_root.root), {})
    finally:
        incident.producer.stop()
    line = shortfalls["billing"]
    reached = int(re.match(rf"machine too slow: {topic} reached (\d+) of 150 msg/s per partition", line).group(1))
    assert reached < 0.8 * 150
    assert f"{line}: billing's incident was not played as designed" in capsys.readouterr().out

    app = create_app(lambda: Settings(data_root=str(lag_data_root.root)))
    app.dependency_overrides[dag_run_reader] = lambda: allow_all
    with TestClient(app) as client:
        page, group = client.get("/").text, client.get("/group/prod/billing").text
    healthy_row = page[page.index('data-group="billing"'):]
    healthy_row = healthy_row[:healthy_row.index("</summary>")]
    assert f"not tested: {line}" in healthy_row and "consumers keep up" not in healthy_row
    assert f'data-shortfall="billing">{line}: the demo' in page
    assert f'data-shortfall="billing">{line}: the demo' in group


def test_a_workload_that_kept_its_rate_raises_nothing_and_a_short_stretch_is_not_judged():
    assert rate_shortfall("audit-log", [RateSegment(30, 60, 60 * 29)]) is None  # 29 of 30: a tick late
    assert rate_shortfall("clicks", [RateSegment(20, 60, 1200), RateSegment(150, 2, 10)]) is None
    assert rate_shortfall("clicks", [RateSegment(20, 60, 1200), RateSegment(150, 45, 495)]) == (
        "machine too slow: clicks reached 11 of 150 msg/s per partition (over 45 s)")


def test_an_incident_whose_workload_fell_short_is_never_reported_as_diagnosed():
    findings = [{"group_id": i.group, "diagnosis": i.expect} for i in live_incidents()]
    findings[1] = {**findings[1], "diagnosis": "healthy"}
    short = {"clicks-aggregator": "machine too slow: clicks reached 11 of 150 msg/s per partition (over 45 s)",
             "audit-archiver": "machine too slow: audit-log reached 3 of 30 msg/s per partition (over 60 s)"}
    lines = played_against_found(live_incidents(), findings, short)
    assert [ok for _, ok in lines] == [True, False, True, True, True, False]
    assert lines[1][0].split()[:2] == ["SHORT", "clicks-aggregator"]
    assert lines[1][0].endswith("found healthy (not tested: machine too slow: clicks reached 11 of 150 msg/s "
                                "per partition (over 45 s))")
    # the healthy group was diagnosed "healthy" as designed, but on a tenth of its traffic: not a pass either
    assert lines[5][0].split()[:2] == ["SHORT", "audit-archiver"]


def test_the_demo_shows_the_newest_complete_run_never_one_killed_mid_write(tmp_path):
    """A diagnosis killed just after findings.jsonl appeared (run.json there, _WRITING left) is not the result."""
    import json

    from lagdoctor.lab.demo import latest_complete_findings

    root = tmp_path / "findings"
    for name, planned, verdict, files in (("run-old", "2026-11-21T10:00:00+00:00", "crashed_consumer",
                                           ("partition_status.jsonl",)),
                                          ("run-killed", "2026-11-21T10:05:00+00:00", "healthy", ("_WRITING",))):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"planned_at": planned, "dag_id": "kafka_lag_health_sweep"}))
        (folder / "findings.jsonl").write_text(json.dumps({"group_id": "mailer", "diagnosis": verdict}) + "\n")
        for extra in files:
            (folder / extra).write_text("")
    run_dir, findings, skipped = latest_complete_findings(str(root))
    assert run_dir == root / "run-old"
    assert [f["diagnosis"] for f in findings] == ["crashed_consumer"]
    assert skipped.startswith("1 incomplete run skipped: ") and "run-killed" in skipped

    (root / "run-old" / "partition_status.jsonl").unlink()  # killed between its two outputs: nothing complete
    assert latest_complete_findings(str(root))[0] is None


class StandInEngine:
    """The Connect server as the demo drives it: an address, a token, and whether it was stopped."""

    url, token, log = "sc://localhost:1", "t", None

    def __init__(self) -> None:
        self.stopped_during_sweep = False
        self.sweep_running = False

    def stop(self) -> None:
        self.stopped_during_sweep |= self.sweep_running

    def alive(self) -> bool:
        return True


def test_a_warm_up_that_fails_after_the_sweep_started_never_stops_the_engine_under_it(tmp_path, monkeypatch):
    """The warm-up outlasts its wait (the sampling ended first), then fails while the sweep runs:
    the engine the sweep's spark_default names must not be stopped under it."""
    import threading
    import types

    import lagdoctor.kafka.broker
    from lagdoctor.connectserver import ConnectServerError
    from lagdoctor.lab import demo

    engine, fail_now, threads = StandInEngine(), threading.Event(), []

    def warm_engine(server, workdir):
        fail_now.wait(60)
        raise ConnectServerError("warming the Spark Connect server failed (1): lost its executors")

    class RecordedThread(threading.Thread):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            threads.append(self)

    def sweep(self):
        used = json.loads(self.airflow_env()["AIRFLOW_CONN_SPARK_DEFAULT"])["conn_type"] == "spark_connect"
        engine.sweep_running = True
        fail_now.set()  # the warm-up fails now, mid-sweep
        for thread in threads:
            thread.join(60)
        engine.sweep_running = False
        sweeps.append(used)
        return 0

    sweeps: list[bool] = []
    broker = types.SimpleNamespace(bootstrap="127.0.0.1:1", stop=lambda: None)
    monkeypatch.setattr(lagdoctor.kafka.broker, "EmbeddedBroker", lambda **_: types.SimpleNamespace(
        start=lambda: broker))
    monkeypatch.setattr(demo, "start_engine", lambda workdir: engine)
    monkeypatch.setattr(demo, "warm_engine", warm_engine)
    monkeypatch.setattr(demo, "WARM_UP_TIMEOUT_S", 0.01)  # the sweep stops waiting for the warm-up
    monkeypatch.setattr(demo.threading, "Thread", RecordedThread)
    monkeypatch.setattr(demo, "live_incidents", lambda _: [])
    monkeypatch.setattr(demo, "start_workloads", lambda *_: None)
    monkeypatch.setattr(demo, "report_shortfalls", lambda *_: {})
    monkeypatch.setattr(demo.Demo, "sample_history", lambda self: None)
    monkeypatch.setattr(demo.Demo, "run_sweep", sweep)
    monkeypatch.setattr(demo.Demo, "show_results", lambda self: 0)

    assert demo.Demo(tmp_path, 0, 1, 0, 0).run() == 0
    assert len(sweeps) == 1
    assert not engine.stopped_during_sweep


def test_the_demos_kubernetes_api_names_each_consumers_pod_and_deployment_through_a_0600_kubeconfig(
        tmp_path, monkeypatch):
    """What `make demo` gives the sweep: each consumer process (its host, its client id) traced to its pod
    and its group's Deployment, through a kubeconfig only its owner reads; the token nowhere else."""
    import os
    import stat
    import types

    from lagdoctor.lab import demo
    from lagdoctor.notify.render import render_incident
    from lagdoctor.remediation.config import KubernetesSettings
    from lagdoctor.workloads import WorkloadResolver

    incidents = live_incidents()
    members = [(inc.group, i) for inc in incidents for i in range(1, len(inc.members) + 1)]
    kube = demo.DemoKubernetes(tmp_path).start(incidents, datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc))
    try:
        run = demo.Demo(tmp_path, 0, 1, 0, 0)
        run.broker, run.kubernetes = types.SimpleNamespace(bootstrap="127.0.0.1:1"), kube
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # the demo run inside some cluster's pod
        env = run.airflow_env()
        assert env["KUBECONFIG"] == str(kube.kubeconfig) and "KUBERNETES_SERVICE_HOST" not in env
        assert stat.S_IMODE(os.stat(kube.kubeconfig).st_mode) == 0o600
        assert not any(kube.api.token in value for value in env.values())
        monkeypatch.setenv("KUBECONFIG", env["KUBECONFIG"])
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
        with WorkloadResolver(KubernetesSettings()) as workloads:
            traced = {m: workloads.resolve(f"/{demo.POD_IP}", demo.pod_name(*m)) for m in members}
        assert {r.authorization for r in kube.api.requests} == {f"Bearer {kube.api.token}"}
    finally:
        kube.stop()
    assert {m: (w.pod, w.target) for m, w in traced.items()} == {
        m: (demo.pod_name(*m), f"Deployment shop/{m[0]}") for m in members}
    assert len({demo.pod_name(*m) for m in members}) == len(members) == 7
    assert [a["name"] for a in traced[(demo.SURGE_GROUP, 1)].autoscalers] == ["clicks-aggregator-cpu"]

    # and what the demo prints under the orders group's Slack message
    orders = ("orders-processor", 1)
    finding = {"cluster": "kafka_default", "group_id": "orders-processor", "topic": "orders", "partitions": [1],
               "diagnosis": "partition_imbalance", "pattern": "steady_climb", "severity": "critical",
               "summary": "partition 1 holds the lag", "window_start": "2026-11-21T02:40:00Z",
               "window_end": "2026-11-21T03:05:00Z",
               "evidence": {"partition": 1, "owner_host": f"/{demo.POD_IP}", "owner_client_id": demo.pod_name(*orders),
                            "lag_onset": "2026-11-21T03:00:30.000000Z", "workload": traced[orders].as_dict()}}
    assert demo.workload_lines_of(render_incident(finding, {}, run_id="r")) == [
        f"Runs in: pod {demo.pod_name(*orders)} of Deployment shop/orders-processor; Deployment rolled out at "
        "03:00:00 UTC, 30s before the lag began"]
