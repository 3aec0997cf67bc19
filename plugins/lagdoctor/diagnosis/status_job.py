"""partition_status.jsonl: Burrow-compatible status per partition (contract 2 and 3).

The evaluator (`lagdoctor.status.evaluate_partition`) is pure Python and
works on a handful of rows per partition, so it runs through mapInPandas on
the per-partition features (each carries its last `status_window`
snapshots): no shuffle, and it scales out with the partitions. Never on the
hot path: it sees partitions x status_window rows, not the history.

A partition whose lag at the end is unknown (a failed read) reports its last
known lag (contract 2 types it as an int) with `lag_unknown: true` and its
`read_error`; a group-level failure row (topic "", partition -1) is
not a partition and gets no status row (its finding says it).
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
    "read_error string, lag_unknown boolean"
)
_ACTIVE_STATES = ("STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "ASSIGNING", "RECONCILING")


def _has_members(members, state) -> bool | None:
    """Live members? A known count decides; an active state with no member list
    (Tansu, missing DESCRIBE rights) still means someone is consuming."""
    import pandas as pd

    if members is not None and not pd.isna(members):
        return bool(members > 0)
    if state in _ACTIVE_STATES:
        return True
    return None


def _window_rows(value) -> list[dict]:
    rows = []
    for item in value if value is not None else ():
        d = item if isinstance(item, dict) else item.asDict()
        rows.append(
            {
                # ms, rounded down: the evaluator compares against now_ms
                "snapshot_ts_ms": int(d["snapshot_ts_us"]) // 1000,
                "committed_offset": _int_or_none(d.get("committed_offset")),
                "log_end_offset": _int_or_none(d.get("log_end_offset")),
                "log_start_offset": _int_or_none(d.get("log_start_offset")),
                "lag": _int_or_none(d.get("lag")),
            }
        )
    rows.sort(key=lambda r: r["snapshot_ts_ms"])
    return rows


def _int_or_none(value):
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def evaluate_batches(batches, now_ms: int, allowed_lag: int, window_len: int):
    """mapInPandas body: one status per partition row."""
    from lagdoctor.status import REWIND, evaluate_partition

    for pdf in batches:
        statuses = []
        for window, members, state, reset in zip(
            pdf["status_window"], pdf["group_members"], pdf["group_state"], pdf["offset_reset"]
        ):
            has_members = _has_members(members, state)
            rows = _window_rows(window)
            if reset:
                # The log restarted below the group's position (topic recreated or
                # truncated). Burrow keeps no such history cut: when the consumer
                # resets, its commit falls and Burrow reports REWIND; until then its
                # lag clamps to 0 and it says OK, the false "healthy" of issue 8.
                # REWIND ("offsets went backwards") is Burrow's word for it either way.
                statuses.append(REWIND)
                continue
            statuses.append(
                evaluate_partition(
                    rows, now_ms, allowed_lag=allowed_lag, window_len=window_len, group_has_members=has_members
                )
                if rows
                else "OK"
            )
        out = pdf[list(PARTITION_KEY)].copy()
        out["status"] = statuses
        # contract 2 types lag as int: the last known lag, flagged when the last read failed
        out["lag"] = pdf["lag_end"].astype("Int64")
        out["lag_unknown"] = pdf["lag_end_unknown"].astype("bool")
        out["time_lag_seconds"] = pdf["time_lag_seconds"].astype("float64").round(3)
        out["consume_rate"] = pdf["consume_rate"].astype("float64").round(3)
        out["produce_rate"] = pdf["produce_rate"].astype("float64").round(3)
        out["time_lag_lower_bound"] = pdf["time_lag_lower_bound"].astype("bool")
        out["committed_offset"] = pdf["committed_end"].astype("Int64")
        out["log_end_offset"] = pdf["log_end_offset_end"].astype("Int64")
        for name in ("member_id", "client_id", "host", "read_error"):
            out[name] = pdf[name]
        yield out


def partition_status(partition_feats, group_feats, now_ms: int, thresholds: Thresholds = Thresholds()):
    """(partition features, group features) -> partition_status rows (contract 2).

    `now_ms` is the window's end: the evaluator's notion of "now".
    """
    from pyspark.sql import functions as F

    th = thresholds
    members = group_feats.select(*GROUP_KEY, "group_members", "group_state")
    inp = partition_feats.select(
        *PARTITION_KEY,
        "status_window",
        "lag_end",
        "time_lag_seconds",
        "consume_rate",
        "produce_rate",
        "time_lag_lower_bound",
        "committed_end",
        "log_end_offset_end",
        "member_id",
        "client_id",
        "host",
        "read_error",
        "lag_end_unknown",
        "offset_reset",
    ).where(~((F.col("topic") == GROUP_MARKER_TOPIC) & (F.col("partition") == GROUP_MARKER_PARTITION)))
    inp = inp.join(F.broadcast(members), list(GROUP_KEY), "left")
    return inp.mapInPandas(
        lambda it: evaluate_batches(it, int(now_ms), th.status_allowed_lag, th.status_window), STATUS_DDL
    )
