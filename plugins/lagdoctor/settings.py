"""Run-time settings: one frozen object, built when a task or command runs.

Nothing here is read at import time, so DAG parsing never touches the
environment. Secrets never live here: they come from Airflow Connections.

Layout under the data root (contract 6):

    <root>/snapshots/cluster=<c>/date=<YYYY-MM-DD>/<file>.parquet   offset history
    <root>/findings/<run_key>/findings.jsonl, partition_status.jsonl  each run's diagnosis
    <root>/state/lagdoctor.db                                          default state database (lagdoctor.state):
                                                                       Slack threads and outbox, action log, leases
    <root>/reports/                                                    HTML incident reports
    <root>/state/spool/                                                Slack notifications kept while the state
                                                                       database is unreachable (lagdoctor.notify.spool)
    <root>/outbox/slack.jsonl                                          messages, when no Slack connection is set

The spool and the outbox are appended to or renamed in place: with an object-store
root (s3://) they live under $AIRFLOW_HOME/lagdoctor on the worker instead.
A local root with LAGDOCTOR_DATA_ROOT_SHARED=1 is one every host mounts: the spool
under it counts as shared (lagdoctor.notify.spool.check_shared).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _default_data_root() -> str:
    airflow_home = os.environ.get("AIRFLOW_HOME") or str(Path.home() / "airflow")
    return str(Path(airflow_home) / "lagdoctor")


def join(root: str, *parts: str) -> str:
    """Join path parts onto a local path or a URI (s3a://bucket/x) alike."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts)])


def _env_number(env, name: str, kind, default, minimum):
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {raw!r}")
    return value


FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
               "off": False}


def _env_flag(env, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return FLAG_VALUES[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"{name} must be 1 or 0, not {raw!r}") from None


@dataclass(frozen=True)
class Settings:
    data_root: str = field(default_factory=_default_data_root)
    # The record at the committed offset is read for this many most lagging
    # partitions of each (group, topic) per snapshot (0: never), within this
    # many seconds per snapshot, all groups together (lagdoctor.kafka.collector).
    record_partitions: int = 3
    record_budget_s: float = 10.0
    # LAGDOCTOR_SPOOL_DIR: where notifications wait while the state database is
    # unreachable; None: <data root>/state/spool (see spool_root). Under a distributed
    # executor it must be set, to a folder every worker mounts, unless the spool is under a local
    # root declared shared (spool.check_shared).
    spool_dir: str | None = None
    # LAGDOCTOR_DATA_ROOT_SHARED=1: a local data root mounted at the same path on every
    # Airflow worker and Spark executor (NFS, a ReadWriteMany volume). Not refused beside a
    # remote master or a distributed executor; each run proves it instead (lagdoctor.mount).
    data_root_shared: bool = False

    def __post_init__(self) -> None:
        # An s3:// root: its AWS connection (LAGDOCTOR_AWS_CONN_ID) becomes fsspec's
        # s3 defaults, read again every few minutes, so every store read and write here uses it.
        from lagdoctor.objectstore import configure_for

        configure_for(self.data_root)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        root = env.get("LAGDOCTOR_DATA_ROOT") or _default_data_root()
        return cls(
            data_root=root,
            record_partitions=_env_number(env, "LAGDOCTOR_RECORD_PARTITIONS", int, cls.record_partitions, 0),
            record_budget_s=_env_number(env, "LAGDOCTOR_RECORD_BUDGET_SECONDS", float, cls.record_budget_s, 0),
            spool_dir=env.get("LAGDOCTOR_SPOOL_DIR") or None,
            data_root_shared=_env_flag(env, "LAGDOCTOR_DATA_ROOT_SHARED", cls.data_root_shared),
        )

    @property
    def snapshots_root(self) -> str:
        return join(self.data_root, "snapshots")

    @property
    def findings_root(self) -> str:
        return join(self.data_root, "findings")

    @property
    def reports_root(self) -> str:
        return join(self.data_root, "reports")

    @property
    def spool_root(self) -> str:
        """A local folder: LAGDOCTOR_SPOOL_DIR, else under a local data root, else
        under $AIRFLOW_HOME on this worker (an object store has no atomic rename);
        the last is refused under a distributed executor (spool.check_shared)."""
        if self.spool_dir:
            return self.spool_dir
        return join(self.local_root, "state", "spool")

    @property
    def local_root(self) -> str:
        """The data root when it is a local folder; for an object store, $AIRFLOW_HOME/lagdoctor
        on this worker: what needs appends or a rename (the spool, the Slack outbox) lives there."""
        root = self.data_root
        if root.startswith("file://"):
            return root[len("file://"):]
        return _default_data_root() if "://" in root else root
