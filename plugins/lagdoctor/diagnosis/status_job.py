"""partition_status.jsonl: Burrow-compatible status per partition (contract 2 and 3).

The evaluator runs as Spark SQL higher-order functions over each partition's
`status_window` (its last `status_window` snapshots and commit runs, carried
by the partition features): no Python worker, no shuffle beyond the features'
own. It is a transcription of `lagdoctor.status.evaluate_partition` (rules
M1-M6 and E1-E5 of that module's docstring, Burrow's rules 0-7), which stays
the reference: tests run both on the same windows and compare every status.

A partition whose lag at the end is unknown (a failed read) reports its last
known lag (contract 2 types it as an int) with `lag_unknown: true` and its
`read_error`; a group-level failure row (topic "", partition -1) is
not a partition and gets no status row (its finding says it).

Too little history (classify's rule case 28): the status stays Burrow's (one
observation is OK by E3), and beside it `complete` (Burrow's field: the share
of the history the rules need, snapshots / min_history_snapshots, at most 1)
and `collecting_history` (true while short), which every reader shows instead
of the status; a partition seen once has null rates (unknown, never 0.0).
"""

from __future__ import annotations

from lagdoctor.diagnosis.features import GROUP_KEY, PARTITION_KEY
from lagdoctor.diagnosis.snapshots import GROUP_MARKER_PARTITION, GROUP_MARKER_TOPIC
from lagdoctor.diagnosis.thresholds import Thresholds

# Contract 2's fields, then extensions the Slack table and the exporter use.
STATUS_DDL = (
    "cluster string, group_id string, topic string, partition int, status string, lag long, "
    "time_lag_seconds double, consume_rate double, produce_rate double, time_lag_lower_bound boolean, "
    "committed_offset long, log_end_offset long, member_id string, client_id string, host string, "
    "read_error string, lag_unknown boolean, time_lag_source string, complete double, collecting_history boolean"
)
_ACTIVE_STATES = ("STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "ASSIGNING", "RECONCILING")

_COMMIT = "struct<offset:bigint,ts:bigint,lag:bigint>"


def _status_columns(now_ms: int, allowed_lag: int, window_len: int) -> list[tuple[str, str]]:
    """(name, SQL) pairs, each reading the columns before it; `_status` is the answer.

    try_element_at / coalesce everywhere: under ANSI mode (Spark 4's default)
    an index past the end raises, and a null predicate makes exists() null.
    """
    n, a, w = int(now_ms), int(allowed_lag), int(window_len)
    active = ", ".join(f"'{s}'" for s in _ACTIVE_STATES)
    return [
        # E1, M1: oldest first (the struct sorts by its first field, the time), none after now
        ("_rows", f"filter(array_sort(coalesce(status_window, array())), r -> r.snapshot_ts_us div 1000 <= {n})"),
        ("_newest", "try_element_at(_rows, -1)"),
        # M2, M3: a changed committed offset is a commit; a repeat takes the newer known lag, keeps the time
        ("_commits", f"""aggregate(_rows, cast(array() as array<{_COMMIT}>), (acc, r) -> CASE
            WHEN r.committed_offset IS NULL THEN acc
            WHEN coalesce(try_element_at(acc, -1).offset = r.committed_offset, false) THEN concat(
                slice(acc, 1, size(acc) - 1),
                array(named_struct('offset', r.committed_offset, 'ts', try_element_at(acc, -1).ts,
                                   'lag', coalesce(r.lag, try_element_at(acc, -1).lag))))
            ELSE concat(acc, array(named_struct('offset', r.committed_offset, 'ts', r.snapshot_ts_us div 1000,
                                                'lag', r.lag)))
            END)"""),
        # M4, M5: the newest window_len commits; log end offsets of the newest window_len rows
        ("_win", f"slice(_commits, greatest(size(_commits) - {w} + 1, 1), {w})"),
        ("_broker", f"filter(transform(slice(_rows, greatest(size(_rows) - {w} + 1, 1), {w}), "
                    "r -> r.log_end_offset), x -> x IS NOT NULL)"),
        # M6
        ("_current_lag", """CASE WHEN _newest.lag IS NOT NULL THEN _newest.lag
            WHEN size(_commits) = 0 OR _newest.log_end_offset IS NULL THEN NULL
            ELSE greatest(0, _newest.log_end_offset - try_element_at(_commits, -1).offset) END"""),
        ("_first", "try_element_at(_win, 1)"),
        ("_last", "try_element_at(_win, -1)"),
        ("_rewind_at", "try_element_at(filter(sequence(2, greatest(size(_win), 2)), "
                       "i -> try_element_at(_win, i).offset < try_element_at(_win, i - 1).offset), 1)"),
        ("_known_lags", "transform(filter(_win, o -> o.lag IS NOT NULL), o -> o.lag)"),
        ("_has_members", f"""CASE WHEN group_members IS NOT NULL THEN group_members > 0
            WHEN group_state IN ({active}) THEN true END"""),
        ("_burrow", f"""CASE
            WHEN _current_lag <= {a} THEN 'OK'
            WHEN {n} - _last.ts > _last.ts - _first.ts AND NOT exists(_broker, b -> b <= _last.offset)
                THEN IF(coalesce(_has_members, false), 'STALL', 'STOP')
            WHEN _rewind_at IS NOT NULL AND NOT exists(slice(_win, _rewind_at, size(_win)),
                    o -> o.offset >= try_element_at(_win, _rewind_at - 1).offset) THEN 'REWIND'
            WHEN exists(_win, o -> coalesce(o.lag <= {a}, false)) THEN 'OK'
            WHEN forall(_win, o -> o.offset = _first.offset) THEN 'STALL'
            WHEN forall(sequence(2, greatest(size(_known_lags), 2)),
                    i -> coalesce(try_element_at(_known_lags, i) >= try_element_at(_known_lags, i - 1), true))
                THEN 'WARN'
            ELSE 'OK' END"""),
        # E3: one observation shows neither movement nor its absence
        ("_judged", "IF(size(filter(_rows, r -> r.committed_offset IS NOT NULL)) < 2, 'OK', _burrow)"),
        # An offset reset (the log restarted below the group's position: topic
        # recreated or truncated) is REWIND. Burrow keeps no such history cut: once
        # the consumer resets, its commit falls and Burrow says REWIND; until then
        # lag clamps to 0 and it says OK, the false "healthy" of issue 8.
        # Then E2, and E5 (retention deleted what the group never read: at least ERR).
        ("_status", """CASE
            WHEN offset_reset THEN 'REWIND'
            WHEN size(_rows) = 0 THEN 'OK'
            WHEN size(_win) = 0 OR _current_lag IS NULL THEN
                IF(coalesce(_newest.log_end_offset > coalesce(_newest.log_start_offset, 0), false), 'ERR', 'OK')
            WHEN coalesce(_newest.committed_offset < _newest.log_start_offset, false)
                AND _judged IN ('OK', 'WARN') THEN 'ERR'
            ELSE _judged END"""),
    ]


def evaluate_status(df, now_ms: int, allowed_lag: int, window_len: int):
    """Add `status` to rows carrying status_window, group_members, group_state, offset_reset."""
    from pyspark.sql import functions as F

    for name, sql in _status_columns(now_ms, allowed_lag, window_len):
        df = df.withColumn(name, F.expr(sql))
    return df.withColumnRenamed("_status", "status")


def partition_status(partition_feats, group_feats, now_ms: int, thresholds: Thresholds = Thresholds()):
    """(partition features, group features) -> partition_status rows (contract 2).

    `now_ms` is the window's end: the evaluator's notion of "now".
    """
    from pyspark.sql import functions as F

    th = thresholds
    seen = F.col("snapshots")
    known_rate = seen >= 2  # a rate needs two snapshots
    members = group_feats.select(*GROUP_KEY, "group_members", "group_state")
    inp = partition_feats.where(
        ~((F.col("topic") == GROUP_MARKER_TOPIC) & (F.col("partition") == GROUP_MARKER_PARTITION))
    ).join(F.broadcast(members), list(GROUP_KEY), "left")
    evaluated = evaluate_status(inp, now_ms, th.status_allowed_lag, th.status_window)
    return evaluated.select(
        *PARTITION_KEY,
        "status",
        F.col("lag_end").cast("long").alias("lag"),
        F.round("time_lag_seconds", 3).cast("double").alias("time_lag_seconds"),
        F.when(known_rate, F.round("consume_rate", 3)).cast("double").alias("consume_rate"),
        F.when(known_rate, F.round("produce_rate", 3)).cast("double").alias("produce_rate"),
        F.coalesce(F.col("time_lag_lower_bound"), F.lit(False)).alias("time_lag_lower_bound"),
        F.col("committed_end").cast("long").alias("committed_offset"),
        F.col("log_end_offset_end").cast("long").alias("log_end_offset"),
        "member_id",
        "client_id",
        "host",
        "read_error",
        F.coalesce(F.col("lag_end_unknown"), F.lit(False)).alias("lag_unknown"),
        "time_lag_source",
        F.round(F.least(F.lit(1.0), seen / float(max(th.min_history_snapshots, 1))), 3).alias("complete"),
        (seen < th.min_history_snapshots).alias("collecting_history"),
    )
