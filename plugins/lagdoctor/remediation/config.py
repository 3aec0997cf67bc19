"""Remediation configuration: one frozen object, loaded at run time.

Where it comes from (first wins):
  1. ``LAGDOCTOR_REMEDIATION_CONFIG``: a path to a YAML/JSON file, or inline JSON;
  2. built-in defaults (every action dry-run, nothing mapped to a deployment).

Secrets never live here: Kafka settings come from the cluster's Airflow
connection, Kubernetes credentials from the in-cluster service account or the
kubeconfig.

Example (YAML)::

    cooldown_minutes: 30
    max_actions_per_hour: 6
    allow_groups: ["orders-*"]
    deny_groups: ["payments-*"]
    require_approval: [restart_consumers]
    dead_letter_topic: "{topic}.dlq"
    max_replicas: 24          # 0 switches scaling off (scale_consumers is blocked, with that reason)
    lease_minutes: 15         # how long a run that died mid-action keeps others off its target
    deployments:
      orders-consumer: {namespace: shop, name: orders-consumer}
      prod/billing: {namespace: billing, name: billing-worker}
    kubernetes: {host: "https://10.0.0.1:6443", request_timeout_seconds: 30,   # else in-cluster, else kubeconfig
                 namespaces: [shop, billing]}   # where consumer pods run (default: every namespace)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

ENV_VAR = "LAGDOCTOR_REMEDIATION_CONFIG"


class ConfigError(ValueError):
    """A remediation config problem, one line naming the source and the field."""


@dataclass(frozen=True)
class Deployment:
    namespace: str
    name: str


@dataclass(frozen=True)
class KubernetesSettings:
    host: str | None = None  # explicit API server (tests, out-of-cluster)
    in_cluster: bool | None = None  # None: try in-cluster, then kubeconfig
    context: str | None = None
    verify_ssl: bool = True
    # Every API call's limit; a patch whose answer does not come in time may
    # still have landed, and is counted as if it had.
    request_timeout_seconds: float = 30
    # Where the consumers' pods run (lagdoctor.workloads): empty looks in every namespace,
    # which needs RBAC to list pods cluster-wide.
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemediationConfig:
    cooldown_minutes: float = 30
    max_actions_per_hour: int = 6
    allow_groups: tuple[str, ...] = ()  # fnmatch globs; empty = every group
    deny_groups: tuple[str, ...] = ()
    require_approval: tuple[str, ...] = ()  # reversible actions that still need a human
    deployments: Mapping[str, Deployment] = field(default_factory=lambda: MappingProxyType({}))
    max_replicas: int | None = None  # absolute cap on top of the partition count; 0: never scale
    scale_step: int = 1
    dead_letter_topic: str = "{topic}.dlq"
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    # recommend_consumer_config: wanted ratio of max.poll.interval.ms to one batch's processing time
    poll_headroom: float = 2.0
    # A real action holds a lease on its target while it runs; a worker that
    # died mid-action keeps others off the target this long.
    lease_minutes: float = 15

    def deployment_for(self, cluster: str, group_id: str) -> Deployment | None:
        """``cluster/group`` beats ``group``: the same group id can live on two clusters."""
        return self.deployments.get(f"{cluster}/{group_id}") or self.deployments.get(group_id)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<config>") -> "RemediationConfig":
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a mapping at the top level")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{source}: {unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
        kw: dict[str, Any] = {}
        for name in ("cooldown_minutes", "poll_headroom", "lease_minutes"):
            if name in data:
                kw[name] = _number(data[name], source, name)
        for name in ("max_actions_per_hour", "scale_step"):
            if name in data:
                kw[name] = int(_number(data[name], source, name))
        if data.get("max_replicas") is not None:
            kw["max_replicas"] = int(_number(data["max_replicas"], source, "max_replicas"))
        for name in ("allow_groups", "deny_groups", "require_approval"):
            if name in data:
                value = data[name]
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    raise ConfigError(f"{source}: {name}: expected a list of strings")
                kw[name] = tuple(value)
        if "dead_letter_topic" in data:
            if not isinstance(data["dead_letter_topic"], str) or not data["dead_letter_topic"]:
                raise ConfigError(f"{source}: dead_letter_topic: expected a non-empty string")
            kw["dead_letter_topic"] = data["dead_letter_topic"]
        if "deployments" in data:
            deps = data["deployments"] or {}
            if not isinstance(deps, Mapping):
                raise ConfigError(f"{source}: deployments: expected a mapping group -> {{namespace, name}}")
            parsed = {}
            for group, target in deps.items():
                if not isinstance(target, Mapping) or not target.get("name"):
                    raise ConfigError(f"{source}: deployments.{group}: expected {{namespace, name}}")
                parsed[str(group)] = Deployment(
                    namespace=str(target.get("namespace") or "default"), name=str(target["name"])
                )
            kw["deployments"] = MappingProxyType(parsed)
        if "kubernetes" in data:
            k = data["kubernetes"] or {}
            kfields = {f.name for f in fields(KubernetesSettings)}
            if not isinstance(k, Mapping) or set(k) - kfields:
                raise ConfigError(f"{source}: kubernetes: expected keys among {', '.join(sorted(kfields))}")
            if "request_timeout_seconds" in k and not _number(
                    k["request_timeout_seconds"], source, "kubernetes.request_timeout_seconds") > 0:
                raise ConfigError(f"{source}: kubernetes.request_timeout_seconds: must be above 0")
            k = dict(k)
            if "namespaces" in k:
                if not isinstance(k["namespaces"], (list, tuple)) or not all(
                        isinstance(n, str) and n for n in k["namespaces"]):
                    raise ConfigError(f"{source}: kubernetes.namespaces: expected a list of namespace names")
                k["namespaces"] = tuple(k["namespaces"])
            kw["kubernetes"] = KubernetesSettings(**k)
        config = cls(**kw)
        if config.cooldown_minutes < 0 or config.max_actions_per_hour < 0 or config.scale_step < 1:
            raise ConfigError(f"{source}: cooldown_minutes, max_actions_per_hour must be >= 0, scale_step >= 1")
        if config.max_replicas is not None and config.max_replicas < 0:
            raise ConfigError(f"{source}: max_replicas: must be >= 0 (0 switches scaling off), got {config.max_replicas}")
        if config.lease_minutes <= 0:
            raise ConfigError(f"{source}: lease_minutes: must be above 0, got {config.lease_minutes}")
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "RemediationConfig":
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read ({exc.strerror})") from None
        return cls.from_mapping(_parse(text, str(p)), str(p))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RemediationConfig":
        env = os.environ if environ is None else environ
        value = (env.get(ENV_VAR) or "").strip()
        if not value:
            return cls()
        if value.startswith("{"):
            return cls.from_mapping(_parse(value, ENV_VAR), ENV_VAR)
        return cls.from_file(value)


def _parse(text: str, source: str) -> Any:
    import yaml  # JSON is YAML too

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" line {line + 1}" if line is not None else ""
        raise ConfigError(f"{source}:{where} not valid YAML/JSON") from None


def _number(value: Any, source: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{source}: {name}: expected a number, got {value!r}")
    return value
