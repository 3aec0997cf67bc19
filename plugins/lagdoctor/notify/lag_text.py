"""Lag in words: time lag and its source, the catch-up and data-loss forecasts,
retention, and the record a stalled consumer is stuck on.

Plain phrases (not escaped): Slack's templates escape them, the page's
autoescape does. forecast_text puts them in Slack lines.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.notify.evidence import evidence_of
from lagdoctor.notify.formatting import (MAX_CELL, finite, fmt_bytes, fmt_duration, fmt_eta, fmt_int, fmt_rate,
                                         one_line_id, partitions_text)
from lagdoctor.notify.templates import render


def is_lower_bound(row: Mapping[str, Any]) -> bool:
    """A time lag older than the window: the value is a minimum."""
    return row.get("time_lag_source") == "lower_bound" or row.get("time_lag_lower_bound") is True


def time_lag_source_of(seconds: Any, rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The source of a time lag shown as the worst of ``rows`` (status rows, evidence):
    that of a row holding the same value, "lower_bound" first; None when no row says.

    The group's worst time lag may be another partition's than the focus, whose
    source the evidence carries: then only a status row can tell."""
    shown = finite(seconds)
    if shown is None:
        return None
    sources = {"lower_bound" if is_lower_bound(r) else r.get("time_lag_source")
               for r in rows if finite(r.get("time_lag_seconds")) is not None
               and abs(float(r["time_lag_seconds"]) - shown) < 0.01}
    return next((s for s in ("lower_bound", "record", "next_record", "interpolated", "caught_up") if s in sources),
                None)


def time_lag_text(seconds: Any, source: str | None) -> str:
    """``40m 00s (exact, from the record's timestamp)``, ``at least 30m 00s (older than the window)``;
    an interpolated or caught-up time lag is the usual estimate and says nothing more."""
    text = fmt_duration(seconds)
    if text == "-":
        return text
    if source == "lower_bound":
        return f"at least {text} (older than the window)"
    if source == "record":
        return f"{text} (exact, from the record's timestamp)"
    if source == "next_record":
        return f"{text} (exact, from the next data record's timestamp)"
    return text


def table_time_lag(row: Mapping[str, Any]) -> str:
    """A time lag cell: ``≥`` marks a minimum (older than the window)."""
    text = fmt_duration(row.get("time_lag_seconds"))
    return "≥" + text if text != "-" and is_lower_bound(row) else text


def _forecast(ev: Mapping[str, Any], key: str) -> tuple[str | None, float | None]:
    value = ev.get(key)
    if not isinstance(value, Mapping) or not isinstance(value.get("state"), str):
        return None, None
    return value["state"], finite(value.get("seconds"))


def _in(seconds: float) -> str:
    # A forecast of a few seconds is "now" within the snapshot interval, never "in 0s".
    return "in under a minute" if seconds < 60 else f"in {fmt_eta(seconds)}"


NEVER_RATE_SLACK = Thresholds().slow_rate_slack


def catch_up_text(ev: Mapping[str, Any]) -> str:
    """When the lag clears at current rates; "" for a finding written before the forecast existed."""
    state, seconds = _forecast(ev, "catch_up")
    if state == "clearing":
        return f"{_in(seconds)} at current rates" if seconds is not None else "clearing at current rates"
    if state == "never":
        consume, produce = finite(ev.get("consume_rate")), finite(ev.get("produce_rate"))
        # "never" is the worst partition's, on the window's late rates; the topic's whole-window
        # rates are shown only when they agree with it (clearly below, as forecast.py F2 asks),
        # never as a contradiction ("consuming 39.9 of 40.0 msg/s").
        below = consume is not None and produce is not None and consume < (1 - NEVER_RATE_SLACK) * produce
        rates = f" (consuming {fmt_rate(consume)} of {fmt_rate(produce)} msg/s)" if below else ""
        return "never at current rates" + rates
    if state == "steady":
        # consume and produce within noise of each other (forecast.py F2): not "never"
        return "lag holding steady at current rates"
    if state == "caught_up":
        return "caught up"
    return "unknown" if state == "unknown" else ""


def _loss_partitions(ev: Mapping[str, Any]) -> list[Any]:
    """The partitions a data-loss line names: for "already", those that lost data
    (retention_loss_partitions; data_loss.partitions also holds those only at risk)."""
    loss = ev.get("data_loss") if isinstance(ev.get("data_loss"), Mapping) else {}
    at_risk = loss.get("partitions") if isinstance(loss.get("partitions"), list) else []
    lost = ev.get("retention_loss_partitions") if isinstance(ev.get("retention_loss_partitions"), list) else []
    return (lost or at_risk) if loss.get("state") == "already" else at_risk


def data_loss_text(ev: Mapping[str, Any]) -> str:
    """When retention deletes records the group has not read; "" without the forecast."""
    state, seconds = _forecast(ev, "data_loss")
    where = partitions_text(_loss_partitions(ev))
    if state == "already":
        return f"already lost on {where}" if where else "already lost: retention deleted unread records"
    if state == "at_risk":
        # From retention.ms the forecast is when deletion can start (whole segments go at once).
        verb = "can start deleting" if ev["data_loss"].get("basis") == "retention_ms" else "will delete"
        text = f"retention {verb} unread records"
        if seconds is not None:
            text += " in under a minute" if seconds < 60 else f" in ~{fmt_eta(seconds)}"
        text += f" ({where})" if where else ""
        return text if seconds is not None else text + "; when is unknown"
    if state == "safe":
        loss, horizon = ev["data_loss"], finite(ev["data_loss"].get("horizon_seconds"))
        kept = all((finite(loss.get(k)) or 0) < 0 for k in ("retention_ms", "retention_bytes"))
        if horizon is not None and not kept:
            # forecast.py F3: safe says how far it looked, never a date past it (a flip between "beyond
            # the horizon" and "no estimate" at the same rates reads the same)
            return f"none within {fmt_eta(horizon)} at current rates"
        return "none expected at current rates"
    if state == "not_applicable":
        return "none from retention.ms: compacted topic (retention.ms does not delete unread records)"
    return "unknown" if state == "unknown" else ""


def data_loss_state(ev: Mapping[str, Any]) -> str | None:
    return _forecast(ev, "data_loss")[0]


DATA_LOSS_BASIS = {"log_start": "from how fast the log start offset advances",
                   "retention_ms": "from the topic's retention.ms and the unread records' age"}


def retention_text(ev: Mapping[str, Any]) -> str:
    """The topic's retention as the collector read it: ``retention.ms 7d · retention.bytes 1.0 GiB``."""
    loss = ev.get("data_loss") if isinstance(ev.get("data_loss"), Mapping) else {}
    parts = []
    for key, fmt in (("retention_ms", lambda v: fmt_eta(v / 1000)), ("retention_bytes", fmt_bytes)):
        value = finite(loss.get(key))
        if value is not None:
            parts.append(f"{key.replace('_', '.')} {'infinite' if value < 0 else fmt(value)}")
    return " · ".join(parts)


MAX_HEADER_NAMES = 8


def _produced_at(value: Any) -> str:
    from datetime import datetime, timezone

    try:
        ts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return one_line_id(value)
    ts = ts.astimezone(timezone.utc) if ts.tzinfo else ts
    return ts.strftime("%Y-%m-%dT%H:%M:%S") + (f".{ts.microsecond // 1000:03d}" if ts.microsecond else "") + "Z"


def stuck_record_parts(ev: Mapping[str, Any]) -> list[str] | None:
    """The record at the committed offset as the collector saw it: offset, key hash, value
    size, header NAMES, produce time. Never a payload or a header value (evidence holds
    none). None when there is no record."""
    rec = ev.get("committed_record")
    if not isinstance(rec, Mapping) or not isinstance(rec.get("offset"), int) or isinstance(rec.get("offset"), bool):
        return None
    key = rec.get("key_sha256")
    offset = f"offset {rec['offset']}"
    committed = rec.get("committed_offset")
    if isinstance(committed, int) and not isinstance(committed, bool) and rec["offset"] > committed:
        # The committed offset held no data record: say which record is meant, and why.
        skipped = rec["offset"] - committed
        offset += (f" (the next data record: {skipped} offset{'s' if skipped > 1 else ''} from the committed "
                   f"{committed} hold transaction markers, aborted or compacted records)")
    parts = [offset, f"key #{one_line_id(key)}" if key else "no key"]
    if finite(rec.get("size")) is not None:
        parts.append(f"{fmt_int(rec['size'])} bytes")
    headers = [one_line_id(h)[:MAX_CELL] for h in rec.get("headers") or [] if h is not None]
    if headers:
        more = f" and {len(headers) - MAX_HEADER_NAMES} more" if len(headers) > MAX_HEADER_NAMES else ""
        parts.append("headers " + ",".join(headers[:MAX_HEADER_NAMES]) + more)
    if rec.get("timestamp"):
        parts.append("produced " + _produced_at(rec["timestamp"]))
    return parts


def stuck_record_text(finding: Mapping[str, Any]) -> str:
    """A stalled consumer's stuck record (``offset 120, key #3fa9…, 2,048 bytes, …``), or
    ``not read: <why>``; "" for any other diagnosis or without a record."""
    ev = evidence_of(finding)
    rec = ev.get("committed_record")
    if finding.get("diagnosis") != "stalled_consumer" or not isinstance(rec, Mapping):
        return ""
    parts = stuck_record_parts(ev)
    if parts:
        return ", ".join(parts)
    return f"not read: {one_line_id(rec['error'])}" if rec.get("error") else ""


def forecast_text(finding: Mapping[str, Any]) -> str:
    """Slack lines for catch-up, data loss and the stuck record; quiet when there is
    nothing to act on (caught up, safe, unknown) or the finding predates them."""
    ev = evidence_of(finding)
    lines = []
    catch_up_state = _forecast(ev, "catch_up")[0]
    if catch_up_state in ("clearing", "steady", "never"):
        lines.append(render("catch_up", text=catch_up_text(ev)))
    if data_loss_state(ev) in ("at_risk", "already"):
        lines.append(render("data_loss", text=data_loss_text(ev)))
    record = stuck_record_text(finding)
    if record:
        partition = ev.get("partition")
        lines.append(render("stuck_record", text=record,
                            partition=partition if isinstance(partition, int) and not isinstance(partition, bool)
                            else ""))
    return "\n".join(lines)
