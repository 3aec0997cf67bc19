"""A provisional finding in words: the causes it is still deciding between,
and when the answer is promised (and whether that time has passed)."""

from __future__ import annotations

from typing import Any, Mapping

from lagdoctor.notify.formatting import as_utc, one_line_id, parse_iso
from lagdoctor.notify.templates import TEMPLATES, render_plain


def is_provisional(finding: Mapping[str, Any]) -> bool:
    """The finding's evidence cannot yet tell its candidates apart."""
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
    return f"will know at the first sweep after {promise_time(by, finding.get('window_end'))}"


def promised_at(decided_by: Any):
    """The time a provisional finding's ``decided_by`` promises, as said: the minute rounded up; None
    when it has none. A sweep at or after it that is still undecided broke the promise."""
    from datetime import timedelta

    by = parse_iso(decided_by)
    if by is not None and (by.second or by.microsecond):
        by = by.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return by


def promise_time(by: Any, window_end: Any = None) -> str:
    """``03:20 UTC``; the date too when it is not ``window_end``'s."""
    end = parse_iso(window_end)
    return by.strftime("%H:%M UTC") if end is None or end.date() == by.date() else by.strftime("%Y-%m-%d %H:%M UTC")


def promise_overdue(decided_by: Any, now: Any) -> bool:
    """Whether the promised time passed by ``now`` (a datetime; None: never)."""
    by = promised_at(decided_by)
    return by is not None and now is not None and as_utc(now) >= by


def promise_text(finding: Mapping[str, Any], now: Any = None) -> str:
    """``will know at the first sweep after 10:10 UTC``, or once that passed by ``now``:
    ``was due at the first sweep after 10:10 UTC: overdue``."""
    if promise_overdue(finding.get("decided_by"), now):
        by = promised_at(finding.get("decided_by"))
        return f"was due at the first sweep after {promise_time(by, finding.get('window_end'))}: overdue"
    return decided_by_text(finding)


def provisional_where(finding: Mapping[str, Any]) -> str:
    """``orders[1]``, ``orders[1,4]`` or the topic alone for a whole-topic finding."""
    topic = one_line_id(finding.get("topic"))
    parts = [p for p in finding.get("partitions") or [] if isinstance(p, int)]
    return f"{topic}[{','.join(str(p) for p in parts[:10])}{',…' if len(parts) > 10 else ''}]" if parts else topic


def provisional_line(finding: Mapping[str, Any]) -> str:
    """The first line of a provisional finding's message, plain text; "" for a decided finding."""
    if not is_provisional(finding):
        return ""
    return render_plain(TEMPLATES["provisional_fallback"], **provisional_values(finding))


def provisional_values(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {"group": one_line_id(finding.get("group_id")), "topic": one_line_id(finding.get("topic")),
            "between": deciding_between_text(finding), "where": provisional_where(finding),
            "by": decided_by_text(finding), "because": finding.get("undecided_because") or "-"}
