"""The window a diagnosis run reads: what --as-of and --window-minutes ask for
(WindowBounds, which also limits the store files listed), and its start and end
in the data (resolve_window, select_window: DataFrame -> DataFrame)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from lagdoctor.diagnosis.input_errors import SnapshotInputError


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
    end = as_of or from_micros(row["hi"])
    start = end - timedelta(minutes=window_minutes) if window_minutes is not None else from_micros(row["lo"])
    return start, end


def from_micros(micros: int) -> datetime:
    """A Parquet timestamp's microseconds since the epoch, as a UTC datetime."""
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=micros)


def select_window(df, start: datetime, end: datetime):
    """Rows with start <= snapshot_ts <= end."""
    from pyspark.sql import functions as F

    return df.where((F.col("snapshot_ts") >= F.lit(start)) & (F.col("snapshot_ts") <= F.lit(end)))
