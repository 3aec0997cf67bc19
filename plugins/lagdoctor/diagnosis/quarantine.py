"""Moving a bad snapshot file aside, so one bad file does not stop every later
diagnosis ("quarantine, not poison"): to <root>/_quarantine/, a reason file beside it."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from lagdoctor.diagnosis.store_files import BadFile, StoreInspection

QUARANTINE_DIR = "_quarantine"


def quarantine_file(inspection: StoreInspection, bad: BadFile, now: datetime, job: str = "diagnose_lag") -> dict:
    """Move a bad file to <root>/_quarantine/<same relative path>, a reason file beside it.

    The reason file is written first and the move is a rename (local) or a
    copy then delete (object stores): a crash leaves the file in place or
    moved, never lost; the next run finishes the job.
    """
    fs, root = inspection.fs, inspection.root
    dest = f"{root}/{QUARANTINE_DIR}/{bad.file.relative}"
    if fs.exists(dest):  # a file of the same name was quarantined before
        dest = f"{dest}.{uuid.uuid4().hex[:8]}"
    parent = dest.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = " ".join(f"{bad.reason}; quarantined at {stamp} by {job}".split()) + "\n"
    reason_path = f"{dest}.reason.txt"
    tmp = f"{parent}/.{uuid.uuid4().hex[:8]}.tmp"
    with fs.open(tmp, "w", encoding="utf-8") as fh:
        fh.write(line)
    fs.mv(tmp, reason_path)
    fs.mv(bad.file.path, dest)
    moved_to = f"{inspection.uri_root}/{dest[len(root) + 1:]}"
    return {"path": bad.file.uri, "moved_to": moved_to, "reason": bad.reason}
