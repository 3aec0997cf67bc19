"""The snapshot store: Parquet files under <root>/cluster=<c>/date=<YYYY-MM-DD>/.

Each snapshot is one uniquely named file, written under a hidden temporary
name and renamed into place, so a crash never leaves a partial file and
readers (Spark and pyarrow both skip names starting with '.' or '_') never see
one. The root is a local path or any fsspec URI.

File names are `snapshot-<UTC time>-<key or random tag>.parquet`. A key
(a run and sample index) makes a write idempotent: the file with that key is
found in any date folder of its cluster, whatever time the earlier attempt
stamped on it, so a retried task never samples twice.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES, SNAPSHOT_OPTIONAL_COLUMNS

_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_PREFIX, _SUFFIX = "snapshot-", ".parquet"
_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"
_TS_LENGTH = len("20261121T031400000000Z")
_OPTIONAL_NAMES = tuple(c[0] for c in SNAPSHOT_OPTIONAL_COLUMNS)


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


def _tag_of(path: str) -> str | None:
    """The key (or random tag) part of a snapshot file name; None for any other file."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
        return None
    rest = name[len(_PREFIX):-len(_SUFFIX)]
    if len(rest) <= _TS_LENGTH + 1 or rest[_TS_LENGTH] != "-":
        return None
    return rest[_TS_LENGTH + 1:]


def _keyed_files(fs: Any, base: str, cluster: str, tag: str = "*") -> dict[str, str]:
    """{tag: path} of the cluster's visible snapshot files, across every date folder."""
    pattern = f"{base}/cluster={_safe_part(cluster)}/date=*/{_PREFIX}*-{tag}{_SUFFIX}"
    found: dict[str, str] = {}
    for path in sorted(fs.glob(pattern)):
        name_tag = _tag_of(path)
        if name_tag is not None:
            found.setdefault(name_tag, path)
    return found


def find_keyed_snapshots(root: str, cluster: str, keys: list[str]) -> dict[str, str]:
    """{key: path} for those of `keys` already written for `cluster`, whatever their
    timestamp or date folder: one listing of the cluster's folders."""
    fs, base = _filesystem(root)
    try:
        existing = _keyed_files(fs, base, cluster)
    except OSError as exc:
        raise StoreError(f"cannot list snapshots under {root}: {exc.strerror or exc}") from None
    return {key: existing[_safe_part(key)] for key in keys if _safe_part(key) in existing}


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
    finds the earlier file (under any timestamp and date folder of the
    cluster) and writes nothing (returns None).
    """
    import pyarrow.parquet as pq

    fs, base = _filesystem(root)
    ts = snapshot_ts.astimezone(timezone.utc)
    directory = snapshot_dir(base, cluster, ts)
    tag = _safe_part(key) if key else uuid.uuid4().hex[:12]
    name = f"{_PREFIX}{ts:{_TS_FORMAT}}-{tag}{_SUFFIX}"
    final = f"{directory}/{name}"
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        if key and tag in _keyed_files(fs, base, cluster, tag):
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
    # The dataset takes its schema from the first file: add the optional columns
    # (read_error, ...) so they are read from the files that have them, and are
    # null in older files without them, instead of being dropped.
    from lagdoctor.contracts import snapshot_writer_schema

    optional = [f for f in snapshot_writer_schema(*_OPTIONAL_NAMES)
                if f.name in _OPTIONAL_NAMES and f.name not in dataset.schema.names]
    if optional:
        dataset = ds.dataset(files, filesystem=fs, format="parquet",
                             schema=pa.schema([*dataset.schema, *optional]))
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
