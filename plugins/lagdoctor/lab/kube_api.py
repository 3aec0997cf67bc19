"""A loopback Kubernetes API: the calls lagdoctor sends, for the tests and the demo's lab.

Serves, as a real API server answers them:
  core/v1 pods: listed in every namespace or one (field selectors ``status.podIP`` and
    ``metadata.name``), and read one by one;
  apps/v1 replicasets and statefulsets (read), deployments (read, and patched: a rollout
    restart), deployments' scale subresource (read and patched);
  autoscaling/v2 horizontalpodautoscalers and keda.sh/v1alpha1 scaledobjects (listed per
    namespace; the second answers 404 unless KEDA is "installed").

Every request needs ``Authorization: Bearer <token>`` when a token is set (the demo always
sets one: any local user can reach a loopback port). A resource named in ``forbidden``
answers 403 as RBAC would. Each request is recorded. ``hold_answers()`` makes every PATCH
apply at once but answer only after ``release_answers()``: a change in flight, or one whose
answer comes too late for the client's timeout.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

PATCH_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")
_NAMESPACED = re.compile(r"^/(?P<group>api/v1|apis/[^/]+/[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<kind>[a-z]+)"
                         r"(?:/(?P<name>[^/]+))?(?P<scale>/scale)?$")
_CLUSTER_WIDE = re.compile(r"^/(?P<group>api/v1|apis/[^/]+/[^/]+)/(?P<kind>[a-z]+)$")
_GROUP_OF = {"pods": "api/v1", "replicasets": "apps/v1", "deployments": "apps/v1", "statefulsets": "apps/v1",
             "horizontalpodautoscalers": "autoscaling/v2", "scaledobjects": "keda.sh/v1alpha1"}


@dataclass
class KubeRequest:
    method: str
    path: str
    content_type: str
    authorization: str
    body: Any


def _iso(at: datetime | str | None) -> str | None:
    if at is None or isinstance(at, str):
        return at
    return at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def replica_set_name(namespace: str, deployment: str) -> str:
    """The current ReplicaSet's name of a Deployment here: its name and a hash, the same every run."""
    return f"{deployment}-{zlib.crc32(f'{namespace}/{deployment}'.encode()) % 16**6:06x}"


@dataclass
class LoopbackKubernetes:
    url: str = ""
    token: str | None = None  # when set, requests must carry "Bearer <token>"
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    statefulsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    replicasets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    autoscalers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # HPAs
    scaled_objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    keda: bool = False  # whether the ScaledObject resource exists
    forbidden: set[str] = field(default_factory=set)  # resources RBAC refuses, e.g. {"pods"}
    requests: list[KubeRequest] = field(default_factory=list)
    answers: threading.Event = field(default_factory=lambda: _set(threading.Event()))

    # -- what the cluster runs ---------------------------------------------------------------

    def add_deployment(self, namespace: str, name: str, replicas: int, *, ready: int | None = None,
                       rolled_out_at: datetime | str | None = None, pods: dict[str, str] | None = None) -> None:
        """A Deployment, its current ReplicaSet (created at `rolled_out_at`) and `pods`
        ({pod name: pod IP}), each owned by that ReplicaSet."""
        self.deployments[(namespace, name)] = {"replicas": replicas, "annotations": {},
                                               "ready": replicas if ready is None else ready}
        replica_set = replica_set_name(namespace, name)
        self.replicasets[(namespace, replica_set)] = {"owner": ("Deployment", name),
                                                      "created": _iso(rolled_out_at) or "2026-01-01T00:00:00Z"}
        for pod, ip in (pods or {}).items():
            self.add_pod(namespace, pod, ip, owner=("ReplicaSet", replica_set))

    def add_statefulset(self, namespace: str, name: str, replicas: int, *, ready: int | None = None,
                        pods: dict[str, str] | None = None) -> None:
        self.statefulsets[(namespace, name)] = {"replicas": replicas, "ready": replicas if ready is None else ready}
        for pod, ip in (pods or {}).items():
            self.add_pod(namespace, pod, ip, owner=("StatefulSet", name))

    def add_pod(self, namespace: str, name: str, ip: str, *, owner: tuple[str, str] | None = None,
                restarts: int = 0, last_termination: dict[str, Any] | None = None, uid: str | None = None) -> None:
        """`last_termination`: {"reason": "OOMKilled", "exitCode": 137, "finishedAt": datetime}; `uid`:
        a new one for a pod recreated under its name (default: the same for the name every run)."""
        self.pods[(namespace, name)] = {"ip": ip, "owner": owner, "restarts": restarts,
                                        "last_termination": last_termination,
                                        "uid": uid or f"{zlib.crc32(f'pod/{namespace}/{name}'.encode()):08x}"}

    def add_autoscaler(self, namespace: str, name: str, deployment: str, *, min_replicas: int = 1,
                       max_replicas: int = 10) -> None:
        self.autoscalers[(namespace, name)] = {"target": deployment, "min": min_replicas, "max": max_replicas}

    def add_scaled_object(self, namespace: str, name: str, deployment: str, *, min_replicas: int = 0,
                          max_replicas: int = 10, lag_threshold: str = "100") -> None:
        self.keda = True
        self.scaled_objects[(namespace, name)] = {"target": deployment, "min": min_replicas, "max": max_replicas,
                                                  "lag_threshold": lag_threshold}

    # -- answers held, writes awaited ------------------------------------------------------

    def hold_answers(self) -> None:
        self.answers.clear()

    def release_answers(self) -> None:
        self.answers.set()

    def writes(self) -> list[KubeRequest]:
        return [r for r in self.requests if r.method != "GET"]

    def wait_for_writes(self, count: int, timeout_s: float = 60.0) -> list[KubeRequest]:
        """Block until `count` writes arrived (they apply before answering)."""
        deadline = time.monotonic() + timeout_s
        while len(self.writes()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.writes())} write(s) arrived, expected {count}")
            time.sleep(0.02)
        return self.writes()

    @contextlib.contextmanager
    def serve(self) -> Iterator["LoopbackKubernetes"]:
        """Serve on a free loopback port (sets `url`); stopped on leaving."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        thread = threading.Thread(target=server.serve_forever, daemon=True, name="loopback-kubernetes")
        thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            yield self
        finally:
            self.release_answers()
            server.shutdown()
            server.server_close()

    # -- objects as the API shows them -------------------------------------------------------

    def _pod(self, ns: str, name: str) -> dict[str, Any]:
        p = self.pods[(ns, name)]
        owners = []
        if p["owner"]:
            kind, owner = p["owner"]
            owners = [{"apiVersion": "apps/v1", "kind": kind, "name": owner, "uid": f"uid-{owner}",
                       "controller": True}]
        status: dict[str, Any] = {"restartCount": p["restarts"], "name": "consumer", "ready": True,
                                  "image": "consumer:1", "imageID": "consumer@sha256:0"}
        if p["last_termination"]:
            t = dict(p["last_termination"])
            t["finishedAt"] = _iso(t.get("finishedAt"))
            status["lastState"] = {"terminated": t}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": p["uid"], "ownerReferences": owners},
                "spec": {"containers": [{"name": "consumer", "image": "consumer:1"}]},
                "status": {"phase": "Running", "podIP": p["ip"], "containerStatuses": [status]}}

    def _replicaset(self, ns: str, name: str) -> dict[str, Any]:
        rs = self.replicasets[(ns, name)]
        kind, owner = rs["owner"]
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": ns, "creationTimestamp": rs["created"],
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": kind, "name": owner,
                                                  "uid": f"uid-{owner}", "controller": True}]},
                "spec": {"selector": {"matchLabels": {"app": owner}}}}

    def _deployment(self, ns: str, name: str) -> dict[str, Any]:
        dep = self.deployments[(ns, name)]
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": dep["replicas"], "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}, "annotations": dict(dep["annotations"])},
                                      "spec": {"containers": [{"name": "consumer", "image": "consumer:1"}]}}},
                "status": {"replicas": dep["replicas"], "readyReplicas": dep.get("ready", dep["replicas"])}}

    def _statefulset(self, ns: str, name: str) -> dict[str, Any]:
        sts = self.statefulsets[(ns, name)]
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": sts["replicas"], "selector": {"matchLabels": {"app": name}},
                         "serviceName": name, "template": {"metadata": {"labels": {"app": name}}}},
                "status": {"replicas": sts["replicas"], "readyReplicas": sts["ready"]}}

    def _scale(self, ns: str, name: str) -> dict[str, Any]:
        dep = self.deployments[(ns, name)]
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": dep["replicas"]}, "status": {"replicas": dep["replicas"]}}

    def _hpa(self, ns: str, name: str) -> dict[str, Any]:
        a = self.autoscalers[(ns, name)]
        return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": a["target"]},
                         "minReplicas": a["min"], "maxReplicas": a["max"]}}

    def _scaled_object(self, ns: str, name: str) -> dict[str, Any]:
        s = self.scaled_objects[(ns, name)]
        return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name, "namespace": ns},
                "spec": {"scaleTargetRef": {"name": s["target"]}, "minReplicaCount": s["min"],
                         "maxReplicaCount": s["max"],
                         "triggers": [{"type": "kafka", "metadata": {"lagThreshold": s["lag_threshold"]}}]}}


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message,
            "code": code}


def _field_matches(selector: str, pod: dict[str, Any]) -> bool:
    for clause in filter(None, selector.split(",")):
        key, _, want = clause.partition("=")
        got = {"status.podIP": pod["status"]["podIP"], "metadata.name": pod["metadata"]["name"],
               "metadata.namespace": pod["metadata"]["namespace"]}.get(key.strip())
        if got != want.strip():
            return False
    return True


def _handler(api: LoopbackKubernetes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (a held answer): what a real server meets too

        def _list(self, kind: str, items: list[dict[str, Any]]) -> None:
            title = {"pods": "PodList", "horizontalpodautoscalers": "HorizontalPodAutoscalerList",
                     "scaledobjects": "ScaledObjectList"}[kind]
            self._answer(200, {"apiVersion": _GROUP_OF[kind], "kind": title, "metadata": {}, "items": items})

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            ctype = (self.headers.get("Content-Type") or "").split(";")[0]
            api.requests.append(KubeRequest(method, self.path, ctype, self.headers.get("Authorization") or "", body))
            if api.token and self.headers.get("Authorization") != f"Bearer {api.token}":
                return self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
            parts = urlsplit(self.path)
            path, query = unquote(parts.path), parse_qs(parts.query)
            m = _NAMESPACED.match(path) or _CLUSTER_WIDE.match(path)
            if not m or _GROUP_OF.get(m["kind"]) != m["group"].removeprefix("apis/"):
                return self._answer(404, _status(404, "NotFound", f"no route {path}"))
            kind, ns = m["kind"], m.groupdict().get("ns")
            name, scale = m.groupdict().get("name"), bool(m.groupdict().get("scale"))
            if kind == "scaledobjects" and not api.keda:
                return self._answer(404, _status(404, "NotFound", "the server could not find the requested resource"))
            if kind in api.forbidden:
                verb = "list" if name is None else "get"
                return self._answer(403, _status(403, "Forbidden", f'{kind} is forbidden: User "system:serviceaccount:'
                                                                   f'lagdoctor:lagdoctor" cannot {verb} resource '
                                                                   f'"{kind}"'))
            if name is None:
                if kind not in ("pods", "horizontalpodautoscalers", "scaledobjects"):
                    return self._answer(404, _status(404, "NotFound", f"listing {kind} is not served here"))
                if method != "GET":
                    return self._answer(405, _status(405, "MethodNotAllowed", f"{method} on a list"))
                return self._list(kind, self._items(kind, ns, (query.get("fieldSelector") or [""])[0]))
            store = {"pods": api.pods, "replicasets": api.replicasets, "deployments": api.deployments,
                     "statefulsets": api.statefulsets, "horizontalpodautoscalers": api.autoscalers,
                     "scaledobjects": api.scaled_objects}[kind]
            if (ns, name) not in store:
                group = "" if kind == "pods" else f".{_GROUP_OF[kind].split('/')[0]}"
                return self._answer(404, _status(404, "NotFound", f'{kind}{group} "{name}" not found'))
            if method == "PATCH":
                if kind != "deployments":
                    return self._answer(405, _status(405, "MethodNotAllowed", f"PATCH on {kind}"))
                if ctype not in PATCH_TYPES or not isinstance(body, dict):
                    return self._answer(415, _status(415, "UnsupportedMediaType", f"unsupported patch {ctype}"))
                dep = api.deployments[(ns, name)]
                if scale:
                    dep["replicas"] = int(body["spec"]["replicas"])
                else:
                    template = (body.get("spec") or {}).get("template") or {}
                    dep["annotations"].update((template.get("metadata") or {}).get("annotations") or {})
                api.answers.wait(60)  # applied; the answer waits while held
            if scale:
                return self._answer(200, api._scale(ns, name))
            show = {"pods": api._pod, "replicasets": api._replicaset, "deployments": api._deployment,
                    "statefulsets": api._statefulset, "horizontalpodautoscalers": api._hpa,
                    "scaledobjects": api._scaled_object}[kind]
            self._answer(200, show(ns, name))

        def _items(self, kind: str, ns: str | None, selector: str) -> list[dict[str, Any]]:
            if kind == "pods":
                pods = [api._pod(n, p) for n, p in api.pods if ns is None or n == ns]
                return [p for p in pods if _field_matches(selector, p)]
            if kind == "horizontalpodautoscalers":
                return [api._hpa(n, a) for n, a in api.autoscalers if ns is None or n == ns]
            return [api._scaled_object(n, s) for n, s in api.scaled_objects if ns is None or n == ns]

        def do_GET(self) -> None:
            self._handle("GET")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

    return Handler
