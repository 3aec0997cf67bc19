"""Kubernetes actions: scale a group's Deployment, or restart its pods.

Both go through the official ``kubernetes`` client (apps/v1), imported inside
the functions. The group -> Deployment mapping is ``deployments`` in the
remediation config; credentials come from the pod's service account or the
kubeconfig, never from lagdoctor's own config.

Both act on a Deployment, which is their target: two groups served by one
Deployment share its lease and cooldown. Every API call has a time limit
(``kubernetes.request_timeout_seconds``); a patch whose answer does not come
back in time raises ``OutcomeUnknown``, because the API server may have
applied it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

from lagdoctor.remediation.actions import Action, ActionBlocked, ActionContext, Outcome, OutcomeUnknown
from lagdoctor.remediation.config import Deployment, KubernetesSettings

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"


@contextlib.contextmanager
def apps_v1(settings: KubernetesSettings) -> Iterator[Any]:
    """An AppsV1Api on a client that is closed afterwards."""
    from kubernetes import client

    from lagdoctor.kube import api_client

    with api_client(settings) as api:
        yield client.AppsV1Api(api)


def deployment_of(ctx: ActionContext) -> Deployment | None:
    """The group's Deployment: the remediation config's map first (an override), else the one its
    owner was traced to (evidence.workload, lagdoctor.workloads)."""
    mapped = ctx.config.deployment_for(ctx.cluster, ctx.group_id)
    if mapped is not None:
        return mapped
    workload = ctx.evidence.get("workload")
    if isinstance(workload, Mapping) and workload.get("kind") == "Deployment" and workload.get("name"):
        return Deployment(namespace=str(workload.get("namespace") or "default"), name=str(workload["name"]))
    return None


def deployment_target(ctx: ActionContext) -> str | None:
    dep = deployment_of(ctx)
    return f"Deployment {dep.namespace}/{dep.name}" if dep else None


@contextlib.contextmanager
def answer_in_time(settings: KubernetesSettings, what: str) -> Iterator[None]:
    """A change request whose answer timed out may have landed: say so, in one line."""
    import urllib3

    try:
        yield
    except urllib3.exceptions.TimeoutError:
        raise OutcomeUnknown(f"no answer from the Kubernetes API within {settings.request_timeout_seconds:g} s; "
                             f"{what} may have been applied") from None


def _deployment(ctx: ActionContext) -> dict[str, str]:
    dep = deployment_of(ctx)
    if dep is None:
        workload = ctx.evidence.get("workload")
        traced = workload if isinstance(workload, Mapping) else {}
        why = (f"its owner runs in {traced['kind']} {traced.get('namespace')}/{traced.get('name')}, not a Deployment"
               if traced.get("kind") else f"its owner was not traced to one: {traced['unknown']}"
               if traced.get("unknown") else "its owner was not traced to one")
        raise ActionBlocked(f"no Deployment mapped for group {ctx.group_id!r} (remediation config: deployments), "
                            f"and {why}")
    return {"namespace": dep.namespace, "deployment": dep.name}


def _stuck(ctx: ActionContext) -> bool:
    return ctx.finding.get("diagnosis") == "stalled_consumer"


def _refuse_beside_an_autoscaler(autoscalers: list[dict[str, Any]], unknown: str | None, plan: Mapping[str, Any],
                                 ctx: ActionContext) -> None:
    """An HPA or ScaledObject owns the replica count: setting it here would fight it (and a
    KEDA scaler's connections can set off rebalances of their own)."""
    from lagdoctor.workloads import autoscaler_advice

    if autoscalers:
        raise ActionBlocked(autoscaler_advice(autoscalers, plan["namespace"], plan["deployment"],
                                              plan.get("partition_count"), _stuck(ctx)))
    if unknown:
        raise ActionBlocked(f"autoscalers on Deployment {plan['namespace']}/{plan['deployment']} unknown "
                            f"({unknown}): refusing to set replicas an autoscaler may own")


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def partition_count_from_kafka(kafka_config: Mapping[str, Any], topic: str) -> int:
    from lagdoctor.remediation.kafka_ops import admin_client, topic_metadata

    with admin_client(kafka_config) as admin:
        meta = topic_metadata(admin, topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ActionBlocked(f"topic {topic!r} not found: partition count unknown")
    return len(meta.partitions)


class ScaleConsumers(Action):
    name = "scale_consumers"
    summary = "scale the group's Deployment up, never above the partition count"
    params = {"step": int, "partition_count": int}

    def target(self, ctx: ActionContext) -> str | None:
        return deployment_target(ctx)

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        plan = _deployment(ctx)
        if ctx.config.max_replicas == 0:
            raise ActionBlocked("max_replicas is 0 in the remediation config: scaling is switched off")
        step = int(ctx.params.get("step", ctx.config.scale_step))
        if step < 1:
            raise ActionBlocked("step must be at least 1")
        plan.update(
            step=step,
            partition_count=_int_or_none(ctx.params.get("partition_count"))
            or _int_or_none(ctx.evidence.get("partition_count")),
            observed_members=_int_or_none(ctx.evidence.get("group_members")),
            max_replicas=ctx.config.max_replicas,
        )
        workload = ctx.evidence.get("workload")
        if isinstance(workload, Mapping) and (workload.get("namespace"), workload.get("name")) == (
                plan["namespace"], plan["deployment"]):
            # what the sweep saw; resolve() asks the API again right before a real change
            _refuse_beside_an_autoscaler(list(workload.get("autoscalers") or []), workload.get("autoscalers_unknown"),
                                         plan, ctx)
        return plan

    def describe(self, plan: Mapping[str, Any]) -> str:
        where = f"{plan['namespace']}/{plan['deployment']}"
        if "target_replicas" in plan:
            return f"scale {where} from {plan['current_replicas']} to {plan['target_replicas']} replicas (cap {plan['cap']})"
        cap = plan.get("partition_count")
        cap_text = f"{cap} partitions" if cap else "the partition count"
        now = plan.get("observed_members")
        frm = f" from ~{now}" if now is not None else ""
        return f"scale {where}{frm} by +{plan['step']} replicas, never above {cap_text}"

    def resolve(self, ctx: ActionContext, plan: dict[str, Any]) -> dict[str, Any]:
        from lagdoctor.workloads import autoscalers_of

        partitions = plan.get("partition_count")
        if not partitions:
            try:
                kafka_config = ctx.kafka_config()
            except ActionBlocked as exc:  # no usable connection
                raise ActionBlocked(f"partition count unknown ({exc}); refusing to scale without the cap") from None
            try:
                partitions = partition_count_from_kafka(kafka_config, ctx.topic)
            except ActionBlocked:
                raise
            except Exception as exc:  # no connection, unreachable cluster...
                raise ActionBlocked(
                    f"partition count unknown ({type(exc).__name__}); refusing to scale without the cap"
                ) from None
        cap = min(partitions, plan["max_replicas"]) if plan.get("max_replicas") is not None else partitions
        _refuse_beside_an_autoscaler(*autoscalers_of(ctx.config.kubernetes, plan["namespace"], plan["deployment"]),
                                     {**plan, "partition_count": partitions}, ctx)
        timeout = ctx.config.kubernetes.request_timeout_seconds
        with apps_v1(ctx.config.kubernetes) as api:
            scale = api.read_namespaced_deployment_scale(plan["deployment"], plan["namespace"],
                                                         _request_timeout=timeout)
        current = int(scale.spec.replicas or 0)
        return {**plan, "partition_count": partitions, "cap": cap,
                "current_replicas": current, "target_replicas": min(current + plan["step"], cap)}

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        target = plan["target_replicas"]
        where = f"{plan['namespace']}/{plan['deployment']}"
        settings = ctx.config.kubernetes
        with apps_v1(settings) as api:
            current = int(api.read_namespaced_deployment_scale(
                plan["deployment"], plan["namespace"], _request_timeout=settings.request_timeout_seconds,
            ).spec.replicas or 0)
            if current >= target:
                # Already there (a retry, or someone scaled by hand): never scale down here.
                why = "the partition count: more consumers would sit idle" if target >= plan["cap"] else "the target"
                return Outcome("noop", f"{where} already has {current} replicas, at or above {why}",
                               {"replicas": current})
            with answer_in_time(settings, f"scaling {where} to {target} replicas"):
                api.patch_namespaced_deployment_scale(
                    plan["deployment"], plan["namespace"], {"spec": {"replicas": target}},
                    _request_timeout=settings.request_timeout_seconds,
                )
        return Outcome("executed", f"scaled {where} from {current} to {target} replicas", {"replicas": target})


class RestartConsumers(Action):
    name = "restart_consumers"
    summary = "rollout restart of the group's Deployment (like kubectl rollout restart)"

    def target(self, ctx: ActionContext) -> str | None:
        return deployment_target(ctx)

    def prepare(self, ctx: ActionContext) -> dict[str, Any]:
        return _deployment(ctx)

    def describe(self, plan: Mapping[str, Any]) -> str:
        return f"rollout restart {plan['namespace']}/{plan['deployment']}"

    def resolve(self, ctx: ActionContext, plan: dict[str, Any]) -> dict[str, Any]:
        # Fixed once per run: patching the same value again starts no second rollout.
        return {**plan, "restarted_at": ctx.now.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def apply(self, ctx: ActionContext, plan: Mapping[str, Any]) -> Outcome:
        body = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: plan["restarted_at"]}}}}}
        settings = ctx.config.kubernetes
        where = f"{plan['namespace']}/{plan['deployment']}"
        with apps_v1(settings) as api, answer_in_time(settings, f"the rollout restart of {where}"):
            api.patch_namespaced_deployment(plan["deployment"], plan["namespace"], body,
                                            _request_timeout=settings.request_timeout_seconds)
        return Outcome("executed", f"rollout restart of {plan['namespace']}/{plan['deployment']} "
                       f"(restartedAt {plan['restarted_at']})", {"restarted_at": plan["restarted_at"]})
