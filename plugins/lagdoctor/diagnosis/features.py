"""Features of the offset history, per partition and per (cluster, group, topic).

Pure DataFrame -> DataFrame transforms: each partition series is sorted once
and aggregated in one vectorised pass over Arrow batches (series.py; the Spark
SQL windows of partition_aggregates_sql are the reference it equals), then
Spark SQL aggregations; one shuffle for the group series. Rates are offsets
per second over the actual time between snapshots, so gaps and jitter change nothing but precision.
Early/late are the first and last thirds of each series' own time span.

Unknown is never zero: a row whose read failed (`read_error` set) has null
offsets and lag; features use the last known value and say the end is unknown
(`lag_end_unknown`) instead of reading the gap as "caught up". A log end
offset that falls (topic recreated or truncated) starts a new series: every
feature counts from the last such reset (`offset_reset_t`).
"""

from __future__ import annotations

from lagdoctor.contracts import INACTIVE_GROUP_STATES, REBALANCING_GROUP_STATES
from lagdoctor.diagnosis import forecast, timelag
from lagdoctor.diagnosis.thresholds import Thresholds

PARTITION_KEY = ("cluster", "group_id", "topic", "partition")
GROUP_KEY = ("cluster", "group_id", "topic")
# Which code computes the per-partition aggregates: "arrow" (lagdoctor.diagnosis.series,
# vectorised over Arrow batches) or "sql" (Spark SQL windows, the reference).
FEATURES_ENGINE_ENV = "LAGDOCTOR_FEATURES_ENGINE"
FEATURES_ENGINES = ("arrow", "sql")


def features_engine() -> str:
    """The engine LAGDOCTOR_FEATURES_ENGINE names (default arrow); ValueError (one line) for another."""
    import os

    name = os.environ.get(FEATURES_ENGINE_ENV, "").strip().lower() or "arrow"
    if name not in FEATURES_ENGINES:
        raise ValueError(f"{FEATURES_ENGINE_ENV}={name!r}: expected one of {', '.join(FEATURES_ENGINES)}")
    return name


def _ratio(num, den):
    from pyspark.sql import functions as F

    # ANSI mode (Spark 4 default) raises on x/0: guard and use try_divide.
    return F.when(den > 0, F.try_divide(num, den))


def _with_read_error(snapshots):
    """Rows from a writer without the optional read_error column: every read succeeded."""
    from pyspark.sql import functions as F

    if "read_error" in snapshots.columns:
        return snapshots
    return snapshots.withColumn("read_error", F.lit(None).cast("string"))


def _with_stable_offset(snapshots):
    """Rows from a writer that did not read the last stable offset: unknown (null), so
    no transaction is ever inferred from them."""
    from pyspark.sql import functions as F

    if "last_stable_offset" in snapshots.columns:
        return snapshots
    return snapshots.withColumn("last_stable_offset", F.lit(None).cast("bigint"))


def _partition_hash():
    from pyspark.sql import functions as F

    return F.xxhash64(*PARTITION_KEY)


def partition_features(snapshots, thresholds: Thresholds = Thresholds(), *, engine: str | None = None):
    """One row per partition over the window.

    Columns: the key, snapshots, t_first/t_last (epoch s), lag_start, lag_end,
    committed_end, log_end_offset_end, log_start_offset_end, produce_rate,
    consume_rate, late_produce_rate, late_consume_rate, early_produce_rate,
    early_consume_rate (first third), baseline_produce_rate and
    baseline_consume_rate (before the lag first passed baseline_lag_share of
    its maximum, when that spans baseline_min_seconds; else the first third),
    stuck_episodes (commit runs of a stuck record that left their backlog
    behind: the steps of a staircase), member_id, client_id,
    host (owner at the end), time_lag_seconds, time_lag_lower_bound,
    time_lag_source, committed_record (the record at the committed offset at
    the last snapshot, when the collector read it), retention_ms,
    retention_bytes, catch_up_state/seconds and data_loss_state/seconds/basis
    (forecast.py),
    frozen_seconds / frozen_snapshots (since the committed offset last
    advanced), max_commit_gap_seconds (longest completed gap between
    advances), stalled, slow, retention_loss, status_window (the last
    `thresholds.status_window` snapshots and commit runs, for the Burrow
    evaluator), read_error (of the last row), lag_end_unknown (the last row's
    lag is null because a read failed: lag_end is then the last known lag,
    null if none), offset_reset_t (epoch s of the last fall of the log end
    offset; the rows before it are ignored), commit_above (a commit far above
    the log end: more than reset_commit_slack and reset_race_seconds of
    production, which the read race cannot explain), offset_reset (either).
    """
    from pyspark.sql import functions as F

    th = thresholds
    snapshots = forecast.with_input_columns(
        timelag.with_record_columns(_with_stable_offset(_with_read_error(snapshots))))
    if (engine or features_engine()) == "arrow":
        from lagdoctor.diagnosis import series

        # one pass: the names and the owner at the last row come out of it too
        agg = series.partition_aggregates(_series_rows(snapshots, OWNER_COLUMNS), th)
        feats = _partition_columns(agg, th)
        return feats.select(*OWNER_COLUMNS, *(c for c in feats.columns if c not in OWNER_COLUMNS and c != "pk"))
    # The SQL windows sort rows that carry a 64-bit hash of the partition key and
    # numbers only; names and owners come from an aggregation on the same hash,
    # joined back once the history is down to one row per partition.
    feats = _partition_columns(partition_aggregates_sql(_series_rows(snapshots), th), th)
    # Grouped by the hash, not the four names: every row is sorted on one long
    # (the names' sort prefix is the cluster's, the same on every row).
    owners = snapshots.groupBy(_partition_hash().alias("pk")).agg(
        *(F.first(k).alias(k) for k in PARTITION_KEY),
        F.max_by("member_id", "snapshot_ts").alias("member_id"),
        F.max_by("client_id", "snapshot_ts").alias("client_id"),
        F.max_by("host", "snapshot_ts").alias("host"),
    )
    return owners.join(feats, "pk").drop("pk")


def window_partition_features(snapshots, ends_us: list[int], window_us: int, thresholds: Thresholds = Thresholds()):
    """partition_features of every sweep ending at `ends_us` (epoch µs), each over its own window
    [end - window, end], in one pass (the backtest): each row reaches its partition's task once
    and is copied into its windows there. The cluster is labelled "<end µs>|<cluster>"
    (replay.relabel's label), so the rows are the ones partition_features gives for each sweep alone."""
    from lagdoctor.diagnosis import series

    th = thresholds
    snapshots = forecast.with_input_columns(
        timelag.with_record_columns(_with_stable_offset(_with_read_error(snapshots))))
    agg = series.window_aggregates(_series_rows(snapshots, OWNER_COLUMNS), th, ends_us, window_us)
    feats = _partition_columns(agg, th)
    return feats.select(*OWNER_COLUMNS, *(c for c in feats.columns if c not in OWNER_COLUMNS and c != "pk"))


# The partition's names and its owner at the last snapshot, first in partition_features' rows.
OWNER_COLUMNS = (*PARTITION_KEY, "member_id", "client_id", "host")


def _series_rows(snapshots, carried: tuple[str, ...] = ()):
    """The history rows the per-partition aggregates read: a 64-bit hash of the key,
    the numbers, and the `carried` columns as they are."""
    from pyspark.sql import functions as F

    # A row that cannot show a stuck consumer: the group is rebalancing, nobody owns the
    # partition while members are live, or nothing waits (lag 0 or unknown).
    unsettled = (
        F.col("group_state").isin(list(REBALANCING_GROUP_STATES))
        | (F.col("member_id").isNull() & (F.coalesce(F.col("group_members"), F.lit(0)) > 0))
        | ~F.coalesce(F.col("lag") > 0, F.lit(False))
    )
    return snapshots.select(
        _partition_hash().alias("pk"),
        F.col("snapshot_ts").cast("double").alias("t"),
        "snapshot_ts",
        "log_start_offset",
        "log_end_offset",
        "last_stable_offset",
        "committed_offset",
        "lag",
        *(name for name, _ in timelag.RECORD_COLUMNS),
        *(name for name, _ in forecast.INPUT_COLUMNS),
        "read_error",
        unsettled.cast("int").alias("unsettled"),
        *carried,
    )


def partition_aggregates_sql(rows, th: Thresholds):
    """The per-partition aggregates as Spark SQL windows (the reference for series.py)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("pk").orderBy("t")
    wall = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    wprev = w.rowsBetween(Window.unboundedPreceding, -1)
    # Two window layers over one sort. Layer 1 reads only input columns (each
    # window expression once: Spark does not deduplicate them); layer 2 needs
    # layer 1's outputs. No "following" frames: Spark recomputes those for
    # every row (O(n^2) per partition).
    committed = F.col("committed_offset")
    # The series restarts where the log end offset last fell below the last
    # known one (same window spec: the sort below is shared, not repeated).
    rows = rows.withColumn(
        "leo_fell", F.col("log_end_offset") < F.last("log_end_offset", ignorenulls=True).over(wprev)
    )
    rows = rows.withColumn("offset_reset_t", F.max(F.when(F.col("leo_fell"), F.col("t"))).over(wall))
    rows = rows.where(F.col("offset_reset_t").isNull() | (F.col("t") >= F.col("offset_reset_t")))
    rows = rows.withColumns(
        {
            "prev_t": F.lag("t").over(w),
            "prev_leo": F.lag("log_end_offset").over(w),
            "prev_com": F.lag("committed_offset").over(w),
            "prev_lag": F.lag("lag").over(w),
            "prev_leo_for_stuck": F.lag("log_end_offset").over(w),
            "lag_max_p": F.max("lag").over(wall),
            "next_com": F.lead("committed_offset").over(w),
            "prev_lso": F.lag("last_stable_offset").over(w),
            "lso_last": F.last("last_stable_offset", ignorenulls=True).over(wall),
            "s_first": F.first("t").over(wall),
            "s_last": F.last("t").over(wall),
            "c_end": F.last("committed_offset", ignorenulls=True).over(wall),
            "n_rows": F.count(F.lit(1)).over(wall),
            "rn": F.row_number().over(w),
        }
    )
    rows = rows.withColumns(
        {
            "dt": F.col("t") - F.col("prev_t"),
            "dleo": F.col("log_end_offset") - F.col("prev_leo"),
            "dcom": committed - F.col("prev_com"),
            "dlso": F.col("last_stable_offset") - F.col("prev_lso"),
            "x": _ratio(F.col("t") - F.col("s_first"), F.col("s_last") - F.col("s_first")),
            **timelag.row_columns(),
            # runs of one committed offset: Burrow's commit window is made of them
            # (a null next to a run ends it: at worst one row more for the evaluator)
            "run_start": committed.isNotNull() & (F.col("prev_com").isNull() | (committed != F.col("prev_com"))),
            "run_end": committed.isNotNull() & (F.col("next_com").isNull() | (committed != F.col("next_com"))),
            # the lag has passed baseline_lag_share of its maximum (at this row or before): the
            # rows before are the baseline, the load the consumer kept up with before it fell behind
            "risen": F.coalesce(F.max(F.col("lag") > th.baseline_lag_share * F.col("lag_max_p")).over(
                w.rowsBetween(Window.unboundedPreceding, 0)), F.lit(False)),
            "unsettled_cum": F.sum("unsettled").over(w.rowsBetween(Window.unboundedPreceding, 0)),
        }
    )
    rows = rows.withColumns(
        {
            "adv_t": F.when(F.col("dcom") > 0, F.col("t")),
            "lso_adv_t": F.when(F.col("dlso") > 0, F.col("t")),
            "late": F.col("x") > 2.0 / 3.0,
            "starts": F.col("run_start").cast("int"),
        }
    )
    rows = rows.withColumns(
        {
            # the same for the last stable offset: how long transactions normally hold it
            "lso_gap": F.when(
                F.col("lso_adv_t").isNotNull(),
                F.col("t") - F.coalesce(F.last("lso_adv_t", ignorenulls=True).over(wprev), F.col("s_first")),
            ),
            "runs_after": F.sum("starts").over(wall) - F.sum("starts").over(w.rowsBetween(Window.unboundedPreceding, 0)),
            # the commit run that this advance ends: since the previous advance (or the first row)
            "run_rn": F.coalesce(F.last(F.when(F.col("dcom") > 0, F.col("rn")), ignorenulls=True).over(wprev),
                                 F.lit(1)),
            "run_t": F.coalesce(F.last("adv_t", ignorenulls=True).over(wprev), F.col("s_first")),
            "run_unsettled": F.coalesce(
                F.last(F.when(F.col("dcom") > 0, F.col("unsettled_cum")), ignorenulls=True).over(wprev), F.lit(0)),
            # the baseline without its last interval, which may hold the rise's first seconds
            "base_row": ~F.col("risen") & ~F.coalesce(F.lead("risen").over(w), F.lit(False)),
        }
    )
    # The commit gap this advance ends. A run seen at one snapshot only (the commit moved
    # at every sample) is no gap: the time between two snapshots is the sampling's, and a
    # sweep's samples come in bursts minutes apart, which would hide a stall for twice that.
    # A run seen standing at two or more snapshots is a committer that waits: its gap
    # counts up to this advance (unseen time included), so a batch committer that slips
    # past one burst of samples is not called stalled.
    rows = rows.withColumn(
        "gap",
        F.when(F.col("adv_t").isNotNull(),
               F.when(F.col("rn") - F.col("run_rn") >= 2, F.col("t") - F.col("run_t")).otherwise(F.lit(0.0))),
    )
    # A stuck episode (a staircase's step): the commit stood still for stall_min_seconds and
    # stall_min_snapshots while the partition was owned, the group settled and data waited at
    # every row, and when it moved on the backlog stayed (at least half of it): a batch
    # committer's commit clears it, a consumer that got past a stuck record does not.
    rows = rows.withColumn(
        "stuck_episode",
        (F.col("dcom") > 0)
        & (F.col("prev_t") - F.col("run_t") >= th.stall_min_seconds)
        & (F.col("rn") - 1 - F.col("run_rn") >= th.stall_min_snapshots)
        & (F.col("unsettled_cum") - F.col("unsettled") - F.col("run_unsettled") == 0)
        & (F.col("prev_lag") > 0)
        & (F.col("lag") >= 0.5 * F.col("prev_lag"))
        # it moved on without passing what already waited: a batch commit passes it
        & (committed < F.col("prev_leo_for_stuck")),
    )
    # The Burrow evaluator's input, without the whole history: the newest
    # `status_window` snapshots (broker offsets, current lag) plus the first
    # and last snapshot of each of the newest `status_window` runs of one
    # committed offset (its commit window). Equivalent for
    # lagdoctor.status.evaluate_partition, a few rows per partition.
    keep_for_status = (F.col("n_rows") - F.col("rn") < th.status_window) | (
        (F.col("run_start") | F.col("run_end")) & (F.col("runs_after") < th.status_window)
    )
    # the committed offset has stood at c_end since the first row holding it
    at_end = committed == F.col("c_end")
    committed_t = F.when(F.col("committed_offset").isNotNull(), F.col("t"))
    leo_t = F.when(F.col("log_end_offset").isNotNull(), F.col("t"))
    lag_t = F.when(F.col("lag").isNotNull(), F.col("t"))
    status_row = F.struct(
        F.unix_micros("snapshot_ts").alias("snapshot_ts_us"),
        F.col("committed_offset").alias("committed_offset"),
        F.col("log_end_offset").alias("log_end_offset"),
        F.col("log_start_offset").alias("log_start_offset"),
        F.col("lag").alias("lag"),
    )
    recent = (F.col("n_rows") - F.col("rn") < th.stall_min_snapshots) | (
        F.col("t") > F.col("s_last") - th.stall_min_seconds)
    agg = rows.groupBy("pk").agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min("t").alias("t_first"),
        F.max("t").alias("t_last"),
        F.min_by("log_end_offset", leo_t).alias("leo_first"),
        F.max_by("log_end_offset", leo_t).alias("log_end_offset_end"),
        F.max_by("log_start_offset", F.when(F.col("log_start_offset").isNotNull(), F.col("t"))).alias(
            "log_start_offset_end"
        ),
        F.min(leo_t).alias("tl_first"),
        F.max(leo_t).alias("tl_last"),
        F.min_by("committed_offset", committed_t).alias("c_first"),
        F.max_by("committed_offset", committed_t).alias("committed_end"),
        F.min(committed_t).alias("tc_first"),
        F.max(committed_t).alias("tc_last"),
        F.coalesce(F.min_by("lag", lag_t), F.lit(0)).alias("lag_start"),
        F.max("lag").alias("lag_peak"),
        F.max_by("lag", lag_t).alias("lag_known_end"),
        F.max_by("read_error", "t").alias("read_error"),
        F.max_by(F.col("lag").isNull(), "t").alias("lag_null_at_end"),
        F.max("offset_reset_t").alias("offset_reset_t"),
        F.sum(F.when(F.col("late"), F.col("dleo"))).alias("late_produced"),
        F.sum(F.when(F.col("late"), F.col("dcom"))).alias("late_consumed"),
        F.sum(F.when(F.col("late"), F.col("dt"))).alias("late_seconds"),
        # the first third's rates: did this partition's load rise, did its consumer keep up before
        # (null when no two snapshots fall in it: unknown, not 0)
        _ratio(F.sum(F.when(F.col("x") <= 1.0 / 3.0, F.col("dleo"))),
               F.sum(F.when(F.col("x") <= 1.0 / 3.0, F.col("dt")))).alias("early_produce_rate"),
        _ratio(F.sum(F.when(F.col("x") <= 1.0 / 3.0, F.col("dcom"))),
               F.sum(F.when(F.col("x") <= 1.0 / 3.0, F.col("dt")))).alias("early_consume_rate"),
        F.count(F.when(F.col("late") & (F.col("dcom") > 0), 1)).alias("late_advances"),
        # the last stall_min_seconds, and stall_min_snapshots intervals at least: what a stall is judged on
        F.sum(F.when(recent, F.col("dleo"))).alias("recent_produced"),
        F.sum(F.when(recent, F.col("dcom"))).alias("recent_consumed"),
        F.sum(F.when(recent, F.col("dt"))).alias("recent_seconds"),
        F.count(F.when(recent & (F.col("dcom") > 0), 1)).alias("recent_advances"),
        F.sum(F.when(recent, F.col("unsettled"))).alias("recent_unsettled"),
        F.sum(F.when(F.col("base_row"), F.col("dleo"))).alias("base_produced"),
        F.sum(F.when(F.col("base_row"), F.col("dcom"))).alias("base_consumed"),
        F.sum(F.when(F.col("base_row"), F.col("dt"))).alias("base_seconds"),
        F.sum(F.when(~F.col("risen"), F.col("dleo"))).alias("base_all_produced"),
        F.sum(F.when(~F.col("risen"), F.col("dcom"))).alias("base_all_consumed"),
        F.sum(F.when(~F.col("risen"), F.col("dt"))).alias("base_all_seconds"),
        # since the lag began to rise (the interval it rose in included): a consumer that slowed
        # late in the window is judged on its rates since then, not diluted by the healthy part
        F.sum(F.when(F.col("risen"), F.col("dleo"))).alias("rise_produced"),
        F.sum(F.when(F.col("risen"), F.col("dcom"))).alias("rise_consumed"),
        F.sum(F.when(F.col("risen"), F.col("dt"))).alias("rise_seconds"),
        # the last snapshot before the rise: the lag began to grow after it (the onset, to the sampling)
        F.max(F.when(~F.col("risen"), F.col("t"))).alias("rise_from_t"),
        F.count(F.when(F.col("stuck_episode"), 1)).alias("stuck_episodes_done"),
        # a batch rhythm: the commit stands still between snapshots while data waits, then
        # one advance passes everything that waited (the largest backlog cleared so)
        F.count(F.when((F.col("dcom") == 0) & (F.col("prev_lag") > 0), 1)).alias("still_intervals"),
        F.count(F.when(F.col("dcom").isNotNull() & (F.col("prev_lag") > 0), 1)).alias("waiting_intervals"),
        F.max(F.when((F.col("dcom") > 0) & (F.col("prev_lag") > 0) & (committed >= F.col("prev_leo_for_stuck")),
                     F.col("prev_lag"))).alias("cleared_backlog"),
        # the run the window ends in has no unsettled row after its start
        (F.max("unsettled_cum") - F.coalesce(F.max(F.when(F.col("dcom") > 0, F.col("unsettled_cum"))), F.lit(0))
         ).alias("open_run_unsettled"),
        F.min(F.when(at_end, F.col("t"))).alias("last_adv_t"),
        F.greatest(F.count(F.when(at_end, 1)) - 1, F.lit(0)).alias("frozen_snapshots"),
        F.coalesce(F.max("gap"), F.lit(0.0)).alias("max_commit_gap_seconds"),
        F.max("lso_last").alias("last_stable_offset_end"),
        F.min(F.when(F.col("last_stable_offset") == F.col("lso_last"), F.col("t"))).alias("lso_since_t"),
        F.greatest(F.count(F.when(F.col("last_stable_offset") == F.col("lso_last"), 1)) - 1, F.lit(0)).alias(
            "lso_frozen_snapshots"),
        F.coalesce(F.max("lso_gap"), F.lit(0.0)).alias("max_lso_gap_seconds"),
        F.collect_list(F.when(keep_for_status, status_row)).alias("status_window"),
        *timelag.aggregate_columns(),
        *forecast.aggregate_columns(),
    )
    return agg


def _partition_columns(agg, th: Thresholds):
    """Features of each partition from its aggregates (keyed by the partition hash `pk`)."""
    from pyspark.sql import functions as F

    # Unknown at the end: the last row's lag is missing because a read failed.
    # Never known and no failure: the group has no commit there (lag 0, as before).
    agg = agg.withColumn("lag_end_unknown", F.col("lag_null_at_end") & F.col("read_error").isNotNull())
    agg = agg.withColumn(
        "lag_end", F.coalesce(F.col("lag_known_end"), F.when(~F.col("lag_end_unknown"), F.lit(0).cast("long")))
    )
    span = F.col("tl_last") - F.col("tl_first")
    time_lag, lower, time_lag_source = timelag.time_lag_expr(
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
            # the rates before the lag began to grow (a surge can start anywhere in the window);
            # the first third when the lag grew from the start
            # (without its last interval when what is left still spans baseline_min_seconds)
            "baseline_produce_rate": F.when(F.col("base_seconds") >= th.baseline_min_seconds,
                                            _ratio(F.col("base_produced"), F.col("base_seconds")))
            .when(F.col("base_all_seconds") >= th.baseline_min_seconds,
                  _ratio(F.col("base_all_produced"), F.col("base_all_seconds")))
            .when(F.col("base_all_seconds") > 0, _ratio(F.col("base_all_produced"), F.col("base_all_seconds")))
            .otherwise(F.col("early_produce_rate")),
            "baseline_consume_rate": F.when(F.col("base_seconds") >= th.baseline_min_seconds,
                                            _ratio(F.col("base_consumed"), F.col("base_seconds")))
            .when(F.col("base_all_seconds") >= th.baseline_min_seconds,
                  _ratio(F.col("base_all_consumed"), F.col("base_all_seconds")))
            .when(F.col("base_all_seconds") > 0, _ratio(F.col("base_all_consumed"), F.col("base_all_seconds")))
            .otherwise(F.col("early_consume_rate")),
            # the rates above came from rows before the lag grew, not the first-third fallback
            "baseline_known": F.coalesce((F.col("base_seconds") >= th.baseline_min_seconds)
                                         | (F.col("base_all_seconds") >= th.baseline_min_seconds), F.lit(False)),
            "rise_produce_rate": _ratio(F.col("rise_produced"), F.col("rise_seconds")),
            "rise_consume_rate": _ratio(F.col("rise_consumed"), F.col("rise_seconds")),
            "frozen_seconds": F.col("t_last") - F.col("last_adv_t"),
            # none when the lag never rose (no peak) or was already up at the window's start
            "lag_onset_t": F.when(F.col("lag_peak") > 0, F.col("rise_from_t")),
            "time_lag_seconds": time_lag,
            "time_lag_lower_bound": lower,
            "time_lag_source": time_lag_source,
            "retention_loss": F.coalesce(F.col("committed_end") < F.col("log_start_offset_end"), F.lit(False)),
        }
    )
    commit_above = (F.col("committed_end") - F.col("log_end_offset_end")) > F.greatest(
        F.lit(float(th.reset_commit_slack)), F.col("produce_rate") * th.reset_race_seconds
    )
    feats = feats.withColumn("commit_above", F.coalesce(commit_above, F.lit(False)))
    feats = feats.withColumn("offset_reset", F.col("offset_reset_t").isNotNull() | F.col("commit_above"))
    # Lag that is only transaction markers or aborted records (the record read found
    # no data after the commit) is nothing waiting: a Java consumer that commits
    # offset + 1 sits on the last commit marker of an idle transactional topic.
    waiting = (F.col("lag_end") > 0) & F.col("committed_end").isNotNull() & ~F.col("nothing_to_read")
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
    # ... judged over the last stall_min_seconds as a still commit is (rule 3, case 33), for a consumer that
    # kept up before its lag rose: the last third holds minutes from before it began to trickle, which hid
    # it for a third of the window (one always that slow is judged on the last third, as before)
    near_frozen_recent = (
        waiting
        & (F.col("baseline_consume_rate") >= th.surge_keepup_ratio * F.col("baseline_produce_rate"))
        & (F.col("recent_unsettled") == 0)
        & (F.col("recent_advances") >= 1)
        & (F.col("recent_seconds") >= th.stall_min_seconds)
        & (F.col("recent_produced") > 0)
        & (F.col("recent_consumed") < th.near_frozen_ratio * F.col("recent_produced"))
        & (F.col("lag_end") > F.col("lag_start"))
    )
    # A staircase of stuck records: the commit stood still again and again (the window's last run
    # counts when it is long enough), each time leaving its backlog behind.
    open_run = (
        waiting
        & (F.col("frozen_seconds") >= th.stall_min_seconds)
        & (F.col("frozen_snapshots") >= th.stall_min_snapshots)
        & (F.col("open_run_unsettled") == 0)
    )
    feats = feats.withColumn(
        "stuck_episodes", F.col("stuck_episodes_done") + F.coalesce(open_run, F.lit(False)).cast("int"))
    stuck_again = F.col("stuck_episodes") >= th.stuck_episodes_min
    feats = feats.withColumn("stalled", F.coalesce(frozen | near_frozen | near_frozen_recent | stuck_again,
                                                   F.lit(False)))
    feats = feats.withColumns(stall_pending_columns(waiting, th))
    # A transaction holds the last stable offset below the high watermark: records
    # after it wait, invisible to read_committed consumers. Hanging: held longer
    # than the stall rule allows a commit, and than transactions here normally
    # take (a producer that commits every few minutes, as Flink's exactly-once
    # sink does at checkpoints, is not hanging).
    held = F.col("t_last") - F.col("lso_since_t")
    feats = feats.withColumn(
        "transaction_open_seconds",
        F.when(F.col("last_stable_offset_end") < F.col("log_end_offset_end"), held),
    )
    hanging = (
        F.col("transaction_open_seconds").isNotNull()
        & (held >= th.stall_min_seconds)
        & (F.col("lso_frozen_snapshots") >= th.stall_min_snapshots)
        & (held > th.stall_gap_factor * F.col("max_lso_gap_seconds"))
    )
    feats = feats.withColumn("hanging_transaction", F.coalesce(hanging, F.lit(False)))
    # The group stands at the stable offset, all a read_committed consumer may read: it
    # waits on the transaction (a read_uncommitted one passes it, to the high watermark).
    feats = feats.withColumn(
        "blocked_by_transaction",
        F.col("hanging_transaction") & F.coalesce(F.col("committed_end") == F.col("last_stable_offset_end"),
                                                  F.lit(False)),
    )
    # below its load over the window, or since its lag began to rise (a consumer that slowed
    # a minute ago is still near its load on the window's average)
    below = (F.col("consume_rate") < (1.0 - th.slow_rate_slack) * F.col("produce_rate")) | F.coalesce(
        F.col("rise_consume_rate") < (1.0 - th.slow_rate_slack) * F.col("rise_produce_rate"), F.lit(False))
    # A batch consumer's lag is a sawtooth by design: it cleared a backlog at least half today's
    # in one commit after standing still. Sampled every minute a 75 s rhythm aliases into what
    # looks like a climb (seen live in the lab): its capacity is proven, it is not slow.
    batch_rhythm = (F.col("still_intervals") * 3 >= F.col("waiting_intervals")) & (
        F.coalesce(F.col("cleared_backlog"), F.lit(0)) >= 0.5 * F.col("lag_end"))
    # Rule case 32: a consumer whose rate since its lag rose meets what arrived on average over the window
    # can carry the load: its lag came from arrivals above the average (a burst it is absorbing), not from
    # a consumer below it. (A consumer that slowed since still falls short of the average: 26 holds.)
    keeps_pace = F.coalesce(F.col("rise_consume_rate"), F.col("consume_rate")) >= (
        1.0 - th.slow_rate_slack) * F.col("produce_rate")
    feats = feats.withColumn("slow", ~F.col("stalled") & below & (F.col("lag_end") > F.col("lag_start"))
                             & ~F.coalesce(batch_rhythm, F.lit(False)) & ~F.coalesce(keeps_pace, F.lit(False)))
    feats = feats.withColumns(forecast.partition_columns(th))
    return feats.drop("leo_first", "c_first", "tc_first", "tc_last", "late_produced", "late_consumed",
                      "late_seconds", "late_advances", "recent_produced", "recent_consumed", "recent_seconds",
                      "recent_advances", "recent_unsettled", "last_adv_t",
                      "tl_t_at", "tl_record_t", "tl_first", "tl_last",
                      "lag_known_end", "lag_null_at_end", "fc_ls_first", "fc_ls_t_first", "fc_ls_t_last",
                      "lso_since_t", "lso_frozen_snapshots", "max_lso_gap_seconds", "tl_record_after",
                      "base_produced", "base_consumed", "base_seconds",
                      "base_all_produced", "base_all_consumed", "base_all_seconds", "stuck_episodes_done", "open_run_unsettled",
                      "rise_produced", "rise_consumed", "rise_seconds", "still_intervals", "waiting_intervals",
                      "cleared_backlog")


def stall_pending_columns(waiting, th: Thresholds) -> dict:
    """stall_pending: not stalled yet, but the commit stands still at the end with data waiting,
    for provisional_frozen_share of stall_min_seconds or after a stuck episode: stalled or a slow
    owner is not decided. stall_decided_t (epoch s): the first expected snapshot at which the stall
    rule's time and snapshot counts are met (from the mean sampling interval), so the commit has
    either stood long enough (stalled) or moved (not); stall_samples_needed: snapshots until then."""
    from pyspark.sql import functions as F

    frozen_s, frozen_n = F.col("frozen_seconds"), F.col("frozen_snapshots")
    interval = _ratio(F.col("t_last") - F.col("t_first"), F.col("snapshots") - 1)
    after_episode = F.col("stuck_episodes") >= 1
    pending = (
        waiting
        & ~F.col("stalled")
        & (frozen_n >= 1)
        & (frozen_s > 0)
        & (after_episode | (frozen_s >= th.provisional_frozen_share * th.stall_min_seconds))
    )
    # a second episode needs the run to last stall_min_seconds; a first stall also outlasts the gap rule
    need = F.when(after_episode, F.lit(th.stall_min_seconds)).otherwise(
        F.greatest(F.lit(th.stall_min_seconds), th.stall_gap_factor * F.col("max_commit_gap_seconds") + 1e-3))
    last_adv = F.col("t_last") - frozen_s
    target = F.greatest(last_adv + need, F.col("t_last") + (th.stall_min_snapshots - frozen_n) * interval)
    more = F.greatest(F.lit(1), F.ceil(F.try_divide(target - F.col("t_last"), interval))).cast("int")
    pending = F.coalesce(pending & interval.isNotNull() & (interval > 0), F.lit(False))
    return {
        "stall_pending": pending,
        "stall_samples_needed": F.when(pending, more),
        "stall_decided_t": F.when(pending, F.col("t_last") + more * interval),
    }


def _inactive(state, members):
    """No live members: EMPTY/DEAD or a member count of 0 (null members is unknown, not inactive)."""
    from pyspark.sql import functions as F

    return state.isin(list(INACTIVE_GROUP_STATES)) | (F.coalesce(members, F.lit(-1)) == 0)


def group_series(snapshots, partition_feats=None):
    """One row per (cluster, group_id, topic, snapshot_ts): the group's totals.

    member_set is a signature of the set of owners (their static instance
    ids where they have one, else member ids; null when nobody owns
    anything), so churn shows as a change of it; member_bits is its 64-bit
    Bloom filter (one bit per id), which tells how many ids came and went;
    unowned_partitions counts
    the partitions nobody owns. total_committed sums the
    committed offsets (null when one is unknown). total_lag is
    null at a snapshot where a partition's lag is unknown (a failed read), and
    total_leo where a log end offset is: a partial sum would read as a drop.
    With `partition_feats`, a partition's rows before its offset reset are
    left out, as they are from its features.
    """
    from pyspark.sql import functions as F

    snapshots = _with_read_error(snapshots)
    if partition_feats is not None:
        resets = partition_feats.where(F.col("offset_reset_t").isNotNull()).select(
            *PARTITION_KEY, "offset_reset_t"
        )
        snapshots = snapshots.join(F.broadcast(resets), list(PARTITION_KEY), "left").where(
            F.col("offset_reset_t").isNull() | (F.col("snapshot_ts").cast("double") >= F.col("offset_reset_t"))
        )

    # A member's identity: its static group.instance.id when it has one (a
    # static member restarts with a new member id but the same instance id, and
    # Kafka does not rebalance for it), else its member id.
    identity_sql = (
        "coalesce(group_instance_id, member_id)" if "group_instance_id" in snapshots.columns else "member_id"
    )
    identity = F.expr(identity_sql)
    # A signature of the set of owner ids that aggregates map-side (no
    # collect_set): the smallest and largest id hash plus a 64-bit Bloom
    # filter of the ids. Duplicates (a member owning several partitions)
    # change nothing; a new id goes unnoticed with probability ~((m-1)/64)^2.
    h = F.xxhash64(identity)
    bloom = F.expr(f"shiftleft(1L, cast(pmod(xxhash64({identity_sql}), 64) as int))")
    owned = F.col("member_id").isNotNull()
    # Two levels, so the big one hashes: a string's max (group_state) makes Spark sort
    # every row for a SortAggregate. Grouped by the state too, the rows fold by hash,
    # map-side, into one row per (group, snapshot, state), nearly always one per
    # (group, snapshot); the second level takes the state's max over those few.
    keys = (*GROUP_KEY, "snapshot_ts")
    part = snapshots.groupBy(*keys, "group_state").agg(
        F.count(F.when(F.col("lag").isNull() & F.col("read_error").isNotNull(), 1)).alias("_unknown"),
        F.sum(F.coalesce(F.col("lag"), F.lit(0))).alias("_lag"),
        F.count(F.lit(1)).alias("_rows"),
        F.count("log_end_offset").alias("_leo_known"),
        F.sum("log_end_offset").alias("_leo"),
        F.count("committed_offset").alias("_committed_known"),
        F.sum("committed_offset").alias("_committed"),
        F.max("group_members").alias("group_members"),
        F.count(F.when(owned, 1)).alias("_owned"),
        F.count(F.when(~owned, 1)).alias("_unowned"),
        F.min(F.when(owned, h)).alias("_hmin"),
        F.max(F.when(owned, h)).alias("_hmax"),
        F.bit_or(F.when(owned, bloom)).alias("_bloom"),
    )
    agg = part.groupBy(*keys).agg(
        F.when(F.sum("_unknown") == 0, F.sum("_lag")).alias("total_lag"),
        # null unless every partition's offset is known: a partial sum would read as a drop, or a move
        F.when(F.sum("_leo_known") == F.sum("_rows"), F.sum("_leo")).alias("total_leo"),
        F.when(F.sum("_committed_known") == F.sum("_rows"), F.sum("_committed")).alias("total_committed"),
        F.max("group_state").alias("group_state"),
        F.max("group_members").alias("group_members"),
        F.sum("_owned").alias("_owned"),
        F.sum("_unowned").alias("unowned_partitions"),
        F.min("_hmin").alias("_hmin"),
        F.max("_hmax").alias("_hmax"),
        F.bit_or("_bloom").alias("_bloom"),
    )
    return agg.select(
        *GROUP_KEY,
        "snapshot_ts",
        "total_lag",
        "total_leo",
        "total_committed",
        "group_state",
        "group_members",
        F.when(F.col("_owned") > 0, F.xxhash64("_hmin", "_hmax", "_bloom")).alias("member_set"),
        # the owners' ids as bits: which came and which went between two snapshots (rule case 29)
        F.when(F.col("_owned") > 0, F.col("_bloom")).alias("member_bits"),
        "unowned_partitions",
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

    # Rule case 20: one rebalance runs from leaving a settled assignment (a known state,
    # not rebalancing, every partition owned) until the next one. Live members with a
    # partition nobody owns are still in it: the STABLE generation between a
    # cooperative-sticky rebalance's revoke and assign rounds. UNKNOWN (a failed read)
    # says nothing either way (null).
    members_waiting = (F.coalesce(F.col("group_members"), F.lit(0)) > 0) & (F.col("unowned_partitions") > 0)
    s = series.withColumns(
        {
            "t": F.col("snapshot_ts").cast("double"),
            "rebalancing": F.when(F.col("group_state") != "UNKNOWN",
                                  F.col("group_state").isin(rebalancing) | members_waiting),
        }
    )
    s = s.withColumns(
        {
            "s_first": F.first("t").over(wall),
            "s_last": F.last("t").over(wall),
            "leo_first_all": F.first("total_leo", ignorenulls=True).over(wall),
            "leo_last_all": F.last("total_leo", ignorenulls=True).over(wall),
            "lag_max_all": F.max("total_lag").over(wall),
            "dt": F.col("t") - F.lag("t").over(w),
            "dleo": F.col("total_leo") - F.lag("total_leo").over(w),
            "prev_state": F.lag("group_state").over(w),
            "prev_rebalancing": F.last("rebalancing", ignorenulls=True).over(wprev),
            "prev_members": F.last("member_set", ignorenulls=True).over(wprev),
            "prev_bits": F.last("member_bits", ignorenulls=True).over(wprev),
            "dcom": F.col("total_committed") - F.lag("total_committed").over(w),
            "dlag": F.col("total_lag") - F.lag("total_lag").over(w),
            "prev_row_rebalancing": F.lag("rebalancing").over(w),
            "inactive": _inactive(F.col("group_state"), F.col("group_members")),
            "prev_inactive": _inactive(F.lag("group_state").over(w), F.lag("group_members").over(w)),
        }
    )
    span = F.col("s_last") - F.col("s_first")
    rate_all = F.coalesce(_ratio(F.col("leo_last_all") - F.col("leo_first_all"), span), F.lit(0.0))
    # A lag that stays under pattern_min_seconds of production is noise at any
    # rate (a busy topic's healthy lag is seconds of production, not a shape).
    floor = F.greatest(F.lit(float(th.pattern_min_lag)), rate_all * th.pattern_min_seconds)
    s = s.withColumns(
        {
            # the last snapshot at which the lag did not rise (rule case 36: the climb's start)
            "climb_from": F.max(F.when(F.coalesce(F.col("dlag") <= 0, F.lit(True)), F.col("t"))).over(wall),
            "x": F.coalesce(_ratio(F.col("t") - F.col("s_first"), span), F.lit(0.0)),
            "y": F.col("total_lag") / F.greatest(F.col("lag_max_all").cast("double"), floor, F.lit(1.0)),
            "noise_floor": floor,
            "entered_rebalance": F.coalesce(F.col("rebalancing") & ~F.col("prev_rebalancing"), F.lit(False)),
            "owners_changed": F.col("member_set").isNotNull()
            & F.col("prev_members").isNotNull()
            & (F.col("member_set") != F.col("prev_members")),
            "state_changed": F.col("prev_state").isNotNull() & (F.col("group_state") != F.col("prev_state")),
        }
    )
    # Rule case 29: each owner id that came or went is a membership change, one rebalance (20). Between two
    # one-minute sweeps a member that rejoined under a new id (a leave and a join) changed the set once:
    # counting changes of the set saw half the rebalances there. (Ids sharing a bit count once: never 0.)
    came = F.bit_count(F.col("member_bits").bitwiseAND(F.bitwise_not(F.col("prev_bits"))))
    went = F.bit_count(F.col("prev_bits").bitwiseAND(F.bitwise_not(F.col("member_bits"))))
    s = s.withColumn("ids_changed", F.when(F.col("owners_changed"), F.greatest(came + went, F.lit(1))).otherwise(0))
    # the group's lag has passed baseline_lag_share of its window maximum (here or before)
    s = s.withColumn("risen", F.coalesce(F.max(F.col("total_lag") > th.baseline_lag_share * F.col("lag_max_all")).over(
        w.rowsBetween(Window.unboundedPreceding, 0)), F.lit(False)))
    s = s.withColumns({
        "dy": F.col("y") - F.lag("y").over(w),
        # the rows since the lag began to rise, with the last one before it: the climb's own fit
        "in_rise": F.col("risen") | F.coalesce(F.lead("risen").over(w), F.lit(False)),
    })
    rise_t = F.when(F.col("in_rise") & F.col("total_lag").isNotNull(), F.col("t") - F.col("s_first"))
    rise_lag = F.when(F.col("in_rise"), F.col("total_lag"))
    # the diffs from the fastest rise down: what share of the total rise happens
    # in the fastest quarter of the window's time (staircase: nearly all of it).
    # Time, not a count of diffs: at a 5-minute sweep's cadence (3 samples 10 s
    # apart) two diffs in three are 10 s long and carry little.
    by_rate = Window.partitionBy(*GROUP_KEY).orderBy(_ratio(F.col("dy"), F.col("dt")).desc_nulls_last())
    s = s.withColumn(
        "dt_before", F.coalesce(F.sum("dt").over(by_rate.rowsBetween(Window.unboundedPreceding, -1)), F.lit(0.0))
    )
    up = F.greatest(F.col("dy"), F.lit(0.0))
    down = F.greatest(-F.col("dy"), F.lit(0.0))
    settled = ~(F.coalesce(F.col("rebalancing"), F.lit(False)) | F.coalesce(F.col("prev_row_rebalancing"), F.lit(False))
                | F.col("owners_changed")) & F.col("dleo").isNotNull() & F.col("dcom").isNotNull()
    early, late = F.col("x") <= 1.0 / 3.0, F.col("x") > 2.0 / 3.0
    middle = ~early & ~late
    churned = (F.col("ids_changed") > 0) | F.coalesce(F.col("entered_rebalance"), F.lit(False))
    g = s.groupBy(*GROUP_KEY).agg(
        F.count(F.lit(1)).alias("snapshots"),
        F.min("t").alias("t_first"),
        F.max("t").alias("t_last"),
        # the first and last known totals (null: never known)
        F.min_by("total_lag", F.when(F.col("total_lag").isNotNull(), F.col("t"))).alias("lag_start"),
        F.max_by("total_lag", F.when(F.col("total_lag").isNotNull(), F.col("t"))).alias("lag_end"),
        F.max("total_lag").alias("lag_max"),
        F.min("total_lag").alias("lag_min"),
        # how the lag moved over the last interval (rule case 32: a lag falling now is being absorbed)
        F.max_by("dlag", F.when(F.col("dlag").isNotNull(), F.col("t"))).alias("lag_last_change"),
        F.max_by("group_state", "t").alias("group_state"),
        F.max_by("group_members", "t").alias("group_members"),
        F.sum(F.col("entered_rebalance").cast("int")).alias("rebalance_entries"),
        F.sum("ids_changed").alias("owner_changes"),
        # rule case 37: the intervals in which a rebalance began or owner ids changed, and whether the last did
        F.count(F.when(churned, 1)).alias("churn_intervals"),
        F.coalesce(F.max_by(churned, "t"), F.lit(False)).alias("churn_last"),
        # rule case 38: intervals in which the group's commits moved (none: its commit cadence is unknown)
        F.count(F.when(F.col("dcom") > 0, 1)).alias("commit_advances"),
        # Rule case 30: what arrived and what was committed while the group was settled, the intervals
        # in which no rebalance ran and no owner id changed (commits stall during each), over the window
        # and since the lag began to rise: a slow consumer falls behind while it runs, a loop in its pauses
        F.sum(F.when(settled, F.col("dleo"))).alias("settled_produced"),
        F.sum(F.when(settled, F.col("dcom"))).alias("settled_consumed"),
        F.sum(F.when(settled & F.col("risen"), F.col("dleo"))).alias("rise_settled_produced"),
        F.sum(F.when(settled & F.col("risen"), F.col("dcom"))).alias("rise_settled_consumed"),
        F.sum(F.col("state_changed").cast("int")).alias("state_changes"),
        # Commits that moved while the group had no members at either end: a consumer
        # that assign()s its partitions and commits without joining the group.
        F.count(F.when(F.col("inactive") & F.col("prev_inactive") & (F.col("dcom") > 0), 1)).alias(
            "memberless_commit_advances"
        ),
        F.count(F.when(~F.coalesce(F.col("inactive"), F.lit(True)), 1)).alias("member_snapshots"),
        F.first("noise_floor").alias("noise_floor"),
        F.sum(F.when(early, F.col("dleo"))).alias("early_produced"),
        F.sum(F.when(early, F.col("dt"))).alias("early_seconds"),
        F.sum(F.when(late, F.col("dleo"))).alias("late_produced"),
        F.sum(F.when(late, F.col("dt"))).alias("late_seconds"),
        # linear fit of lag on x in [0, 1]: slope is the fitted rise over the window
        F.covar_pop("x", "total_lag").alias("cov_xl"),
        F.var_pop("x").alias("var_x"),
        F.corr("x", "total_lag").alias("corr_xl"),
        F.covar_pop(rise_t, rise_lag).alias("cov_rise"),
        F.var_pop(rise_t).alias("var_rise"),
        F.corr(rise_t, rise_lag).alias("corr_rise"),
        F.count(rise_t).alias("rise_snapshots"),
        (F.max(rise_t) - F.min(rise_t)).alias("rise_span"),
        # how long the lag has risen at every snapshot, to the last (rule case 36: a burst's rise is young)
        (F.max("t") - F.max("climb_from")).alias("climb_span"),
        # its intervals, its fastest rise and the last interval's (msg/s): a burst's rise slows as it ends
        F.count(F.when(F.col("t") > F.col("climb_from"), 1)).alias("climb_intervals"),
        F.max(F.when(F.col("t") > F.col("climb_from"), _ratio(F.col("dlag"), F.col("dt")))).alias("climb_peak_rate"),
        F.max_by(_ratio(F.col("dlag"), F.col("dt")), F.when(F.col("dlag").isNotNull(), F.col("t"))).alias(
            "lag_last_rate"),
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
        # the highest lag of each third: a roller coaster's peaks grow, a sawtooth's stay level
        F.max(F.when(early, F.col("y"))).alias("y_peak_early"),
        F.max(F.when(middle, F.col("y"))).alias("y_peak_middle"),
        F.max(F.when(late, F.col("y"))).alias("y_peak_late"),
        F.avg((F.col("y") < 0.25).cast("double")).alias("low_fraction"),
        F.sum(up).alias("up"),
        F.sum(down).alias("down"),
        F.sum(up * up).alias("up_sq"),
        F.sum(down * down).alias("down_sq"),
        F.count("dy").alias("diffs"),
        F.sum(F.when(F.col("dt_before") < 0.25 * (F.col("s_last") - F.col("s_first")), up)).alias("top_quarter_up"),
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
        "lag_last_change",
        "group_state",
        "group_members",
        F.greatest(F.col("rebalance_entries"), F.col("owner_changes")).alias("rebalances"),
        "rebalance_entries",
        "owner_changes",
        "churn_intervals",
        "churn_last",
        "commit_advances",
        "settled_produced",
        "settled_consumed",
        "rise_settled_produced",
        "rise_settled_consumed",
        "state_changes",
        "memberless_commit_advances",
        "member_snapshots",
        F.coalesce(_ratio(F.col("early_produced"), F.col("early_seconds")), F.lit(0.0)).alias("early_produce_rate"),
        F.coalesce(_ratio(F.col("late_produced"), F.col("late_seconds")), F.lit(0.0)).alias("late_produce_rate"),
        F.coalesce(_ratio(F.col("cov_xl"), F.col("var_x")), F.lit(0.0)).alias("lag_growth"),
        F.coalesce(F.col("corr_xl") * F.col("corr_xl"), F.lit(0.0)).alias("lag_r2"),
        # the same fit over the rows since the lag began to rise: the fitted rise since then
        "rise_snapshots",
        "climb_span",
        "climb_intervals",
        "climb_peak_rate",
        "lag_last_rate",
        F.coalesce(_ratio(F.col("cov_rise"), F.col("var_rise")) * F.col("rise_span"), F.lit(0.0)).alias("rise_growth"),
        F.coalesce(F.col("corr_rise") * F.col("corr_rise"), F.lit(0.0)).alias("rise_r2"),
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
        "y_peak_early",
        "y_peak_middle",
        "y_peak_late",
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
