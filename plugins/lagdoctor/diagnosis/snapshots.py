"""Reading the snapshot store (contract 1) into Spark, with schema validation.

`check_input_path` runs before any session exists so a typo fails in a
second, not after the JVM starts. `read_snapshots` tolerates the optional
columns being absent, Hive partition folders, and a path to a single file.
`conform_snapshots`, `select_window` and `scope_snapshots` are pure
DataFrame -> DataFrame.

One bad file must not stop diagnosis (issue 8, "quarantine, not poison"), so a
store directory is not handed to Spark whole: `inspect_store` lists its files
(hidden and `_` names skipped below the root, only the date= folders that can
hold the window), reads each footer with pyarrow and sorts them into readable
files, grouped by schema, and bad ones with a one-line reason naming the file
and the column. `read_snapshot_store` moves the bad ones to
`<root>/_quarantine/` and reads the groups one by one, conformed and unioned,
so differing integer widths or timestamp units never meet in a schema merge.
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

# Hive folder columns that are not part of the contract (date=YYYY-MM-DD).
_FOLDER_ONLY_COLUMNS = ("date",)
# Optional column written by the collector when a read failed (null: every read
# behind the row succeeded). Added here until contracts.py lists it.
READ_ERROR_COLUMN = ("read_error", "string", True)
QUARANTINE_DIR = "_quarantine"
# GROUP_MARKER_TOPIC / GROUP_MARKER_PARTITION: the one row ("", -1) of a group
# whose read failed before its topics were known (contracts.GROUP_ROW_*).


class SnapshotInputError(ValueError):
    """The input cannot be diagnosed; str() is one line meant for stderr."""


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
    """One Parquet file of the store: `path` as its filesystem names it, `uri` as Spark does."""

    path: str
    uri: str
    relative: str
    folder_columns: tuple[str, ...] = ()
    size: int = 0


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


def _fsspec_url(path: str) -> str:
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


def store_filesystem(path: str):
    """(fsspec filesystem, its path for `path`), or None when this machine has no
    filesystem for the URI's scheme (then Spark reads the store as it is)."""
    try:
        import fsspec

        if is_local_path(path):
            return fsspec.filesystem("file"), os.path.abspath(local_path(path))
        fs, fs_path = fsspec.core.url_to_fs(_fsspec_url(path))
        return fs, fs_path
    except (ImportError, ValueError, OSError):  # no s3fs, no libhdfs, unknown scheme
        return None


def window_days(as_of: datetime | None, window_minutes: float | None) -> tuple[date, date] | None:
    """The UTC days a window can touch, when --as-of and --window-minutes bound it."""
    if as_of is None or window_minutes is None:
        return None
    end = as_of.astimezone(timezone.utc)
    return (end - timedelta(minutes=window_minutes)).date(), end.date()


def _day_outside(name: str, days: tuple[date, date] | None) -> bool:
    if days is None or not name.startswith("date="):
        return False
    try:
        day = date.fromisoformat(name[len("date="):])
    except ValueError:
        return False  # not a store day folder: read it
    return not days[0] <= day <= days[1]


def list_store_files(fs, root: str, uri_root: str, days: tuple[date, date] | None = None) -> list[StoreFile]:
    """Parquet files under root, skipping hidden and `_` names below it (not in the
    root itself, which may live in a dot-folder) and date= folders outside `days`."""
    found: list[StoreFile] = []

    def walk(directory: str, relative: str) -> None:
        for entry in sorted(fs.ls(directory, detail=True), key=lambda e: e["name"]):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if name.startswith((".", "_")):
                continue
            rel = f"{relative}/{name}" if relative else name
            if entry["type"] == "directory":
                if not _day_outside(name, days):
                    walk(entry["name"], rel)
            elif name.endswith(".parquet") or "." not in name:  # Spark writers name parts without a suffix
                folders = tuple(p.split("=", 1)[0] for p in rel.split("/")[:-1] if "=" in p)
                found.append(StoreFile(entry["name"], f"{uri_root}/{rel}", rel, folders, int(entry.get("size") or 0)))

    walk(root, "")
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


def inspect_file(fs, f: StoreFile, contract_types: dict[str, Any]):
    """(columns to read as (name, arrow type), None) or (None, one-line reason)."""
    import pyarrow.parquet as pq

    try:
        with fs.open(f.path, "rb") as fh:
            # INT96 timestamps as µs: what Spark reads them as too
            schema = pq.ParquetFile(fh, coerce_int96_timestamp_unit="us").schema_arrow
    except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for truncated or foreign files
        return None, f"not a readable Parquet file: {one_line(exc)}"

    def values(name):
        def read():
            with fs.open(f.path, "rb") as fh:
                return pq.read_table(fh, columns=[name]).column(name)

        return read

    names = [column.name for column in schema]
    twice = sorted({n for n in names if names.count(n) > 1 and n in contract_types})
    if twice:  # Spark refuses the whole read (COLUMN_ALREADY_EXISTS)
        return None, f"column {twice[0]} appears more than once"
    keep = []
    for column in schema:
        target = contract_types.get(column.name)
        if target is None:  # not a contract column (date=, a writer's extras): not read
            continue
        try:
            problem = column_problem(column.type, target, values(column.name))
        except Exception as exc:  # reading the values failed: the file is damaged
            return None, f"column {column.name} cannot be read: {one_line(exc)}"
        if problem:
            return None, f"column {column.name} is {column.type} where contract 1 has {target} ({problem})"
        import pyarrow as pa

        if not pa.types.is_null(column.type):  # an all-null column reads as absent: nulls
            keep.append((column.name, str(column.type)))
    return tuple(keep), None


def inspect_store(path: str, days: tuple[date, date] | None = None) -> StoreInspection | None:
    """Sort a store directory's files into readable groups and bad files (pyarrow only).

    None when the path is a single file or its filesystem is not available
    here (Spark then reads it as given). Raises SnapshotInputError when no
    readable file has a required column.
    """
    located = store_filesystem(path)
    if located is None:
        return None
    fs, root = located
    if not fs.isdir(root):
        return None
    uri_root = path.rstrip("/")
    inspection = StoreInspection(fs, root.rstrip("/"), uri_root)
    files = list_store_files(fs, inspection.root, uri_root, days)
    types = _contract_arrow_types()
    readable: list[tuple[StoreFile, tuple]] = []
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # footers are small reads: latency-bound, above all on object stores
        results = list(pool.map(lambda f: inspect_file(fs, f, types), files))
    for f, (columns, problem) in zip(files, results):
        if problem:
            inspection.bad.append(BadFile(f, problem))
        else:
            readable.append((f, columns))
    if not readable:
        return inspection
    present = {name for f, columns in readable for name in (*[c for c, _ in columns], *f.folder_columns)}
    missing = missing_columns(present)
    if missing:
        example = next(f for f, _ in readable)
        raise SnapshotInputError(
            f"snapshots under {path} lack required column(s): {', '.join(missing)} (e.g. {example.uri})"
        )
    for f, columns in readable:
        lacking = missing_columns({c for c, _ in columns} | set(f.folder_columns))
        if lacking:  # other files have them: this one is not contract 1
            inspection.bad.append(BadFile(f, f"lacks required column(s): {', '.join(lacking)}"))
            continue
        key = (columns, f.folder_columns)
        inspection.groups.setdefault(key, []).append(f)
        inspection.read_columns[key] = columns
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


def read_snapshots(spark, path: str, *, days: tuple[date, date] | None = None):
    """Read every Parquet file under `path` (or the file itself) as contract 1.

    Raises SnapshotInputError (one line, naming the file and, for a schema
    problem, the column) for a missing path, an unreadable file or a missing
    required column. An existing path with no data files yields an empty
    DataFrame: empty input is not an error. Moves nothing: see read_snapshot_store.
    """
    check_input_path(path)
    inspection = inspect_store(path, days)
    if inspection is None:
        return _read_with_spark(spark, path)
    if inspection.bad:
        first = inspection.bad[0]
        raise SnapshotInputError(f"cannot read snapshot file {first.file.uri}: {first.reason}")
    return _read_groups(spark, inspection)


def read_snapshot_store(spark, path: str, now: datetime, *, days: tuple[date, date] | None = None,
                        job: str = "diagnose_lag", quarantine: bool = True) -> StoreRead:
    """Like read_snapshots, but with `quarantine` files that cannot be read are
    moved aside, not fatal (the DAGs ask for it; a bare job run moves nothing).

    `now` stamps the reason files. Nothing is moved, and SnapshotInputError
    names a file, when no file could be read at all (a wrong path or a wrong
    schema everywhere is the user's input, not one poison file) or when a
    required column is missing from every file.
    """
    check_input_path(path)
    inspection = inspect_store(path, days)
    if inspection is None:
        return StoreRead(_read_with_spark(spark, path), [])
    if inspection.bad and (not quarantine or not inspection.groups):
        first = inspection.bad[0]
        everywhere = "" if inspection.groups else f" (no file under {path} could be read)"
        raise SnapshotInputError(f"cannot read snapshot file {first.file.uri}: {first.reason}{everywhere}")
    quarantined = [quarantine_file(inspection, bad, now, job) for bad in inspection.bad]
    size = sum(f.size for files in inspection.groups.values() for f in files)
    return StoreRead(_read_groups(spark, inspection), quarantined, size)


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
    """Read each schema group with its own exact schema, conform, union."""
    from functools import reduce

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    frames = []
    for key, files in inspection.groups.items():
        columns, folders = key
        fields = [T.StructField(name, _spark_type(kind), True) for name, kind in columns]
        fields += [T.StructField(name, T.StringType(), True) for name in folders if name not in dict(columns)]
        reader = spark.read.schema(T.StructType(fields)).option("basePath", inspection.uri_root)
        df = reader.parquet(*[f.uri for f in files])
        for name, kind in columns:
            if kind.startswith("timestamp[ns"):
                df = df.withColumn(name, F.timestamp_micros(F.floor(F.col(name) / 1000).cast("long")))
        frames.append(conform_snapshots(df))
    if not frames:
        return spark.createDataFrame([], snapshot_schema_with_optional())
    return reduce(lambda a, b: a.unionByName(b), frames)


def _read_with_spark(spark, path: str):
    """Spark reads `path` itself (a single file, or a URI this machine has no filesystem for)."""
    from pyspark.errors import AnalysisException

    try:
        df = spark.read.option("mergeSchema", "true").parquet(path)
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
    full, and only `topic`; a group's topic-less read-failure row stays in scope.

    Group ids are matched on the driver (a linear-time engine over the distinct
    ids, never Java's backtracking regex on executors).
    """
    from pyspark.sql import functions as F

    if topic is not None:
        marker = (F.col("topic") == GROUP_MARKER_TOPIC) & (F.col("partition") == GROUP_MARKER_PARTITION)
        df = df.where((F.col("topic") == topic) | marker)
    if group_pattern is not None:
        ids = [r["group_id"] for r in df.select("group_id").distinct().collect()]
        wanted = sorted(g for g in ids if g is not None and group_pattern.fullmatch(g))
        df = df.where(F.col("group_id").isin(wanted)) if wanted else df.limit(0)
    return df


def compile_groups(pattern: str):
    """`--groups` as RE2, full match; ValueError (one line) when it does not compile."""
    try:
        from lagdoctor.collector import compile_group_pattern

        return compile_group_pattern(pattern, what="--groups")
    except (ImportError, TypeError):  # an older collector: compile here, the same way
        import re2

        try:
            return re2.compile(pattern)
        except re2.error as exc:
            raise ValueError(f"invalid --groups regex {pattern!r}: {exc}") from None


def one_line(exc: BaseException) -> str:
    """First meaningful line of an exception message (Py4J errors carry JVM stacks)."""
    import re

    text = str(exc).strip()
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
    df, as_of: datetime | None, window_minutes: float | None
) -> tuple[datetime, datetime] | None:
    """The window [start, end] the job diagnoses, or None when there is no data in it.

    Contract 2: end is --as-of or the latest snapshot_ts; start is end minus
    --window-minutes, or the earliest snapshot_ts (up to end).
    """
    from pyspark.sql import functions as F

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
    "check_input_path",
    "read_snapshots",
    "read_snapshot_store",
    "scope_snapshots",
    "compile_groups",
    "conform_snapshots",
    "select_window",
    "resolve_window",
    "parse_as_of",
    "SNAPSHOT_COLUMNS",
    "SNAPSHOT_OPTIONAL_COLUMNS",
]
