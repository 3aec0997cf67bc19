"""From a group member to the pod and the workload that run it, through the Kubernetes API.

A member is known to Kafka by its host (the client's address as the broker saw it, most often
the pod's IP) and its client id (often the pod's name). The pod comes from either; its owner
chain (ReplicaSet -> Deployment, or a StatefulSet) names the workload. Beside them, what
explains a lag: the pod's restarts and its last termination (OOMKilled, an exit code), when
the workload last rolled out, its ready replicas against desired, and any autoscaler (an HPA
or a KEDA ScaledObject) that scaling by hand would fight.

Unknown is said as what it is: no Kubernetes API at all (said once per run, not per member),
no RBAC to read pods, a host that no pod of this cluster has. Every call has the settings'
time limit; one resolver serves one run and asks about each member and workload once.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from lagdoctor.remediation.config import KubernetesSettings

log = logging.getLogger(__name__)

NO_API = "no Kubernetes API: workload unknown"
# Evidence is read inside the sweep's minute: an API that does not answer costs one short wait
# per run (then every member says so), never the actions' timeout and urllib3's retries.
READ_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class Workload:
    """Where a member runs; `unknown` says why the pod or workload is not known."""

    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None  # tells a pod from an older one of the same name (a StatefulSet's)
    kind: str | None = None  # the top of the owner chain: Deployment, StatefulSet, ...
    name: str | None = None
    unknown: str | None = None
    restarts: int | None = None
    last_termination: dict[str, Any] | None = None  # {"reason", "exit_code", "finished_at"}
    rolled_out_at: str | None = None  # when the pod's ReplicaSet was created (a Deployment's rollout)
    ready_replicas: int | None = None
    desired_replicas: int | None = None
    autoscalers: tuple[dict[str, Any], ...] = ()  # {"kind", "name", "min_replicas", "max_replicas", ...}
    autoscalers_unknown: str | None = None  # why the autoscalers could not be read (none known is not none)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["autoscalers"] = [dict(a) for a in self.autoscalers]
        return out

    @property
    def target(self) -> str | None:
        """"Deployment shop/orders", for messages and remediation's target."""
        return f"{self.kind} {self.namespace}/{self.name}" if self.kind and self.name else None


class _Refused(Exception):
    """An answer that ends the lookup of one member, said as `reason`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class WorkloadResolver:
    """Member -> Workload for one run; pods are looked for in the settings' namespaces (none:
    every namespace, which needs RBAC to list pods cluster-wide)."""

    settings: KubernetesSettings = field(default_factory=KubernetesSettings)
    api_error: str | None = None  # set once the API is known unusable this run: every member after says it
    _client: Any = None
    _members: dict[tuple[str | None, str | None], Workload] = field(default_factory=dict)
    _workloads: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "WorkloadResolver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def resolve(self, host: str | None, client_id: str | None) -> Workload:
        key = (host, client_id)
        if key not in self._members:
            self._members[key] = self._resolve(host, client_id)
        return self._members[key]

    # -- the lookup ------------------------------------------------------------------------

    def _resolve(self, host: str | None, client_id: str | None) -> Workload:
        if self.api_error:
            return Workload(unknown=self.api_error)
        try:
            pod = self._find_pod(_address(host), client_id)
            return self._describe(pod)
        except _Refused as exc:
            return Workload(unknown=exc.reason)
        except (KeyError, TypeError, AttributeError) as exc:  # an object without the fields every API server sends
            return Workload(unknown=f"the Kubernetes API's answer could not be read ({type(exc).__name__}: {exc})")

    def _find_pod(self, ip: str | None, client_id: str | None) -> dict[str, Any]:
        by_ip = self._pods(f"status.podIP={ip}") if ip else []
        if len(by_ip) == 1:
            return by_ip[0]
        named = [p for p in by_ip if _names(client_id, p["metadata"]["name"])]
        if len(named) == 1:  # pods on the node's network share its IP: the client id tells them apart
            return named[0]
        if client_id and not by_ip:
            by_name = self._pods(f"metadata.name={client_id}")
            if len(by_name) == 1:
                return by_name[0]
        if by_ip:
            raise _Refused(f"{len(by_ip)} pods have IP {ip} and client id {client_id!r} names none of them")
        if ip is None and not client_id:
            raise _Refused("the broker lists no host or client id for this member")
        where = f"IP {ip}" if ip else "its address"
        raise _Refused(f"no pod on this cluster has {where} or the name {client_id!r}: the member runs outside "
                       f"this cluster (or behind NAT)")

    def _describe(self, pod: dict[str, Any]) -> Workload:
        meta, status = pod["metadata"], pod.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        statuses = status.get("containerStatuses") or []
        restarts = sum(int(s.get("restartCount") or 0) for s in statuses)
        ended = [s["lastState"]["terminated"] for s in statuses if (s.get("lastState") or {}).get("terminated")]
        last = max(ended, key=lambda t: t.get("finishedAt") or "", default=None)
        termination = None if last is None else {
            "reason": last.get("reason"), "exit_code": last.get("exitCode"), "finished_at": last.get("finishedAt")}
        kind, owner, rolled_out = self._owner_chain(namespace, meta.get("ownerReferences") or [])
        details = self._workload(namespace, kind, owner) if kind in ("Deployment", "StatefulSet") else {}
        return Workload(namespace=namespace, pod=name, pod_uid=meta.get("uid"), kind=kind, name=owner,
                        restarts=restarts, last_termination=termination, rolled_out_at=rolled_out,
                        ready_replicas=details.get("ready"), desired_replicas=details.get("desired"),
                        autoscalers=tuple(details.get("autoscalers") or ()),
                        autoscalers_unknown=details.get("autoscalers_unknown"),
                        unknown=None if kind else "the pod has no controller (a bare pod)")

    def _owner_chain(self, namespace: str, owners: list[dict[str, Any]]) -> tuple[str | None, str | None, str | None]:
        controller = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
        if controller is None:
            return None, None, None
        if controller["kind"] != "ReplicaSet":
            return controller["kind"], controller["name"], None
        replica_set = self._get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{controller['name']}")
        rs_meta = replica_set["metadata"]
        above = next((o for o in rs_meta.get("ownerReferences") or [] if o.get("controller")), None)
        if above is None:
            return "ReplicaSet", controller["name"], rs_meta.get("creationTimestamp")
        return above["kind"], above["name"], rs_meta.get("creationTimestamp")

    def _workload(self, namespace: str, kind: str, name: str) -> dict[str, Any]:
        key = (namespace, kind, name)
        if key not in self._workloads:
            plural = {"Deployment": "deployments", "StatefulSet": "statefulsets"}[kind]
            obj = self._get(f"/apis/apps/v1/namespaces/{namespace}/{plural}/{name}")
            autoscalers, unknown = self._autoscalers(namespace, kind, name)
            self._workloads[key] = {"desired": (obj.get("spec") or {}).get("replicas"),
                                    "ready": int((obj.get("status") or {}).get("readyReplicas") or 0),
                                    "autoscalers": autoscalers, "autoscalers_unknown": unknown}
        return self._workloads[key]

    def _autoscalers(self, namespace: str, kind: str, name: str) -> tuple[list[dict[str, Any]], str | None]:
        """The HPAs and ScaledObjects that target the workload, and why some could not be read."""
        found, unknown = [], []
        scaled_objects = self._list_or_why(f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects", unknown)
        for so in scaled_objects:
            spec = so.get("spec") or {}
            ref = spec.get("scaleTargetRef") or {}
            if ref.get("name") == name and ref.get("kind", "Deployment") == kind:
                lag = [t.get("metadata", {}).get("lagThreshold") for t in spec.get("triggers") or []
                       if t.get("type") == "kafka"]
                found.append({"kind": "ScaledObject", "name": so["metadata"]["name"],
                              "min_replicas": spec.get("minReplicaCount"), "max_replicas": spec.get("maxReplicaCount"),
                              "lag_threshold": lag[0] if lag else None})
        keda_hpas = {f"keda-hpa-{a['name']}" for a in found}  # KEDA drives the Deployment through an HPA of its own
        for hpa in self._list_or_why(f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers", unknown):
            spec = hpa.get("spec") or {}
            ref = spec.get("scaleTargetRef") or {}
            if ref.get("kind") == kind and ref.get("name") == name and hpa["metadata"]["name"] not in keda_hpas:
                found.append({"kind": "HorizontalPodAutoscaler", "name": hpa["metadata"]["name"],
                              "min_replicas": spec.get("minReplicas"), "max_replicas": spec.get("maxReplicas")})
        return found, "; ".join(unknown) or None

    # -- the API ---------------------------------------------------------------------------

    def _pods(self, selector: str) -> list[dict[str, Any]]:
        paths = [f"/api/v1/namespaces/{ns}/pods" for ns in self.settings.namespaces] or ["/api/v1/pods"]
        pods = []
        for path in paths:
            pods += self._get(path, field_selector=selector).get("items") or []
        return pods

    def _list_or_why(self, path: str, unknown: list[str]) -> list[dict[str, Any]]:
        """A list that may not exist (KEDA not installed: none) or may be refused (said in `unknown`)."""
        try:
            return self._get(path).get("items") or []
        except _Refused as exc:
            if not exc.reason.startswith("404 "):
                unknown.append(exc.reason)
            return []

    def _get(self, path: str, field_selector: str | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        client = self._api()
        params = [("fieldSelector", field_selector)] if field_selector else []
        request = client.param_serialize("GET", path, query_params=params, header_params={"Accept": "application/json"},
                                         auth_settings=["BearerToken"])
        try:
            response = client.call_api(*request, _request_timeout=min(self.settings.request_timeout_seconds,
                                                                       READ_TIMEOUT_SECONDS))
            response.read()
        except Exception as exc:  # no answer: the API is down for this run, said once
            self.api_error = (f"the Kubernetes API at {client.configuration.host} did not answer "
                              f"({type(exc).__name__}): workload unknown")
            log.warning("%s", self.api_error)
            raise _Refused(self.api_error) from None
        if not 200 <= response.status <= 299:
            try:
                ApiException.from_response(http_resp=response, body=None, data=None)  # raises its kind
            except ApiException as exc:
                raise _Refused(_refusal(exc, path)) from None
        try:
            answer = json.loads(response.data)
        except ValueError:  # a proxy's login page, say: not the API
            answer = None
        if not isinstance(answer, dict):
            raise _Refused(f"{client.configuration.host} answered {path} with something other than a Kubernetes "
                           f"object (a proxy in the way?)")
        return answer

    def _api(self) -> Any:
        if self._client is None:
            from kubernetes.config import ConfigException

            from lagdoctor.kube import configured_client

            try:
                self._client = configured_client(self.settings, retries=0)
            except (ConfigException, FileNotFoundError, OSError):
                self.api_error = NO_API
                log.warning("%s (no in-cluster service account, no kubeconfig)", NO_API)
                raise _Refused(NO_API) from None
        return self._client


def _refusal(exc: Any, path: str) -> str:
    """An API error as one line: RBAC's refusal named, never the request's headers."""
    try:
        message = json.loads(exc.body or "{}").get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    if exc.status == 403:
        return f"no RBAC to read it: {message}"
    if exc.status == 401:
        return "the Kubernetes API refused lagdoctor's credentials (401 Unauthorized)"
    return f"{exc.status} from the Kubernetes API on {path.split('?')[0]}: {message}"


def _names(client_id: str | None, pod: str) -> bool:
    """A client id set from the pod's hostname: the name itself, or the name and a suffix
    ("orders-7d9f-x2-1" for a second consumer thread), never a longer pod's name."""
    return bool(client_id) and (client_id == pod or client_id.startswith(pod + "-"))


def _address(host: str | None) -> str | None:
    """The IP in a member's host as the broker reports it ("/10.0.1.15"), else None."""
    text = (host or "").strip().lstrip("/")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def attach_workloads(findings: list[dict[str, Any]], settings: KubernetesSettings | None = None) -> dict[str, Any]:
    """Each problem finding whose focus partition names an owner gets ``evidence["workload"]``
    (Workload.as_dict). Returns what a run summary says: how many were traced, and the run-wide
    reason when none could be (no Kubernetes API), logged once here."""
    from lagdoctor.contracts import NO_PROBLEM_DIAGNOSES

    if settings is None:
        from lagdoctor.remediation.config import ConfigError, RemediationConfig

        try:
            settings = RemediationConfig.from_env().kubernetes
        except ConfigError as exc:
            log.warning("pods and workloads not traced: %s", exc)
            return {"traced": 0, "unknown": 0, "not_traced": str(exc)}
    traced = unknown = 0
    with WorkloadResolver(settings) as resolver:
        for finding in findings:
            ev = finding.get("evidence")
            if finding.get("diagnosis") in NO_PROBLEM_DIAGNOSES or not isinstance(ev, dict):
                continue
            host, client_id = ev.get("owner_host"), ev.get("owner_client_id")
            if not host and not client_id:
                continue
            workload = resolver.resolve(host, client_id)
            ev["workload"] = workload.as_dict()
            traced += workload.pod is not None
            unknown += workload.pod is None
        return {"traced": traced, "unknown": unknown, "not_traced": resolver.api_error}


# An observation this long before a window's start still counts as its start (sweeps a minute
# apart leave one a minute before; older ones would count restarts from long before the window).
RESTARTS_LOOKBACK = timedelta(minutes=30)


def remember_restarts(findings: list[dict[str, Any]], now: datetime, db: Any = None) -> str | None:
    """Kubernetes gives a pod's restarts only as a total: each traced pod's count is kept with
    ``now`` in lagdoctor's state, and each workload gets ``restarts_since`` ({"at", "restarts"}):
    the count seen last at or before its window's start (at most RESTARTS_LOOKBACK before it),
    else first inside the window, and ``observed_at`` (now). Without such an observation only
    the total is known, and said. Returns why nothing was counted (the state database is not
    usable: the plan goes on without it), else None."""
    import sqlalchemy as sa

    from lagdoctor.notify.formatting import parse_iso
    from lagdoctor.state import StateConfigError, as_utc, is_unavailable, pod_restarts, state_db, unavailable_line

    traced = [(f, f["evidence"]["workload"]) for f in findings
              if isinstance(f.get("evidence"), dict) and isinstance(f["evidence"].get("workload"), dict)]
    traced = [(f, w) for f, w in traced
              if w.get("pod") and w.get("namespace") and isinstance(w.get("restarts"), int)]
    if not traced:
        return None
    now = as_utc(now)
    table = pod_restarts.c
    try:
        db = db if db is not None else state_db()
        with db.transaction() as conn:
            for f, w in traced:
                start = as_utc(parse_iso(f.get("window_start")))
                uid = w.get("pod_uid")
                pod = (table.namespace == w["namespace"], table.pod == w["pod"],
                       table.pod_uid == uid if uid else table.pod_uid.is_(None))
                row = None if start is None else conn.execute(
                    sa.select(table.restarts, table.observed_at)
                    .where(*pod, table.observed_at <= start, table.observed_at >= start - RESTARTS_LOOKBACK)
                    .order_by(table.observed_at.desc()).limit(1)).first() or conn.execute(
                    sa.select(table.restarts, table.observed_at)
                    .where(*pod, table.observed_at > start, table.observed_at < now)
                    .order_by(table.observed_at).limit(1)).first()
                # a count above today's: another pod of the same name that the API gave no uid
                if row is not None and row.restarts <= w["restarts"]:
                    w["restarts_since"] = {"at": as_utc(row.observed_at).isoformat().replace("+00:00", "Z"),
                                           "restarts": row.restarts}
                w["observed_at"] = now.isoformat().replace("+00:00", "Z")
            observed = {(w["namespace"], w["pod"], w.get("pod_uid")): w["restarts"] for _, w in traced}
            conn.execute(sa.insert(pod_restarts), [
                {"namespace": ns, "pod": name, "pod_uid": uid, "restarts": n, "observed_at": now}
                for (ns, name, uid), n in observed.items()])
    except (StateConfigError, sa.exc.SQLAlchemyError) as exc:
        if not (isinstance(exc, StateConfigError) or is_unavailable(exc)):
            raise
        for _, w in traced:  # said as totals, as without any observation
            w.pop("restarts_since", None)
            w.pop("observed_at", None)
        why = unavailable_line(exc)
        log.warning("restarts not counted per window: %s", why)
        return why
    return None


def autoscalers_of(settings: KubernetesSettings, namespace: str, name: str,
                   kind: str = "Deployment") -> tuple[list[dict[str, Any]], str | None]:
    """The HPAs and KEDA ScaledObjects that scale a workload now, and why some could not be read
    (no API, no RBAC): what scale_consumers checks right before it would change replicas."""
    with WorkloadResolver(settings) as resolver:
        try:
            return resolver._autoscalers(namespace, kind, name)
        except _Refused as exc:
            return [], exc.reason


def autoscaler_advice(autoscalers: list[dict[str, Any]], namespace: str, deployment: str,
                      partition_count: int | None, stuck_partitions: bool) -> str:
    """Why lagdoctor does not scale a Deployment an autoscaler owns, and the change to make there."""
    cap = f"{partition_count} (the partition count)" if partition_count else "the partition count"
    advice = []
    for a in autoscalers:
        if a["kind"] == "ScaledObject":
            parts = [f"maxReplicaCount {a.get('max_replicas')} -> up to {cap}"]
            if a.get("lag_threshold"):
                parts.append(f"lagThreshold below {a['lag_threshold']} to scale out sooner")
            if stuck_partitions:
                parts.append("limitToPartitionsWithLag: true (stuck partitions)")
        else:
            parts = [f"maxReplicas {a.get('max_replicas')} -> up to {cap}"]
        advice.append(("" if len(autoscalers) == 1 else f"{a['kind']} {a['name']}: ") + ", ".join(parts))
    names = " and ".join(f"{a['kind']} {a['name']}" for a in autoscalers)
    return (f"Deployment {namespace}/{deployment} is scaled by {names}, not by lagdoctor behind it; change "
            f"{'it' if len(autoscalers) == 1 else 'them'} there: " + "; ".join(advice))
