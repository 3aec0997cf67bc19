"""The snapshot store: Parquet files under <root>/cluster=<c>/date=<YYYY-MM-DD>/.

Each snapshot is one uniquely named file, written under a hidden temporary
name and renamed into place, so a crash never leaves a partial file and
readers (Spark and pyarrow both skip names starting with '.' or '_') never see
one. The root is a local path or any fsspec URI.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


class StoreError(RuntimeError):
    """The store could not be written or read; the message is one line."""


def _filesystem(root: str):
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    return fs, path.rstrip("/") or "/"


def _safe_part(value: str) -> str:
    # Hive partition values and file names: keep them portable across filesystems.
    return "".join(c if c in _SAFE else "_" for c in value) or "_"


def snapshot_dir(root: str, cluster: str, day: datetime) -> str:
    return f"{root.rstrip('/')}/cluster={_safe_part(cluster)}/date={day:%Y-%m-%d}"


def write_snapshot(
    table: Any,
    root: str,
    cluster: str,
    snapshot_ts: datetime,
    *,
    key: str | None = None,
) -> str | None:
    """Write one snapshot atomically and return its final path (fsspec form).

    `key` makes the write idempotent: a retried task that passes the same key
    finds the file already there and writes nothing (returns None).
    """
    import pyarrow.parquet as pq

    fs, base = _filesystem(root)
    ts = snapshot_ts.astimezone(timezone.utc)
    directory = snapshot_dir(base, cluster, ts)
    name = f"snapshot-{ts:%Y%m%dT%H%M%S%fZ}-{_safe_part(key) if key else uuid.uuid4().hex[:12]}.parquet"
    final = f"{directory}/{name}"
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        if key and fs.exists(final):
            return None
        fs.makedirs(directory, exist_ok=True)
        try:
            with fs.open(tmp, "wb") as fh:
                pq.write_table(table, fh, compression="zstd")
            fs.mv(tmp, final)
        except BaseException:
            if fs.exists(tmp):
                fs.rm(tmp)
            raise
    except OSError as exc:
        raise StoreError(f"cannot write snapshot under {root}: {exc.strerror or exc}") from None
    return final


def list_snapshot_files(root: str) -> list[str]:
    """Visible Parquet files under root (temporary and hidden files excluded)."""
    fs, base = _filesystem(root)
    if not fs.exists(base):
        return []
    files = fs.find(base) if fs.isdir(base) else [base]
    return sorted(
        f for f in files
        if f.endswith(".parquet") and not any(part.startswith((".", "_")) for part in f.split("/"))
    )


def read_snapshots(root: str, since: datetime | None = None):
    """The store as one pyarrow Table in contract 1 (Python side; Spark reads it itself)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    fs, base = _filesystem(root)
    files = list_snapshot_files(root)
    if not files:
        from lagdoctor.contracts import snapshot_arrow_schema

        return snapshot_arrow_schema().empty_table()
    # The cluster value lives inside the files too; reading without hive
    # partitioning keeps the file's typed column as the one truth.
    dataset = ds.dataset(files, filesystem=fs, format="parquet")
    table = dataset.to_table()
    missing = [c for c in SNAPSHOT_COLUMN_NAMES if c not in table.column_names]
    if missing:
        raise StoreError(f"snapshot files under {root} lack contract column(s): {', '.join(missing)}")
    if since is not None:
        import pyarrow.compute as pc

        table = table.filter(pc.greater_equal(table["snapshot_ts"], pa.scalar(since, pa.timestamp("us", tz="UTC"))))
    return table


def prune_snapshots(root: str, keep_days: int, today: datetime) -> list[str]:
    """Delete date= folders older than keep_days before `today`; return what was removed."""
    fs, base = _filesystem(root)
    if not fs.exists(base):
        return []
    cutoff = (today.astimezone(timezone.utc) - timedelta(days=keep_days)).strftime("%Y-%m-%d")
    removed = []
    for cluster_dir in fs.ls(base, detail=False):
        if not cluster_dir.rstrip("/").split("/")[-1].startswith("cluster="):
            continue
        for day_dir in fs.ls(cluster_dir, detail=False):
            day = day_dir.rstrip("/").split("/")[-1]
            if day.startswith("date=") and day[len("date="):] < cutoff:
                fs.rm(day_dir, recursive=True)
                removed.append(day_dir)
    return removed
