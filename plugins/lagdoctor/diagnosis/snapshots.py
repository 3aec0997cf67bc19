"""Reading the snapshot store (contract 1) into Spark, with schema validation.

`read_snapshots` tolerates the optional columns being absent, Hive partition
folders, and a path to a single file. `conform_snapshots` and
`scope_snapshots` are pure DataFrame -> DataFrame.

One bad file must not stop diagnosis ("quarantine, not poison"), so a store
directory is not handed to Spark whole: `inspect_store` (store_files.py) sorts
its files into readable ones, grouped by schema, and bad ones.
`read_snapshot_store` moves the bad ones to `<root>/_quarantine/`
(quarantine.py) and reads the groups one by one, conformed and unioned, so
differing integer widths or timestamp units never meet in a schema merge.
Which snapshots a run reads is window.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lagdoctor.contracts import SNAPSHOT_COLUMNS, SNAPSHOT_OPTIONAL_COLUMNS
from lagdoctor.contracts import GROUP_ROW_PARTITION as GROUP_MARKER_PARTITION
from lagdoctor.contracts import GROUP_ROW_TOPIC as GROUP_MARKER_TOPIC
from lagdoctor.contracts import LISTING_ROW_GROUP
from lagdoctor.diagnosis.input_errors import SnapshotInputError, one_line
from lagdoctor.diagnosis.quarantine import quarantine_file
from lagdoctor.diagnosis.store_files import (StoreInspection, check_input_path, inspect_store, missing_columns,
                                             optional_columns)
from lagdoctor.diagnosis.window import WindowBounds

# Importable from here, as before they moved to modules of their own.
from lagdoctor.diagnosis.input_errors import StoreReadError, store_failure_in  # noqa: F401
from lagdoctor.diagnosis.store_files import is_local_path, list_store_files, local_path, store_filesystem  # noqa: F401
from lagdoctor.diagnosis.window import parse_as_of, resolve_window, select_window, window_bounds  # noqa: F401

# Hive folder columns that are not part of the contract (date=YYYY-MM-DD, hour=HH).
_FOLDER_ONLY_COLUMNS = ("date", "hour")
# GROUP_MARKER_TOPIC / GROUP_MARKER_PARTITION: the one row ("", -1) of a group
# whose read failed before its topics were known (contracts.GROUP_ROW_*).


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
