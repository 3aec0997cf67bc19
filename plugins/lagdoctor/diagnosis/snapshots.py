"""Reading the snapshot store (contract 1) into Spark, with schema validation.

`check_input_path` runs before any session exists so a typo fails in a
second, not after the JVM starts. `read_snapshots` tolerates the optional
columns being absent, Hive partition folders, and a path to a single file.
`conform_snapshots` and `select_window` are pure DataFrame -> DataFrame.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES, SNAPSHOT_COLUMNS, SNAPSHOT_OPTIONAL_COLUMNS

# Hive folder columns that are not part of the contract (date=YYYY-MM-DD).
_FOLDER_ONLY_COLUMNS = ("date",)


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


def read_snapshots(spark, path: str):
    """Read every Parquet file under `path` (or the file itself) as contract 1.

    Raises SnapshotInputError (one line) for a missing path, an unreadable
    file or a missing required column. An existing path with no data files
    yields an empty DataFrame: empty input is not an error.
    """
    from pyspark.errors import AnalysisException

    check_input_path(path)
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
    from lagdoctor.contracts import snapshot_spark_schema

    return snapshot_spark_schema(include_optional=True)


def conform_snapshots(df):
    """Cast to the contract's types, add absent optional columns as nulls, drop folder-only columns.

    Writers differ in integer widths and timestamp units; Spark merges the
    Hive `cluster=` folder with the in-file column, `date=` is dropped.
    """
    from pyspark.sql import functions as F

    schema = snapshot_schema_with_optional()
    present = set(df.columns)
    out = []
    for field in schema.fields:
        if field.name in present:
            out.append(F.col(field.name).cast(field.dataType).alias(field.name))
        else:
            out.append(F.lit(None).cast(field.dataType).alias(field.name))
    return df.select(*out)


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
    "conform_snapshots",
    "select_window",
    "resolve_window",
    "parse_as_of",
    "SNAPSHOT_COLUMNS",
    "SNAPSHOT_OPTIONAL_COLUMNS",
]
