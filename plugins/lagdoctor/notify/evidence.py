"""What the notifier reads from a finding's evidence: its partition rows, the
worst first, and the group's lag and time lag.

Evidence keys read from a finding (contract 2 leaves ``evidence`` open; each
one may be missing and then shows as ``-``)::

    evidence["partitions"]        list of rows, one per partition, any order:
        partition, committed_offset (or current_offset), log_end_offset, lag,
        member_id (or consumer_id), host, client_id,
        time_lag_seconds, consume_rate, produce_rate       (msg/s)
    evidence["lag_total"]         int, the group's lag on the topic
    evidence["time_lag_seconds"]  number, worst time lag
    evidence["partition_count"]   int, partitions of the topic (scale cap)
    evidence["group_members"]     int, live members
    evidence["group_state"]       str, contract 1's upper snake case
    evidence["consume_rate"], evidence["produce_rate"]   msg/s, topic-wide
    evidence["processing_ms_per_record"], evidence["consumer_config"]  (recommend_consumer_config)

The diagnosis engine (lagdoctor.diagnosis.classify) writes a flat evidence
struct today; these of its keys are read when the rows above are absent::

    lag (total), max_time_lag_seconds, partition (the focus partition),
    partition_lag, owner_member_id, owner_client_id, owner_host,
    partition_produce_rate, partition_consume_rate, time_lag_seconds (focus)

and, in findings written since time lag sources and forecasts exist (absent or null
in older ones: nothing is shown; lagdoctor.notify.lag_text reads them)::

    time_lag_source        "record" | "next_record" | "interpolated" | "lower_bound" | "caught_up"
                           (also per status row)
    committed_record       the record at the focus partition's committed offset (never its payload)
    catch_up               {"state": "clearing" | "steady" | "never" | "caught_up" | "unknown", "seconds"}
    data_loss              {"state": "already" | "at_risk" | "safe" | "not_applicable" | "unknown", "seconds",
                            "partitions", "retention_ms", "retention_bytes", "basis", "cleanup_policy",
                            "horizon_seconds"}   (basis "beyond_horizon" with safe: none within the horizon)

``with_partition_status(finding, rows)`` fills ``evidence["partitions"]`` from
contract 2's partition_status.jsonl rows (lag, time lag, rates per partition).
Without any of it, the table shows one row per partition number in
``finding["partitions"]`` with ``-`` for what is unknown.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

WORST_ROWS = 5


def evidence_of(finding: Mapping[str, Any]) -> Mapping[str, Any]:
    ev = finding.get("evidence")
    return ev if isinstance(ev, Mapping) else {}


def _focus_row(ev: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine's flat 'focus partition' keys as a table row."""
    if not isinstance(ev.get("partition"), int):
        return None
    return {"partition": ev["partition"], "lag": ev.get("partition_lag"),
            "member_id": ev.get("owner_member_id"), "client_id": ev.get("owner_client_id"),
            "host": ev.get("owner_host"), "time_lag_seconds": ev.get("time_lag_seconds"),
            "time_lag_source": ev.get("time_lag_source"), "time_lag_lower_bound": ev.get("time_lag_lower_bound"),
            "produce_rate": ev.get("partition_produce_rate"), "consume_rate": ev.get("partition_consume_rate")}


def partition_rows(finding: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    ev = evidence_of(finding)
    rows = [r for r in ev.get("partitions") or [] if isinstance(r, Mapping)]
    if rows:
        return rows
    focus = _focus_row(ev)
    rows = [focus] if focus else []
    seen = {focus["partition"]} if focus else set()
    rows += [{"partition": p} for p in finding.get("partitions") or [] if p not in seen]
    return rows


def with_partition_status(finding: Mapping[str, Any], status_rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of ``finding`` whose ``evidence["partitions"]`` holds its partition_status rows.

    Rows of other (cluster, group, topic) are ignored; the focus partition keeps
    its owner (member, client, host) from the engine's evidence.
    """
    key = (finding.get("cluster"), finding.get("group_id"), finding.get("topic"))
    ev = dict(evidence_of(finding))
    focus = _focus_row(ev) or {}
    rows = []
    for r in status_rows:
        if (r.get("cluster"), r.get("group_id"), r.get("topic")) != key:
            continue
        row = {k: r.get(k) for k in ("partition", "lag", "time_lag_seconds", "consume_rate", "produce_rate", "status",
                                     "committed_offset", "log_end_offset", "member_id", "client_id", "host",
                                     "time_lag_source", "time_lag_lower_bound")}
        if focus.get("partition") == row["partition"]:
            # The status row's owner is the same snapshot's; the engine's focus fills gaps only.
            row.update({k: focus[k] for k in ("member_id", "client_id", "host") if row.get(k) is None})
        rows.append(row)
    if rows and not ev.get("partitions"):
        ev["partitions"] = rows
    return {**finding, "evidence": ev}


def worst_partitions(finding: Mapping[str, Any], limit: int = WORST_ROWS) -> list[Mapping[str, Any]]:
    """Highest lag first (unknown lag last), then time lag, then partition number."""
    def key(r: Mapping[str, Any]):
        lag = r.get("lag")
        tl = r.get("time_lag_seconds")
        return (-(lag if isinstance(lag, (int, float)) else -1),
                -(tl if isinstance(tl, (int, float)) else -1),
                r.get("partition") if isinstance(r.get("partition"), int) else 1 << 31)
    return sorted(partition_rows(finding), key=key)[:limit]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _evidence_or_rows(finding: Mapping[str, Any], keys: tuple[str, ...], row_key: str, combine) -> Any:
    """The first of `keys` the evidence holds as a number, else `combine` of the partition rows' `row_key`."""
    ev = evidence_of(finding)
    for k in keys:
        if _number(ev.get(k)):
            return ev[k]
    values = [r.get(row_key) for r in partition_rows(finding) if isinstance(r.get(row_key), (int, float))]
    return combine(values) if values else None


def lag_total(finding: Mapping[str, Any]) -> Any:
    return _evidence_or_rows(finding, ("lag_total", "lag"), "lag", sum)


def worst_time_lag(finding: Mapping[str, Any]) -> Any:
    return _evidence_or_rows(finding, ("max_time_lag_seconds", "time_lag_seconds"), "time_lag_seconds", max)
