"""A local data root declared shared (LAGDOCTOR_DATA_ROOT_SHARED=1), proved, not trusted.

An executor or a worker on another host that does not mount the root reads an
empty folder there, and every group looks healthy. So each run checks:

- Spark (`check_executors_see`, in the diagnosis job before it reads): the driver
  writes a marker with a random token into `<snapshots>/_mount_check/`, a job of
  a few tasks per core reads it back on the executors, each reporting (host,
  token seen, snapshot files it lists); a host that misses the token, or lists
  none where the driver lists some, fails the run in one line (MountNotSeen).
  The marker is removed after; `_` folders are skipped by every store reader.
- Airflow (`leave_run_marker`, `check_worker_sees`): the first task of a run
  leaves `<root>/state/_mount_check/<run key>.marker`; each later task that uses
  the root checks it sees that marker and can write to the state and spool
  folders. Markers of runs older than MARKER_MAX_AGE_S are removed by the next
  run's first task.

The token is random, not a credential: it only tells this run's marker apart.
The executor side (`executor_view`) uses the standard library alone: it is
pickled by value, so a Spark Connect server's executors need no lagdoctor.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from dataclasses import dataclass

MOUNT_FOLDER = "_mount_check"
MARKER_SUFFIX = ".marker"
MARKER_MAX_AGE_S = 3600.0
TASKS_PER_CORE = 4
MIN_TASKS = 8
COUNT_CAP = 1000  # listing is the point, not counting a year of history on every task


class MountNotSeen(ValueError):
    """A host does not see the declared shared data root; str() is one line."""


@dataclass(frozen=True)
class Marker:
    path: str
    token: str


def write_marker(folder: str, name: str | None = None) -> Marker:
    """A new marker file with a random token in `<folder>/_mount_check/`."""
    token = secrets.token_hex(16)
    directory = os.path.join(folder, MOUNT_FOLDER)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, (name or f"{socket.gethostname()}-{os.getpid()}-{token[:8]}") + MARKER_SUFFIX)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(token)
        fh.flush()
        os.fsync(fh.fileno())
    return Marker(path, token)


def remove_marker(marker: Marker) -> None:
    try:
        os.unlink(marker.path)
        os.rmdir(os.path.dirname(marker.path))  # only when no other run's marker is there
    except OSError:
        pass


def count_snapshot_files(root: str, cap: int = COUNT_CAP) -> int:
    """Files the store readers would list under `root` (hidden and `_` names skipped below
    it, like lagdoctor.diagnosis.store_files), up to `cap`."""
    seen = 0
    for directory, folders, files in os.walk(root):
        folders[:] = [f for f in folders if not f.startswith((".", "_"))]
        for name in files:
            if not name.startswith((".", "_")) and (name.endswith(".parquet") or "." not in name):
                seen += 1
                if seen >= cap:
                    return seen
    return seen


def executor_view(task: int, snapshots: str, marker_path: str, token: str) -> str:
    """What one task sees, as "host<TAB>token seen (0/1)<TAB>files<TAB>error". Standard library only
    (pickled by value for the executors)."""
    import socket as _socket

    host = _socket.gethostname()
    try:
        with open(marker_path, encoding="utf-8") as fh:
            seen = fh.read().strip() == token
        error = "" if seen else "another token"
    except OSError as exc:
        seen, error = False, f"{type(exc).__name__}: {exc.strerror or exc}"
    files = count_snapshot_files(snapshots)  # this module travels by value: the same count as the driver's
    return "\t".join((host, "1" if seen else "0", str(files), error.replace("\t", " ")))


def unseen_line(views: list[str], *, path: str, driver_files: int, master: str) -> str | None:
    """The one-line failure for the executors' answers (executor_view's), None when every host
    saw the marker and lists snapshot files wherever the driver does."""
    bad: dict[str, str] = {}
    hosts: set[str] = set()
    for view in views:
        host, seen, files, error = (view.split("\t") + ["", "", "", ""])[:4]
        hosts.add(host)
        if seen != "1":
            bad.setdefault(host, f"no marker ({error})" if error else "no marker")
        elif driver_files and int(files or 0) == 0:
            bad.setdefault(host, f"lists no snapshot file where the driver lists {driver_files}")
    if not views:
        return f"no Spark task on {master} reported whether it sees {path}"
    if not bad:
        return None
    said = "; ".join(f"{host}: {why}" for host, why in sorted(bad.items()))
    return (f"LAGDOCTOR_DATA_ROOT_SHARED=1, but {len(bad)} of {len(hosts)} Spark executor host(s) on {master} "
            f"do not see {path}: {said}: mount it at that path on every Spark host, or use an s3:// data root")


def check_executors_see(spark, snapshots: str) -> None:
    """Raise MountNotSeen (one line) unless every executor that runs a task sees `snapshots`
    as the driver does. Nothing to prove on a local master (one process) or a remote URI."""
    from lagdoctor.diagnosis.store_files import is_local_path, local_path

    master = str(spark.conf.get("spark.master", "") or "")
    if master.startswith("local") or not is_local_path(snapshots):
        return
    root = os.path.abspath(local_path(snapshots))
    marker = write_marker(root)
    try:
        views = _run_views(spark, root, marker, _task_count(spark))
    finally:
        remove_marker(marker)
    line = unseen_line(views, path=root, driver_files=count_snapshot_files(root), master=master)
    if line:
        raise MountNotSeen(line)


def _task_count(spark) -> int:
    try:
        cores = spark.sparkContext.defaultParallelism  # classic: the executors' cores
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        cores = int(spark.conf.get("spark.default.parallelism", "0") or 0)
    return max(MIN_TASKS, TASKS_PER_CORE * int(cores or 0))


def _run_views(spark, root: str, marker: Marker, tasks: int) -> list[str]:
    import sys

    from pyspark import cloudpickle
    from pyspark.sql import functions as F

    path, token = marker.path, marker.token
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        view = F.udf(lambda i: executor_view(int(i), root, path, token), "string")
        rows = spark.range(0, tasks, 1, tasks).select(view("id").alias("view")).collect()
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    return [r["view"] for r in rows]


# -- Airflow workers ------------------------------------------------------------------------


def _checked_root(settings, executor: str | None) -> str | None:
    """The local root to prove on Airflow's workers, or None (not declared shared, an object
    store, or one machine's executor)."""
    from lagdoctor.objectstore import distributed_executor, is_remote

    if not settings.data_root_shared or is_remote(settings.data_root) or not distributed_executor(executor):
        return None
    return settings.local_root


def _run_marker_folder(root: str) -> str:
    return os.path.join(root, "state")


def leave_run_marker(settings, run_key: str, *, executor: str | None, now: float | None = None) -> str | None:
    """The run's marker (the first task), and older runs' removed; None when nothing is to prove."""
    root = _checked_root(settings, executor)
    if root is None:
        return None
    folder = _run_marker_folder(root)
    marker = write_marker(folder, run_key)
    now = time.time() if now is None else now
    directory = os.path.dirname(marker.path)
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        try:
            if path != marker.path and now - os.stat(path).st_mtime > MARKER_MAX_AGE_S:
                os.unlink(path)
        except OSError:
            pass  # another run's first task removed it first
    return marker.path


def check_worker_sees(settings, run_key: str, *, executor: str | None) -> None:
    """Raise MountNotSeen (one line) when this worker does not see the run's marker, or cannot
    write to the state or spool folder: it would write where the next task never reads."""
    root = _checked_root(settings, executor)
    if root is None:
        return
    host = socket.gethostname()
    marker = os.path.join(_run_marker_folder(root), MOUNT_FOLDER, run_key + MARKER_SUFFIX)
    if not os.path.isfile(marker):
        raise MountNotSeen(
            f"LAGDOCTOR_DATA_ROOT_SHARED=1, but this Airflow worker ({host}) does not see the data root {root} "
            f"as this run's first task left it ({marker} is missing): mount it at that path on every worker")
    for folder in (os.path.join(root, "state"), settings.spool_root):
        try:
            os.makedirs(folder, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise MountNotSeen(
                f"LAGDOCTOR_DATA_ROOT_SHARED=1, but this Airflow worker ({host}) cannot write to {folder} "
                f"({exc.strerror or type(exc).__name__}): mount {root} read-write at that path on every worker"
            ) from None
