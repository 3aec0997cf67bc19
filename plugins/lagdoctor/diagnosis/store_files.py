"""The snapshot store's files, on the driver (fsspec and pyarrow, never Spark):
listed, their footers read, and sorted into readable files, grouped by schema,
and bad ones with a one-line reason naming the file and the column.

`check_input_path` runs before any session exists so a typo fails in a
second, not after the JVM starts. `inspect_store` lists a store's files
(hidden and `_` names skipped below the root; only the cluster= folders asked
for and the date= and hour= folders that can hold the window) and reads each
footer.

Only the bytes make a file bad: not Parquet, a truncated or corrupt footer, a
schema that cannot be contract 1. When the store fails to serve them (a
timeout, a 503 SlowDown, a reset connection, denied access, an expired token)
inspection stops with StoreReadError and nothing is moved: a passing error
must not take good history out of every later window.

Read cost follows the window: files outside it are never opened, not even
their footer. A compacted file (lagdoctor.store.compact_snapshots) is read
instead of the files its footer says it covers. Without --as-of the window's
end is the latest snapshot_ts in the footers' statistics of the files listed
(for the whole input, whatever --groups/--topic then keep), found newest
folder first; Spark scans for it only when a file has no statistics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlparse

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES, SNAPSHOT_OPTIONAL_COLUMNS
from lagdoctor.diagnosis.input_errors import SnapshotInputError, StoreReadError, one_line
from lagdoctor.diagnosis.window import WindowBounds, from_micros

# Optional column written by the collector when a read failed (null: every read
# behind the row succeeded). Added here until contracts.py lists it.
READ_ERROR_COLUMN = ("read_error", "string", True)


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

    Both layouts are read: date=D/file (the older one) and date=D/hour=H/file.
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
            lo = from_micros(latest - int(window.minutes * 60_000_000))
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
            inspection.ts_range = (from_micros(min(lows)),
                                   from_micros(max(x.ts_max for x in kept if x.ts_max is not None)))
    return inspection
