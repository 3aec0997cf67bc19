"""Forecasts: when the lag clears, and when retention deletes what the group has not read.

Per partition, from the window's own rates (the last third of it, as the
rules read "now"), then rolled up per (cluster, group, topic):

catch_up      caught_up   the lag is not real (F1): 0, or within noise
              clearing    consumed faster than produced by more than the band (F2):
                          seconds = lag / (consume - produce)
              steady      consume and produce within the band of each other (F2): the lag
                          holds at current rates, neither clears nor grows
              never       consumed slower than produced by more than the band (F2)
                          (a crashed group consumes nothing)
              unknown     the lag at the end is unknown, fewer than 2 snapshots, or the
                          commit is above the log end (classify.py case 10: the group
                          reads nothing until it resets)
data_loss     already     committed offset below the log start (retention_loss_partitions)
              at_risk     real lag (F1) and an estimate that reaches the group's position
                          sooner than the horizon (F3), at current rates:
                          log_start     the log start offset moves faster than the group
                                        consumes: (committed - log start) / (start rate - consume)
                          retention_ms  the time lag grows at 1 - consume/produce per second and
                                        meets retention.ms: (retention - time lag) / that growth
                          `seconds` is the sooner; retention deletes whole segments, so the
                          retention_ms estimate is the earliest deletion can start
              safe        an estimate exists and neither reaches the group (retention.ms and
                          retention.bytes -1: never), the lag is within noise, or the
                          estimate lies beyond the horizon (basis "beyond_horizon", F3)
              not_applicable  the topic is compacted only (cleanup.policy compact, no delete):
                          retention.ms deletes nothing, so no estimate from it; a log start
                          that moves (DeleteRecords) still gives at_risk, a commit below it already
              unknown     no retention known and the log start did not move in the window

Cases (the numbered rules of the forecasts; classify.py case 17 reads them):

 #  case                 holds when                                              so
F1  real lag             lag > forecast_min_lag and > forecast_noise_seconds of   below it the partition is caught up
                         the partition's own late produce rate                    (within noise): never at_risk, never
                                                                                  "never"; a group keeping up shows a
                                                                                  commit interval of records (lag 0-8
                                                                                  at 13 msg/s flipped [1] <-> [0, 1, 2]
                                                                                  between sweeps, seen live)
F2  noise band           |consume - produce| <= band = max(slow_rate_slack x      steady: "lag holding steady at
                         produce, the noise lag (F1) / the late third's seconds)  current rates", not never (39.9 of
                                                                                  40.0 msg/s read "never" for a lag
                                                                                  of 4); clearing and never need the
                                                                                  rates apart by more than the band
F3  horizon              an estimate at or beyond least(retention.ms,             safe, basis "beyond_horizon": rates
                         forecast_max_horizon_seconds)                            that hold for a week are no forecast
                                                                                  (a lag of 96 read "at risk in
                                                                                  ~382d03h"); horizon_seconds says
                                                                                  which bound applied

The rollup reads the worst partition: never > unknown > steady > clearing > caught_up
(the longest clearing time), and already > at_risk > unknown > safe (the
soonest loss). A group at risk within the window's length is critical.
"""

from __future__ import annotations

from lagdoctor.diagnosis.thresholds import Thresholds

CATCH_UP_ORDER = ("caught_up", "clearing", "steady", "unknown", "never")
DATA_LOSS_ORDER = ("not_applicable", "safe", "unknown", "at_risk", "already")
COMPACTED_BASIS = "compacted topic: retention.ms does not delete unread records"
BEYOND_HORIZON = "beyond_horizon"  # F3: safe, the estimate lies beyond the horizon


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


def partition_columns(thresholds: Thresholds = Thresholds()):
    """{name: Column} per partition; needs the features' lag_end, lag_end_unknown,
    committed_end, log_start_offset_end, late rates, late_seconds, time_lag_seconds,
    retention_loss, commit_above."""
    from pyspark.sql import functions as F

    th = thresholds
    c, p = F.col("late_consume_rate"), F.col("late_produce_rate")
    lag = F.col("lag_end")
    # F1: the lag a group that keeps up shows anyway (a commit interval, the read race)
    noise_lag = F.greatest(F.lit(float(th.forecast_min_lag)), p * th.forecast_noise_seconds)
    real = F.coalesce(lag > noise_lag, F.lit(False))
    # F2: rates closer than this are the same rate (the noise lag spread over the late third
    # is what sampled offsets can tell apart)
    band = F.greatest(
        F.lit(th.slow_rate_slack) * p,
        F.coalesce(F.when(F.col("late_seconds") > 0, F.try_divide(noise_lag, F.col("late_seconds"))), F.lit(0.0)),
    )
    catch_state = (
        F.when(F.col("lag_end_unknown") | lag.isNull() | (F.col("snapshots") < 2)
               | F.coalesce(F.col("commit_above"), F.lit(False)), F.lit("unknown"))
        .when(~real, F.lit("caught_up"))
        .when(c > p + band, F.lit("clearing"))
        .when(c < p - band, F.lit("never"))
        .otherwise(F.lit("steady"))
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
    # F3: no forecast past the topic's retention, nor past the named horizon
    horizon = F.least(F.when(F.col("retention_ms") > 0, retention_s), F.lit(float(th.forecast_max_horizon_seconds)))
    at_risk = real & F.coalesce(seconds < horizon, F.lit(False))
    beyond = real & F.coalesce(seconds >= horizon, F.lit(False))
    known = F.col("retention_ms").isNotNull() | (F.coalesce(ls_rate, F.lit(0.0)) > 0) | seconds.isNotNull()
    loss_state = (
        F.when(F.col("retention_loss"), F.lit("already"))
        .when(at_risk, F.lit("at_risk"))
        .when(compacted, F.lit("not_applicable"))
        .when(F.col("committed_end").isNotNull() & known, F.lit("safe"))
        .otherwise(F.lit("unknown"))
    )
    return {
        "catch_up_state": catch_state,
        "catch_up_seconds": catch_seconds.cast("double"),
        "data_loss_state": loss_state,
        "data_loss_seconds": F.when(loss_state == "at_risk", seconds).cast("double"),
        "data_loss_basis": F.when(loss_state == "at_risk", basis)
        .when(loss_state == "not_applicable", F.lit(COMPACTED_BASIS))
        .when((loss_state == "safe") & beyond, F.lit(BEYOND_HORIZON)),
        "data_loss_horizon_seconds": horizon.cast("double"),
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
        F.max(F.col("data_loss_basis") == BEYOND_HORIZON).alias("fc_loss_beyond"),
        F.min("data_loss_horizon_seconds").alias("fc_horizon_seconds"),
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
        .when((loss_state == "safe") & F.coalesce(F.col("fc_loss_beyond"), F.lit(False)), F.lit(BEYOND_HORIZON))
        .alias("basis"),
        F.col("cleanup_policy").alias("cleanup_policy"),
        F.col("fc_horizon_seconds").alias("horizon_seconds"),
    )
    return catch_up, data_loss


def loses_data_within(seconds_column):
    """True when unread data is deleted within `seconds_column` (the window's length)."""
    from pyspark.sql import functions as F

    return F.coalesce(F.col("fc_loss_first")["data_loss_seconds"] <= seconds_column, F.lit(False))
