"""Reading the snapshot store (contract 1) into Spark, with schema validation.

`check_input_path` runs before any session exists so a typo fails in a
second, not after the JVM starts. `read_snapshots` tolerates the optional
columns being absent, Hive partition folders, and a path to a single file.
`conform_snapshots`, `select_window` and `scope_snapshots` are pure
DataFrame -> DataFrame.

One bad file must not stop diagnosis (issue 8, "quarantine, not poison"), so a
store directory is not handed to Spark whole: `inspect_store` lists its files
(hidden and `_` names skipped below the root; only the cluster= folders asked
for and the date= and hour= folders that can hold the window), reads each
footer with pyarrow and sorts them into readable files, grouped by schema,
and bad ones with a one-line reason naming the file and the column.
`read_snapshot_store` moves the bad ones to `<root>/_quarantine/` and reads
the groups one by one, conformed and unioned, so differing integer widths or
timestamp units never meet in a schema merge.

Only the bytes make a file bad (issue 30): not Parquet, a truncated or
corrupt footer, a schema that cannot be contract 1. When the store fails to
serve them (a timeout, a 503 SlowDown, a reset connection, denied access,
an expired token) inspection stops with StoreReadError and nothing is
moved: a passing error must not take good history out of every later window.

Read cost follows the window (issue 9): files outside it are never opened,
not even their footer. A compacted file (lagdoctor.store.compact_snapshots)
is read instead of the files its footer says it covers. Without --as-of the
window's end is the latest snapshot_ts in the footers' statistics of the
files listed (for the whole input, whatever --groups/--topic then keep),
found newest folder first; Spark scans for it only when a file has no
statistics.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlparse

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES, SNAPSHOT_COLUMNS, SNAPSHOT_OPTIONAL_COLUMNS
from lagdoctor.contracts import GROUP_ROW_PARTITION as GROUP_MARKER_PARTITION
from lagdoctor.contracts import GROUP_ROW_TOPIC as GROUP_MARKER_TOPIC
from lagdoctor.contracts import LISTING_ROW_GROUP

# Hive folder columns that are not part of the contract (date=YYYY-MM-DD, hour=HH).
_FOLDER_ONLY_COLUMNS = ("date", "hour")
# Optional column written by the collector when a read failed (null: every read
# behind the row succeeded). Added here until contracts.py lists it.
READ_ERROR_COLUMN = ("read_error", "string", True)
QUARANTINE_DIR = "_quarantine"
# GROUP_MARKER_TOPIC / GROUP_MARKER_PARTITION: the one row ("", -1) of a group
# whose read failed before its topics were known (contracts.GROUP_ROW_*).


class SnapshotInputError(ValueError):
    """The input cannot be diagnosed; str() is one line meant for stderr."""


class StoreReadError(OSError):
    """The store failed to serve a file (I/O, throttling, a timeout, auth): not a bad file.

    Nothing is moved; str() is one line naming the file; a later run may read it.
    """


def is_local_path(path: str) -> bool:
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def local_path(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def check_input_path(path: str) -> None:
    """Fail fast (before Spark starts) when a local input path does not exist.

    Remote URIs (s3a://, hdfs://) are left to Spark, which reports them.
    """
    if is_local_path(path) and not os.path.exists(local_path(path)):
        raise SnapshotInputError(f"snapshot path does not exist: {path}")


def missing_columns(columns) -> list[str]:
    present = set(columns)
    return [name for name in SNAPSHOT_COLUMN_NAMES if name not in present]


def optional_columns() -> tuple[tuple[str, str, bool], ...]:
    """Contract 1's optional columns, read_error included (whether or not contracts lists it yet)."""
    names = {c[0] for c in SNAPSHOT_OPTIONAL_COLUMNS}
    return SNAPSHOT_OPTIONAL_COLUMNS + (() if READ_ERROR_COLUMN[0] in names else (READ_ERROR_COLUMN,))


# -- listing and inspecting the store (pyarrow, driver side) -------------------------------


@dataclass(frozen=True)
class StoreFile:
    """One Parquet file of the store: `path` as its filesystem names it, `uri` as Spark does.

    `span` is the UTC time range its date= / hour= folders allow ([start, end)),
    None when it lies in no such folder.
    """

    path: str
    uri: str
    relative: str
    folder_columns: tuple[str, ...] = ()
    size: int = 0
    span: tuple[datetime, datetime] | None = None


@dataclass(frozen=True)
class BadFile:
    file: StoreFile
    reason: str


@dataclass
class StoreInspection:
    """The store's files sorted out: readable ones grouped by schema, bad ones with a reason."""

    fs: Any
    root: str
    uri_root: str
    groups: dict[tuple, list[StoreFile]] = field(default_factory=dict)
    read_columns: dict[tuple, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    bad: list[BadFile] = field(default_factory=list)
    # earliest and latest snapshot_ts of the files to read, from their footers'
    # statistics; None when a file has none (then Spark finds them) or no file has rows
    ts_range: tuple[datetime, datetime] | None = None
    clusters_seen: set[str] = field(default_factory=set)  # cluster= folder names listed
    loose_files: bool = False  # files outside any cluster= folder were listed
    opened: list[str] = field(default_factory=list)  # relative paths whose footer was read


def _fsspec_url(path: str) -> str:
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


def store_filesystem(path: str):
    """(fsspec filesystem, its path for `path`).

    Raises SnapshotInputError (one line) when this machine has no fsspec
    filesystem for the URI's scheme: handing such a store to Spark whole
    would read every file with mergeSchema, quarantine nothing and count
    compacted hours twice, so it is refused instead.
    """
    import fsspec

    if is_local_path(path):
        return fsspec.filesystem("file"), os.path.abspath(local_path(path))
    url = _fsspec_url(path)
    try:
        fs, fs_path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:  # no s3fs/gcsfs/adlfs installed, unknown scheme
        scheme = url.split("://", 1)[0]
        raise SnapshotInputError(
            f"no fsspec filesystem for {scheme}:// on this machine, so {path} cannot be listed: install its "
            f"fsspec package (s3fs for s3://, gcsfs for gs://, adlfs for abfs://) ({one_line(exc)})") from None
    return fs, fs_path


@dataclass(frozen=True)
class WindowBounds:
    """The window a run asks for: it ends at `as_of` (None: the latest snapshot_ts
    in the input) and reaches back `minutes` (None: to the earliest)."""

    as_of: datetime | None = None
    minutes: float | None = None

    def fixed_range(self) -> tuple[datetime | None, datetime | None]:
        """(earliest, latest) snapshot_ts a row in the window can have, as far as
        known before reading anything (None: unbounded on that side)."""
        if self.as_of is None:
            return None, None
        end = self.as_of.astimezone(timezone.utc)
        return (end - timedelta(minutes=self.minutes) if self.minutes is not None else None), end


def window_bounds(as_of: datetime | None, window_minutes: float | None) -> WindowBounds | None:
    """What `--as-of` and `--window-minutes` ask for; None when neither is given (read everything)."""
    if as_of is None and window_minutes is None:
        return None
    return WindowBounds(as_of, window_minutes)


def _descend(name: str, day: date | None, span):
    """(day, span) below a folder called `name`: date=D spans the day, hour=H (under a
    date) the hour; any other folder keeps its parent's."""
    if name.startswith("date="):
        try:
            d = date.fromisoformat(name[len("date="):])
        except ValueError:
            return day, span  # not a store day folder: read it
        start = datetime.combine(d, datetime.min.time(), timezone.utc)
        return d, (start, start + timedelta(days=1))
    if name.startswith("hour=") and day is not None:
        value = name[len("hour="):]
        if value.isdigit() and 0 <= int(value) <= 23:
            start = datetime.combine(day, datetime.min.time(), timezone.utc) + timedelta(hours=int(value))
            return day, (start, start + timedelta(hours=1))
    return day, span


def _outside(span, lo: datetime | None, hi: datetime | None) -> bool:
    """No snapshot_ts in [start, end) can fall in [lo, hi]."""
    return span is not None and ((hi is not None and span[0] > hi) or (lo is not None and span[1] <= lo))


def list_store_files(fs, root: str, uri_root: str, *,
                     span: tuple[datetime | None, datetime | None] | None = None,
                     clusters: list[str] | None = None, seen: set[str] | None = None) -> list[StoreFile]:
    """Parquet files under root, skipping hidden and `_` names below it (not in the
    root itself, which may live in a dot-folder), date= and hour= folders whose
    time cannot meet `span`, and cluster= folders not in `clusters`.

    Both layouts are read: date=D/file (before issue 9) and date=D/hour=H/file.
    `seen` collects the cluster= folder names listed.
    """
    lo, hi = span if span is not None else (None, None)
    from lagdoctor.store import cluster_folder_name

    allowed = None if clusters is None else {cluster_folder_name(c) for c in clusters}
    found: list[StoreFile] = []

    def walk(directory: str, relative: str, day: date | None, folder_span) -> None:
        for entry in sorted(fs.ls(directory, detail=True), key=lambda e: e["name"]):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.startswith((".", "_")):
                continue
            if entry["type"] != "directory" and entry["name"].endswith("/"):
                continue  # an object store's folder marker (an emptied folder, a console's "folder"): no data
            rel = f"{relative}/{name}" if relative else name
            if entry["type"] == "directory":
                if name.startswith("cluster="):
                    if allowed is not None and name not in allowed:
                        continue
                    if seen is not None:
                        seen.add(name)
                sub_day, sub_span = _descend(name, day, folder_span)
                if not _outside(sub_span, lo, hi):
                    walk(entry["name"], rel, sub_day, sub_span)
            elif name.endswith(".parquet") or "." not in name:  # Spark writers name parts without a suffix
                folders = tuple(p.split("=", 1)[0] for p in rel.split("/")[:-1] if "=" in p)
                found.append(StoreFile(entry["name"], f"{uri_root}/{rel}", rel, folders,
                                       int(entry.get("size") or 0), folder_span))

    # a root that is itself a cluster=, date= or hour= folder (the DAGs pass cluster=<c>)
    day, root_span = None, None
    for part in root.rstrip("/").split("/")[-3:]:
        day, root_span = _descend(part, day, root_span)
    root_cluster = next((p for p in reversed(root.rstrip("/").split("/")) if p.startswith("cluster=")), None)
    if root_cluster is not None:
        if allowed is not None and root_cluster not in allowed:
            return []
        if seen is not None:
            seen.add(root_cluster)
    if _outside(root_span, lo, hi):
        return []
    walk(root, "", day, root_span)
    return found


def _contract_arrow_types() -> dict[str, Any]:
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    types = {f.name: f.type for f in snapshot_arrow_schema(include_optional=True)}
    for name, _, _ in optional_columns():
        types.setdefault(name, pa.string())
    return types


def _widens(source, target) -> bool:
    """An integer type every value of which fits the target integer type."""
    import pyarrow as pa

    bits = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
    if pa.types.is_signed_integer(source):
        return source.bit_width <= bits[target]
    return pa.types.is_unsigned_integer(source) and source.bit_width < bits[target]


def column_problem(source, target, read_values) -> str | None:
    """Why a column of type `source` cannot be cast to the contract's `target`, or None.

    Integer widths and timestamp units are fine; a narrowing or float column
    is fine when its values cast exactly (read only then, via `read_values`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    t = pa.types
    if t.is_dictionary(source):
        source = source.value_type
    if t.is_null(source):
        return None
    if t.is_string(target):
        return None if (t.is_string(source) or t.is_large_string(source)) else "not a string"
    if t.is_timestamp(target):
        return None if t.is_timestamp(source) else "not a timestamp"
    if t.is_integer(source) and _widens(source, target):
        return None
    if t.is_integer(source) or t.is_floating(source) or t.is_decimal(source):
        try:
            pc.cast(read_values(), target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            return "values do not fit: " + " ".join(str(exc).split())[:160]
        return None
    return "not a number"


@dataclass(frozen=True)
class FileFacts:
    """What one footer says: the columns to read (or why the file is bad), the
    snapshot_ts range from its statistics (epoch µs; None when it has none),
    its row count, and for a compacted file the names it covers."""

    columns: tuple | None
    problem: str | None
    ts_min: int | None = None
    ts_max: int | None = None
    rows: int = 0
    covers: frozenset[str] | None = None

    @property
    def lacks_stats(self) -> bool:
        return self.problem is None and self.rows > 0 and self.ts_min is None


def _to_micros(raw: int, unit: str | None) -> int | None:
    if unit == "microseconds":
        return raw
    if unit == "milliseconds":
        return raw * 1_000
    if unit == "nanoseconds":
        return raw // 1_000  # as the reader converts them (floor)
    return None


def _ts_statistics(metadata) -> tuple[int | None, int | None]:
    """(min, max) snapshot_ts in epoch µs from the row groups' statistics, or (None, None)."""
    import json

    lo = hi = None
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        if group.num_rows == 0:
            continue
        column = next((group.column(j) for j in range(group.num_columns)
                       if group.column(j).path_in_schema == "snapshot_ts"), None)
        stats = column.statistics if column is not None else None
        if stats is None or not stats.has_min_max or stats.physical_type != "INT64":
            return None, None  # INT96 or no statistics: Spark has to look
        try:
            unit = json.loads(stats.logical_type.to_json()).get("timeUnit")
        except (ValueError, AttributeError):
            return None, None
        g_lo, g_hi = _to_micros(stats.min_raw, unit), _to_micros(stats.max_raw, unit)
        if g_lo is None or g_hi is None:
            return None, None
        lo = g_lo if lo is None else min(lo, g_lo)
        hi = g_hi if hi is None else max(hi, g_hi)
    return lo, hi


class _StoreReads:
    """A file object that keeps the first exception its store raised.

    pyarrow re-raises what a file object raised, and raises plain OSError for a
    corrupt footer too: the exception's type cannot say whether the store or the
    bytes failed, this record can.
    """

    def __init__(self, fh):
        self._fh = fh
        self.failure: Exception | None = None

    def __getattr__(self, name):
        attr = self._kept(getattr, self._fh, name)
        if not callable(attr):
            return attr
        return lambda *args, **kwargs: self._kept(attr, *args, **kwargs)

    def _kept(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except AttributeError:  # a method this file object lacks: pyarrow asks, that is no failure
            raise
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
            raise


def _is_format_error(exc: Exception) -> bool:
    """What pyarrow raises for bytes it was given and cannot parse (bad magic, truncated,
    a corrupt footer's thrift). Anything else (out of memory, a bug) is not the file's fault."""
    import pyarrow as pa

    return isinstance(exc, (pa.ArrowException, OSError)) and not isinstance(exc, MemoryError)


# What Spark's own read error says when the store failed, not the file's bytes (S3A's exception
# names, S3's codes and statuses, the network's words): Spark wraps both in FAILED_READ_FILE.
_STORE_FAILURE_MARKERS = (
    "SlowDown", "Status Code: 5", "Status Code: 403", "Service Unavailable", "Throttled", "InternalError",
    "RequestTimeout", "SocketTimeoutException", "ConnectTimeoutException", "timed out", "Connection reset",
    "Connection refused", "NoHttpResponseException", "AWSNoResponseException", "AccessDeniedException",
    "ExpiredToken", "UnknownHostException",
)


def store_failure_in(spark_error: str) -> str | None:
    """The first sign in Spark's error text (all of it, the JVM's causes too) that the store
    failed while Spark read a file (throttled, timed out, refused): worth a retry, not bad
    input. None when nothing says so."""
    return next((m for m in _STORE_FAILURE_MARKERS if m in spark_error), None)


def store_read_error(f: StoreFile, exc: Exception) -> StoreReadError:
    from lagdoctor.objectstore import s3_error_code

    said = one_line(exc)
    code = s3_error_code(exc)
    if code and code not in said:
        said = f"{said} ({code})"
    return StoreReadError(f"cannot read snapshot file {f.uri}: {type(exc).__name__}: {said} "
                          "(the store failed, not the file: nothing was moved)")


def read_store_file(fs, f: StoreFile, read):
    """`read(file object)` on `f`. StoreReadError when the store failed to serve it, or
    for an error that is not pyarrow's verdict on the bytes (unknown is not bad); a
    format error is raised as pyarrow raised it."""
    try:
        opened = fs.open(f.path, "rb")  # opening parses nothing: any failure is the store's
    except Exception as exc:
        raise store_read_error(f, exc) from exc
    with opened as fh:
        reads = _StoreReads(fh)
        try:
            return read(reads)
        except Exception as exc:
            if reads.failure is not None or not _is_format_error(exc):
                raise store_read_error(f, reads.failure or exc) from exc
            raise


def file_facts(fs, f: StoreFile, contract_types: dict[str, Any]) -> FileFacts:
    """Read one footer (and, for a narrowing column, that column's values).

    A file whose bytes are not a snapshot file gets a problem; StoreReadError when
    the store could not serve them.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lagdoctor.store import compaction_facts, is_compacted_name

    def footer(fh):
        # INT96 timestamps as µs: what Spark reads them as too
        parquet = pq.ParquetFile(fh, coerce_int96_timestamp_unit="us")
        return parquet.schema_arrow, parquet.metadata

    try:
        schema, metadata = read_store_file(fs, f, footer)
    except StoreReadError:
        raise
    except Exception as exc:  # read_store_file lets only format errors through: truncated or foreign bytes
        return FileFacts(None, f"not a readable Parquet file: {one_line(exc)}")

    def values(name):
        def read():
            return read_store_file(fs, f, lambda fh: pq.read_table(fh, columns=[name]).column(name))

        return read

    names = [column.name for column in schema]
    twice = sorted({n for n in names if names.count(n) > 1 and n in contract_types})
    if twice:  # Spark refuses the whole read (COLUMN_ALREADY_EXISTS)
        return FileFacts(None, f"column {twice[0]} appears more than once")
    keep = []
    for column in schema:
        target = contract_types.get(column.name)
        if target is None:  # not a contract column (date=, a writer's extras): not read
            continue
        try:
            problem = column_problem(column.type, target, values(column.name))
        except StoreReadError:
            raise
        except Exception as exc:  # the values' bytes could not be parsed: the file is damaged
            return FileFacts(None, f"column {column.name} cannot be read: {one_line(exc)}")
        if problem:
            return FileFacts(None, f"column {column.name} is {column.type} where contract 1 has {target} ({problem})")
        if not pa.types.is_null(column.type):  # an all-null column reads as absent: nulls
            keep.append((column.name, str(column.type)))
    lo, hi = _ts_statistics(metadata)
    compacted = compaction_facts(metadata.metadata) if is_compacted_name(f.path) else None
    return FileFacts(tuple(keep), None, lo, hi, metadata.num_rows, compacted.covers if compacted else None)


def inspect_file(fs, f: StoreFile, contract_types: dict[str, Any]):
    """(columns to read as (name, arrow type), None) or (None, one-line reason)."""
    facts = file_facts(fs, f, contract_types)
    return facts.columns, facts.problem


def _read_footers(fs, files: list[StoreFile], types, opened: list[str]) -> dict[StoreFile, FileFacts]:
    from concurrent.futures import ThreadPoolExecutor

    if not files:
        return {}
    opened.extend(f.relative for f in files)
    with ThreadPoolExecutor(8) as pool:  # footers are small reads: latency-bound, above all on object stores
        return dict(zip(files, pool.map(lambda f: file_facts(fs, f, types), files)))


def _covered_files(files: list[StoreFile], facts: dict[StoreFile, FileFacts]) -> set[StoreFile]:
    """Files a compacted file in the same folder holds the rows of (lagdoctor.store.covered_names)."""
    from lagdoctor.store import covered_names

    by_folder: dict[str, list[StoreFile]] = {}
    for f in files:
        by_folder.setdefault(f.path.rsplit("/", 1)[0], []).append(f)
    skip: set[StoreFile] = set()
    for folder_files in by_folder.values():
        covers = {f.path.rsplit("/", 1)[-1]: facts[f].covers or frozenset()
                  for f in folder_files if f in facts and facts[f].problem is None}
        if not covers:
            continue
        names = covered_names(covers)
        skip |= {f for f in folder_files if f.path.rsplit("/", 1)[-1] in names}
    return skip


def _read_batch(fs, files: list[StoreFile], types, opened: list[str]):
    """Footers of `files`: compacted ones first, then those no compacted file covers
    (covered files are never opened). Returns ({file: facts}, covered files)."""
    from lagdoctor.store import is_compacted_name

    facts = _read_footers(fs, [f for f in files if is_compacted_name(f.path)], types, opened)
    covered = _covered_files(files, facts)
    facts.update(_read_footers(fs, [f for f in files if f not in covered and f not in facts], types, opened))
    return {f: x for f, x in facts.items() if f not in covered}, covered


_LATEST_UNKNOWN = object()


def _latest_micros(facts: dict[StoreFile, FileFacts]):
    """The latest snapshot_ts among readable footers read so far; _LATEST_UNKNOWN when
    one lacks statistics; None when none has rows."""
    if any(x.lacks_stats for x in facts.values()):
        return _LATEST_UNKNOWN
    return max((x.ts_max for x in facts.values() if x.problem is None and x.ts_max is not None), default=None)


def _footers_newest_first(fs, files: list[StoreFile], types, minutes: float,
                          opened: list[str]) -> dict[StoreFile, FileFacts]:
    """Footers read folder by folder, newest first, until the folders left end before
    the window that the latest snapshot_ts seen (by statistics) begins."""
    window = int(minutes * 60_000_000)

    def folder_end(f: StoreFile) -> float:
        return float("inf") if f.span is None else f.span[1].timestamp() * 1_000_000

    pending = sorted(files, key=lambda f: (-folder_end(f), f.relative))
    read: dict[StoreFile, FileFacts] = {}
    while pending:
        latest = _latest_micros(read)
        if latest is _LATEST_UNKNOWN:  # no statistics somewhere: every footer, Spark finds the end
            read.update(_read_batch(fs, pending, types, opened)[0])
            break
        if latest is not None and folder_end(pending[0]) <= latest - window:
            break  # everything left ends before the window starts: never opened
        batch = [f for f in pending if folder_end(f) == folder_end(pending[0])]
        pending = pending[len(batch):]
        read.update(_read_batch(fs, batch, types, opened)[0])
    return read


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _micros_to_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _micros(value: datetime) -> int:
    return (value.astimezone(timezone.utc) - _EPOCH) // timedelta(microseconds=1)


def inspect_store(path: str, *, window: WindowBounds | None = None,
                  clusters: list[str] | None = None) -> StoreInspection | None:
    """Sort a store directory's files into readable groups and bad files (pyarrow only).

    With `window`, only the date= and hour= folders that
    can hold it are listed; files whose footer statistics put them outside are
    not read. Without --as-of but with a length, footers are read newest
    folder first until the window's start is passed: older files are never
    opened. Compacted files are opened first, and the files they cover never.

    None when the path is a single file (Spark then reads it as given).
    Raises SnapshotInputError when no fsspec filesystem serves the path's
    scheme, or when no readable file has a required column; StoreReadError
    when the store fails to serve a file (nothing is moved before this returns).
    """
    fs, root = store_filesystem(path)
    if not fs.isdir(root):
        return None
    uri_root = path.rstrip("/")
    inspection = StoreInspection(fs, root.rstrip("/"), uri_root)
    lo, hi = window.fixed_range() if window is not None else (None, None)
    listed = list_store_files(fs, inspection.root, uri_root, span=(lo, hi), clusters=clusters,
                              seen=inspection.clusters_seen)
    inspection.loose_files = any("cluster" not in f.folder_columns for f in listed) and not any(
        p.startswith("cluster=") for p in inspection.root.split("/"))
    types = _contract_arrow_types()
    if window is not None and window.as_of is None and window.minutes is not None:
        facts = _footers_newest_first(fs, listed, types, window.minutes, inspection.opened)
        latest = _latest_micros(facts)
        if latest is not None and latest is not _LATEST_UNKNOWN:
            lo = _micros_to_datetime(latest - int(window.minutes * 60_000_000))
    else:
        facts = _read_batch(fs, listed, types, inspection.opened)[0]
    files = [f for f in listed if f in facts]
    lo_us = None if lo is None else _micros(lo)
    hi_us = None if hi is None else _micros(hi)

    readable: list[tuple[StoreFile, tuple]] = []
    for f in files:
        x = facts[f]
        if x.problem:
            inspection.bad.append(BadFile(f, x.problem))
        elif x.ts_min is None or not ((lo_us is not None and x.ts_max < lo_us) or (hi_us is not None and x.ts_min > hi_us)):
            readable.append((f, x.columns))  # statistics, not folder names, decide what is read
    if not readable:
        return inspection
    present = {name for f, columns in readable for name in (*[c for c, _ in columns], *f.folder_columns)}
    missing = missing_columns(present)
    if missing:
        example = next(f for f, _ in readable)
        raise SnapshotInputError(
            f"snapshots under {path} lack required column(s): {', '.join(missing)} (e.g. {example.uri})"
        )
    kept = []
    for f, columns in readable:
        in_file = {c for c, _ in columns}
        lacking = missing_columns(in_file | set(f.folder_columns))
        if lacking:  # other files have them: this one is not contract 1
            inspection.bad.append(BadFile(f, f"lacks required column(s): {', '.join(lacking)}"))
            continue
        # folder values are read only for a required column the file lacks; a file's
        # own typed columns are never overridden by its cluster=/date=/hour= folders
        folders = f.folder_columns if missing_columns(in_file) else ()
        key = (columns, folders)
        inspection.groups.setdefault(key, []).append(f)
        inspection.read_columns[key] = columns
        kept.append(facts[f])
    if kept and not any(x.lacks_stats for x in kept):
        lows = [x.ts_min for x in kept if x.ts_min is not None]
        if lows:
            inspection.ts_range = (_micros_to_datetime(min(lows)),
                                   _micros_to_datetime(max(x.ts_max for x in kept if x.ts_max is not None)))
    return inspection


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


# -- reading into Spark -------------------------------------------------------------------


@dataclass
class StoreRead:
    """What `read_snapshot_store` gives the job: the conformed rows and the files moved aside."""

    snapshots: Any
    quarantined: list[dict]
    # bytes of the files read (None: the store was not listed here: a single file, or no fsspec filesystem)
    input_bytes: int | None = None
    # earliest and latest snapshot_ts of the files read, from their footers (None: unknown
    # without a Spark scan, or nothing read); resolve_window(..., ts_range=) takes it
    ts_range: tuple[datetime, datetime] | None = None
    # --clusters names with no cluster= folder in the store (and no loose files that might hold them)
    missing_clusters: list[str] = field(default_factory=list)


def read_snapshots(spark, path: str, *, window: WindowBounds | None = None,
                   clusters: list[str] | None = None):
    """Read every Parquet file under `path` (or the file itself) as contract 1.

    Raises SnapshotInputError (one line, naming the file and, for a schema
    problem, the column) for a missing path, a file that is not a snapshot
    file or a missing required column, StoreReadError for a file the store
    could not serve. An existing path with no data files yields an empty
    DataFrame: empty input is not an error. Moves nothing: see read_snapshot_store.
    """
    check_input_path(path)
    inspection = inspect_store(path, window=window, clusters=clusters)
    if inspection is None:
        return scope_clusters(_read_with_spark(spark, path), clusters)
    if inspection.bad:
        first = inspection.bad[0]
        raise SnapshotInputError(f"cannot read snapshot file {first.file.uri}: {first.reason}")
    return scope_clusters(_read_groups(spark, inspection), clusters)


def read_snapshot_store(spark, path: str, now: datetime, *, window: WindowBounds | None = None,
                        clusters: list[str] | None = None, job: str = "diagnose_lag",
                        quarantine: bool = True) -> StoreRead:
    """Like read_snapshots, but with `quarantine` files that are not snapshot files
    are moved aside, not fatal (the DAGs ask for it; a bare job run moves nothing).
    A file the store could not serve is never moved: StoreReadError, before any move.

    `window` (window_bounds(--as-of, --window-minutes)) limits what is listed
    and opened; `clusters` limits the cluster= folders listed and the rows
    kept. `now` stamps the reason files. Nothing is moved, and
    SnapshotInputError names a file, when no file could be read at all (a
    wrong path or a wrong schema everywhere is the user's input, not one
    poison file) or when a required column is missing from every file.
    """
    check_input_path(path)
    inspection = inspect_store(path, window=window, clusters=clusters)
    if inspection is None:
        return StoreRead(scope_clusters(_read_with_spark(spark, path), clusters), [])
    if inspection.bad and (not quarantine or not inspection.groups):
        first = inspection.bad[0]
        everywhere = "" if inspection.groups else f" (no file under {path} could be read)"
        raise SnapshotInputError(f"cannot read snapshot file {first.file.uri}: {first.reason}{everywhere}")
    quarantined = [quarantine_file(inspection, bad, now, job) for bad in inspection.bad]
    size = sum(f.size for files in inspection.groups.values() for f in files)
    missing = []
    if clusters and not inspection.loose_files:
        from lagdoctor.store import cluster_folder_name

        missing = [c for c in clusters if cluster_folder_name(c) not in inspection.clusters_seen]
    return StoreRead(scope_clusters(_read_groups(spark, inspection), clusters), quarantined, size,
                     inspection.ts_range, missing)


def scope_clusters(df, clusters: list[str] | None):
    """Only rows of the named clusters (None: all); for files outside cluster= folders."""
    if not clusters:
        return df
    from pyspark.sql import functions as F

    return df.where(F.col("cluster").isin(list(clusters)))


def parse_clusters(value: str | None) -> list[str] | None:
    """`--clusters a,b` -> ["a", "b"]; None when absent. ValueError (one line) for an empty list."""
    if value is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if not names:
        raise ValueError(f"--clusters names no cluster: {value!r}")
    return names


def _spark_type(arrow_type: str):
    from pyspark.sql import types as T

    if arrow_type.startswith("timestamp[ns"):
        return T.LongType()  # read as epoch ns (spark.sql.legacy.parquet.nanosAsLong), converted below
    if arrow_type.startswith("timestamp["):
        return T.TimestampType() if "tz=" in arrow_type else T.TimestampNTZType()
    if arrow_type.startswith("decimal"):
        precision, scale = arrow_type[arrow_type.index("(") + 1:-1].split(",")
        return T.DecimalType(int(precision), int(scale))
    simple = {
        "int8": T.ByteType(), "int16": T.ShortType(), "int32": T.IntegerType(), "int64": T.LongType(),
        "uint8": T.ShortType(), "uint16": T.IntegerType(), "uint32": T.LongType(),
        "uint64": T.DecimalType(20, 0), "float": T.FloatType(), "halffloat": T.FloatType(),
        "double": T.DoubleType(), "string": T.StringType(), "large_string": T.StringType(),
    }
    if arrow_type.startswith("dictionary<values=string"):
        return T.StringType()
    return simple[arrow_type]


def _read_groups(spark, inspection: StoreInspection):
    """Read each schema group with its own exact schema, conform, union.

    A group whose files hold every required column is read as a plain file
    list (no partition discovery): a folder value (cluster=, date=, hour=)
    never overrides a file's own typed column, and date=D/file beside
    date=D/hour=H/file is no partition conflict. Only files lacking a
    required column get it from their folders (basePath discovery; their
    group shares one folder layout).
    """
    from functools import reduce

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    frames = []
    for key, files in inspection.groups.items():
        columns, folders = key
        fields = [T.StructField(name, _spark_type(kind), True) for name, kind in columns]
        fields += [T.StructField(name, T.StringType(), True) for name in folders if name not in dict(columns)]
        reader = spark.read.schema(T.StructType(fields))
        if folders:
            reader = reader.option("basePath", inspection.uri_root)
        else:
            reader = reader.option("recursiveFileLookup", "true")  # no partition columns at all
        df = reader.parquet(*[f.uri for f in files])
        for name, kind in columns:
            if kind.startswith("timestamp[ns"):
                df = df.withColumn(name, F.timestamp_micros(F.floor(F.col(name) / 1000).cast("long")))
        frames.append(conform_snapshots(df))
    if not frames:
        return spark.createDataFrame([], snapshot_schema_with_optional())
    return reduce(lambda a, b: a.unionByName(b), frames)


def _read_with_spark(spark, path: str):
    """Spark reads `path` itself: a single file (a store folder is always listed
    here first: store_filesystem refuses a scheme fsspec cannot open).
    """
    from pyspark.errors import AnalysisException

    try:
        try:
            df = spark.read.option("mergeSchema", "true").parquet(path)
        except Exception as exc:
            if "CONFLICTING_PARTITION_COLUMN_NAMES" not in str(exc):
                raise
            # date=D/file beside date=D/hour=H/file: no partition discovery (the files carry the columns)
            df = spark.read.option("mergeSchema", "true").option("recursiveFileLookup", "true").parquet(path)
    except AnalysisException as exc:
        condition = exc.getCondition() or ""
        if condition == "UNABLE_TO_INFER_SCHEMA":
            return spark.createDataFrame([], snapshot_schema_with_optional())
        if condition == "PATH_NOT_FOUND":
            raise SnapshotInputError(f"snapshot path does not exist: {path}") from None
        raise SnapshotInputError(f"cannot read snapshots under {path}: {one_line(exc)}") from None
    except Exception as exc:  # corrupt footers surface here (SparkException via Py4J)
        raise SnapshotInputError(f"cannot read snapshots under {path}: {one_line(exc)}") from None
    missing = missing_columns(df.columns)
    if missing:
        raise SnapshotInputError(
            f"snapshots under {path} lack required column(s): {', '.join(missing)}"
        )
    return conform_snapshots(df)


def snapshot_schema_with_optional():
    from pyspark.sql import types as T

    from lagdoctor.contracts import snapshot_spark_schema

    schema = snapshot_spark_schema(include_optional=True)
    for name, _, nullable in optional_columns():
        if name not in schema.fieldNames():
            schema = schema.add(T.StructField(name, T.StringType(), nullable))
    return schema


def conform_snapshots(df):
    """Cast to the contract's types, add absent optional columns as nulls, drop folder-only columns.

    Writers differ in integer widths and timestamp units; Spark merges the
    Hive `cluster=` folder with the in-file column, `date=` is dropped.
    """
    from pyspark.sql import functions as F

    schema = snapshot_schema_with_optional()
    present = set(df.columns)
    out = []
    for field_ in schema.fields:
        if field_.name in present:
            out.append(F.col(field_.name).cast(field_.dataType).alias(field_.name))
        else:
            out.append(F.lit(None).cast(field_.dataType).alias(field_.name))
    return df.select(*out)


def scope_snapshots(df, group_pattern=None, topic: str | None = None):
    """Only the groups whose id `group_pattern` (a compiled RE2 pattern) matches in
    full, and only `topic`; a group's topic-less read-failure row stays in scope, and so
    does a failed group listing's (group_id LISTING_ROW_GROUP: the groups asked for may be the missing ones).

    Group ids are matched on the driver (a linear-time engine over the distinct
    ids, never Java's backtracking regex on executors).
    """
    from pyspark.sql import functions as F

    if topic is not None:
        marker = (F.col("topic") == GROUP_MARKER_TOPIC) & (F.col("partition") == GROUP_MARKER_PARTITION)
        df = df.where((F.col("topic") == topic) | marker)
    if group_pattern is not None:
        ids = [r["group_id"] for r in df.select("group_id").distinct().collect()]
        wanted = sorted(g for g in ids if g is not None and (g == LISTING_ROW_GROUP or group_pattern.fullmatch(g)))
        df = df.where(F.col("group_id").isin(wanted)) if wanted else df.limit(0)
    return df


def compile_groups(pattern: str):
    """`--groups` as RE2, full match; ValueError (one line) when it does not compile."""
    try:
        from lagdoctor.kafka.group_listing import compile_group_pattern

        return compile_group_pattern(pattern, what="--groups")
    except (ImportError, TypeError):  # an older collector: compile here, the same way
        import re2

        try:
            return re2.compile(pattern)
        except re2.error as exc:
            raise ValueError(f"invalid --groups regex {pattern!r}: {exc}") from None


def _is_rpc_error(exc: BaseException) -> bool:
    try:
        import grpc
    except ImportError:  # no Spark Connect client here: no gRPC errors either
        return False
    return isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None))


def one_line(exc: BaseException) -> str:
    """First meaningful line of an exception message (Py4J errors carry JVM stacks; a gRPC error from
    Spark Connect is said as its status and details, not the first line of its repr)."""
    import re

    text = str(exc).strip()
    if _is_rpc_error(exc):
        try:
            status, said = exc.code(), exc.details()
        except Exception:  # noqa: BLE001 - a call without a status yet: read its text below
            status = said = None
        if status is not None:
            return f"gRPC call failed: {getattr(status, 'name', status)}: {' '.join(str(said or '').split())}"[:400]
    rpc = re.search(r'status = StatusCode\.(\w+)\s+details = "((?:[^"\\]|\\.)*)"', text)
    if rpc:  # the same error's text, as a wrapper carried it ("<_MultiThreadedRendezvous of RPC that ...")
        return f"gRPC call failed: {rpc.group(1)}: {' '.join(rpc.group(2).split())}"[:400]
    for line in text.splitlines():
        line = line.strip().lstrip(": ").strip()
        if not line or line.startswith(("JVM stacktrace", "at ", "py4j", "An error occurred while calling")):
            continue
        # "org.apache.spark.SparkException: [FAILED_READ_FILE...] ..." -> the message
        line = re.sub(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error):\s*", "", line)
        return line[:400]
    return type(exc).__name__


def parse_as_of(value: str | None) -> datetime | None:
    """ISO-8601 -> aware UTC datetime ('Z' accepted; naive means UTC)."""
    if value is None:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise SnapshotInputError(f"--as-of is not ISO-8601: {value}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def resolve_window(
    df, as_of: datetime | None, window_minutes: float | None,
    ts_range: tuple[datetime, datetime] | None = None,
) -> tuple[datetime, datetime] | None:
    """The window [start, end] the job diagnoses, or None when there is no data in it.

    Contract 2: end is --as-of or the latest snapshot_ts; start is end minus
    --window-minutes, or the earliest snapshot_ts (up to end). Without
    --as-of, `ts_range` (StoreRead.ts_range: the footers' statistics of the
    files read) gives them without a Spark scan of everything read; only
    without it does Spark aggregate. With both --as-of and --window-minutes
    (every sweep) the window is known without a scan: the footers (when
    known) only tell an empty window apart, and an empty window that they
    cannot tell gives empty outputs through the transforms just the same.
    """
    from pyspark.sql import functions as F

    if as_of is None and ts_range is not None:
        lo, hi = ts_range
        return (hi - timedelta(minutes=window_minutes) if window_minutes is not None else lo), hi
    if as_of is not None and window_minutes is not None:
        start = as_of - timedelta(minutes=window_minutes)
        if ts_range is not None and (ts_range[1] < start or ts_range[0] > as_of):
            return None
        return start, as_of
    scoped = df if as_of is None else df.where(F.col("snapshot_ts") <= F.lit(as_of))
    if window_minutes is not None and as_of is not None:
        scoped = scoped.where(F.col("snapshot_ts") >= F.lit(as_of - timedelta(minutes=window_minutes)))
    # Epoch microseconds, not datetimes: collected datetimes are naive in the
    # Python process's local zone.
    row = scoped.agg(
        F.min(F.unix_micros("snapshot_ts")).alias("lo"), F.max(F.unix_micros("snapshot_ts")).alias("hi")
    ).first()
    if row is None or row["hi"] is None:
        return None
    end = as_of or _from_micros(row["hi"])
    start = end - timedelta(minutes=window_minutes) if window_minutes is not None else _from_micros(row["lo"])
    return start, end


def _from_micros(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)


def select_window(df, start: datetime, end: datetime):
    """Rows with start <= snapshot_ts <= end."""
    from pyspark.sql import functions as F

    return df.where((F.col("snapshot_ts") >= F.lit(start)) & (F.col("snapshot_ts") <= F.lit(end)))


__all__ = [
    "SnapshotInputError",
    "StoreReadError",
    "check_input_path",
    "read_snapshots",
    "read_snapshot_store",
    "scope_snapshots",
    "compile_groups",
    "conform_snapshots",
    "select_window",
    "resolve_window",
    "parse_as_of",
    "parse_clusters",
    "scope_clusters",
    "window_bounds",
    "WindowBounds",
    "SNAPSHOT_COLUMNS",
    "SNAPSHOT_OPTIONAL_COLUMNS",
]
