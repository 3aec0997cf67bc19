"""Retention and compaction of the store and the run folders."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.settings import Settings
from lagdoctor.stages.common import MAX_WINDOW_MINUTES

log = logging.getLogger(__name__)


SNAPSHOT_RETENTION_DAYS = 7
RETENTION_GRACE_DAYS = 1


def prune_history(keep_days: int = SNAPSHOT_RETENTION_DAYS, settings: Settings | None = None,
                  now: datetime | None = None) -> int:
    """Retention: snapshot days and per-run findings/report folders older than `keep_days`.

    Never less than the longest window a diagnosis may read plus a grace day:
    a 7-day incident diagnosis running now must not lose its oldest files
    mid-read. A run folder goes only when its newest file is older than that
    too; a job still writing one (its time limit is 30 minutes) is far younger.
    """
    import fsspec

    from lagdoctor.store import prune_snapshots

    settings = settings or Settings.from_env()
    now = now or datetime.now(timezone.utc)
    keep_days = max(keep_days, math.ceil(MAX_WINDOW_MINUTES / 1440) + RETENTION_GRACE_DAYS)
    removed = prune_snapshots(settings.snapshots_root, keep_days, now)
    cutoff = now.timestamp() - keep_days * 86400
    for root in (settings.findings_root, settings.reports_root):
        fs, path = fsspec.core.url_to_fs(root)
        if not fs.exists(path):
            continue
        for run_dir in fs.ls(path, detail=True):
            if run_dir["type"] != "directory":
                continue
            stamps = [f.get("mtime") or f.get("LastModified") for f in fs.ls(run_dir["name"], detail=True)]
            newest = max((s.timestamp() if hasattr(s, "timestamp") else float(s) for s in stamps if s), default=None)
            if newest is not None and newest < cutoff:
                fs.rm(run_dir["name"], recursive=True)
                removed.append(run_dir["name"])
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
