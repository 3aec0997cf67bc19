"""The remediation audit log: one JSON object per line at Settings.actions_log.

Every decision is appended (dry run, blocked, awaiting approval, executed,
failed...), so the log answers "what did lagdoctor do to this group and why".
Guardrails read it back: cooldowns and the hourly cap count ``executed``
records only, so dry runs never use up a real action's budget.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

# Statuses a record can have. ``started`` is written just before a real change
# so that a retried task reuses the same plan (same restartedAt, same offset).
STATUSES = (
    "dry_run",
    "blocked",
    "awaiting_approval",
    "rejected",
    "started",
    "executed",
    "noop",
    "failed",
    "recommended",
)
# A record with one of these ends its idempotency key: a retry returns it.
FINAL_STATUSES = frozenset({"dry_run", "blocked", "rejected", "executed", "noop", "recommended"})


def _local(path: str) -> Path:
    return Path(path[len("file://"):] if path.startswith("file://") else path)


class ActionLog:
    """Append-only JSONL file; appends are locked so parallel tasks don't interleave."""

    def __init__(self, path: str) -> None:
        if "://" in path and not path.startswith("file://"):
            # Appends and locks need a local (or mounted) filesystem.
            raise ValueError(f"action log must be a local path, got {path.split('://')[0]}:// URI")
        self.path = _local(path)

    def append(self, record: dict[str, Any]) -> None:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def records(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    # A torn last line after a crash must not stop remediation.
                    log.warning("%s:%d: skipping a line that is not JSON", self.path, number)

    def for_key(self, idempotency_key: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("idempotency_key") == idempotency_key]

    def executed_since(self, since: datetime) -> list[dict[str, Any]]:
        """Real changes at or after ``since`` (records carry ISO-8601 UTC ``ts``)."""
        out = []
        for r in self.records():
            if r.get("status") != "executed":
                continue
            try:
                ts = datetime.fromisoformat(r["ts"])
            except (KeyError, ValueError):
                continue
            if ts >= since:
                out.append(r)
        return out
