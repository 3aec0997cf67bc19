"""What every stage shares: the run key, the run folder's plan file, limits the form and retention agree on.

Imports no stage: every stage may import it."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any


DEFAULT_KAFKA_CONN_ID = "kafka_default"
# The incident form accepts windows up to 7 days; retention keeps that much
# plus a day, so a diagnosis started near a day boundary still finds its files.
MAX_WINDOW_MINUTES = 10080
PLANS_FILE = "plans.json"
SNAPSHOT_TASK_ID = "snapshot"  # mapped: one instance per cluster
VALIDATE_TASK_ID = "validate_params"
LATE_RUN_KEY = "late_run"  # validate_params' XCom: the line a late scheduled run skipped with


def late_run(context: Mapping[str, Any]) -> str | None:
    """The line validate_params skipped this run with (a scheduled run that started when the
    next was already due), or None. For the tasks and callbacks that run whatever happened upstream."""
    ti = context.get("ti") or context.get("task_instance")
    try:
        line = ti.xcom_pull(task_ids=VALIDATE_TASK_ID, key=LATE_RUN_KEY) if ti is not None else None
    except Exception:  # noqa: BLE001 (no answer: not skipped, as far as anyone can tell)
        return None
    return line if isinstance(line, str) and line else None
_RUN_KEY_PREFIX = 80


def run_key(run_id: str, dag_id: str | None = None) -> str:
    """A folder/file name for one DAG run: readable, safe, stable across retries.

    The sanitised prefix is for people; the hash of the exact (dag_id, run_id)
    keeps two runs apart that sanitise alike (`a/b`, `a_b`) or that would
    otherwise name a path (`..`, `.`), and separates DAGs that share a run id.
    """
    raw = run_id if dag_id is None else f"{dag_id}__{run_id}"
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).strip("._-")[:_RUN_KEY_PREFIX].rstrip("._-") or "run"
    digest = hashlib.sha1(f"{dag_id or ''}\x00{run_id}".encode()).hexdigest()[:10]
    return f"{prefix}-{digest}"


def read_plans(plans_path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(plans_path, "rt") as fh:
        return json.load(fh)


def failed_task_label(state_key: str, clusters: list[str]) -> str:
    """`snapshot_1` (how Airflow keys a mapped instance's state) -> `snapshot[kafka_eu]`."""
    prefix = SNAPSHOT_TASK_ID + "_"
    if state_key.startswith(prefix) and state_key[len(prefix):].isdigit():
        i = int(state_key[len(prefix):])
        return f"{SNAPSHOT_TASK_ID}[{clusters[i] if i < len(clusters) else i}]"
    return state_key


def run_failure_line(states: Mapping[str, Any], clusters: list[str]) -> str:
    """Why a run failed, from its tasks' states (task key -> state): the failed ones, named
    as the grid shows them (a snapshot by its cluster)."""
    failed = [t for t, state in states.items() if str(state) in ("failed", "TaskInstanceState.FAILED")]
    names = sorted(failed_task_label(t, clusters) for t in failed)
    return f"this run failed at: {', '.join(names) or 'an earlier task'} (see its log)"
