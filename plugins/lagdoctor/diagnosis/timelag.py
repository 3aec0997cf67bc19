"""Time lag: how far behind real time a partition's consumer is, in seconds.

As kafka-lag-exporter does: place the committed offset on the log-end-offset
over time curve (linear interpolation between the two snapshots whose end
offsets bracket it) and subtract that time from the snapshot's time.

- exact instead, when the collector recorded `committed_record_ts` (the
  timestamp of the record at the committed offset), also far beyond the
  window: no cap, no lower bound;
- 0 when lag is 0 (including a commit briefly above the end offset), and
  when the record read found nothing after the committed offset but
  transaction markers or aborted records (the lag is offsets, not data);
- no extrapolation beyond the window: when the committed offset is older than
  the window's first end offset the value is CAPPED at the window's span and
  `time_lag_lower_bound` is true ("at least this far behind");
- null when there is no committed offset.

`time_lag_source` says which: "record", "next_record" (exact too, from the
first data record after the committed offset: the committed offset holds a
transaction marker, or an aborted or compacted record the group never sees),
"interpolated", "lower_bound", or "caught_up" (lag 0: nothing waits); null
when the time lag is unknown.

These are Column builders so the features pass computes time lag in the same
window sort as everything else; `time_lag_by_partition` is the stand-alone
transform.
"""

from __future__ import annotations

from lagdoctor.contracts import NOTHING_TO_READ

PARTITION_KEY = ("cluster", "group_id", "topic", "partition")


def row_columns():
    """Per-row column: on rows whose (previous, current) end offsets bracket the
    committed offset at the window's end (c_end), the interpolated time at
    which the end offset passed it. Needs t, prev_t, prev_leo, c_end."""
    from pyspark.sql import functions as F

    c_end, prev_leo, prev_t = F.col("c_end"), F.col("prev_leo"), F.col("prev_t")
    leo = F.col("log_end_offset")
    bracket = (prev_leo <= c_end) & (c_end < leo)
    t_at = prev_t + F.try_divide(c_end - prev_leo, leo - prev_leo) * (F.col("t") - prev_t)
    return {"tl_t_at": F.when(bracket, t_at)}


RECORD_COLUMNS = (
    ("committed_record_ts", "timestamp"),
    ("committed_record_offset", "bigint"),
    ("committed_record_key_sha256", "string"),
    ("committed_record_size", "bigint"),
    ("committed_record_headers", "string"),
    ("committed_record_error", "string"),
)


def with_record_columns(snapshots):
    """Rows from a writer that did not read records: every committed_record_* column null."""
    from pyspark.sql import functions as F

    missing = {name: F.lit(None).cast(kind) for name, kind in RECORD_COLUMNS if name not in snapshots.columns}
    return snapshots.withColumns(missing) if missing else snapshots


def aggregate_columns():
    """Per-partition aggregates feeding `time_lag_expr`, and the record at the
    committed offset at the partition's last snapshot (`committed_record`: null
    when none was fetched; its `error` says why a fetch gave none)."""
    from pyspark.sql import functions as F

    return [
        F.max("tl_t_at").alias("tl_t_at"),
        F.max_by("committed_record_ts", "t").cast("double").alias("tl_record_t"),
        F.max_by(F.col("committed_record_offset") > F.col("committed_offset"), "t").alias("tl_record_after"),
        F.coalesce(F.max_by(F.col("committed_record_error").startswith(NOTHING_TO_READ), "t"), F.lit(False)).alias(
            "nothing_to_read"),
        F.max_by(committed_record(), "t").alias("committed_record"),
    ]


def committed_record(committed_offset: str = "committed_offset"):
    """The record at the committed offset as the findings show it, from a row's
    committed_record_* columns; null when none was fetched (its `error` says why a
    fetch gave none)."""
    from pyspark.sql import functions as F

    record = F.struct(
        F.col("committed_record_offset").alias("offset"),
        F.date_format(F.col("committed_record_ts"), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("timestamp"),
        F.col("committed_record_key_sha256").alias("key_sha256"),
        F.col("committed_record_size").alias("size"),
        F.when(F.col("committed_record_headers") != "", F.split("committed_record_headers", ",")).otherwise(
            F.when(F.col("committed_record_headers").isNotNull(), F.array().cast("array<string>"))
        ).alias("headers"),
        F.col("committed_record_error").alias("error"),
        # the offset read from; a record above it means the offsets between hold no
        # data the group will see (transaction markers, aborted or compacted records)
        F.col(committed_offset).alias("committed_offset"),
    )
    fetched = F.col("committed_record_offset").isNotNull() | F.col("committed_record_error").isNotNull()
    return F.when(fetched, record)


def time_lag_expr(t_first, t_last, leo_first, committed_end, lag_end):
    """(time_lag_seconds, time_lag_lower_bound, time_lag_source) from per-partition aggregates."""
    from pyspark.sql import functions as F

    seconds = (
        F.when(committed_end.isNull(), F.lit(None))
        .when((lag_end <= 0) | F.col("nothing_to_read"), F.lit(0.0))
        .when(F.col("tl_record_t").isNotNull(), F.greatest(t_last - F.col("tl_record_t"), F.lit(0.0)))
        .when(F.col("tl_t_at").isNotNull(), F.greatest(t_last - F.col("tl_t_at"), F.lit(0.0)))
        .when(committed_end < leo_first, t_last - t_first)
        .otherwise(F.lit(None))
        .cast("double")
    )
    lower_bound = (
        committed_end.isNotNull()
        & (lag_end > 0)
        & ~F.col("nothing_to_read")
        & F.col("tl_record_t").isNull()
        & F.col("tl_t_at").isNull()
        & (committed_end < leo_first)
    )
    source = (
        F.when(committed_end.isNull(), F.lit(None))
        .when((lag_end <= 0) | F.col("nothing_to_read"), F.lit("caught_up"))
        .when(F.col("tl_record_t").isNotNull() & F.coalesce(F.col("tl_record_after"), F.lit(False)),
              F.lit("next_record"))
        .when(F.col("tl_record_t").isNotNull(), F.lit("record"))
        .when(F.col("tl_t_at").isNotNull(), F.lit("interpolated"))
        .when(committed_end < leo_first, F.lit("lower_bound"))
    )
    return seconds, F.coalesce(lower_bound, F.lit(False)), source


def time_lag_by_partition(snapshots):
    """snapshots -> (cluster, group_id, topic, partition, time_lag_seconds, time_lag_lower_bound)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy(*PARTITION_KEY).orderBy("t")
    wall = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    rows = with_record_columns(snapshots).withColumn("t", F.col("snapshot_ts").cast("double"))
    rows = rows.withColumns(
        {
            "prev_t": F.lag("t").over(w),
            "prev_leo": F.lag("log_end_offset").over(w),
            "c_end": F.last("committed_offset", ignorenulls=True).over(wall),
        }
    )
    rows = rows.withColumns(row_columns())
    agg = rows.groupBy(*PARTITION_KEY).agg(
        F.min("t").alias("t_first"),
        F.max("t").alias("t_last"),
        F.min_by("log_end_offset", "t").alias("leo_first"),
        F.max_by("committed_offset", F.when(F.col("committed_offset").isNotNull(), F.col("t"))).alias("c_end"),
        F.max_by("lag", "t").alias("lag_end"),
        *aggregate_columns(),
    )
    seconds, lower, source = time_lag_expr(F.col("t_first"), F.col("t_last"), F.col("leo_first"), F.col("c_end"),
                                           F.col("lag_end"))
    return agg.select(*PARTITION_KEY, seconds.alias("time_lag_seconds"), lower.alias("time_lag_lower_bound"),
                      source.alias("time_lag_source"))
