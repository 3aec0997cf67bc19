"""The Spark diagnosis: its arguments, the run it carries surges from, its failure line, and reading what it wrote."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.settings import Settings, join
from lagdoctor.stages.common import run_key
from lagdoctor.stages.params import check_thresholds

log = logging.getLogger(__name__)


SPARK_CONN_ID = "spark_default"
QUARANTINE_FILE = "quarantined.jsonl"


def prepare_diagnosis(
    clusters: str | list[str],
    run_id: str,
    *,
    window_minutes: float,
    thresholds: Mapping[str, Any] | None = None,
    group_pattern: str | None = None,
    topic: str | None = None,
    dag_id: str | None = None,
    as_of: datetime | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Arguments for the SparkSubmitOperator, built at run time (the package zip too).

    `group_pattern`/`topic` scope the job: an incident run writes findings only
    for the groups it was asked about, never a verdict on everyone else.
    `as_of` (default: now, after this run's samples were written) ends the
    window, so the job opens only the date folders the window reaches instead
    of every file's footer in a week of history.

    `clusters`: the connection ids to diagnose, in one job. One cluster reads
    its own `cluster=` folder, as it always did; several read the store's root
    with `--clusters a,b`, which limits the job to those folders, so a cluster
    this run could not snapshot is not judged on its stale history.

    `--carry-from`: per cluster, the newest earlier comparable run that read it
    (``previous_findings``): a failed snapshot, a run with overrides or a manual
    run scoped elsewhere never drops a surge's carried baseline.
    """
    import os
    import sys
    from pathlib import Path

    from lagdoctor.diagnosis.submit import (
        build_package_zip,
        default_job_script,
        job_arguments,
        quiet_log_config,
        window_input_bytes,
    )

    settings = settings or Settings.from_env()
    work_dir = Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "lagdoctor-spark"
    output = join(settings.findings_root, run_key(run_id, dag_id))
    clusters = [clusters] if isinstance(clusters, str) else list(dict.fromkeys(clusters))
    if not clusters:
        raise ValueError("prepare_diagnosis: no cluster to diagnose")
    if len(clusters) == 1:
        from lagdoctor.store import cluster_folder_name

        snapshots = join(settings.snapshots_root, cluster_folder_name(clusters[0]))
        only: list[str] = []
    else:
        snapshots, only = settings.snapshots_root, ["--clusters", ",".join(clusters)]
    bindir = str(Path(sys.executable).parent)
    scope = {k: v for k, v in (("groups", group_pattern), ("topic", topic)) if v}
    as_of = as_of or datetime.now(timezone.utc)
    carried = previous_findings(settings, dag_id, output, as_of, clusters=clusters, run_id=run_id,
                                group_pattern=group_pattern, topic=topic) if dag_id else {}
    if carried:
        log.info("carrying surges from %s", ", ".join(f"{c}: {p}" for c, p in carried.items()))
    carry_from = carry_source(carried, output)
    return {
        "application": default_job_script(),
        "py_files": build_package_zip(work_dir),
        "args": job_arguments(snapshots, output, as_of=as_of.isoformat(),
                              window_minutes=window_minutes, thresholds=check_thresholds(thresholds),
                              quarantine=True, carry_from=carry_from, check_mount=declared_shared(settings),
                              **scope) + only,
        "output": output,
        "clusters": clusters,
        "python": sys.executable,
        "spark_submit": str(Path(bindir) / "spark-submit"),
        "path": bindir + os.pathsep + os.environ.get("PATH", ""),
        "log_config": quiet_log_config(work_dir),
        # decides the driver JVM's options (C1 only for a small local job)
        "input_bytes": window_input_bytes(snapshots, as_of, window_minutes, clusters if only else None),
    }


def declared_shared(settings: Settings) -> bool:
    """A local data root declared mounted on every host: the job proves its executors see it."""
    from lagdoctor.objectstore import is_remote

    return settings.data_root_shared and not is_remote(settings.data_root)


SCHEDULED_RUN_PREFIX = "scheduled__"  # the run id Airflow gives a run its schedule made
CARRIED_FILE = "carried.jsonl"  # --carry-from when a sweep's clusters carry from different runs


def is_scheduled(run_id: Any) -> bool:
    return isinstance(run_id, str) and run_id.startswith(SCHEDULED_RUN_PREFIX)


def comparable_run(meta: Mapping[str, Any], *, dag_id: str, scheduled: bool,
                   group_pattern: str | None = None, topic: str | None = None) -> bool:
    """Whether an earlier run's surges may carry into this one (rule case 27's input): same DAG,
    no threshold overrides (an experiment's verdicts are no baseline), and a scheduled run, or,
    when this run is manual too, a manual run asked about the same groups. So a click on
    "Trigger" never changes what the next scheduled run says, and an incident run carries from
    the last look at its own groups, never from one scoped to others."""
    from lagdoctor.runindex import has_overrides

    if meta.get("dag_id") != dag_id or has_overrides(meta):
        return False
    if is_scheduled(meta.get("run_id")):
        return True
    scope = (meta.get("group_pattern") or None, meta.get("topic") or None)
    return not scheduled and scope == (group_pattern or None, topic or None)


def previous_findings(settings: Settings, dag_id: str, output: str, before: datetime, *,
                      clusters: list[str], run_id: str | None = None, group_pattern: str | None = None,
                      topic: str | None = None) -> dict[str, str]:
    """Per cluster of `clusters`, findings.jsonl of the newest comparable run (``comparable_run``)
    before `before` that read that cluster (a failed snapshot is no read), never this run's own
    folder (a retry's): a surge older than the window keeps that run's baseline (rule case 27).
    A cluster without such a run is left out, and is judged on its window alone; so is every
    cluster when the run index cannot be read."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.runindex import clusters_read, parse_time, refresh

    try:
        index = refresh(settings.findings_root)
    except (OSError, ValueError) as exc:
        log.warning("no previous run to carry surges from: the run index could not be read (%s)", exc)
        return {}
    before = before if before.tzinfo else before.replace(tzinfo=timezone.utc)
    own = output.rstrip("/").rsplit("/", 1)[-1]
    scheduled = is_scheduled(run_id)
    newest: dict[str, tuple[datetime, str]] = {}
    for key, rec in index.runs.items():
        meta = rec.get("meta") or {}
        at = parse_time(meta.get("planned_at"))
        if key == own or at is None or at >= before or not comparable_run(
                meta, dag_id=dag_id, scheduled=scheduled, group_pattern=group_pattern, topic=topic):
            continue
        for cluster in clusters_read(meta).intersection(clusters):
            newest[cluster] = max(newest.get(cluster, (at, key)), (at, key))
    return {c: join(settings.findings_root, newest[c][1], FINDINGS_FILE) for c in clusters if c in newest}


def carry_source(carried: Mapping[str, str], output: str) -> str | None:
    """The --carry-from path for ``previous_findings``' answer: the one run's findings.jsonl when
    it serves every cluster (the usual case), else CARRIED_FILE in this run's folder holding each
    cluster's rows from its own run (a cluster another run could not read keeps its newer run)."""
    import fsspec

    paths = sorted(set(carried.values()))
    if len(paths) <= 1:
        return paths[0] if paths else None
    rows: list[dict[str, Any]] = []
    for cluster, path in carried.items():
        try:
            rows += [r for r in _read_jsonl(path) if r.get("cluster") == cluster]
        except (OSError, ValueError) as exc:
            log.warning("nothing carried for %s from %s (%s)", cluster, path, " ".join(str(exc).split())[:200])
    target = join(output, CARRIED_FILE)
    with fsspec.open(target, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return target


# Exit codes of spark_jobs/diagnose_lag.py that a retry cannot change.
DIAGNOSIS_USAGE_EXIT, DIAGNOSIS_BAD_INPUT_EXIT = 2, 3


def diagnosis_failure_line(message: str, *, exit_code: int | None = None,
                           runner: str = "spark-submit") -> tuple[int | None, str]:
    """(exit code, one line) from the job's failure text (spark-submit's, or the Connect
    client's output tail with its `exit_code`): the job's own `diagnose_lag: error:` line
    when the tail holds it."""
    code = re.search(r"Error code is: (\d+)", message)
    reason = re.search(r"diagnose_lag: error: ([^\n]+)", message)
    if exit_code is None:
        exit_code = int(code.group(1)) if code else None
    line = reason.group(1).strip() if reason else f"{runner} failed (exit code {exit_code})"
    return exit_code, "diagnosis: " + " ".join(line.split())[:400]


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_findings(output: str) -> list[dict[str, Any]]:
    """The run's findings, each with its partitions' status rows as evidence; ValueError (one
    line) when the folder is not a complete run (lagdoctor.runindex.run_completeness)."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.notify.evidence import with_partition_status
    from lagdoctor.runindex import filesystem, run_completeness

    state = run_completeness(*filesystem(output))
    if not state.complete:
        raise ValueError(f"diagnosis output {output} is incomplete: {state.reason or 'no findings'}")

    status_rows = _read_jsonl(join(output, PARTITION_STATUS_FILE))
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in status_rows:
        by_key.setdefault((row["cluster"], row["group_id"], row["topic"]), []).append(row)
    return [
        with_partition_status(f, by_key.get((f["cluster"], f["group_id"], f["topic"]), []))
        for f in _read_jsonl(join(output, FINDINGS_FILE))
    ]


def read_quarantined(output: str) -> list[dict[str, Any]]:
    """Files the job moved aside this run ({"path", "moved_to", "reason"}); [] when none."""
    import fsspec

    path = join(output, QUARANTINE_FILE)
    fs, local = fsspec.core.url_to_fs(path)
    if not fs.exists(local):
        return []
    return [e for e in _read_jsonl(path) if isinstance(e, Mapping) and e.get("path")]
