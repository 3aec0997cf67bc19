"""From a group member to its pod and workload, on the loopback Kubernetes API (a real HTTP
server speaking the API's paths and answers, through the official client)."""

from __future__ import annotations

import json
import logging
import socket
from datetime import datetime, timezone

import pytest

from lagdoctor.remediation.config import KubernetesSettings
from lagdoctor.workloads import NO_API, WorkloadResolver

from tests.fixtures.k8s import k8s_server  # noqa: F401

OOM = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": datetime(2026, 11, 21, 3, 12, tzinfo=timezone.utc)}


def resolver(api, **kw) -> WorkloadResolver:
    return WorkloadResolver(KubernetesSettings(host=api.url, request_timeout_seconds=5, **kw))


def test_a_member_is_traced_from_its_ip_to_the_pod_its_replicaset_and_deployment(k8s_server):
    k8s_server.add_deployment("shop", "orders", replicas=3, ready=2, rolled_out_at="2026-11-21T03:10:00Z",
                              pods={"orders-7d9f-x2": "10.0.1.15", "orders-7d9f-k8": "10.0.1.16"})
    k8s_server.add_pod("shop", "orders-7d9f-x2", "10.0.1.15", owner=("ReplicaSet", next(iter(k8s_server.replicasets))[1]),
                       restarts=3, last_termination=OOM)
    with resolver(k8s_server) as workloads:
        got = workloads.resolve("/10.0.1.15", "consumer-orders-1")
        asked = len(k8s_server.requests)
        assert workloads.resolve("/10.0.1.15", "consumer-orders-1") == got  # once per member per run
        assert len(k8s_server.requests) == asked
        sibling = workloads.resolve("/10.0.1.16", "consumer-orders-2")
    assert (got.namespace, got.pod, got.kind, got.name, got.target) == (
        "shop", "orders-7d9f-x2", "Deployment", "orders", "Deployment shop/orders")
    assert got.unknown is None and got.restarts == 3
    assert got.last_termination == {"reason": "OOMKilled", "exit_code": 137, "finished_at": "2026-11-21T03:12:00Z"}
    assert (got.rolled_out_at, got.ready_replicas, got.desired_replicas) == ("2026-11-21T03:10:00Z", 2, 3)
    assert got.autoscalers == () and got.autoscalers_unknown is None
    assert (sibling.pod, sibling.target, sibling.restarts, sibling.last_termination) == (
        "orders-7d9f-k8", "Deployment shop/orders", 0, None)
    # the Deployment (and its autoscalers) were read once for both members
    assert sum("/deployments/orders" in r.path for r in k8s_server.requests) == 1


def test_pods_sharing_the_nodes_ip_are_told_apart_by_the_client_id(k8s_server):
    k8s_server.add_statefulset("etl", "loader", replicas=2, pods={"loader-0": "10.0.2.1", "loader-1": "10.0.2.1"})
    with resolver(k8s_server) as workloads:
        named = workloads.resolve("/10.0.2.1", "loader-1-consumer")
        unnamed = workloads.resolve("/10.0.2.1", "rdkafka")
    assert (named.pod, named.target, named.rolled_out_at) == ("loader-1", "StatefulSet etl/loader", None)
    assert unnamed.pod is None and unnamed.unknown == "2 pods have IP 10.0.2.1 and client id 'rdkafka' names none of them"


def test_a_member_whose_address_no_pod_has_is_found_by_its_client_id_or_said_to_run_outside(k8s_server):
    k8s_server.add_deployment("shop", "mailer", replicas=1, pods={"mailer-5c-q1": "10.0.3.7"})
    with resolver(k8s_server) as workloads:
        by_name = workloads.resolve("/192.168.9.9", "mailer-5c-q1")  # behind NAT: the client id is the pod's name
        outside = workloads.resolve("/192.168.9.10", "billing-1")
        no_host = workloads.resolve(None, None)
    assert by_name.target == "Deployment shop/mailer"
    assert outside.target is None and outside.unknown == (
        "no pod on this cluster has IP 192.168.9.10 or the name 'billing-1': the member runs outside this cluster "
        "(or behind NAT)")
    assert no_host.unknown == "the broker lists no host or client id for this member"


def test_without_rbac_to_list_pods_each_member_says_so_in_one_line(k8s_server):
    k8s_server.add_deployment("shop", "orders", replicas=1, pods={"orders-1": "10.0.1.15"})
    k8s_server.forbidden = {"pods"}
    with resolver(k8s_server) as workloads:
        got = workloads.resolve("/10.0.1.15", "orders-1")
    assert got.target is None and got.unknown.startswith("no RBAC to read it: pods is forbidden: ")
    assert "\n" not in got.unknown


def test_pods_are_looked_for_only_in_the_namespaces_given(k8s_server):
    k8s_server.add_deployment("shop", "orders", replicas=1, pods={"orders-1": "10.0.1.15"})
    with resolver(k8s_server, namespaces=("billing",)) as workloads:
        assert workloads.resolve("/10.0.1.15", "orders-1").target is None
    with resolver(k8s_server, namespaces=("billing", "shop")) as workloads:
        assert workloads.resolve("/10.0.1.15", "orders-1").target == "Deployment shop/orders"
    assert not any(r.path.startswith("/api/v1/pods") for r in k8s_server.requests)  # no cluster-wide list


def test_an_hpa_or_a_keda_scaledobject_on_the_deployment_is_named_once(k8s_server):
    k8s_server.add_deployment("shop", "orders", replicas=2, pods={"orders-1": "10.0.1.15"})
    k8s_server.add_deployment("shop", "clicks", replicas=2, pods={"clicks-1": "10.0.1.20"})
    k8s_server.add_deployment("shop", "plain", replicas=2, pods={"plain-1": "10.0.1.30"})
    k8s_server.add_autoscaler("shop", "orders-cpu", "orders", min_replicas=2, max_replicas=12)
    k8s_server.add_scaled_object("shop", "clicks-lag", "clicks", max_replicas=8, lag_threshold="500")
    k8s_server.add_autoscaler("shop", "keda-hpa-clicks-lag", "clicks", max_replicas=8)  # KEDA's own HPA
    with resolver(k8s_server) as workloads:
        orders = workloads.resolve("/10.0.1.15", "c")
        clicks = workloads.resolve("/10.0.1.20", "c")
        plain = workloads.resolve("/10.0.1.30", "c")
    assert orders.autoscalers == ({"kind": "HorizontalPodAutoscaler", "name": "orders-cpu", "min_replicas": 2,
                                   "max_replicas": 12},)
    assert clicks.autoscalers == ({"kind": "ScaledObject", "name": "clicks-lag", "min_replicas": 0,
                                   "max_replicas": 8, "lag_threshold": "500"},)
    assert plain.autoscalers == () and plain.autoscalers_unknown is None


def test_autoscalers_that_cannot_be_read_are_unknown_not_none(k8s_server):
    k8s_server.add_deployment("shop", "orders", replicas=2, pods={"orders-1": "10.0.1.15"})
    k8s_server.forbidden = {"horizontalpodautoscalers"}
    with resolver(k8s_server) as workloads:
        got = workloads.resolve("/10.0.1.15", "c")
    assert got.target == "Deployment shop/orders" and got.autoscalers == ()
    assert got.autoscalers_unknown.startswith("no RBAC to read it: horizontalpodautoscalers is forbidden")


def test_without_any_kubernetes_every_member_is_unknown_and_it_is_said_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    caplog.set_level(logging.WARNING, logger="lagdoctor.workloads")
    with WorkloadResolver(KubernetesSettings()) as workloads:
        got = [workloads.resolve(f"/10.0.0.{i}", f"c-{i}") for i in range(5)]
    assert {w.unknown for w in got} == {NO_API} and all(w.target is None for w in got)
    assert [r.getMessage() for r in caplog.records].count(
        f"{NO_API} (no in-cluster service account, no kubeconfig)") == 1


def test_an_api_that_does_not_answer_is_said_once_not_waited_for_per_member(caplog):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    caplog.set_level(logging.WARNING, logger="lagdoctor.workloads")
    with WorkloadResolver(KubernetesSettings(host=f"http://127.0.0.1:{port}", request_timeout_seconds=2)) as workloads:
        got = [workloads.resolve(f"/10.0.0.{i}", f"c-{i}") for i in range(5)]
    reason = f"the Kubernetes API at http://127.0.0.1:{port} did not answer (MaxRetryError): workload unknown"
    assert {w.unknown for w in got} == {reason}
    ours = [r.getMessage() for r in caplog.records if r.name == "lagdoctor.workloads"]
    assert ours == [reason]


def test_a_kubeconfig_token_is_sent_and_a_refused_one_is_never_echoed(k8s_server, tmp_path, monkeypatch):
    k8s_server.token = "t0ken-6b1f"
    k8s_server.add_deployment("shop", "orders", replicas=1, pods={"orders-1": "10.0.1.15"})
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": k8s_server.url}}],
        "users": [{"name": "lab", "user": {"token": "t0ken-6b1f"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with WorkloadResolver(KubernetesSettings(in_cluster=False)) as workloads:
        assert workloads.resolve("/10.0.1.15", "c").target == "Deployment shop/orders"
    k8s_server.token = "rotated"
    with WorkloadResolver(KubernetesSettings(in_cluster=False)) as workloads:
        refused = workloads.resolve("/10.0.1.15", "c")
    assert refused.unknown == "the Kubernetes API refused lagdoctor's credentials (401 Unauthorized)"
    assert "t0ken" not in json.dumps(refused.as_dict())


# -- the words: a restart or rollout against the lag's onset -------------------------------------------


def _said(rolled_out_at=None, onset=None, terminated_at=None, restarts=1, **seen):
    from lagdoctor.notify.workload_text import workload_lines

    termination = terminated_at and {"reason": "OOMKilled", "exit_code": 137, "finished_at": terminated_at}
    finding = {"window_start": "2026-11-21T03:00:00.000000Z", "window_end": "2026-11-21T03:30:00.000000Z",
               "evidence": {"lag_onset": onset, "workload": {
                   "namespace": "shop", "pod": "orders-7d9f-x2", "kind": "Deployment", "name": "orders",
                   "restarts": restarts, "last_termination": termination, "rolled_out_at": rolled_out_at, **seen}}}
    kind, text = workload_lines(finding)
    assert kind == "known"
    return text.removeprefix("pod orders-7d9f-x2 of Deployment shop/orders").removeprefix("; ") or None


@pytest.mark.parametrize(("rolled_out_at", "onset", "said"), [
    # the case: a rollout minutes before the lag began is the first suspect
    ("2026-11-21T03:10:00Z", "2026-11-21T03:12:00.000000Z",
     "Deployment rolled out at 03:10:00 UTC, 2m 00s before the lag began"),
    # before the window, and still within 30 minutes of the onset
    ("2026-11-21T02:50:00Z", "2026-11-21T03:05:00.000000Z",
     "Deployment rolled out at 02:50:00 UTC, 15m 00s before the lag began"),
    # after the onset: named, but not as a cause
    ("2026-11-21T03:20:00Z", "2026-11-21T03:12:00.000000Z",
     "Deployment rolled out at 03:20:00 UTC, 8m 00s after the lag began"),
    # no onset (the lag was already up at the window's first snapshot): against the window
    ("2026-11-21T02:50:00Z", None, "Deployment rolled out at 02:50:00 UTC, 10m 00s before this window"),
    ("2026-11-21T03:10:00Z", None, "Deployment rolled out at 03:10:00 UTC, in this window"),
    # hours before the onset and the window: not a suspect, not said
    ("2026-11-21T01:00:00Z", "2026-11-21T03:12:00.000000Z", None),
])
def test_a_rollout_is_said_against_the_moment_the_lag_began_when_the_diagnosis_knows_it(rolled_out_at, onset, said):
    assert _said(rolled_out_at=rolled_out_at, onset=onset) == said


def test_a_restart_is_said_against_the_onset_too():
    assert _said(onset="2026-11-21T03:12:00.000000Z", terminated_at="2026-11-21T03:11:00Z") == (
        "last OOMKilled (exit 137) at 03:11:00 UTC, 1m 00s before the lag began, 1 restart in all")


OOM_AT_0325 = "last OOMKilled (exit 137) at 03:25:00 UTC, in this window"


@pytest.mark.parametrize(("restarts", "seen", "said"), [
    # a sweep saw the count 10 minutes ago: the restarts since are counted, with their span
    (5, {"restarts_since": {"at": "2026-11-21T03:20:00Z", "restarts": 2}, "observed_at": "2026-11-21T03:30:00Z"},
     f"{OOM_AT_0325}, 3 restarts in the last 10m 00s (since 03:20:00 UTC)"),
    (2, {"restarts_since": {"at": "2026-11-21T03:20:00Z", "restarts": 2}, "observed_at": "2026-11-21T03:30:00Z"},
     f"{OOM_AT_0325}, no restart in the last 10m 00s (since 03:20:00 UTC)"),
    # no sighting before: the total, said as a total (unknown is not zero)
    (3, {}, f"{OOM_AT_0325}, 3 restarts in all"),
    # a count above today's (another pod of the name) or a sighting not before now compares nothing
    (3, {"restarts_since": {"at": "2026-11-21T03:20:00Z", "restarts": 7}, "observed_at": "2026-11-21T03:30:00Z"},
     f"{OOM_AT_0325}, 3 restarts in all"),
    (3, {"restarts_since": {"at": "2026-11-21T03:30:00Z", "restarts": 1}, "observed_at": "2026-11-21T03:30:00Z"},
     f"{OOM_AT_0325}, 3 restarts in all"),
])
def test_restarts_are_counted_since_a_sweep_last_saw_the_pod_else_said_as_a_total(restarts, seen, said):
    assert _said(terminated_at="2026-11-21T03:25:00Z", restarts=restarts, **seen) == said


def test_restarts_counted_lately_are_said_even_when_the_last_termination_is_not_known():
    assert _said(restarts=4, restarts_since={"at": "2026-11-21T03:20:00Z", "restarts": 1},
                 observed_at="2026-11-21T03:30:00Z") == "3 restarts in the last 10m 00s (since 03:20:00 UTC)"
    assert _said(restarts=4) is None  # a total alone, with no termination near the window, explains nothing


# -- in the sweep: the plan carries each owner's workload, Slack names it -----------------------------


def _run_folder(tmp_path, *findings):
    out = tmp_path / "findings" / "run"
    out.mkdir(parents=True)
    (out / "findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    (out / "partition_status.jsonl").write_text("")
    return out


def _finding(group, diagnosis, host=None, client_id=None):
    return {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": [1], "diagnosis": diagnosis,
            "pattern": "steady_climb", "severity": "critical" if diagnosis != "healthy" else "ok",
            "summary": "partition 1 holds 87% of the lag", "window_start": "2026-11-21T03:00:00.000000Z",
            "window_end": "2026-11-21T03:30:00.000000Z",
            "evidence": {"partition": 1, "owner_member_id": "consumer-2-def", "owner_host": host,
                         "owner_client_id": client_id}}


def _blocks_text(message):
    return "\n".join(b.get("text", {}).get("text", "") for b in message["blocks"] if isinstance(b.get("text"), dict))


def test_the_plan_names_each_owners_pod_and_workload_and_slack_says_what_explains_the_lag(
        k8s_server, tmp_path, monkeypatch):
    from lagdoctor.notify.render import render_incident
    from lagdoctor.stages.common import read_plans
    from lagdoctor.stages.plan import plan_findings

    k8s_server.add_deployment("shop", "orders", replicas=3, ready=2, rolled_out_at="2026-11-21T02:50:00Z",
                              pods={"orders-7d9f-x2": "10.0.1.15"})
    (_, replica_set), = k8s_server.replicasets
    k8s_server.add_pod("shop", "orders-7d9f-x2", "10.0.1.15", owner=("ReplicaSet", replica_set), restarts=3,
                       last_termination=OOM)
    k8s_server.add_autoscaler("shop", "orders-cpu", "orders", min_replicas=2, max_replicas=12)
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({"kubernetes": {"host": k8s_server.url}}))
    out = _run_folder(tmp_path, _finding("orders", "partition_imbalance", "/10.0.1.15", "consumer-orders-1"),
                      _finding("billing", "slow_consumer", "/172.16.0.9", "billing-1"),
                      _finding("quiet", "healthy", "/10.0.1.15", "consumer-orders-1"))
    summary = plan_findings(str(out))
    assert summary["workloads"] == {"traced": 1, "unknown": 1, "not_traced": None}
    planned = {item["finding"]["group_id"]: item for item in read_plans(summary["plans"])}
    assert planned["orders"]["finding"]["evidence"]["workload"]["pod"] == "orders-7d9f-x2"
    assert "workload" not in planned["quiet"]["finding"]["evidence"]  # a healthy group is not looked up

    orders = _blocks_text(render_incident(planned["orders"]["finding"], planned["orders"]["plan"], run_id="r"))
    assert (":package: *Runs in:* pod orders-7d9f-x2 of Deployment shop/orders; last OOMKilled (exit 137) at "
            "03:12:00 UTC, in this window, 3 restarts in all; Deployment rolled out at 02:50:00 UTC, 10m 00s before "
            "this window; 2 of 3 replicas ready; scaled by HorizontalPodAutoscaler orders-cpu (2-12 replicas)") in orders
    billing = _blocks_text(render_incident(planned["billing"]["finding"], planned["billing"]["plan"], run_id="r"))
    assert (":grey_question: *Pod and workload unknown:* no pod on this cluster has IP 172.16.0.9 or the name "
            "'billing-1': the member runs outside this cluster (or behind NAT)") in billing


def test_without_kubernetes_the_sweep_plans_and_posts_as_before_and_says_so_once(tmp_path, monkeypatch, caplog):
    from lagdoctor.notify.render import render_incident
    from lagdoctor.stages.common import read_plans
    from lagdoctor.stages.plan import plan_findings

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("LAGDOCTOR_REMEDIATION_CONFIG", raising=False)
    caplog.set_level(logging.WARNING, logger="lagdoctor.workloads")
    out = _run_folder(tmp_path, *(_finding(f"g{i}", "slow_consumer", f"/10.0.0.{i}", f"c-{i}") for i in range(4)))
    summary = plan_findings(str(out))
    assert summary["workloads"] == {"traced": 0, "unknown": 4, "not_traced": NO_API}
    assert len(caplog.records) == 1
    for item in read_plans(summary["plans"]):
        text = _blocks_text(render_incident(item["finding"], item["plan"], run_id="r"))
        assert "Runs in" not in text and "workload unknown" not in text.lower()


def test_a_proxy_answering_in_the_apis_place_leaves_the_workload_unknown_not_the_sweep_failed(tmp_path):
    from http.server import BaseHTTPRequestHandler

    from tests.fixtures.loopback import serve_loopback

    class LoginPage(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = b"<html>sign in</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serve_loopback(LoginPage) as url, WorkloadResolver(KubernetesSettings(host=url)) as workloads:
        got = workloads.resolve("/10.0.1.15", "c")
    assert got.target is None and got.unknown == (
        f"{url} answered /api/v1/pods with something other than a Kubernetes object (a proxy in the way?)")


def test_an_api_that_takes_the_connection_and_never_answers_is_waited_for_once_per_run():
    """A firewall that lets the connection in and drops the rest: one short read timeout for the run, no
    retries, and every member after says so at once (the sweep's minute is not spent on evidence)."""
    import threading

    accepted, held = [], []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def take():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            held.append(conn)  # never answered

    threading.Thread(target=take, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        with WorkloadResolver(KubernetesSettings(host=url, request_timeout_seconds=30)) as workloads:
            got = [workloads.resolve(f"/10.0.0.{i}", f"c-{i}") for i in range(5)]
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert len(accepted) == 1
    assert {w.unknown for w in got} == {f"the Kubernetes API at {url} did not answer (MaxRetryError): workload unknown"}


def test_restarts_in_a_window_are_counted_from_what_earlier_sweeps_saw_in_lagdoctors_state(
        k8s_server, tmp_path, monkeypatch, state_url):
    """Kubernetes keeps a pod's total only: the plan writes each traced pod's count with its time,
    and a later sweep says the restarts since (SQLite and PostgreSQL)."""
    from lagdoctor.notify.render import render_incident
    from lagdoctor.stages.common import read_plans
    from lagdoctor.stages.plan import plan_findings

    k8s_server.add_deployment("shop", "orders", replicas=1, pods={"orders-7d9f-x2": "10.0.1.15"})
    (_, replica_set), = k8s_server.replicasets
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({"kubernetes": {"host": k8s_server.url}}))

    def sweep(name, start, end, restarts, terminated, uid=None):
        k8s_server.add_pod("shop", "orders-7d9f-x2", "10.0.1.15", owner=("ReplicaSet", replica_set),
                           restarts=restarts, last_termination={**OOM, "finishedAt": terminated}, uid=uid)
        finding = {**_finding("orders", "slow_consumer", "/10.0.1.15", "c"), "window_start": start,
                   "window_end": end}
        out = _run_folder(tmp_path / name, finding)
        summary = plan_findings(str(out), now=datetime.fromisoformat(end.replace("Z", "+00:00")))
        (item,) = read_plans(summary["plans"])
        return _blocks_text(render_incident(item["finding"], item["plan"], run_id=name))

    first = sweep("a", "2026-11-21T02:35:00Z", "2026-11-21T03:05:00Z", 1,
                  datetime(2026, 11, 21, 3, 1, tzinfo=timezone.utc))
    assert "last OOMKilled (exit 137) at 03:01:00 UTC, in this window, 1 restart in all" in first
    later = sweep("b", "2026-11-21T03:00:00Z", "2026-11-21T03:30:00Z", 4,
                  datetime(2026, 11, 21, 3, 28, tzinfo=timezone.utc))
    assert ("last OOMKilled (exit 137) at 03:28:00 UTC, in this window, 3 restarts in the last 25m 00s "
            "(since 03:05:00 UTC)") in later
    # recreated under the same name (a StatefulSet's pod, a new uid): its count starts again, and what
    # the sweeps saw of the old pod is not its history
    again = sweep("c", "2026-11-21T03:10:00Z", "2026-11-21T03:40:00Z", 1,
                  datetime(2026, 11, 21, 3, 38, tzinfo=timezone.utc), uid="recreated")
    assert "last OOMKilled (exit 137) at 03:38:00 UTC, in this window, 1 restart in all" in again


def test_without_a_usable_state_database_restarts_are_said_as_totals_and_the_plan_goes_on(
        k8s_server, tmp_path, monkeypatch, caplog):
    from lagdoctor.stages.common import read_plans
    from lagdoctor.stages.plan import plan_findings
    from lagdoctor.state import dispose_engines

    k8s_server.add_deployment("shop", "orders", replicas=1, pods={"orders-7d9f-x2": "10.0.1.15"})
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({"kubernetes": {"host": k8s_server.url}}))
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", "postgresql+psycopg://lagdoctor:s3cret@127.0.0.1:1/state")
    caplog.set_level(logging.WARNING, logger="lagdoctor.workloads")
    out = _run_folder(tmp_path, _finding("orders", "slow_consumer", "/10.0.1.15", "c"))
    try:
        summary = plan_findings(str(out), now=datetime(2026, 11, 21, 3, 30, tzinfo=timezone.utc))
    finally:
        dispose_engines()
    (item,) = read_plans(summary["plans"])
    workload = item["finding"]["evidence"]["workload"]
    assert workload["pod"] == "orders-7d9f-x2" and workload["restarts"] == 0 and "restarts_since" not in workload
    lines = [r.getMessage() for r in caplog.records if r.name == "lagdoctor.workloads"]
    assert len(lines) == 1 and lines[0].startswith("restarts not counted per window: ")
    assert "s3cret" not in lines[0] and "s3cret" not in json.dumps(summary)
