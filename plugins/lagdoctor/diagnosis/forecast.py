"""Forecasts: when the lag clears, and when retention deletes what the group has not read.

Per partition, from the window's own rates (the last third of it, as the
rules read "now"), then rolled up per (cluster, group, topic):

catch_up      caught_up   lag 0
              clearing    consumed faster than produced: seconds = lag / (consume - produce)
              never       consumed no faster than produced (a crashed group consumes nothing)
              unknown     the lag at the end is unknown, fewer than 2 snapshots, or the
                          commit is above the log end (classify.py case 10: the group
                          reads nothing until it resets)
data_loss     already     committed offset below the log start (retention_loss_partitions)
              at_risk     an estimate reaches the group's position at current rates:
                          log_start     the log start offset moves faster than the group
                                        consumes: (committed - log start) / (start rate - consume)
                          retention_ms  the time lag grows at 1 - consume/produce per second and
                                        meets retention.ms: (retention - time lag) / that growth
                          `seconds` is the sooner; retention deletes whole segments, so the
                          retention_ms estimate is the earliest deletion can start
              safe        an estimate exists and neither reaches the group (retention.ms and
                          retention.bytes -1: never)
              not_applicable  the topic is compacted only (cleanup.policy compact, no delete):
                          retention.ms deletes nothing, so no estimate from it; a log start
                          that moves (DeleteRecords) still gives at_risk, a commit below it already
              unknown     no retention known and the log start did not move in the window

The rollup reads the worst partition: never > unknown > clearing > caught_up
(the longest clearing time), and already > at_risk > unknown > safe (the
soonest loss). A group at risk within the window's length is critical.
"""

from __future__ import annotations

CATCH_UP_ORDER = ("caught_up", "clearing", "unknown", "never")
DATA_LOSS_ORDER = ("not_applicable", "safe", "unknown", "at_risk", "already")
COMPACTED_BASIS = "compacted topic: retention.ms does not delete unread records"


INPUT_COLUMNS = (("retention_ms", "bigint"), ("retention_bytes", "bigint"), ("cleanup_policy", "string"))


def with_input_columns(snapshots):
    """Rows from a writer that did not read retention: retention_ms/bytes, cleanup_policy null (unknown)."""
    from pyspark.sql import functions as F

    missing = {name: F.lit(None).cast(kind) for name, kind in INPUT_COLUMNS if name not in snapshots.columns}
    return snapshots.withColumns(missing) if missing else snapshots


def aggregate_columns():
    """Per-partition aggregates over the history rows (needs t)."""
    from pyspark.sql import functions as F

    ls_t = F.when(F.col("log_start_offset").isNotNull(), F.col("t"))
    return [
        F.min_by("log_start_offset", ls_t).alias("fc_ls_first"),
        F.min(ls_t).alias("fc_ls_t_first"),
        F.max(ls_t).alias("fc_ls_t_last"),
        F.max_by("retention_ms", F.when(F.col("retention_ms").isNotNull(), F.col("t"))).alias("retention_ms"),
        F.max_by("retention_bytes", F.when(F.col("retention_bytes").isNotNull(), F.col("t"))).alias(
            "retention_bytes"
        ),
        F.max_by("cleanup_policy", F.when(F.col("cleanup_policy").isNotNull(), F.col("t"))).alias("cleanup_policy"),
    ]


def compacted_only(policy):
    """cleanup.policy lists compact and not delete (null policy: false, unknown is not compacted)."""
    from pyspark.sql import functions as F

    parts = F.transform(F.split(F.lower(policy), ","), lambda p: F.trim(p))
    return F.coalesce(F.array_contains(parts, "compact") & ~F.array_contains(parts, "delete"), F.lit(False))


def partition_columns():
    """{name: Column} per partition; needs the features' lag_end, lag_end_unknown,
    committed_end, log_start_offset_end, late rates, time_lag_seconds, retention_loss, commit_above."""
    from pyspark.sql import functions as F

    c, p = F.col("late_consume_rate"), F.col("late_produce_rate")
    lag = F.col("lag_end")
    catch_state = (
        F.when(F.col("lag_end_unknown") | lag.isNull() | (F.col("snapshots") < 2)
               | F.coalesce(F.col("commit_above"), F.lit(False)), F.lit("unknown"))
        .when(lag <= 0, F.lit("caught_up"))
        .when(c > p, F.lit("clearing"))
        .otherwise(F.lit("never"))
    )
    catch_seconds = F.when(catch_state == "clearing", F.try_divide(lag, c - p))

    span = F.col("fc_ls_t_last") - F.col("fc_ls_t_first")
    ls_rate = F.when(span > 0, F.try_divide(F.col("log_start_offset_end") - F.col("fc_ls_first"), span))
    margin = F.col("committed_end") - F.col("log_start_offset_end")
    by_log_start = F.when(
        (margin >= 0) & (ls_rate > c), F.try_divide(margin, ls_rate - c)
    )
    retention_s = F.col("retention_ms") / 1000.0
    growth = F.when(p > 0, 1.0 - F.try_divide(c, p)).when(c <= 0, F.lit(1.0)).otherwise(F.lit(0.0))
    tl = F.col("time_lag_seconds")
    compacted = compacted_only(F.col("cleanup_policy"))
    by_time = F.when(
        ~compacted & (F.col("retention_ms") > 0) & tl.isNotNull() & (lag > 0),
        F.when(tl >= retention_s, F.lit(0.0)).when(growth > 0, (retention_s - tl) / growth),
    )
    seconds = F.least(by_log_start, by_time)  # least skips nulls
    basis = F.when(seconds.isNull(), F.lit(None)).when(
        by_log_start.isNotNull() & (by_time.isNull() | (by_log_start <= by_time)), F.lit("log_start")
    ).otherwise(F.lit("retention_ms"))
    known = F.col("retention_ms").isNotNull() | (F.coalesce(ls_rate, F.lit(0.0)) > 0)
    loss_state = (
        F.when(F.col("retention_loss"), F.lit("already"))
        .when(seconds.isNotNull(), F.lit("at_risk"))
        .when(compacted, F.lit("not_applicable"))
        .when(F.col("committed_end").isNotNull() & known, F.lit("safe"))
        .otherwise(F.lit("unknown"))
    )
    return {
        "catch_up_state": catch_state,
        "catch_up_seconds": catch_seconds.cast("double"),
        "data_loss_state": loss_state,
        "data_loss_seconds": F.when(loss_state == "at_risk", seconds).cast("double"),
        "data_loss_basis": F.when(loss_state == "at_risk", basis).when(
            loss_state == "not_applicable", F.lit(COMPACTED_BASIS)
        ),
    }


def _rank(column, order):
    from pyspark.sql import functions as F

    return F.array_position(F.array(*[F.lit(x) for x in order]), column)


def rollup_columns():
    """Group aggregates over partition features (for classify.partition_rollup)."""
    from pyspark.sql import functions as F

    catch_rank = _rank(F.col("catch_up_state"), CATCH_UP_ORDER)
    loss_rank = _rank(F.col("data_loss_state"), DATA_LOSS_ORDER)
    return [
        F.max(catch_rank).alias("fc_catch_rank"),
        F.max(F.when(F.col("catch_up_state") == "clearing", F.col("catch_up_seconds"))).alias("fc_catch_seconds"),
        F.max(loss_rank).alias("fc_loss_rank"),
        F.min_by(F.struct("data_loss_seconds", "data_loss_basis"), F.col("data_loss_seconds")).alias("fc_loss_first"),
        F.array_sort(
            F.collect_list(F.when(F.col("data_loss_state").isin("already", "at_risk"), F.col("partition")))
        ).alias("fc_loss_partitions"),
        F.max("retention_ms").alias("retention_ms"),
        F.max("retention_bytes").alias("retention_bytes"),
        F.max("cleanup_policy").alias("cleanup_policy"),
    ]


def evidence_columns():
    """(catch_up, data_loss) evidence structs from rollup_columns' output."""
    from pyspark.sql import functions as F

    catch_state = F.element_at(F.array(*[F.lit(x) for x in CATCH_UP_ORDER]), F.col("fc_catch_rank").cast("int"))
    catch_state = F.coalesce(catch_state, F.lit("unknown"))
    catch_up = F.struct(
        catch_state.alias("state"),
        F.when(catch_state == "clearing", F.round(F.col("fc_catch_seconds"), 1)).alias("seconds"),
    )
    loss_state = F.element_at(F.array(*[F.lit(x) for x in DATA_LOSS_ORDER]), F.col("fc_loss_rank").cast("int"))
    loss_state = F.coalesce(loss_state, F.lit("unknown"))
    at_risk = loss_state == "at_risk"
    data_loss = F.struct(
        loss_state.alias("state"),
        F.when(at_risk, F.round(F.col("fc_loss_first")["data_loss_seconds"], 1)).alias("seconds"),
        F.coalesce(F.col("fc_loss_partitions"), F.array().cast("array<int>")).alias("partitions"),
        F.col("retention_ms").alias("retention_ms"),
        F.col("retention_bytes").alias("retention_bytes"),
        F.when(at_risk, F.col("fc_loss_first")["data_loss_basis"])
        .when(loss_state == "not_applicable", F.lit(COMPACTED_BASIS))
        .alias("basis"),
        F.col("cleanup_policy").alias("cleanup_policy"),
    )
    return catch_up, data_loss


def loses_data_within(seconds_column):
    """True when unread data is deleted within `seconds_column` (the window's length)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.col("fc_loss_first")["data_loss_seconds"] <= seconds_column, F.lit(False))
