"""The spool: notifications kept on local disk while the state database is unreachable.

Every Slack message goes through the state database (the outbox, thread state).
When that database cannot be reached (stopped, paused, timed out:
``lagdoctor.state.is_unavailable``), the coordinator (incidents.py) does not
drop the call and does not send it directly either: it writes the call itself
(what to post, for which run, at what time) as one JSON file here, and the
task is told how many wait. Sending directly would post without thread state,
so the same finding would be posted again once the database is back;
the spool loses nothing and repeats nothing.

Replay: the next coordinator call that reaches the database (any task, a
callback, ``deliver_pending``) first replays every spooled call, oldest first,
through the same code a live call runs, then delivers the outbox as usual.
Each replay runs in one transaction with a marker row (``spool_replays``,
keyed by the file's id), so a file replayed twice (two workers at once, or a
crash before the file was removed) queues its message once. Calls are replayed
with the ``now`` and run they were made with: a missed CRITICAL finding is
posted as of the run that found it, and a later run's same finding is not
posted again. A finding older than its thread's newest state (another worker
applied a newer run's verdict first: its ``updated_at`` is later than the
call's ``now``) is dropped, not sent, with one log line: a stale "Recovered"
never closes a thread that is critical again, nor a stale problem reopen one
that recovered.

Many workers: the spool is only as shared as its folder. Under a distributed
executor (Celery, Kubernetes, ...) the default folder is one worker's disk, gone
with a pod, replayed only by that worker: ``check_shared`` refuses it in one
line at the first task and before a post, unless LAGDOCTOR_SPOOL_DIR names a
folder every worker mounts, or the spool is under a local data root declared
shared (LAGDOCTOR_DATA_ROOT_SHARED=1: it is under the same mount). Not the state database: the spool exists for when
that cannot be reached.

Files: ``<id>.json`` under ``Settings.spool_root`` (a POSIX folder), written to
a temporary name and renamed, so a reader never sees half a file. A file that
cannot be read or replayed (not a database outage: a bug, a corrupt file) is
renamed ``<id>.failed`` with an error line, kept for people, and never blocks
the ones after it.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping

from lagdoctor.notify.redact import one_line

log = logging.getLogger(__name__)

SUFFIX = ".json"
FAILED_SUFFIX = ".failed"
_sequence = itertools.count()

Handler = Callable[..., Any]


class SpoolNotShared(ValueError):
    """The spool is on one worker's disk while tasks run on many; str() is one line."""


def check_shared(settings: Any, *, executor: str | None) -> None:
    """Refuse, in one line, the default spool (this worker's disk) under a distributed executor:
    a call kept there dies with a Kubernetes pod, or waits on one Celery worker until it is stale.
    LAGDOCTOR_SPOOL_DIR set is the operator's word that every worker mounts that folder; so is
    LAGDOCTOR_DATA_ROOT_SHARED=1 with a local data root, for the spool under it (each task then
    checks it can write there: lagdoctor.mount.check_worker_sees)."""
    from lagdoctor.objectstore import distributed_executor, is_remote

    distributed = distributed_executor(executor)
    if settings.spool_dir or not distributed:
        return
    if getattr(settings, "data_root_shared", False) and not is_remote(settings.data_root):
        return
    raise SpoolNotShared(
        f"LAGDOCTOR_SPOOL_DIR is not set, so the Slack spool is on this worker's disk ({settings.spool_root}), "
        f"but Airflow runs tasks with the {distributed}, whose hosts share no disk: set LAGDOCTOR_SPOOL_DIR "
        f"to a folder every worker mounts (NFS, EFS, a ReadWriteMany volume)")


def spool_dir(settings: Any) -> Path:
    return Path(settings.spool_root)


def spool_call(settings: Any, kind: str, args: Mapping[str, Any], *, reason: str) -> Path:
    """Write one call to the spool atomically; the file's path."""
    from lagdoctor.state import utcnow

    root = spool_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    # Sorts by when it was spooled; pid, a counter and a random tail keep two writers apart.
    entry_id = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}-{uuid.uuid4().hex[:8]}"
    data = json.dumps({"id": entry_id, "kind": kind, "args": dict(args), "reason": reason,
                       "spooled_at": utcnow().isoformat()}, sort_keys=True, default=str)
    tmp = root / f".tmp-{entry_id}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    path = root / f"{entry_id}{SUFFIX}"
    os.replace(tmp, path)
    _fsync_dir(root)
    return path


def _fsync_dir(root: Path) -> None:
    try:
        fd = os.open(root, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def spooled(settings: Any) -> list[Path]:
    """The calls that wait, oldest first."""
    root = spool_dir(settings)
    if not root.is_dir():
        return []
    return sorted(root.glob(f"*{SUFFIX}"))


def spooled_count(settings: Any) -> int:
    return len(spooled(settings))


def _set_aside(path: Path, why: str) -> None:
    log.error("spool: %s cannot be replayed, kept as %s: %s", path.name, path.with_suffix(FAILED_SUFFIX).name, why)
    try:
        path.rename(path.with_suffix(FAILED_SUFFIX))
    except OSError as exc:
        log.error("spool: could not set %s aside: %s", path.name, one_line(exc))


def replay_spool(db: Any, settings: Any, handlers: Mapping[str, Handler],
                 stale: Mapping[str, Callable[..., str | None]] | None = None) -> int:
    """Replay every spooled call into the state database, oldest first; how many acted.

    ``stale[kind]``, called in the replay's transaction with the call's arguments: why the
    call is older than the state it would change (None: it is not); such a call is dropped,
    not sent, and the log says so in one line.
    Raises what an unreachable database raises (the rest stays spooled, in order);
    anything else sets that one file aside and goes on."""
    from lagdoctor.state import is_unavailable, spool_replays, utcnow

    replayed = 0
    older = stale or {}
    for path in spooled(settings):
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            entry_id, kind, args = str(entry["id"]), str(entry["kind"]), dict(entry["args"])
            handler = handlers[kind]
        except FileNotFoundError:
            continue  # another worker replayed and removed it just now
        except (ValueError, KeyError, TypeError, OSError) as exc:
            _set_aside(path, one_line(exc))
            continue
        try:
            with db.transaction() as conn:
                fresh = db.insert_ignore(conn, spool_replays, {"entry_id": entry_id[:64], "kind": kind[:32],
                                                               "replayed_at": utcnow()}, ("entry_id",))
                why = older[kind](db, conn, **args) if fresh and kind in older else None
                if why:
                    log.warning("%s", one_line(f"spool: dropped {path.name}, not sent: {why}"))
                elif fresh:
                    handler(db, conn, **args)
        except Exception as exc:  # noqa: BLE001 - a bad entry must not block the ones after it
            if is_unavailable(exc):
                raise
            _set_aside(path, one_line(exc))
            continue
        if fresh and not why:
            replayed += 1
            log.info("spool: replayed %s (%s) into the outbox", path.name, kind)
        path.unlink(missing_ok=True)
    return replayed
