"""Block Kit rendering: a finding (plus its runbook plan) -> a Slack message.

Renders only; never sends, never decides (threads.py decides, slack.py sends).

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

and, from findings of issue 10 on (absent or null in older ones: nothing is shown)::

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

import math
from typing import Any, Iterable, Mapping, Sequence

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.notify.buttons import approval_buttons, incident_buttons, target_buttons
from lagdoctor.notify.templates import (code_safe, escape_mrkdwn, mrkdwn_value, render, render_plain, shared_by_text,
                                        TEMPLATES)

SEVERITY_EMOJI = {"critical": ":red_circle:", "warning": ":large_yellow_circle:", "ok": ":large_green_circle:"}
STATUS_EMOJI = {
    "dry_run": ":test_tube:", "blocked": ":no_entry:", "awaiting_approval": ":hourglass_flowing_sand:",
    "rejected": ":no_entry_sign:", "executed": ":white_check_mark:", "noop": ":heavy_minus_sign:",
    "failed": ":x:", "recommended": ":bulb:", "proposed": ":bulb:",
}
STATUS_WORDS = {
    "dry_run": "dry run", "blocked": "blocked", "awaiting_approval": "waiting for approval",
    "rejected": "rejected", "executed": "done", "noop": "nothing to do", "failed": "failed",
    "recommended": "recommended", "proposed": "proposed",
}
DESCRIBE_COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                    "CONSUMER-ID", "HOST", "CLIENT-ID")
EXTRA_COLUMNS = ("TIME-LAG", "IN/S", "OUT/S")
WORST_ROWS = 5
MAX_CELL = 40  # long consumer ids are cut so the table stays readable in a Slack column
SECTION_LIMIT = 3000  # Slack's limit for a section's text
HEADER_LIMIT = 150


# ---------------------------------------------------------------- formatting

def fmt_int(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{int(value):,}"


def fmt_rate(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "-"
    return f"{value:,.1f}"


def fmt_duration(seconds: Any) -> str:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fmt_eta(seconds: Any) -> str:
    """A forecast or a retention, as coarse as it is sure: 45s, 12m, 1h05m, 2d03h, 7d ("-" when unknown)."""
    value = _finite(seconds)
    if value is None or value < 0:
        return "-"
    if value < 60:
        return f"{int(round(value))}s"
    m = int(round(value / 60))
    if m < 60:
        return f"{m}m"
    if m < 24 * 60:
        return f"{m // 60}h{m % 60:02d}m"
    h = int(round(value / 3600))
    return f"{h // 24}d{h % 24:02d}h" if h % 24 else f"{h // 24}d"


def fmt_bytes(value: Any) -> str:
    number = _finite(value)
    if number is None or number < 0:
        return "-"
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if number >= div:
            return f"{number / div:,.1f} {unit}"
    return f"{int(number):,} bytes"


def _cell(value: Any) -> str:
    text = code_safe("-" if value is None or value == "" else value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _evidence(finding: Mapping[str, Any]) -> Mapping[str, Any]:
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
    ev = _evidence(finding)
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
    ev = dict(_evidence(finding))
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


def evidence_table(finding: Mapping[str, Any], limit: int = WORST_ROWS) -> str:
    """A fixed-width table in a code block, columns as kafka-consumer-groups.sh --describe."""
    group, topic = finding.get("group_id"), finding.get("topic")
    lines = [DESCRIBE_COLUMNS + EXTRA_COLUMNS]
    for r in worst_partitions(finding, limit):
        current = r.get("committed_offset", r.get("current_offset"))
        lines.append(tuple(_cell(v) for v in (
            group, topic, r.get("partition"),
            current if current is not None else None, r.get("log_end_offset"), r.get("lag"),
            r.get("member_id") or r.get("consumer_id"), r.get("host"), r.get("client_id"),
        )) + (table_time_lag(r), fmt_rate(r.get("produce_rate")), fmt_rate(r.get("consume_rate"))))
    if len(lines) == 1:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = "\n".join(" ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    # Escaped after alignment so widths count what people see.
    return escape_mrkdwn(text)


def _lag_total(finding: Mapping[str, Any]) -> Any:
    ev = _evidence(finding)
    for k in ("lag_total", "lag"):
        if isinstance(ev.get(k), (int, float)) and not isinstance(ev.get(k), bool):
            return ev[k]
    lags = [r.get("lag") for r in partition_rows(finding) if isinstance(r.get("lag"), (int, float))]
    return sum(lags) if lags else None


def _time_lag(finding: Mapping[str, Any]) -> Any:
    ev = _evidence(finding)
    for k in ("max_time_lag_seconds", "time_lag_seconds"):
        if isinstance(ev.get(k), (int, float)) and not isinstance(ev.get(k), bool):
            return ev[k]
    tls = [r.get("time_lag_seconds") for r in partition_rows(finding) if isinstance(r.get("time_lag_seconds"), (int, float))]
    return max(tls) if tls else None


# ---------------------------------------------------------------- issue 10: time lag source, forecasts, stuck record
# Plain phrases (not escaped): Slack's templates escape them, the page's autoescape does.

def is_lower_bound(row: Mapping[str, Any]) -> bool:
    """A time lag older than the window: the value is a minimum."""
    return row.get("time_lag_source") == "lower_bound" or row.get("time_lag_lower_bound") is True


def time_lag_source_of(seconds: Any, rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The source of a time lag shown as the worst of ``rows`` (status rows, evidence):
    that of a row holding the same value, "lower_bound" first; None when no row says.

    The group's worst time lag may be another partition's than the focus, whose
    source the evidence carries: then only a status row can tell."""
    shown = _finite(seconds)
    if shown is None:
        return None
    sources = {"lower_bound" if is_lower_bound(r) else r.get("time_lag_source")
               for r in rows if _finite(r.get("time_lag_seconds")) is not None
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
    return value["state"], _finite(value.get("seconds"))


def partitions_text(partitions: Iterable[Any], limit: int = 10) -> str:
    """``partition 3`` / ``partitions 0, 3`` (the first ``limit``, then ``and N more``)."""
    parts = [one_line_id(p) for p in partitions if p is not None]
    if not parts:
        return ""
    shown = ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if len(parts) > limit else "")
    return f"partition{'s' if len(parts) > 1 else ''} {shown}"


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
        consume, produce = _finite(ev.get("consume_rate")), _finite(ev.get("produce_rate"))
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
        loss, horizon = ev["data_loss"], _finite(ev["data_loss"].get("horizon_seconds"))
        kept = all((_finite(loss.get(k)) or 0) < 0 for k in ("retention_ms", "retention_bytes"))
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
        value = _finite(loss.get(key))
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
    if _finite(rec.get("size")) is not None:
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
    ev = _evidence(finding)
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
    ev = _evidence(finding)
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


def _title(diagnosis: str) -> str:
    return diagnosis.replace("_", " ").capitalize() if diagnosis else "Finding"


def _text_section(text: str) -> dict[str, Any]:
    if len(text) > SECTION_LIMIT:
        text = text[: SECTION_LIMIT - 1] + "…"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def one_line_id(value: Any, default: str = "-") -> str:
    """A broker- or user-chosen name on one line: a line break in a group id must not
    start a line of its own in Slack (a forged "Recovered", say), and a backtick must
    not open or close a code span (Slack has no escape for it). Not escaped here."""
    text = " ".join(str(value).replace("`", "'").split()) if value is not None else ""
    return text or default


# The job names no owner when the broker lists no group members (some
# Kafka-compatible brokers, missing DESCRIBE rights) and says why in every summary;
# a message says it once.
OWNER_UNKNOWN = "unknown (the broker lists no members)"
OWNER_UNKNOWN_NOTE = (":information_source: Owner unknown: the broker lists no members for this group "
                      "(as some Kafka-compatible brokers do), so no consumer can be named.")


def owner_unknown_once(text: Any) -> tuple[str, bool]:
    """``text`` with the broker's excuse cut to "unknown", and whether it was there."""
    value = "" if text is None else str(text)
    return value.replace(OWNER_UNKNOWN, "unknown"), OWNER_UNKNOWN in value


def _owner_note_block() -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": OWNER_UNKNOWN_NOTE}]}


def links_text(finding: Mapping[str, Any], *, dag_id: str | None, run_id: str) -> str:
    """`<run|Airflow run> · <group|group view> · <report|HTML report>`: each one only when it has a URL
    (an absolute one: Airflow's base URL must be configured, lagdoctor.web.links)."""
    from lagdoctor.web import links

    parts = [report_link(links.run_url(dag_id or "", run_id), "Airflow run") if dag_id and run_id else "",
             report_link(links.group_url(str(finding.get("cluster") or ""), str(finding.get("group_id") or "")),
                         "group view"),
             report_link(finding.get("report_url"))]
    return " · ".join(p for p in parts if p)


def is_provisional(finding: Mapping[str, Any]) -> bool:
    """Issue 18: the finding's evidence cannot yet tell its candidates apart."""
    return finding.get("provisional") is True


def _candidates(finding: Mapping[str, Any]) -> list[str]:
    between = [one_line_id(d, "") for d in finding.get("deciding_between") or [] if d]
    return between or [one_line_id(finding.get("diagnosis"), "")]


def deciding_between_text(finding: Mapping[str, Any]) -> str:
    """``partition imbalance and stalled consumer`` (the candidates, the leading one first)."""
    names = [d.replace("_", " ") for d in _candidates(finding)]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def decided_by_text(finding: Mapping[str, Any]) -> str:
    """``will know at the first sweep after 03:20 UTC``; the date too when it is not the window
    end's. The minute is rounded up (never a promise earlier than the rule's), and no sample
    count: a sweep's samples come in bursts, so the answer comes with the first sweep after it."""
    by = promised_at(finding.get("decided_by"))
    if by is None:
        return "will know at a later sweep"
    return f"will know at the first sweep after {_promise_time(by, finding.get('window_end'))}"


def promised_at(decided_by: Any):
    """The time a provisional finding's ``decided_by`` promises, as said: the minute rounded up; None
    when it has none. A sweep at or after it that is still undecided broke the promise."""
    from datetime import timedelta

    by = _parse_iso(decided_by)
    if by is not None and (by.second or by.microsecond):
        by = by.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return by


def _promise_time(by: Any, window_end: Any = None) -> str:
    """``03:20 UTC``; the date too when it is not ``window_end``'s."""
    end = _parse_iso(window_end)
    return by.strftime("%H:%M UTC") if end is None or end.date() == by.date() else by.strftime("%Y-%m-%d %H:%M UTC")


def promise_overdue(decided_by: Any, now: Any) -> bool:
    """Whether the promised time passed by ``now`` (a datetime; None: never)."""
    by = promised_at(decided_by)
    return by is not None and now is not None and _utc(now) >= by


def promise_text(finding: Mapping[str, Any], now: Any = None) -> str:
    """``will know at the first sweep after 10:10 UTC``, or once that passed by ``now``:
    ``was due at the first sweep after 10:10 UTC: overdue``."""
    if promise_overdue(finding.get("decided_by"), now):
        by = promised_at(finding.get("decided_by"))
        return f"was due at the first sweep after {_promise_time(by, finding.get('window_end'))}: overdue"
    return decided_by_text(finding)


def _utc(value: Any):
    from datetime import timezone

    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _parse_iso(value: Any):
    from datetime import datetime, timezone

    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def provisional_where(finding: Mapping[str, Any]) -> str:
    """``orders[1]``, ``orders[1,4]`` or the topic alone for a whole-topic finding."""
    topic = one_line_id(finding.get("topic"))
    parts = [p for p in finding.get("partitions") or [] if isinstance(p, int)]
    return f"{topic}[{','.join(str(p) for p in parts[:10])}{',…' if len(parts) > 10 else ''}]" if parts else topic


def provisional_line(finding: Mapping[str, Any]) -> str:
    """The first line of a provisional finding's message, plain text; "" for a decided finding."""
    if not is_provisional(finding):
        return ""
    return render_plain(TEMPLATES["provisional_fallback"], **_provisional_values(finding))


def _provisional_values(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {"group": one_line_id(finding.get("group_id")), "topic": one_line_id(finding.get("topic")),
            "between": deciding_between_text(finding), "where": provisional_where(finding),
            "by": decided_by_text(finding), "because": finding.get("undecided_because") or "-"}


def _values(finding: Mapping[str, Any]) -> dict[str, Any]:
    diagnosis = one_line_id(finding.get("diagnosis"), "")
    severity = str(finding.get("severity") or "")
    summary, owner_unknown = owner_unknown_once(finding.get("summary"))
    return {
        "owner_unknown": owner_unknown,
        "group": one_line_id(finding.get("group_id")), "topic": one_line_id(finding.get("topic")),
        "cluster": one_line_id(finding.get("cluster")), "diagnosis": diagnosis,
        "diagnosis_title": _title(diagnosis), "severity": severity or "-",
        "severity_word": severity.upper() or "FINDING",
        "emoji": SEVERITY_EMOJI.get(severity, ":grey_question:"),
        "pattern": finding.get("pattern") or "-", "summary": summary,
        "time_lag": _time_lag_shown(finding), "lag_total": fmt_int(_lag_total(finding)),
    }


def _time_lag_shown(finding: Mapping[str, Any]) -> str:
    seconds = _time_lag(finding)
    return time_lag_text(seconds, time_lag_source_of(seconds, [*partition_rows(finding), _evidence(finding)]))


def action_lines(actions: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per planned action or action record (``status`` present) ."""
    out = []
    for a in actions:
        status = a.get("status") or "proposed"
        state = STATUS_WORDS.get(status, status)
        if status == "proposed":
            flags = [w for w, on in (("needs approval", a.get("requires_approval")), ("irreversible", a.get("irreversible"))) if on]
            state += f" ({', '.join(flags)})" if flags else ""
        out.append(render("action_line", emoji=STATUS_EMOJI.get(status, ":grey_question:"), action=a.get("action", "?"),
                          state=state, description=a.get("description") or a.get("message") or ""))
    return out


MAX_READ_ERRORS = 5


def incomplete_data_text(finding: Mapping[str, Any]) -> str:
    """What a person must know when the verdict rests on incomplete data; "" when it does not.

    Reads evidence ``data_complete`` (false), ``read_errors`` (one line each,
    the first MAX_READ_ERRORS shown), ``read_error_count`` and
    ``offset_reset_partitions`` (log end offsets that went backwards; from issue 29 on
    ``log_end_fell_partitions`` and ``commit_above_partitions`` say which) and
    ``hanging_transaction_partitions`` (an open transaction holds the last stable offset).
    """
    ev = _evidence(finding)
    lines = []
    if ev.get("data_complete") is False:
        errors = [str(e) for e in ev.get("read_errors") or [] if e is not None]
        count = ev.get("read_error_count")
        count = count if isinstance(count, int) and not isinstance(count, bool) and count >= len(errors) else len(errors)
        lines.append(render("incomplete_data", count=count))
        lines += [f"• `{escape_mrkdwn(code_safe(e))}`" for e in errors[:MAX_READ_ERRORS]]
        if count > min(len(errors), MAX_READ_ERRORS):
            lines.append(f"… and {count - min(len(errors), MAX_READ_ERRORS)} more")
    resets = [p for p in ev.get("offset_reset_partitions") or [] if p is not None]
    if "commit_above_partitions" in ev or "log_end_fell_partitions" in ev:
        # said apart (classify.py case 10): only a log end that fell "went backwards"
        resets = [p for p in ev.get("log_end_fell_partitions") or [] if p is not None]
        above = [p for p in ev.get("commit_above_partitions") or [] if p is not None]
        if above:
            lines.append(render("commit_above", partitions=", ".join(one_line_id(p) for p in above)))
    if resets:
        lines.append(render("offset_reset", partitions=", ".join(one_line_id(p) for p in resets)))
    hanging = [p for p in ev.get("hanging_transaction_partitions") or [] if p is not None]
    if hanging and not ev.get("transaction_blocked_partitions"):  # else the summary says it already
        lines.append(render("open_transaction", partitions=", ".join(one_line_id(p) for p in hanging)))
    return "\n".join(lines)


# ---------------------------------------------------------------- messages

def render_incident(finding: Mapping[str, Any], plan: Mapping[str, Any] | None = None,
                    *, run_id: str = "", actions: Sequence[Mapping[str, Any]] | None = None,
                    dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """The first message of an incident thread: ``{"text": fallback, "blocks": [...]}``.

    ``plan`` is ``lagdoctor.runbooks.Plan.as_dict()`` (next steps, proposed actions);
    ``actions`` are action records to show instead of the plan's proposals.
    ``dag_id`` links the Airflow run; ``controls`` (the incident key's digest)
    adds Acknowledge / Snooze 1 h (lagdoctor.notify.interactive).
    """
    v = _values(finding)
    plan = plan or {}
    provisional = is_provisional(finding)
    if provisional:
        # Issue 18: no cause in the first line until one is decided; what is open, and until when.
        pv = {**_provisional_values(finding), "summary": v["summary"]}
        header = render_plain(TEMPLATES["header_provisional"], **v)
        lead = [_text_section(render("provisional", **pv)), _text_section(render("provisional_evidence", **pv))]
    else:
        header = render_plain(TEMPLATES["header"], **v)
        lead = [_text_section(render("summary", **v))]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header[:HEADER_LIMIT], "emoji": True}},
        *lead,
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": render(name, **v)}
            for name in ("field_cluster", "field_topic", "field_pattern", "field_time_lag", "field_lag", "field_severity")
        ]},
    ]
    forecast = forecast_text(finding)
    if forecast:
        blocks.append(_text_section(forecast))
    incomplete = incomplete_data_text(finding)
    if incomplete:
        blocks.append(_text_section(incomplete))
    own = own_actions_text(finding)
    if own:
        blocks.append(_text_section(own))
    table = evidence_table(finding)
    if table:
        blocks.append(_text_section(render("evidence_title") + "\n```\n" + table + "\n```"))
    blocks.extend(_plan_blocks(plan, actions if actions is not None else plan.get("actions") or []))
    window = " → ".join(str(finding[k]) for k in ("window_start", "window_end") if finding.get(k))
    context = render("context", window=window or "-", run_id=run_id or "-")
    link = links_text(finding, dag_id=dag_id, run_id=run_id)
    if link:
        context += " · " + link
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    if v["owner_unknown"]:
        blocks.append(_owner_note_block())
    if controls:
        blocks.append(incident_buttons(controls))
    # the notification text is mrkdwn too: values escaped, so no name can ping or link
    fallback = render("provisional_fallback", **_provisional_values(finding)) if provisional else render("fallback", **v)
    return {"text": fallback, "blocks": blocks}


def render_decided(finding: Mapping[str, Any], was_between: Sequence[str], plan: Mapping[str, Any] | None = None,
                   *, run_id: str = "", dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """The reply in a provisional incident's thread once a sweep decided the cause (not a change of
    diagnosis: the first message said it was still open), with the next steps and actions now planned."""
    v = _values(finding)
    between = deciding_between_text({"deciding_between": list(was_between), "diagnosis": finding.get("diagnosis")})
    decided = render("decided", diagnosis=v["diagnosis"].replace("_", " "), between=between)
    plan = plan or {}
    blocks = _reply_blocks(finding, v, decided + "\n" + render("summary", **v),
                           _plan_blocks(plan, plan.get("actions") or []),
                           run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render("decided_fallback", diagnosis=v["diagnosis"].replace("_", " "), group=v["group"],
                           topic=v["topic"]), "blocks": blocks}


def render_cause_change(finding: Mapping[str, Any], was: str, plan: Mapping[str, Any] | None = None, *,
                        still_open: bool, run_id: str = "", dag_id: str | None = None,
                        controls: str | None = None) -> dict[str, Any]:
    """A reply in the open thread of a (cluster, group, topic) when a sweep finds another cause there:
    the cause the thread named is gone (``still_open`` False: "Cause changed"), or holds beside the new
    one ("Also"). The whole finding, next steps and actions, as a first message has them: one incident,
    one top-level message."""
    v = _values(finding)
    names = {"was": one_line_id(was, "").replace("_", " "), "diagnosis": v["diagnosis"].replace("_", " ")}
    kind = "cause_added" if still_open else "cause_changed"
    plan = plan or {}
    blocks = _reply_blocks(finding, v, render(kind, emoji=v["emoji"], **names) + "\n" + render("summary", **v),
                           _plan_blocks(plan, plan.get("actions") or []),
                           run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render(f"{kind}_fallback", group=v["group"], topic=v["topic"], **names), "blocks": blocks}


def _plan_blocks(plan: Mapping[str, Any], actions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan's next steps and the action lines, each a section when there is any."""
    blocks = []
    steps = list(plan.get("next_steps") or [])
    if steps:
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
        blocks.append(_text_section(render("next_steps_title", runbook=plan.get("runbook", "")) + "\n" + body))
    lines = action_lines(actions)
    if lines:
        blocks.append(_text_section(render("actions_title") + "\n" + "\n".join(lines)))
    return blocks


def _reply_blocks(finding: Mapping[str, Any], v: Mapping[str, Any], lead: str,
                  middle: Sequence[Mapping[str, Any]] = (), *, run_id: str, dag_id: str | None,
                  controls: str | None) -> list[dict[str, Any]]:
    """A thread reply about a finding: ``lead``, the four fields, forecast, incomplete data, the
    evidence table, ``middle`` (e.g. the plan), links, the owner note and the buttons."""
    blocks = [_text_section(lead),
              {"type": "section", "fields": [
                  {"type": "mrkdwn", "text": render(n, **v)} for n in ("field_pattern", "field_time_lag", "field_lag", "field_severity")]}]
    forecast = forecast_text(finding)
    if forecast:
        blocks.append(_text_section(forecast))
    incomplete = incomplete_data_text(finding)
    if incomplete:
        blocks.append(_text_section(incomplete))
    own = own_actions_text(finding)
    if own:
        blocks.append(_text_section(own))
    table = evidence_table(finding)
    if table:
        blocks.append(_text_section("```\n" + table + "\n```"))
    blocks.extend(middle)
    link = links_text(finding, dag_id=dag_id, run_id=run_id)
    if link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": link}]})
    if v["owner_unknown"]:
        blocks.append(_owner_note_block())
    if controls:
        blocks.append(incident_buttons(controls))
    return blocks


def render_still_undecided(finding: Mapping[str, Any], was_promised: Any,
                           changes: Sequence[str] = ()) -> dict[str, Any]:
    """The one reply in a provisional thread whose promised time passed while the sweep is still
    undecided (threads rule 9): that it is, why, and the new time."""
    pv = _provisional_values(finding)
    by = promised_at(was_promised)
    was = _promise_time(by, finding.get("window_end")) if by is not None else "the time promised"
    text = render("still_undecided", was=was, **pv)
    if changes:
        text += "\n" + render("still_undecided_changes", changes="; ".join(changes))
    return {"text": render("still_undecided_fallback", was=was, **pv), "blocks": [_text_section(text)]}


def render_superseded(finding: Mapping[str, Any], was_between: Sequence[str], *, existing: bool = False,
                      existing_since: Any = None) -> dict[str, Any]:
    """The closing reply of a provisional thread the finding did not land in (threads rule 8): what
    it became, and where that is followed: its own new thread, or (``existing``) the thread already
    open (since ``existing_since``, a datetime, when known). Short: the evidence is in that thread."""
    v = _values(finding)
    if is_provisional(finding):
        now = "still deciding between " + deciding_between_text(finding)
    else:
        now = v["diagnosis"].replace("_", " ")
    between = deciding_between_text({"deciding_between": list(was_between), "diagnosis": finding.get("diagnosis")})
    decided = not is_provisional(finding) and finding.get("diagnosis") in set(was_between)
    where = "its own thread"
    if existing:
        where = ("its existing thread" + (f", opened {_utc(existing_since):%H:%M} UTC"
                                          if existing_since is not None else ""))
    text = render("superseded", decided=decided, now=now, between=between, where=where)
    return {"text": render("superseded_fallback", now=now, where=where, group=v["group"], topic=v["topic"]),
            "blocks": [_text_section(text)]}


def report_link(url: object, label: str = "HTML report") -> str:
    """A mrkdwn link to the incident report (lagdoctor.web.report), or "" without a URL.

    Only http(s) URLs are linked; ``|`` and ``>`` would end Slack's link syntax
    early, so they are percent-encoded, and ``&``/``<`` escaped as Slack asks.
    """
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        return ""
    safe = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C").replace("&", "&amp;")
    return f"<{safe}|{label}>"


def render_update(finding: Mapping[str, Any], changes: Sequence[str], *, run_id: str = "",
                  dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """A reply in an incident's thread: what changed, with the same links and buttons as the first message."""
    v = _values(finding)
    changes_text = "; ".join(changes)
    lead = render("update", changes=changes_text, **{k: v[k] for k in ("emoji", "summary")})
    blocks = _reply_blocks(finding, v, lead, run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render("update_fallback", changes=changes_text, group=v["group"], topic=v["topic"]), "blocks": blocks}


def render_recovery(finding: Mapping[str, Any], *, diagnosis: str, duration_seconds: float | None) -> dict[str, Any]:
    v = {**_values(finding), "diagnosis": diagnosis.replace("_", " "), "duration": fmt_duration(duration_seconds)}
    blocks = [_text_section(render("recovery", **v))] + ([_owner_note_block()] if v["owner_unknown"] else [])
    return {"text": render("recovery_fallback", **v), "blocks": blocks}


def own_actions_text(finding: Mapping[str, Any]) -> str:
    """What lagdoctor itself changed that explains part of this finding (``evidence.own_actions``,
    lines from lagdoctor.remediation.postcheck.attribution), one line each; "" for none."""
    lines = [str(x) for x in _evidence(finding).get("own_actions") or [] if x]
    return "\n".join(render("own_action", line=" ".join(line.split())) for line in lines)


def render_action_check(record: Mapping[str, Any], verdict: str, text: str, *, after_seconds: float) -> dict[str, Any]:
    """The one reply that says whether an action lagdoctor took did what it was for."""
    v = {"action": one_line_id(record.get("action"), "?"), "group": one_line_id(record.get("group_id")),
         "text": " ".join(str(text).split()), "after": fmt_duration(after_seconds)}
    kind = "action_check_worked" if verdict == "worked" else "action_check_failed"
    return {"text": render(f"{kind}_fallback", **v), "blocks": [_text_section(render(kind, **v))]}


def render_action_result(record: Mapping[str, Any]) -> dict[str, Any]:
    status = str(record.get("status", ""))
    v = {"emoji": STATUS_EMOJI.get(status, ":grey_question:"), "action": one_line_id(record.get("action"), "?"),
         "state": STATUS_WORDS.get(status, status), "message": record.get("message", ""),
         "group": one_line_id(record.get("group_id"))}
    text = render("action_result", **v)
    if record.get("warning") and status in ("dry_run", "awaiting_approval", "executed"):
        text += "\n" + render("action_warning", warning=record["warning"])
    who = approval_line(record)
    if who:
        text += "\n" + who
    if status == "awaiting_approval":
        import re

        # How to act: the sweep never waits for a human; an incident run with dry_run off asks.
        text += "\n" + render("approval_how_to", pattern=re.escape(str(record.get("group_id", ""))),
                               cluster=one_line_id(record.get("cluster")))
    return {"text": render("action_fallback", **v), "blocks": [_text_section(text)]}


def approval_line(record: Mapping[str, Any]) -> str | None:
    """Who answered the approval this record ran (or was rejected, or blocked) under:
    the Slack user when answered with Slack's buttons, and the Airflow user Airflow
    recorded; None when nobody was asked."""
    approval = record.get("approval")
    if not isinstance(approval, Mapping) or not (approval.get("by") or approval.get("slack")):
        return None
    chosen = approval.get("chosen") or []
    verb = "Rejected" if record.get("status") == "rejected" or chosen in (["Reject"], ["Reject all"]) else "Approved"
    airflow = mrkdwn_value(approval.get("by") or approval.get("airflow_user") or "-")
    if approval.get("slack"):
        return f":bust_in_silhouette: {verb} by {mrkdwn_value(approval['slack'])} in Slack (Airflow user {airflow})"
    return f":bust_in_silhouette: {verb} in Airflow by {airflow}"


def render_failure(*, dag_id: str, task_id: str, run_id: str, reason: str = "") -> dict[str, Any]:
    v = {"dag_id": one_line_id(dag_id), "task_id": task_id, "run_id": run_id, "reason": " ".join(str(reason).split())}
    return {"text": render("failure_fallback", **v), "blocks": [_text_section(render("failure", **v))]}


def render_failure_recovery(*, dag_id: str, run_id: str, failed_runs: int) -> dict[str, Any]:
    """The one reply in a DAG's failure thread once a run succeeds again."""
    v = {"dag_id": one_line_id(dag_id), "run_id": run_id, "failed_runs": failed_runs}
    return {"text": render("failure_recovery_fallback", **v), "blocks": [_text_section(render("failure_recovery", **v))]}


def render_data_incomplete(finding: Mapping[str, Any], diagnosis: str) -> dict[str, Any]:
    """A reply in an open thread: the group looks healthy, but on incomplete data,
    so the thread stays open (unknown is never recovery)."""
    v = {**_values(finding), "diagnosis": one_line_id(diagnosis, "").replace("_", " ")}
    text = render("data_incomplete", **v)
    detail = incomplete_data_text(finding)
    return {"text": render("data_incomplete_fallback", **v),
            "blocks": [_text_section(text + ("\n" + detail if detail else ""))]
            + ([_owner_note_block()] if v["owner_unknown"] else [])}


def render_quarantine_notice(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One notice per run: the snapshot files the diagnosis could not read and moved
    aside (``{"path", "moved_to", "reason"}`` each); the diagnosis ran on the rest."""
    lines = [render("quarantine_line", path=code_safe(e.get("path")), reason=" ".join(str(e.get("reason") or "-").split()),
                    moved_to=code_safe(e.get("moved_to") or "-"))
             for e in entries[:20]]
    if len(entries) > 20:
        lines.append(f"… and {len(entries) - 20} more (see the plan task's log)")
    text = render("quarantine", count=len(entries)) + "\n" + "\n".join(lines)
    return {"text": render("quarantine_fallback", count=len(entries)), "blocks": [_text_section(text)]}


WATCHING_NAMES = 10  # group names a watching notice lists; the rest are counted


def render_watching_notice(cluster: str, findings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The one notice of a new deployment (issue 29): how many groups of ``cluster`` it watches
    (the first WATCHING_NAMES named), and when the first verdicts come: the earliest
    ``evidence.decides_at`` of the findings, to the minute (as their summaries say it)."""
    from datetime import timedelta

    groups = sorted({str(f.get("group_id") or "") for f in findings} - {""})
    due = [t for t in (_parse_iso(_evidence(f).get("decides_at")) for f in findings) if t is not None]
    first = min(due) if due else None
    at = (first + timedelta(seconds=30)).strftime("%H:%M") if first else "-"
    needed = next((_evidence(f).get("snapshots_needed") for f in findings
                   if isinstance(_evidence(f).get("snapshots_needed"), int)), "-")
    crashed = len({str(f.get("group_id")) for f in findings if f.get("diagnosis") == "crashed_consumer"})
    v = {"count": len(groups), "cluster": one_line_id(cluster), "names": [one_line_id(g) for g in groups[:WATCHING_NAMES]],
         "more": max(0, len(groups) - WATCHING_NAMES), "at": at, "needed": needed, "crashed": crashed}
    text = render("watching", **v) + ("\n" + render("watching_crashed", **v) if crashed else "")
    return {"text": render("watching_fallback", **v), "blocks": [_text_section(text[:SECTION_LIMIT])]}


def render_approval_request(record: Mapping[str, Any]) -> dict[str, str]:
    from lagdoctor.notify.templates import APPROVAL_BODY, APPROVAL_SUBJECT, escape_markdown, plain_label

    message = str(record.get("message", ""))
    raw = {"action": record.get("action"), "group": record.get("group_id"), "topic": record.get("topic"),
           "cluster": record.get("cluster"), "diagnosis": record.get("diagnosis"), "run_id": record.get("run_id"),
           "warning": record.get("warning"), "description": message.removeprefix("needs approval: ")}
    flags = {"irreversible": record.get("irreversible")}
    # The subject is plain text (one line); the body Markdown, every value escaped.
    return {"subject": render_plain(APPROVAL_SUBJECT, **{k: plain_label(v, 200) for k, v in raw.items()}, **flags),
            "body": render_plain(APPROVAL_BODY, **{k: escape_markdown(v) if v else v for k, v in raw.items()},
                                 **flags)}


def render_run_header(findings: Sequence[Mapping[str, Any]], *, scope: str, run_id: str,
                      dag_id: str | None = None) -> dict[str, Any]:
    """The first message of a manual incident run: what was looked at and what was found."""
    from lagdoctor.web import links

    link = report_link(links.run_url(dag_id, run_id), "Airflow run") if dag_id and run_id else ""
    from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES

    problems = [f for f in findings if f.get("diagnosis") not in NO_PROBLEM_DIAGNOSES]
    # issue 29: no verdict yet: neither a problem nor healthy
    collecting = sum(1 for f in findings if f.get("diagnosis") == COLLECTING_HISTORY)
    worst = "critical" if any(f.get("severity") == "critical" for f in problems) else (
        "warning" if problems else "ok")
    owner_unknown = any(owner_unknown_once(f.get("summary"))[1] for f in problems[:20])
    lines = [
        f"{SEVERITY_EMOJI.get(f.get('severity', ''), ':grey_question:')} "
        + (f"*Still deciding* ({escape_mrkdwn(deciding_between_text(f))}) " if is_provisional(f) else
           f"*{escape_mrkdwn(_title(one_line_id(f.get('diagnosis'), '')))}* ")
        + f"· `{escape_mrkdwn(code_safe(f.get('group_id', '')))}` on `{escape_mrkdwn(code_safe(f.get('topic', '')))}`: "
        f"{mrkdwn_value(owner_unknown_once(f.get('summary', ''))[0])}"
        + (" _(incomplete data)_" if _evidence(f).get("data_complete") is False else "")
        for f in problems[:20]
    ] or ([f"No problem found yet: {collecting} (group, topic) pair(s) still collecting history, no verdict."]
          if collecting else ["No problem found: every matching group keeps up."])
    if len(problems) > 20:
        lines.append(f"… and {len(problems) - 20} more in this thread.")
    healthy = len(findings) - len(problems) - collecting
    still = f", {collecting} collecting history" if collecting else ""
    text = (f"Incident run for {escape_mrkdwn(one_line_id(scope))}: {len(problems)} problem(s), {healthy} healthy"
            f"{still} (group, topic) pair(s)")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "emoji": True,
                                    "text": f"{SEVERITY_EMOJI[worst]} lagdoctor incident run"[:150]}},
        _text_section(f"*Scope* `{escape_mrkdwn(code_safe(scope))}` · {len(problems)} problem(s), {healthy} healthy"
                      f"{still}"),
        _text_section("\n".join(lines)[:2900]),
        {"type": "context", "elements": [{"type": "mrkdwn",
                                          "text": f"run `{escape_mrkdwn(code_safe(run_id))}` · details in this thread"
                                                  + (" · " + link if link else "")}]},
    ]
    if owner_unknown:
        blocks.append(_owner_note_block())
    return {"text": text, "blocks": blocks}


APPROVAL_LINES_MAX = 20


def approval_target_label(target: Mapping[str, Any]) -> str:
    """One approval line's subject in mrkdwn: the group on cluster / topic; for a target several
    groups share (a topic, a Deployment), the target and its groups (one change for all)."""
    shared = shared_by_text(target)
    if shared:
        return f"{mrkdwn_value(target.get('target'))}, one change for {mrkdwn_value(shared)}"
    return (f"`{escape_mrkdwn(code_safe(target.get('group_id')))}` on {mrkdwn_value(target.get('cluster'))}"
            f" / `{escape_mrkdwn(code_safe(target.get('topic') or '(all)'))}`")


def render_approval_prompt(subject: str, body: str | None, *, approval_id: str | int | None,
                           answer_url: str | None, targets: Sequence[Mapping[str, Any]] | None = None,
                           dag_id: str | None = None) -> dict[str, Any]:
    """A HITL task waits: its question, and where to answer in Airflow. With `targets`
    (a per-target approval): one line per target, "blocked now: <why>" for those not
    offered, and, when ``approval_id`` is given (buttons enabled: the row's
    interactive.approval_ref, id and nonce), a button per offered
    target, "Approve all" and "Reject all". Without: the body's lines and Approve / Reject.
    Every name goes through mrkdwn_value (one line, escaped)."""
    subject_text = mrkdwn_value(subject)
    owner_unknown = False
    if targets is not None:
        lines = []
        for n, t in enumerate(targets[:APPROVAL_LINES_MAX]):
            where = approval_target_label(t)
            if t.get("option"):
                number = str(t["option"]).split(":", 1)[0].removeprefix("Approve ")
                lines.append(f"{number}. {where}: {mrkdwn_value(t.get('does'))}")
            else:
                why = (f"*blocked now*: {mrkdwn_value(t.get('blocked'))}" if t.get("blocked")
                       else "over the form's limit")
                lines.append(f":no_entry: {where}: {why} (not offered)")
        if len(targets) > APPROVAL_LINES_MAX:
            lines.append(f"… and {len(targets) - APPROVAL_LINES_MAX} more: see the form in Airflow.")
    else:
        body_text, owner_unknown = owner_unknown_once(body or "")
        # The form's body is Markdown for the Airflow UI: Slack's bold is one asterisk.
        lines = [escape_mrkdwn(" ".join(line.replace("**", "*").split()))
                 for line in body_text.splitlines() if line.strip()][:20]
    text = f":raised_hand: *Approval needed:* {subject_text}" + ("\n" + "\n".join(lines) if lines else "")
    blocks: list[dict[str, Any]] = [_text_section(text[:2900])]
    where = report_link(answer_url, "answer in Airflow")
    if approval_id is not None:
        hint = ("Buttons answer the task in Airflow (approvers for this DAG and cluster only)"
                + (f" · or {where}" if where else ""))
    else:
        hint = f"Answer in Airflow: {where}" if where else "Answer in the Airflow UI (Required actions)."
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": hint}]})
    if owner_unknown:
        blocks.append(_owner_note_block())
    if approval_id is not None:
        if targets is None:
            blocks.append(approval_buttons(approval_id))
        else:
            blocks.extend(target_buttons(approval_id, targets))
    return {"text": f"Approval needed: {subject_text}", "blocks": blocks}
