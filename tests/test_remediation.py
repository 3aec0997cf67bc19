"""Remediation without a broker: guardrails, dry runs, approval, audit, Kubernetes actions.

Kubernetes actions run the real ``kubernetes`` client against the loopback
API server of tests/fixtures/k8s.py. Every test that keeps state runs against
SQLite and against PostgreSQL (the ``state_url`` fixture).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pytest

import airflow.sdk  # noqa: F401  (Airflow configures logging on import; before caplog)

from lagdoctor.remediation import (
    ConfigError,
    RemediationConfig,
    RemediationFailed,
    approval_request,
    approved_from_hitl,
    needs_approval,
    run_action,
)
from lagdoctor.remediation.config import Deployment, KubernetesSettings
from lagdoctor.remediation.guardrails import check_guardrails
from lagdoctor.remediation.recommend import recommend_consumer_config
from lagdoctor.settings import Settings
from tests.fixtures.k8s import k8s_server  # noqa: F401
from tests.fixtures.slack import slack_connection, slack_server  # noqa: F401

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)


def finding(diagnosis="slow_consumer", group="orders", **evidence):
    return {"cluster": "prod", "group_id": group, "topic": "orders.v1", "partitions": [0, 1],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": "critical", "summary": "lag climbs",
            "evidence": {"partition_count": 6, "group_members": 2, **evidence},
            "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}


@pytest.fixture
def settings(tmp_path, monkeypatch, state_url):
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.delenv("LAGDOCTOR_REMEDIATION_CONFIG", raising=False)
    return Settings.from_env()


@pytest.fixture
def k8s(k8s_server):
    k8s_server.add_deployment("shop", "orders-consumer", replicas=2)
    return k8s_server


def config_for(server, **kw):
    base = {"deployments": {"orders": Deployment("shop", "orders-consumer")},
            "kubernetes": KubernetesSettings(host=server.url)}
    return RemediationConfig(**{**base, **kw})


def audit(settings):
    from lagdoctor.remediation.audit import ActionLog

    return list(ActionLog.from_settings(settings).records())


def audit_text(settings):
    return json.dumps(audit(settings))


# ------------------------------------------------------------ guardrail rules

def executed(action="scale_consumers", group="orders", minutes_ago=0, cluster="prod", target=None,
             outcome="executed"):
    return {"status": "executed", "cluster": cluster, "group_id": group, "action": action, "target": target,
            "outcome": outcome, "run_id": "r0", "ts": (T0 - timedelta(minutes=minutes_ago)).isoformat()}


SHARED = "Deployment shop/orders-consumer"


# (config, history, group, action, target (None: the group itself), expected rule or "" for allowed, why)
GUARDRAIL_CASES = [
    (RemediationConfig(), [], "orders", "scale_consumers", None, "", "nothing ran: allowed"),
    (RemediationConfig(deny_groups=("pay*",)), [], "payments", "scale_consumers", None, "deny_list",
     "1: a denied group is never touched"),
    (RemediationConfig(deny_groups=("pay*",), allow_groups=("pay*",)), [], "payments", "scale_consumers", None,
     "deny_list", "1: deny wins over allow"),
    (RemediationConfig(allow_groups=("orders*",)), [], "billing", "scale_consumers", None, "allow_list",
     "2: with an allow list, other groups are left alone"),
    (RemediationConfig(allow_groups=("orders*",)), [], "orders-eu", "scale_consumers", None, "",
     "2: allow list globs match"),
    (RemediationConfig(cooldown_minutes=30), [executed(minutes_ago=10)], "orders", "scale_consumers", None,
     "cooldown", "3: the last scale has not taken effect yet"),
    (RemediationConfig(cooldown_minutes=30), [executed(minutes_ago=31)], "orders", "scale_consumers", None,
     "", "3: cooldown over"),
    (RemediationConfig(cooldown_minutes=30), [executed("restart_consumers", minutes_ago=1)], "orders",
     "scale_consumers", None, "", "3: cooldown is per (group, action)"),
    (RemediationConfig(cooldown_minutes=30), [executed(group="billing", minutes_ago=1)], "orders",
     "scale_consumers", None, "", "3: another group's cooldown is not ours"),
    (RemediationConfig(cooldown_minutes=30), [executed(cluster="dr", minutes_ago=1)], "orders",
     "scale_consumers", None, "", "3: same group id on another cluster is another group"),
    (RemediationConfig(max_actions_per_hour=2, cooldown_minutes=0),
     [executed(group="a", minutes_ago=5), executed(group="b", minutes_ago=50)], "orders", "scale_consumers", None,
     "hourly_cap", "4: cap counts every group"),
    (RemediationConfig(max_actions_per_hour=2, cooldown_minutes=0),
     [executed(group="a", minutes_ago=5), executed(group="b", minutes_ago=61)], "orders", "scale_consumers", None,
     "", "4: only the last hour counts"),
    (RemediationConfig(cooldown_minutes=30), [executed(group="orders-eu", target=SHARED, minutes_ago=1)],
     "orders", "scale_consumers", SHARED, "cooldown", "3: two groups served by one Deployment share its cooldown"),
    (RemediationConfig(cooldown_minutes=30), [executed(outcome="started", target=SHARED, minutes_ago=1)],
     "orders", "scale_consumers", SHARED, "cooldown", "3: a change still in flight (started, no outcome) counts"),
    (RemediationConfig(max_actions_per_hour=1, cooldown_minutes=0), [executed(group="a", outcome="failed")],
     "orders", "scale_consumers", None, "hourly_cap", "4: a failure that may have landed (timed out) counts"),
]


@pytest.mark.parametrize("config,history,group,action,target,rule,why", GUARDRAIL_CASES,
                         ids=[c[6] for c in GUARDRAIL_CASES])
def test_guardrail_rules(config, history, group, action, target, rule, why):
    verdict = check_guardrails(cluster="prod", group_id=group, action=action, config=config, history=history, now=T0,
                               target=target)
    assert verdict.allowed == (rule == "") and verdict.rule == rule


def test_cooldown_reason_names_the_run_and_says_when_the_outcome_is_unknown():
    history = [executed("restart_consumers", target=SHARED, outcome="failed", minutes_ago=2)]
    verdict = check_guardrails(cluster="prod", group_id="orders", action="restart_consumers",
                               config=RemediationConfig(cooldown_minutes=30), history=history, now=T0, target=SHARED)
    assert verdict.reason == (f"restart_consumers on {SHARED} started at {history[0]['ts']} by run r0 and may have "
                              "taken effect before it failed; cooldown ends in 29 min")


# ------------------------------------------------------------ config

def test_config_from_env_inline_json_and_from_yaml_file(tmp_path):
    cfg = RemediationConfig.from_env({"LAGDOCTOR_REMEDIATION_CONFIG": json.dumps(
        {"cooldown_minutes": 5, "deployments": {"prod/orders": {"namespace": "shop", "name": "w"}}})})
    assert cfg.cooldown_minutes == 5 and cfg.deployment_for("prod", "orders") == Deployment("shop", "w")
    assert cfg.deployment_for("dr", "orders") is None  # a cluster-qualified mapping is only for that cluster
    path = tmp_path / "remediation.yaml"
    path.write_text("deny_groups: [payments]\nmax_actions_per_hour: 3\n")
    cfg = RemediationConfig.from_env({"LAGDOCTOR_REMEDIATION_CONFIG": str(path)})
    assert cfg.deny_groups == ("payments",) and cfg.max_actions_per_hour == 3
    assert RemediationConfig.from_env({}) == RemediationConfig()
    path.write_text("kubernetes: {namespaces: [shop, billing]}\n")
    assert RemediationConfig.from_file(path).kubernetes.namespaces == ("shop", "billing")


@pytest.mark.parametrize("text,field", [
    ("cooldown: 5", "cooldown"), ("cooldown_minutes: soon", "cooldown_minutes"),
    ("deployments: {orders: {namespace: x}}", "deployments.orders"), ("deny_groups: payments", "deny_groups"),
    ("kubernetes: {token: abc}", "kubernetes"), ("max_replicas: -1", "max_replicas"),
    ("lease_minutes: 0", "lease_minutes"),
    ("kubernetes: {request_timeout_seconds: 0}", "kubernetes.request_timeout_seconds"),
    ("kubernetes: {namespaces: shop}", "kubernetes.namespaces"),
])
def test_config_errors_are_one_line_naming_file_and_field(tmp_path, text, field):
    path = tmp_path / "remediation.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        RemediationConfig.from_file(path)
    assert str(err.value).startswith(f"{path}: {field}") and "\n" not in str(err.value)


# ------------------------------------------------------------ dry run, approvals

def test_dry_run_is_the_default_and_changes_nothing(settings, k8s):
    rec = run_action("scale_consumers", finding(), run_id="r1", config=config_for(k8s), now=T0)
    assert rec["status"] == "dry_run" and rec["dry_run"] is True
    assert rec["message"] == "would scale shop/orders-consumer from ~2 by +1 replicas, never above 6 partitions"
    assert k8s.requests == [] and k8s.deployments[("shop", "orders-consumer")]["replicas"] == 2


def test_a_dry_run_never_waits_for_a_human_even_for_irreversible_actions(settings):
    for name in ("skip_poison_pill", "add_partitions"):
        assert needs_approval(name, dry_run=True) is False
        assert needs_approval(name, dry_run=False) is True
        # a consumer on each partition: nothing in the finding rules either action out
        rec = run_action(name, finding("stalled_consumer", group_members=6), run_id="r1", now=T0)
        assert rec["status"] == "dry_run" and rec["requires_approval"] is False
        assert "irreversible" in rec["warning"].lower() or "never process" in rec["warning"]


def test_reversible_actions_need_approval_only_when_config_or_runbook_says_so(settings):
    assert needs_approval("scale_consumers", dry_run=False) is False
    assert needs_approval("scale_consumers", dry_run=False, guardrails={"require_approval": True}) is True
    assert needs_approval("restart_consumers", dry_run=False,
                          config=RemediationConfig(require_approval=("restart_consumers",))) is True
    assert needs_approval("recommend_consumer_config", dry_run=False, guardrails={"require_approval": True}) is False


def answer(operator, option):
    """Test helper: answer a HITL ApprovalOperator the way the API/UI response does."""
    event = {"chosen_options": [option], "params_input": {}, "responded_at": T0,
             "responded_by_user": {"id": "1", "name": "oncall"}}
    return operator.execute_complete(context={}, event=event)


def test_approval_flow_with_the_standard_providers_approval_operator(settings, k8s):
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    cfg = config_for(k8s)
    kw = dict(run_id="r1", dry_run=False, config=cfg, now=T0, guardrails={"require_approval": True})
    waiting = run_action("restart_consumers", finding("crashed_consumer"), **kw)
    assert waiting["status"] == "awaiting_approval" and k8s.requests == []
    request = approval_request(waiting)
    assert request["subject"] == "Approve restart_consumers for orders on orders.v1 (prod)?"
    assert "rollout restart shop\\/orders\\-consumer" in request["body"]  # Markdown-escaped
    operator = ApprovalOperator(task_id="approve_restart_consumers", **request)
    done = run_action("restart_consumers", finding("crashed_consumer"), approved=approved_from_hitl(answer(operator, "Approve")), **kw)
    assert done["status"] == "executed"
    annotations = k8s.deployments[("shop", "orders-consumer")]["annotations"]
    assert annotations == {"kubectl.kubernetes.io/restartedAt": "2026-11-21T10:00:00Z"}
    assert [r["status"] for r in audit(settings)] == ["awaiting_approval", "started", "executed"]


def test_rejected_action_is_logged_and_changes_nothing(settings, k8s):
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    kw = dict(run_id="r1", dry_run=False, config=config_for(k8s), now=T0, guardrails={"require_approval": True})
    waiting = run_action("scale_consumers", finding(), **kw)
    operator = ApprovalOperator(task_id="approve", **approval_request(waiting))
    rec = run_action("scale_consumers", finding(), approved=approved_from_hitl(answer(operator, "Reject")), **kw)
    assert rec["status"] == "rejected" and k8s.writes() == []
    assert approved_from_hitl(None) is None


# ------------------------------------------------------------ scale_consumers

def test_scale_never_goes_above_the_partition_count(settings, k8s):
    rec = run_action("scale_consumers", finding(partition_count=4), run_id="r1", dry_run=False,
                     params={"step": 5}, config=config_for(k8s), now=T0)
    assert rec["status"] == "executed" and rec["message"] == "scaled shop/orders-consumer from 2 to 4 replicas"
    assert k8s.deployments[("shop", "orders-consumer")]["replicas"] == 4
    (patch,) = k8s.writes()
    assert patch.path.endswith("/deployments/orders-consumer/scale")
    assert patch.content_type == "application/strategic-merge-patch+json" and patch.body == {"spec": {"replicas": 4}}
    # At the cap, a later run does nothing: extra consumers would sit idle.
    again = run_action("scale_consumers", finding(partition_count=4), run_id="r2", dry_run=False,
                       config=config_for(k8s, cooldown_minutes=0), now=T0 + timedelta(minutes=1))
    assert again["status"] == "noop" and "would sit idle" in again["message"]
    assert len(k8s.writes()) == 1


def test_max_replicas_caps_below_the_partition_count(settings, k8s):
    rec = run_action("scale_consumers", finding(), run_id="r1", dry_run=False, params={"step": 10},
                     config=config_for(k8s, max_replicas=3), now=T0)
    assert k8s.deployments[("shop", "orders-consumer")]["replicas"] == 3 and rec["plan"]["cap"] == 3


@pytest.mark.parametrize("dry_run", [True, False])
def test_max_replicas_zero_switches_scaling_off_with_a_reason(settings, k8s, dry_run):
    assert RemediationConfig.from_mapping({"max_replicas": 0}).max_replicas == 0
    rec = run_action("scale_consumers", finding(), run_id="r1", dry_run=dry_run,
                     config=config_for(k8s, max_replicas=0), now=T0)
    assert rec["status"] == "blocked"
    assert rec["message"] == "max_replicas is 0 in the remediation config: scaling is switched off"
    assert k8s.requests == []


def test_scale_without_a_known_partition_count_is_refused(settings, k8s):
    f = finding()
    del f["evidence"]["partition_count"]
    rec = run_action("scale_consumers", f, run_id="r1", dry_run=False, config=config_for(k8s), now=T0)
    assert rec["status"] == "blocked" and "partition count unknown" in rec["message"]
    assert k8s.requests == []


def test_group_without_a_mapped_deployment_is_blocked(settings, k8s):
    rec = run_action("scale_consumers", finding(group="billing"), run_id="r1", dry_run=False,
                     config=config_for(k8s), now=T0)
    assert rec["status"] == "blocked" and "no Deployment mapped for group 'billing'" in rec["message"]


def test_retry_of_the_same_run_is_idempotent(settings, k8s):
    kw = dict(run_id="r1", dry_run=False, config=config_for(k8s), now=T0)
    first = run_action("scale_consumers", finding(), **kw)
    second = run_action("scale_consumers", finding(), **kw)
    assert first == second and len(k8s.writes()) == 1
    assert k8s.deployments[("shop", "orders-consumer")]["replicas"] == 3
    assert [r["status"] for r in audit(settings)] == ["started", "executed"]
    # The log lives in the state database now: nothing under <data root>/actions/.
    assert not (Path(settings.data_root) / "actions").exists()


def test_two_groups_on_one_deployment_share_its_cooldown(settings, k8s):
    cfg = config_for(k8s, deployments={"orders": Deployment("shop", "orders-consumer"),
                                       "orders-eu": Deployment("shop", "orders-consumer")})
    first = run_action("restart_consumers", finding("crashed_consumer"), run_id="r1", dry_run=False, config=cfg, now=T0)
    assert first["status"] == "executed" and first["target"] == "Deployment shop/orders-consumer"
    other = run_action("restart_consumers", finding("crashed_consumer", group="orders-eu"), run_id="r2",
                       dry_run=False, config=cfg, now=T0 + timedelta(minutes=5))
    assert other["status"] == "blocked" and other["rule"] == "cooldown"
    assert other["message"].startswith("cooldown: restart_consumers on Deployment shop/orders-consumer ran at "
                                       "2026-11-21T10:00:00+00:00 by run r1")
    assert len(k8s.writes()) == 1


def test_cooldown_and_hourly_cap_block_real_runs_but_dry_runs_do_not_count(settings, k8s):
    cfg = config_for(k8s, cooldown_minutes=30, max_actions_per_hour=10)
    for i in range(3):  # dry runs use up nothing
        run_action("scale_consumers", finding(), run_id=f"dry{i}", config=cfg, now=T0)
    assert run_action("scale_consumers", finding(), run_id="r1", dry_run=False, config=cfg, now=T0)["status"] == "executed"
    blocked = run_action("scale_consumers", finding(), run_id="r2", dry_run=False, config=cfg,
                         now=T0 + timedelta(minutes=5))
    assert blocked["status"] == "blocked" and blocked["rule"] == "cooldown"
    dry = run_action("scale_consumers", finding(), run_id="r2-dry", config=cfg, now=T0 + timedelta(minutes=5))
    assert dry["status"] == "blocked", "a dry run reports what a real run would meet"
    later = run_action("scale_consumers", finding(), run_id="r3", dry_run=False, config=cfg,
                       now=T0 + timedelta(minutes=31))
    assert later["status"] == "executed"
    capped = run_action("restart_consumers", finding(), run_id="r4", dry_run=False,
                        config=config_for(k8s, max_actions_per_hour=2), now=T0 + timedelta(minutes=32))
    assert capped["status"] == "blocked" and capped["rule"] == "hourly_cap"
    assert len(k8s.writes()) == 2


def test_runbook_can_lengthen_but_not_shorten_the_cooldown(settings, k8s):
    cfg = config_for(k8s, cooldown_minutes=10)
    run_action("scale_consumers", finding(), run_id="r1", dry_run=False, config=cfg, now=T0)
    at = T0 + timedelta(minutes=20)
    longer = run_action("scale_consumers", finding(), run_id="r2", dry_run=False, config=cfg, now=at,
                        guardrails={"cooldown_minutes": 60})
    shorter = run_action("scale_consumers", finding(), run_id="r3", dry_run=False, config=cfg,
                         now=T0 + timedelta(minutes=5), guardrails={"cooldown_minutes": 1})
    assert longer["status"] == "blocked" and shorter["status"] == "blocked"


def test_deny_listed_group_is_never_touched(settings, k8s):
    rec = run_action("scale_consumers", finding(), run_id="r1", dry_run=False,
                     config=config_for(k8s, deny_groups=("ord*",)), now=T0)
    assert rec["status"] == "blocked" and rec["rule"] == "deny_list" and k8s.requests == []


# ------------------------------------------------------------ the owner's traced workload, autoscalers

def traced(namespace="shop", name="orders-consumer", kind="Deployment", **kw):
    """evidence.workload as the sweep's plan writes it (lagdoctor.workloads)."""
    return {"namespace": namespace, "pod": f"{name}-7d9f-x2", "kind": kind, "name": name, "unknown": None,
            "autoscalers": [], "autoscalers_unknown": None, **kw}


@pytest.mark.parametrize("action", ["restart_consumers", "scale_consumers"])
def test_without_a_mapping_the_deployment_the_owner_was_traced_to_is_the_target(settings, k8s, action):
    config = config_for(k8s, deployments={})
    rec = run_action(action, finding(workload=traced()), run_id="r1", dry_run=False, config=config, now=T0)
    assert rec["status"] == "executed" and rec["target"] == "Deployment shop/orders-consumer", rec
    assert [w.path.split("?")[0] for w in k8s.writes()] == [
        "/apis/apps/v1/namespaces/shop/deployments/orders-consumer"
        + ("/scale" if action == "scale_consumers" else "")]


def test_a_hand_written_mapping_overrides_the_traced_workload(settings, k8s):
    k8s.add_deployment("shop", "orders-v2", replicas=1)
    config = config_for(k8s, deployments={"orders": Deployment("shop", "orders-v2")})
    rec = run_action("restart_consumers", finding(workload=traced()), run_id="r1", dry_run=False, config=config,
                     now=T0)
    assert rec["target"] == "Deployment shop/orders-v2" and k8s.deployments[("shop", "orders-v2")]["annotations"]


def test_an_owner_traced_to_no_deployment_blocks_with_the_reason(settings, k8s):
    config = config_for(k8s, deployments={})
    outside = run_action("restart_consumers", finding(workload={"unknown": "no pod on this cluster has IP 10.9.9.9 "
                                                                           "or the name 'c': the member runs outside "
                                                                           "this cluster (or behind NAT)"}),
                         run_id="r1", config=config, now=T0)
    assert outside["status"] == "blocked" and outside["message"].endswith(
        "and its owner was not traced to one: no pod on this cluster has IP 10.9.9.9 or the name 'c': the member "
        "runs outside this cluster (or behind NAT)")
    sts = run_action("restart_consumers", finding(workload=traced("etl", "loader", "StatefulSet")), run_id="r2",
                     config=config, now=T0)
    assert sts["status"] == "blocked" and sts["message"].endswith("its owner runs in StatefulSet etl/loader, not a "
                                                                  "Deployment")
    assert k8s.requests == []


@pytest.mark.parametrize("dry_run", [True, False])
def test_scale_beside_an_hpa_or_a_keda_scaledobject_recommends_the_change_there(settings, k8s, dry_run):
    hpa = [{"kind": "HorizontalPodAutoscaler", "name": "orders-cpu", "min_replicas": 2, "max_replicas": 4}]
    rec = run_action("scale_consumers", finding(workload=traced(autoscalers=hpa)), run_id="r1", dry_run=dry_run,
                     config=config_for(k8s), now=T0)
    assert rec["status"] == "blocked" and rec["message"] == (
        "Deployment shop/orders-consumer is scaled by HorizontalPodAutoscaler orders-cpu, not by lagdoctor behind it; "
        "change it there: maxReplicas 4 -> up to 6 (the partition count)")
    keda = [{"kind": "ScaledObject", "name": "orders-lag", "min_replicas": 0, "max_replicas": 2,
             "lag_threshold": "1000"}]
    stuck = run_action("scale_consumers", finding("stalled_consumer", workload=traced(autoscalers=keda)),
                       run_id="r2", dry_run=dry_run, config=config_for(k8s), now=T0)
    assert stuck["status"] == "blocked" and stuck["message"] == (
        "Deployment shop/orders-consumer is scaled by ScaledObject orders-lag, not by lagdoctor behind it; change it "
        "there: maxReplicaCount 2 -> up to 6 (the partition count), lagThreshold below 1000 to scale out sooner, "
        "limitToPartitionsWithLag: true (stuck partitions)")
    unread = run_action("scale_consumers", finding(workload=traced(autoscalers_unknown="no RBAC to read it: x")),
                        run_id="r3", dry_run=dry_run, config=config_for(k8s), now=T0)
    assert unread["status"] == "blocked" and "autoscalers on Deployment shop/orders-consumer unknown" in unread["message"]
    assert k8s.writes() == [] and k8s.deployments[("shop", "orders-consumer")]["replicas"] == 2


def test_an_autoscaler_found_right_before_a_real_scale_stops_it(settings, k8s):
    """The sweep saw none (or the group is mapped by hand): the API is asked again before replicas change."""
    k8s.add_scaled_object("shop", "orders-lag", "orders-consumer", max_replicas=3)
    rec = run_action("scale_consumers", finding(), run_id="r1", dry_run=False, config=config_for(k8s), now=T0)
    assert rec["status"] == "blocked" and "is scaled by ScaledObject orders-lag" in rec["message"]
    assert k8s.writes() == [] and k8s.deployments[("shop", "orders-consumer")]["replicas"] == 2
    assert run_action("restart_consumers", finding(), run_id="r2", dry_run=False, config=config_for(k8s),
                      now=T0)["status"] == "executed"  # a restart does not fight the autoscaler


# ------------------------------------------------------------ restart_consumers

def test_failed_restart_is_one_line_and_a_retry_reuses_the_same_restarted_at(settings, k8s_server):
    cfg = config_for(k8s_server)
    with pytest.raises(RemediationFailed) as err:
        run_action("restart_consumers", finding("crashed_consumer"), run_id="r1", dry_run=False, config=cfg, now=T0)
    assert str(err.value) == ('restart_consumers failed for group orders: Kubernetes API 404 Not Found: '
                              'deployments.apps "orders-consumer" not found')
    k8s_server.add_deployment("shop", "orders-consumer", replicas=2)
    rec = run_action("restart_consumers", finding("crashed_consumer"), run_id="r1", dry_run=False, config=cfg,
                     now=T0 + timedelta(minutes=3))  # Airflow's retry, a few minutes later
    assert rec["status"] == "executed"
    assert k8s_server.deployments[("shop", "orders-consumer")]["annotations"] == {
        "kubectl.kubernetes.io/restartedAt": "2026-11-21T10:00:00Z"}
    assert [r["status"] for r in audit(settings)] == ["started", "failed", "executed"]


def test_kubeconfig_token_is_used_but_never_logged_or_recorded(settings, k8s, tmp_path, monkeypatch, caplog, capfd):
    token = "k8s-test-token-Hq7Lw2"
    k8s.token = token
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": k8s.url}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    caplog.set_level(logging.DEBUG)
    cfg = config_for(k8s, kubernetes=KubernetesSettings())
    rec = run_action("scale_consumers", finding(), run_id="r1", dry_run=False, config=cfg, now=T0)
    assert rec["status"] == "executed" and k8s.requests[-1].authorization == f"Bearer {token}"
    k8s.token = "rotated"  # now the same token is refused: the error must not echo it
    with pytest.raises(RemediationFailed) as err:
        run_action("restart_consumers", finding(), run_id="r2", dry_run=False, config=cfg, now=T0)
    assert "401" in str(err.value)
    out, errout = capfd.readouterr()
    for text in (str(err.value), caplog.text, out, errout, audit_text(settings)):
        assert token not in text


# ------------------------------------------------------------ recommend_consumer_config

# (per_record_ms, current settings, rebalance loop, expected {key: recommended}, why)
RECOMMEND_CASES = [
    (None, {}, False, {}, "no processing time observed, defaults are consistent: nothing to say"),
    (100.0, {}, False, {}, "500 x 100 ms = 50 s, 2x fits in 300 s"),
    (1000.0, {}, False, {"max.poll.records": 150, "max.poll.interval.ms": 1_020_000},
     "1: 500 s per batch > 300 s: fewer records or a longer interval (rounded up to 30 s)"),
    (10.0, {"heartbeat.interval.ms": 20_000}, False, {"heartbeat.interval.ms": 15_000},
     "2: heartbeat at most a third of the 45 s session"),
    (None, {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 3_000}, True,
     {"session.timeout.ms": 45_000}, "3: short sessions in a rebalance loop go back to the default"),
    (None, {"session.timeout.ms": 6_000, "heartbeat.interval.ms": 3_000}, False,
     {"heartbeat.interval.ms": 2_000}, "2: without a loop, keep the session and fix the heartbeat"),
]


@pytest.mark.parametrize("per_record_ms,current,loop,expected,why", RECOMMEND_CASES, ids=[c[4][:40] for c in RECOMMEND_CASES])
def test_recommend_consumer_config(per_record_ms, current, loop, expected, why):
    recs = recommend_consumer_config(per_record_ms=per_record_ms, current=current, rebalance_loop=loop)
    assert {r.key: r.recommended for r in recs} == expected


def test_recommendation_is_posted_never_applied_even_when_not_a_dry_run(settings, k8s):
    f = finding("rebalance_loop", processing_ms_per_record=1000.0)
    rec = run_action("recommend_consumer_config", f, run_id="r1", dry_run=False, config=config_for(k8s), now=T0)
    assert rec["status"] == "recommended" and k8s.requests == []
    assert "max.poll.records=150 (now 500)" in rec["message"]


# ------------------------------------------------------------ Kafka clients like the provider's

def test_kafka_config_comes_from_the_providers_hook_with_callbacks_resolved(monkeypatch):
    from lagdoctor.remediation.kafka_ops import kafka_config_for

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_SASL", json.dumps({"conn_type": "kafka", "extra": {
        "bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "oauth_cb": "tests.test_remediation.fake_oauth_cb"}}))
    monkeypatch.setenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", "tests.test_remediation.fake_oauth_cb")
    config = kafka_config_for("kafka_sasl")
    assert config["oauth_cb"] is fake_oauth_cb  # resolved by the provider, as for collection
    assert config["bootstrap.servers"] == "kafka-1:9093" and config["security.protocol"] == "SASL_SSL"


def fake_oauth_cb(_config):
    return "token", 0.0


@pytest.mark.parametrize("conn,environ,expected", [
    (None, {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"}, {"bootstrap.servers": "127.0.0.1:9092"}),
    (None, {}, "no Airflow connection 'kafka_default' of type kafka, and KAFKA_BOOTSTRAP_SERVERS is not set"),
    ({"conn_type": "kafka", "extra": {"security.protocol": "SSL"}}, {},
     "connection 'kafka_default': no bootstrap.servers in its extra"),
    ({"conn_type": "kafka", "extra": {"bootstrap.servers": "k:9092", "oauth_cb": "os.system"}}, {},
     "connection 'kafka_default': Refusing to resolve Kafka callback oauth_cb='os.system': the [apache_kafka] "
     "callback_allowlist is empty."),
], ids=["no connection: the default falls back to the env", "no connection, no env",
        "extra without bootstrap.servers", "a callback the allowlist does not name"])
def test_kafka_config_fallback_and_errors(monkeypatch, conn, environ, expected):
    from lagdoctor.remediation.actions import ActionBlocked
    from lagdoctor.remediation.kafka_ops import kafka_config_for

    monkeypatch.delenv("AIRFLOW__APACHE_KAFKA__CALLBACK_ALLOWLIST", raising=False)
    if conn is None:
        monkeypatch.delenv("AIRFLOW_CONN_KAFKA_DEFAULT", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(conn))
    if isinstance(expected, dict):
        assert kafka_config_for("kafka_default", environ=environ) == expected
        return
    with pytest.raises(ActionBlocked) as err:
        kafka_config_for("kafka_default", environ=environ)
    assert str(err.value) == expected


# ------------------------------------------------------------ Kafka action guard without a broker

@pytest.mark.parametrize("members, said", [
    (2, "2 member(s)"),
    (None, "an unknown number of member(s)"),  # an active group whose member list the broker left out
])
def test_skip_poison_pill_refuses_a_group_that_is_not_empty(settings, monkeypatch, members, said):
    from lagdoctor.remediation import kafka_ops

    monkeypatch.setattr(kafka_ops, "read_group", lambda *a: kafka_ops.GroupRead("STABLE", members, {0: 7}))
    rec = run_action("skip_poison_pill", finding("stalled_consumer"), run_id="r1", dry_run=False, approved=True,
                     kafka_config={"bootstrap.servers": "unused:9092"}, now=T0)
    assert rec["status"] == "blocked"
    assert rec["message"] == f"group is STABLE with {said}, not EMPTY: stop its consumers first"


def test_kafka_failure_is_one_line_without_the_sasl_password(settings, monkeypatch, caplog, capfd):
    from lagdoctor.remediation import kafka_ops

    monkeypatch.setattr(kafka_ops, "TIMEOUT_S", 2)
    secret = "sasl-Pa55word-9xY"
    config = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
              "sasl.username": "lagdoctor", "sasl.password": secret}
    with pytest.raises(RemediationFailed) as err:
        run_action("add_partitions", finding("producer_surge"), run_id="r1", dry_run=False, approved=True,
                   params={"add": 2}, kafka_config=config, now=T0)
    assert "\n" not in str(err.value)
    out, errout = capfd.readouterr()
    for text in (str(err.value), caplog.text, out, errout, audit_text(settings)):
        assert secret not in text


# ------------------------------------------------------------ the task-level flow a DAG wires

def test_sweep_flow_plan_post_act_reply(settings, k8s, slack_connection, monkeypatch):
    from lagdoctor.notify import post_action_result, post_or_update_incident
    from lagdoctor.runbooks import plan_for_finding

    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps(
        {"deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"}},
         "kubernetes": {"host": k8s.url}}))
    f = finding("slow_consumer", processing_ms_per_record=1000.0)
    plan = plan_for_finding(f)                                      # @task: runbook plan (XCom-safe)
    assert plan["branches"] == ["scale_consumers", "recommend_consumer_config"]   # @task.branch targets
    post_or_update_incident(f, plan, run_id="sweep-1", now=T0)      # @task: Slack thread
    for item in plan["actions"]:                                     # one task per branch
        assert not needs_approval(item["action"], dry_run=True, guardrails=item["guardrails"])
        rec = run_action(item["action"], f, run_id="sweep-1", params=item["params"],
                         guardrails=item["guardrails"], now=T0)
        post_action_result(rec)
    root, *replies = slack_connection.messages
    assert "scale_consumers" in json.dumps(root["blocks"]) and "Next steps" in json.dumps(root["blocks"])
    assert [r["thread_ts"] for r in replies] == [slack_connection.posts[0].ts] * 2
    assert "dry run" in replies[0]["text"] and "max.poll.records=150" in replies[1]["blocks"][0]["text"]["text"]
    assert k8s.requests == []  # dry run by default: nothing was touched


# ------------------------------------------------------------ what an approval says, what a block shows

def write_plans(tmp_path, items):
    """A plan file as the plan task writes it: [(finding, action), ...]."""
    path = tmp_path / "plans.json"
    path.write_text(json.dumps([{"finding": f, "plan": {"actions": [{"action": a, "params": {}, "guardrails": {}}]}}
                                for f, a in items]))
    return str(path)


def stuck_at(offset, group="payments-ledger"):
    return {**finding("stalled_consumer", group=group), "topic": "payments", "partitions": [0],
            "summary": "offset 120 has not moved for 40 min while 3,000 records wait",
            "evidence": {"partitions": [{"partition": 0, "committed_offset": offset}]}}


def test_the_approval_names_the_record_the_topic_and_the_offset_it_will_commit(settings, tmp_path):
    from lagdoctor.stages.plan import approval_form

    form = approval_form("skip_poison_pill", write_plans(tmp_path, [(stuck_at(120), "skip_poison_pill")]), now=T0)
    change = ("copy the record at payments p0@120 to payments.dlq and commit offset 121 "
              "(group must be EMPTY); irreversible")
    assert form["subject"] == f"lagdoctor: {change} (group payments-ledger on prod)?"
    assert form["options"] == ["Approve 1: payments-ledger on prod / payments", "Reject all"]
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(form["body"])  # as the Airflow UI shows it
    assert f"Approve 1: <strong>payments-ledger</strong> on prod, topic payments: {change}" in html
    assert "target: group payments-ledger on prod (skip_poison_pill)" in html
    assert "why: stalled_consumer: offset 120 has not moved for 40 min" in html
    assert "Effect: The group will never process the skipped record" in html
    assert "blocked now" not in html


def test_the_approval_says_when_a_guardrail_would_block_it(settings, tmp_path, monkeypatch):
    from lagdoctor.stages.plan import approval_form

    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({
        "deny_groups": ["payments-*"], "deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"}},
        "require_approval": ["restart_consumers"]}))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="payments-ledger"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    # The blocked group is shown, not offered: the form asks about the one group that can run.
    assert form["subject"] == "lagdoctor: rollout restart shop/orders-consumer (group orders on prod)?"
    assert form["options"] == ["Approve 1: orders on prod / orders.v1", "Reject all"]
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(form["body"])
    assert "<strong>orders</strong> on prod, topic orders.v1: rollout restart shop/orders-consumer" in html
    assert "target: Deployment shop/orders-consumer" in html
    assert ("<strong>blocked now</strong>: deny_list: group matches deny pattern 'payments-*' (not offered)"
            in html)
    assert html.count("blocked now") == 1


def test_an_approved_action_its_guard_blocks_is_reported_and_raised_not_returned(
        settings, k8s, slack_connection, tmp_path, monkeypatch):
    from lagdoctor.stages.remediate import remediate, RemediationBlocked

    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({
        "deny_groups": ["orders"], "deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"}},
        "kubernetes": {"host": k8s.url}}))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers")])
    with pytest.raises(RemediationBlocked) as blocked:
        remediate("restart_consumers", plans, "manual__1", dry_run=False, approved=True, settings=settings)
    assert str(blocked.value) == ("restart_consumers blocked for 1 of 1 group(s), not run: group orders on prod: "
                                  "deny_list: group matches deny pattern 'orders'")
    assert blocked.value.changed is False
    assert k8s.writes() == []
    # The reason is in the action log and in Slack, as before.
    assert [(r["status"], r["rule"]) for r in audit(settings)] == [("blocked", "deny_list")]
    assert any("deny pattern 'orders'" in json.dumps(m) for m in slack_connection.messages)
    # A dry run that would meet the same guard just says so: nothing to skip.
    assert remediate("restart_consumers", plans, "manual__2", dry_run=True, settings=settings) == {"blocked": 1}


def test_blocked_for_one_group_after_acting_for_another_says_something_changed(settings, k8s, tmp_path, monkeypatch):
    from lagdoctor.stages.remediate import remediate, RemediationBlocked

    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({
        "deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"}}, "kubernetes": {"host": k8s.url}}))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    with pytest.raises(RemediationBlocked) as blocked:
        remediate("restart_consumers", plans, "manual__1", dry_run=False, approved=True, settings=settings)
    assert blocked.value.changed is True
    assert "blocked for 1 of 2 group(s), not run: group billing on prod: no Deployment mapped" in str(blocked.value)
    assert len(k8s.writes()) == 1


@pytest.mark.parametrize("members,partitions,offered,why", [
    (1, 2, False, "seen live: 2 -> 8 approved for a group with one consumer; partitions 2-7 stayed unassigned"),
    (0, 6, False, "a crashed group consumes none of the partitions it has"),
    (6, 6, True, "a consumer on every partition: only more partitions add capacity"),
    (None, 6, True, "membership unknown: not ruled out (the approval still asks a human)"),
])
def test_add_partitions_is_offered_only_once_scaling_consumers_cannot_help(settings, members, partitions, offered,
                                                                           why):
    from lagdoctor.remediation.runner import preview_action

    surge = finding("producer_surge", partition_count=partitions, group_members=members)
    dry = run_action("add_partitions", surge, run_id="r1", params={"add": 6}, now=T0)
    form = preview_action("add_partitions", surge, params={"add": 6}, now=T0)
    if offered:
        assert dry["status"] == "dry_run" and form["blocked"] is None
    else:
        assert dry["status"] == "blocked" and dry["rule"] == "action"
        assert form["blocked"] == dry["message"]
        assert ("scale consumers first" if members else "no live consumer") in dry["message"]


def test_a_rebalance_loops_advice_says_what_the_broker_cannot_see_and_gives_the_rule(settings):
    """Seen live: "consumer config: nothing to change" for a loop whose max.poll.interval.ms (4 s) was below
    its batch time (6 s): Kafka's defaults were taken for the client's settings, which no broker reports."""
    loop = finding("rebalance_loop", consume_rate=40.0, group_members=2)
    rec = run_action("recommend_consumer_config", loop, run_id="r1", now=T0)
    assert rec["status"] == "recommended"
    assert "nothing to change" not in rec["message"]
    assert "broker cannot see the group's client settings" in rec["message"]
    assert "max.poll.interval.ms above the time one poll's batch takes" in rec["message"]
    # the settings observed (a client that reports them): the concrete fix, as before
    seen = finding("rebalance_loop", processing_ms_per_record=12.0,
                   consumer_config={"max.poll.records": 500, "max.poll.interval.ms": 4000})
    rec = run_action("recommend_consumer_config", seen, run_id="r2", now=T0)
    assert rec["message"].startswith("consider max.poll.records=") and "defaults" not in rec["message"]
