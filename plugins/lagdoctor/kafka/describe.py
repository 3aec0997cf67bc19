"""`kafka-consumer-groups.sh --describe`, rendered from snapshot rows.

Same columns, same left-aligned layout and the same "-" for a missing
offset, lag or owner, so the output reads like the tool on-call engineers know.
A value whose read failed is "-" too (never 0); `read_errors_line` says which
reads failed, for the one line on stderr.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DESCRIBE_COLUMNS = (
    "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
    "CONSUMER-ID", "HOST", "CLIENT-ID",
)


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def describe_rows(snapshot_rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """One describe line per partition, ordered by group, topic, partition.

    A group whose topics could not be read is one line with "-" for topic and
    partition (its snapshot row has topic "" and partition -1).
    """
    ordered = sorted(snapshot_rows, key=lambda r: (r["group_id"], r["topic"], r["partition"]))
    return [
        (
            r["group_id"], _cell(r["topic"]), "-" if r["partition"] < 0 else str(r["partition"]),
            _cell(r.get("committed_offset")), _cell(r.get("log_end_offset")), _cell(r.get("lag")),
            _cell(r.get("member_id")), _cell(r.get("host")), _cell(r.get("client_id")),
        )
        for r in ordered
    ]


def read_errors_line(snapshot_rows: Iterable[Mapping[str, Any]]) -> str | None:
    """The reads that failed behind these rows, as one line; None when all succeeded."""
    errors: list[str] = []
    for r in snapshot_rows:
        for part in (r.get("read_error") or "").split("; "):
            if part and part not in errors:
                errors.append(part)
    if not errors:
        return None
    more = f" (and {len(errors) - 1} other failed read{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"could not read {errors[0]}{more}; unknown values are shown as -"


def render_describe(snapshot_rows: Iterable[Mapping[str, Any]]) -> str:
    lines = describe_rows(snapshot_rows)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(DESCRIBE_COLUMNS)]
    # Kafka pads numeric columns to at least 10/15 characters.
    widths[2] = max(widths[2], 10)
    for i in (3, 4, 5):
        widths[i] = max(widths[i], 15)

    def fmt(cells: tuple[str, ...]) -> str:
        return " ".join(c.ljust(w) for c, w in zip(cells[:-1], widths[:-1])) + " " + cells[-1]

    return "\n".join([fmt(DESCRIBE_COLUMNS), *(fmt(line) for line in lines)])
