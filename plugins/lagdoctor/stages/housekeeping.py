"""Retention and compaction of the store and the run folders."""

from __future__ import annotations

import json
import logging
import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.settings import Settings
from lagdoctor.stages.common import MAX_WINDOW_MINUTES

log = logging.getLogger(__name__)


SNAPSHOT_RETENTION_DAYS = 7
RETENTION_GRACE_DAYS = 1


# Retention runs at most this often: a sweep every minute would otherwise look at a week of
# run folders (about 10,000: as many S3 LIST calls) every minute, to remove one.
PRUNE_EVERY = timedelta(hours=1)
PRUNE_MARKER = "_retention.json"  # in the data root: {"pruned_at": ISO-8601} of the last prune
# The run id's time in a run key (stages.common.run_key), e.g. `scheduled__2026-11-21T03_15_00_00_00`.
_RUN_ID_TIME = re.compile(r"__(\d{4}-\d\d-\d\d)T(\d\d)[_:](\d\d)[_:](\d\d)")


def prune_history(keep_days: int = SNAPSHOT_RETENTION_DAYS, settings: Settings | None = None,
                  now: datetime | None = None) -> int:
    """Retention: snapshot days and per-run findings/report folders older than `keep_days`.

    Never less than the longest window a diagnosis may read plus a grace day:
    a 7-day incident diagnosis running now must not lose its oldest files
    mid-read. A run folder goes only when its newest file is older than that
    too; a job still writing one (its time limit is 30 minutes) is far younger.
    Only the folders old enough by their run key's time (or the run index's
    planned_at) have their files listed (on an object store, an hour of runs
    in one request); a folder neither dates is listed, as before. At most once
    per PRUNE_EVERY (the marker PRUNE_MARKER in the data root says when it
    last ran; 0 removed until then).
    """
    from lagdoctor.runindex import filesystem

    settings = settings or Settings.from_env()
    now = now or datetime.now(timezone.utc)
    marker_fs, marker = filesystem(settings.data_root)
    marker = f"{marker}/{PRUNE_MARKER}"
    last = _last_pruned(marker_fs, marker)
    if last is not None and timedelta(0) <= now - last < PRUNE_EVERY:
        log.info("retention: last ran at %s, next after %s", last.isoformat(), (last + PRUNE_EVERY).isoformat())
        return 0
    removed = _prune(keep_days, settings, now)
    try:
        marker_fs.pipe_file(marker, json.dumps({"pruned_at": now.isoformat()}).encode())
    except OSError as exc:  # the next sweep prunes again: wasteful, not wrong
        log.warning("retention: marker %s not written: %s", marker, " ".join(str(exc).split()))
    return removed


def _last_pruned(fs, marker: str) -> datetime | None:
    try:
        with fs.open(marker, "rt", encoding="utf-8") as fh:
            at = datetime.fromisoformat(json.load(fh)["pruned_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no marker (first run) or an unreadable one: prune now
    return at if at.tzinfo else at.replace(tzinfo=timezone.utc)


def _run_time(name: str, planned: dict[str, datetime]) -> datetime | None:
    """When a run folder's run began, from its name (the run id's time) or the run index; None: unknown."""
    found = _RUN_ID_TIME.search(name)
    if found:
        try:
            return datetime.fromisoformat(f"{found[1]}T{found[2]}:{found[3]}:{found[4]}+00:00")
        except ValueError:
            pass
    return planned.get(name)


def _newest_file_times(fs, path: str, folders: list[str]) -> dict[str, float | None]:
    """{folder: epoch s of its newest file, None when it holds none} for run folders under `path`.

    On an object store the folders of one hour (their run ids' time) are listed in one
    request by their common name prefix: about one LIST an hour of runs, not one per
    folder. A local root, and a folder whose name has no run time, is listed on its own.
    """
    from lagdoctor.store import _is_local

    newest: dict[str, float | None] = {f: None for f in folders}
    by_hour: dict[str, list[str]] = {}
    object_store = not _is_local(fs)
    for folder in folders:
        name = folder.rsplit("/", 1)[-1]
        found = _RUN_ID_TIME.search(name)
        if object_store and found:
            by_hour.setdefault(name[:found.start(2) + 2], []).append(folder)
        else:
            newest[folder] = _newest(fs.ls(folder, detail=True))
    for prefix, group in by_hour.items():
        try:
            files = fs.find(path, prefix=prefix, detail=True)
        except TypeError:  # a filesystem whose find takes no prefix: one listing per folder
            newest.update({f: _newest(fs.ls(f, detail=True)) for f in group})
            continue
        base = path.rstrip("/") + "/"
        per_folder: dict[str, list[dict]] = {}
        for name, info in files.items():
            if name.startswith(base):
                per_folder.setdefault(base + name[len(base):].split("/", 1)[0], []).append(info)
        newest.update({f: _newest(per_folder.get(f, [])) for f in group})
    return newest


def _newest(entries: list[dict]) -> float | None:
    stamps = [e.get("mtime") or e.get("LastModified") for e in entries]
    return max((s.timestamp() if hasattr(s, "timestamp") else float(s) for s in stamps if s), default=None)


def _prune(keep_days: int, settings: Settings, now: datetime) -> int:
    from lagdoctor.runindex import filesystem, planned_times
    from lagdoctor.store import prune_snapshots

    keep_days = max(keep_days, math.ceil(MAX_WINDOW_MINUTES / 1440) + RETENTION_GRACE_DAYS)
    removed = prune_snapshots(settings.snapshots_root, keep_days, now)
    cutoff = now.timestamp() - keep_days * 86400
    planned = planned_times(settings.findings_root)
    for root in (settings.findings_root, settings.reports_root):
        fs, path = filesystem(root)
        if not fs.exists(path):
            continue
        old = []
        for run_dir in fs.ls(path, detail=True):
            if run_dir["type"] != "directory":
                continue
            began = _run_time(run_dir["name"].rstrip("/").rsplit("/", 1)[-1], planned)
            if began is not None and began.timestamp() >= cutoff:
                continue  # younger than the cutoff by its run's own time: its files are no older
            old.append(run_dir["name"].rstrip("/"))
        # The files decide: a cleared old run may be writing into its folder again right now.
        for folder, newest in _newest_file_times(fs, path, old).items():
            if newest is not None and newest < cutoff:
                fs.rm(folder, recursive=True)
                removed.append(folder)
    for path in removed:
        log.info("retention: removed %s", path)
    from lagdoctor.state import StateConfigError

    try:
        pruned = prune_state(keep_days, now, settings=settings)
    except StateConfigError as exc:  # files are pruned; the state's own retention waits for its config
        log.error("retention: state database not pruned: %s", " ".join(str(exc).split()))
    else:
        log.info("retention: state rows removed: %s", pruned)
    return len(removed)


def compact_history(settings: Settings | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Fold each closed hour's snapshot files into one (lagdoctor.store.compact_snapshots):
    a day holds tens of files per cluster, not 864, so a week's window reads fast."""
    from lagdoctor.store import compact_snapshots

    settings = settings or Settings.from_env()
    result = compact_snapshots(settings.snapshots_root, now or datetime.now(timezone.utc))
    log.info("compaction: %s", result.summary())
    return {"hours": len(result.compacted_hours), "files_folded": result.files_folded,
            "files_removed": result.files_removed, "left_alone": len(result.left_alone)}


def prune_state(keep_days: float, now: datetime, *, settings: Any = None) -> dict[str, int]:
    """Retention for the whole state database: rows deleted per table.

    Slack state older than ``keep_days`` (``prune_notifications``) and the
    action log (``prune_action_log``: never inside a guardrail's window).
    """
    from lagdoctor.remediation.audit import prune_action_log
    from lagdoctor.state import as_utc, prune_notifications, state_db

    db = state_db(settings)
    counts = prune_notifications(db, as_utc(now) - timedelta(days=keep_days))
    counts["action_log"] = prune_action_log(keep_days, now, db=db)
    for table, n in counts.items():
        if n:
            log.info("retention: %d row(s) removed from %s", n, table)
    return counts
