"""Features of the offset history, per partition and per (cluster, group, topic).

Pure DataFrame -> DataFrame transforms built from Spark SQL window functions
and aggregations (no Python UDFs): one window sort per partition series, one
shuffle for the group series. Rates are offsets per second over the actual
time between snapshots, so gaps and jitter change nothing but precision.
Early/late are the first and last thirds of each series' own time span.
"""

from __future__ import annotations

from lagdoctor.contracts import INACTIVE_GROUP_STATES, REBALANCING_GROUP_STATES
from lagdoctor.diagnosis import timelag
from lagdoctor.diagnosis.thresholds import Thresholds

PARTITION_KEY = ("cluster", "group_id", "topic", "partition")
GROUP_KEY = ("cluster", "group_id", "topic")


def _ratio(num, den):
    from pyspark.sql import functions as F

    # ANSI mode (Spark 4 default) raises on x/0: guard and use try_divide.
    return F.when(den > 0, F.try_divide(num, den))


def partition_features(snapshots, thresholds: Thresholds = Thresholds()):
    """One row per partition over the window.

    Columns: the key, snapshots, t_first/t_last (epoch s), lag_start, lag_end,
    committed_end, log_end_offset_end, log_start_offset_end, produce_rate,
    consume_rate, late_produce_rate, late_consume_rate, member_id, client_id,
    host (owner at the end), time_lag_seconds, time_lag_lower_bound,
    frozen_seconds / frozen_snapshots (since the committed offset last
    advanced), max_commit_gap_seconds (longest completed gap between
    advances), stalled, slow, retention_loss, status_window (the last
    `thresholds.status_window` snapshots and commit runs, for the Burrow
    evaluator).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    th = thresholds
    w = Window.partitionBy(*PARTITION_KEY).orderBy("t")
    wall = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    wprev = w.rowsBetween(Window.unboundedPreceding, -1)

    rows = snapshots.withColumn("t", F.col("snapshot_ts").cast("double"))
    rows = rows.withColumns(
        {
            "dt": F.col("t") - F.lag("t").over(w),
            "dleo": F.col("log_end_offset") - F.lag("log_end_offset").over(w),
            "dcom": F.col("committed_offset") - F.lag("committed_offset").over(w),
            "s_first": F.first("t").over(wall),
            "s_last": F.last("t").over(wall),
            "n_rows": F.count(F.lit(1)).over(wall),
            "rn": F.row_number().over(w),
            **timelag.row_columns(w, wall),
        }
    )
    rows = rows.withColumns(
        {
            "adv_t": F.when(F.col("dcom") > 0, F.col("t")),
            "x": _ratio(F.col("t") - F.col("s_first"), F.col("s_last") - F.col("s_first")),
        }
    )
    rows = rows.withColumns(
        {
            # time of the latest advance (whole series) and of the previous one (for gaps)
            "last_adv_t": F.coalesce(F.last("adv_t", ignorenulls=True).over(wall), F.col("s_first")),
            "gap": F.when(
                F.col("adv_t").isNotNull(),
                F.col("t") - F.coalesce(F.last("adv_t", ignorenulls=True).over(wprev), F.col("s_first")),
            ),
            "late": F.col("x") > 2.0 / 3.0,
        }
    )
    # The Burrow evaluator's input, without the whole history: the newest
    # `status_window` snapshots (broker offsets, current lag) plus the first
    # and last snapshot of each of the newest `status_window` runs of one
    # committed offset (its commit window). Equivalent for
    # lagdoctor.status.evaluate_partition, a few rows per partition.
    wnext = w.rowsBetween(1, Window.unboundedFollowing)
    committed = F.col("committed_offset")
    prev_c = F.last("committed_offset", ignorenulls=True).over(wprev)
    next_c = F.first("committed_offset", ignorenulls=True).over(wnext)
    rows = rows.withColumns(
        {
            "run_start": committed.isNotNull() & (prev_c.isNull() | (committed != prev_c)),
            "run_end": committed.isNotNull() & (next_c.isNull() | (committed != next_c)),
        }
    )
    rows = rows.withColumn(
        "runs_after", F.coalesce(F.sum(F.col("run_start").cast("int")).over(wnext), F.lit(0))
    )
    keep_for_status = (F.col("n_rows") - F.col("rn") < th.status_window) | (
        (F.col("run_start") | F.col("run_end")) & (F.col("runs_after") < th.status_window)
    )
    committed_t = F.when(F.col("committed_offset").isNotNull(), F.col("t"))
    status_row = F.struct(
        F.unix_micros("snapshot_ts").alias("snapshot_ts_us"),
        F.col("committed_offset").alias("committed_offset"),
        F.col("log_end_offset").alias("log_end_offset"),
        F.col("log_start_offset").alias("log_start_offset"),
        F.col("lag").alias("lag"),
    )
    agg = rows.groupBy(*PARTITION_KEY).agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min("t").alias("t_first"),
        F.max("t").alias("t_last"),
        F.min_by("log_end_offset", "t").alias("leo_first"),
        F.max_by("log_end_offset", "t").alias("log_end_offset_end"),
        F.max_by("log_start_offset", "t").alias("log_start_offset_end"),
        F.min_by("committed_offset", committed_t).alias("c_first"),
        F.max_by("committed_offset", committed_t).alias("committed_end"),
        F.min(committed_t).alias("tc_first"),
        F.max(committed_t).alias("tc_last"),
        F.coalesce(F.min_by("lag", "t"), F.lit(0)).alias("lag_start"),
        F.coalesce(F.max_by("lag", "t"), F.lit(0)).alias("lag_end"),
        F.max_by("member_id", "t").alias("member_id"),
        F.max_by("client_id", "t").alias("client_id"),
        F.max_by("host", "t").alias("host"),
        F.sum(F.when(F.col("late"), F.col("dleo"))).alias("late_produced"),
        F.sum(F.when(F.col("late"), F.col("dcom"))).alias("late_consumed"),
        F.sum(F.when(F.col("late"), F.col("dt"))).alias("late_seconds"),
        F.count(F.when(F.col("late") & (F.col("dcom") > 0), 1)).alias("late_advances"),
        F.max("last_adv_t").alias("last_adv_t"),
        F.count(F.when(F.col("t") > F.col("last_adv_t"), 1)).alias("frozen_snapshots"),
        F.coalesce(F.max("gap"), F.lit(0.0)).alias("max_commit_gap_seconds"),
        F.collect_list(F.when(keep_for_status, status_row)).alias("status_window"),
        *timelag.aggregate_columns(),
    )
    span = F.col("t_last") - F.col("t_first")
    time_lag, lower = timelag.time_lag_expr(
        F.col("t_first"), F.col("t_last"), F.col("leo_first"), F.col("committed_end"), F.col("lag_end")
    )
    feats = agg.withColumns(
        {
            "produce_rate": F.coalesce(_ratio(F.col("log_end_offset_end") - F.col("leo_first"), span), F.lit(0.0)),
            "consume_rate": F.coalesce(
                _ratio(F.col("committed_end") - F.col("c_first"), F.col("tc_last") - F.col("tc_first")), F.lit(0.0)
            ),
            "late_produce_rate": F.coalesce(_ratio(F.col("late_produced"), F.col("late_seconds")), F.lit(0.0)),
            "late_consume_rate": F.coalesce(_ratio(F.col("late_consumed"), F.col("late_seconds")), F.lit(0.0)),
            "frozen_seconds": F.col("t_last") - F.col("last_adv_t"),
            "time_lag_seconds": time_lag,
            "time_lag_lower_bound": lower,
            "retention_loss": F.coalesce(F.col("committed_end") < F.col("log_start_offset_end"), F.lit(False)),
        }
    )
    waiting = (F.col("lag_end") > 0) & F.col("committed_end").isNotNull()
    frozen = (
        waiting
        & (F.col("frozen_seconds") >= th.stall_min_seconds)
        & (F.col("frozen_snapshots") >= th.stall_min_snapshots)
        & (F.col("frozen_seconds") > th.stall_gap_factor * F.col("max_commit_gap_seconds"))
    )
    # Still committing, but a trickle of what arrives (hung handler retrying).
    near_frozen = (
        waiting
        & (F.col("late_advances") >= 2)
        & (F.col("late_seconds") >= th.stall_min_seconds)
        & (F.col("late_produced") > 0)
        & (F.col("late_consumed") < th.near_frozen_ratio * F.col("late_produced"))
        & (F.col("lag_end") > F.col("lag_start"))
    )
    feats = feats.withColumn("stalled", F.coalesce(frozen | near_frozen, F.lit(False)))
    feats = feats.withColumn(
        "slow",
        ~F.col("stalled")
        & (F.col("consume_rate") < (1.0 - th.slow_rate_slack) * F.col("produce_rate"))
        & (F.col("lag_end") > F.col("lag_start")),
    )
    return feats.drop("leo_first", "c_first", "tc_first", "tc_last", "late_produced", "late_consumed",
                      "late_seconds", "late_advances", "last_adv_t", "tl_t_at", "tl_record_t")


def group_series(snapshots):
    """One row per (cluster, group_id, topic, snapshot_ts): the group's totals.

    member_set is a hash of the set of owner member ids (null when nobody
    owns anything), so churn shows as a change of that hash.
    """
    from pyspark.sql import functions as F

    members = F.array_sort(F.collect_set("member_id"))
    return snapshots.groupBy(*GROUP_KEY, "snapshot_ts").agg(
        F.sum(F.coalesce(F.col("lag"), F.lit(0))).alias("total_lag"),
        F.sum("log_end_offset").alias("total_leo"),
        F.max("group_state").alias("group_state"),
        F.max("group_members").alias("group_members"),
        F.when(F.size(members) > 0, F.xxhash64(members)).alias("member_set"),
    )


def group_features(series, thresholds: Thresholds = Thresholds()):
    """Group series -> one row per (cluster, group_id, topic): trend, rates,
    rebalances and the normalized shape statistics the pattern rules read.

    Shape statistics work on y = total_lag / scale, where scale is the
    window's max lag but at least `pattern_min_lag` and `pattern_min_seconds`
    of production (below that the shape is noise), and x = time in [0, 1].
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    th = thresholds
    w = Window.partitionBy(*GROUP_KEY).orderBy("t")
    wall = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    wprev = w.rowsBetween(Window.unboundedPreceding, -1)
    rebalancing = list(REBALANCING_GROUP_STATES)

    s = series.withColumn("t", F.col("snapshot_ts").cast("double"))
    s = s.withColumns(
        {
            "s_first": F.first("t").over(wall),
            "s_last": F.last("t").over(wall),
            "leo_first_all": F.first("total_leo").over(wall),
            "leo_last_all": F.last("total_leo").over(wall),
            "lag_max_all": F.max("total_lag").over(wall),
            "dt": F.col("t") - F.lag("t").over(w),
            "dleo": F.col("total_leo") - F.lag("total_leo").over(w),
            "prev_state": F.lag("group_state").over(w),
            "prev_members": F.last("member_set", ignorenulls=True).over(wprev),
        }
    )
    span = F.col("s_last") - F.col("s_first")
    rate_all = F.coalesce(_ratio(F.col("leo_last_all") - F.col("leo_first_all"), span), F.lit(0.0))
    floor = F.greatest(F.lit(float(th.pattern_min_lag)), rate_all * th.pattern_min_seconds)
    s = s.withColumns(
        {
            "x": F.coalesce(_ratio(F.col("t") - F.col("s_first"), span), F.lit(0.0)),
            "y": F.col("total_lag") / F.greatest(F.col("lag_max_all").cast("double"), floor, F.lit(1.0)),
            "noise_floor": floor,
            "entered_rebalance": F.col("group_state").isin(rebalancing)
            & F.col("prev_state").isNotNull()
            & ~F.col("prev_state").isin(rebalancing),
            "owners_changed": F.col("member_set").isNotNull()
            & F.col("prev_members").isNotNull()
            & (F.col("member_set") != F.col("prev_members")),
            "state_changed": F.col("prev_state").isNotNull() & (F.col("group_state") != F.col("prev_state")),
        }
    )
    s = s.withColumn("dy", F.col("y") - F.lag("y").over(w))
    # rank of each rise among the group's diffs: what share of the total rise
    # do the largest quarter of the steps carry (staircase: nearly all of it)
    by_dy = Window.partitionBy(*GROUP_KEY).orderBy(F.col("dy").desc_nulls_last())
    s = s.withColumns(
        {"dy_rank": F.row_number().over(by_dy), "n_dy": F.count("dy").over(Window.partitionBy(*GROUP_KEY))}
    )
    up = F.greatest(F.col("dy"), F.lit(0.0))
    down = F.greatest(-F.col("dy"), F.lit(0.0))
    early, late = F.col("x") <= 1.0 / 3.0, F.col("x") > 2.0 / 3.0
    middle = ~early & ~late
    g = s.groupBy(*GROUP_KEY).agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min("t").alias("t_first"),
        F.max("t").alias("t_last"),
        F.min_by("total_lag", "t").alias("lag_start"),
        F.max_by("total_lag", "t").alias("lag_end"),
        F.max("total_lag").alias("lag_max"),
        F.min("total_lag").alias("lag_min"),
        F.max_by("group_state", "t").alias("group_state"),
        F.max_by("group_members", "t").alias("group_members"),
        F.sum(F.col("entered_rebalance").cast("int")).alias("rebalance_entries"),
        F.sum(F.col("owners_changed").cast("int")).alias("owner_changes"),
        F.sum(F.col("state_changed").cast("int")).alias("state_changes"),
        F.first("noise_floor").alias("noise_floor"),
        F.sum(F.when(early, F.col("dleo"))).alias("early_produced"),
        F.sum(F.when(early, F.col("dt"))).alias("early_seconds"),
        F.sum(F.when(late, F.col("dleo"))).alias("late_produced"),
        F.sum(F.when(late, F.col("dt"))).alias("late_seconds"),
        # linear fit of lag on x in [0, 1]: slope is the fitted rise over the window
        F.covar_pop("x", "total_lag").alias("cov_xl"),
        F.var_pop("x").alias("var_x"),
        F.corr("x", "total_lag").alias("corr_xl"),
        # shape of y
        F.min_by("y", "t").alias("y_start"),
        F.max_by("y", "t").alias("y_end"),
        F.max("y").alias("y_max"),
        F.min("y").alias("y_min"),
        F.avg("y").alias("y_mean"),
        F.avg(F.when(early, F.col("y"))).alias("y_early"),
        F.avg(F.when(middle, F.col("y"))).alias("y_middle"),
        F.avg(F.when(late, F.col("y"))).alias("y_late"),
        (F.max(F.when(late, F.col("y"))) - F.min(F.when(late, F.col("y")))).alias("y_late_range"),
        F.avg((F.col("y") < 0.25).cast("double")).alias("low_fraction"),
        F.sum(up).alias("up"),
        F.sum(down).alias("down"),
        F.sum(up * up).alias("up_sq"),
        F.sum(down * down).alias("down_sq"),
        F.count("dy").alias("diffs"),
        F.sum(F.when(F.col("dy_rank") <= F.ceil(F.col("n_dy") / 4.0), up)).alias("top_quarter_up"),
        F.count(F.when(F.col("dy") < -0.3, 1)).alias("sharp_drops"),
        F.count(F.when(F.col("dy") > 0.3, 1)).alias("sharp_rises"),
    )
    span_g = F.col("t_last") - F.col("t_first")
    return g.select(
        *GROUP_KEY,
        "snapshots",
        "t_first",
        "t_last",
        "lag_start",
        "lag_end",
        "lag_max",
        "lag_min",
        "group_state",
        "group_members",
        F.greatest(F.col("rebalance_entries"), F.col("owner_changes")).alias("rebalances"),
        "rebalance_entries",
        "owner_changes",
        "state_changes",
        F.coalesce(_ratio(F.col("early_produced"), F.col("early_seconds")), F.lit(0.0)).alias("early_produce_rate"),
        F.coalesce(_ratio(F.col("late_produced"), F.col("late_seconds")), F.lit(0.0)).alias("late_produce_rate"),
        F.coalesce(_ratio(F.col("cov_xl"), F.col("var_x")), F.lit(0.0)).alias("lag_growth"),
        F.coalesce(F.col("corr_xl") * F.col("corr_xl"), F.lit(0.0)).alias("lag_r2"),
        (F.col("lag_max") < F.col("noise_floor")).alias("below_noise_floor"),
        "y_start",
        "y_end",
        "y_max",
        "y_min",
        "y_mean",
        "y_early",
        "y_middle",
        "y_late",
        "y_late_range",
        "low_fraction",
        "up",
        "down",
        # share of the diffs that effectively carry the rises / falls:
        # ~1 for a smooth ramp, small when a few jumps do all the work
        F.coalesce(_ratio(_ratio(F.col("up") * F.col("up"), F.col("up_sq")), F.col("diffs").cast("double")), F.lit(0.0)).alias(
            "up_spread"
        ),
        F.coalesce(
            _ratio(_ratio(F.col("down") * F.col("down"), F.col("down_sq")), F.col("diffs").cast("double")), F.lit(0.0)
        ).alias("down_spread"),
        F.coalesce(_ratio(F.col("top_quarter_up"), F.col("up")), F.lit(0.0)).alias("top_quarter_rise_share"),
        "sharp_drops",
        "sharp_rises",
        span_g.alias("window_seconds"),
    )
