"""Numbers, durations, sizes, names and timestamps as Slack messages and the
page show them: "-" for what is unknown, one line for a name a broker or user chose."""

from __future__ import annotations

import math
from typing import Any, Iterable

MAX_CELL = 40  # long consumer ids are cut so the table stays readable in a Slack column


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


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def fmt_eta(seconds: Any) -> str:
    """A forecast or a retention, as coarse as it is sure: 45s, 12m, 1h05m, 2d03h, 7d ("-" when unknown)."""
    value = finite(seconds)
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
    number = finite(value)
    if number is None or number < 0:
        return "-"
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if number >= div:
            return f"{number / div:,.1f} {unit}"
    return f"{int(number):,} bytes"


def one_line_id(value: Any, default: str = "-") -> str:
    """A broker- or user-chosen name on one line: a line break in a group id must not
    start a line of its own in Slack (a forged "Recovered", say), and a backtick must
    not open or close a code span (Slack has no escape for it). Not escaped here."""
    text = " ".join(str(value).replace("`", "'").split()) if value is not None else ""
    return text or default


def partitions_text(partitions: Iterable[Any], limit: int = 10) -> str:
    """``partition 3`` / ``partitions 0, 3`` (the first ``limit``, then ``and N more``)."""
    parts = [one_line_id(p) for p in partitions if p is not None]
    if not parts:
        return ""
    shown = ", ".join(parts[:limit]) + (f" and {len(parts) - limit} more" if len(parts) > limit else "")
    return f"partition{'s' if len(parts) > 1 else ''} {shown}"


def as_utc(value: Any):
    from datetime import timezone

    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def parse_iso(value: Any):
    from datetime import datetime, timezone

    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
