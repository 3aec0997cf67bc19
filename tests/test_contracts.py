"""The contract constants and schemas agree with shared/CONTRACTS.md, read from the page itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lagdoctor import contracts

CONTRACTS_MD = Path(__file__).resolve().parents[2] / "shared" / "CONTRACTS.md"

_ARROW_TYPE_OF_PAGE = {
    "timestamp (UTC, µs)": "timestamp[us, tz=UTC]",
    "string": "string",
    "int32": "int32",
    "int64": "int64",
}


def _page() -> str:
    if not CONTRACTS_MD.exists():
        pytest.skip(f"{CONTRACTS_MD} is not beside this checkout")
    return CONTRACTS_MD.read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    level = heading.split(" ")[0]  # "##" or "###": the section ends at the next of its level or above
    ends = [text.find(f"\n{h} ", start + len(heading)) for h in ("#" * n for n in range(2, len(level) + 1))]
    nxt = min((e for e in ends if e != -1), default=-1)
    return text[start: nxt if nxt != -1 else len(text)]


def page_snapshot_columns() -> list[tuple[str, str, bool]]:
    """(name, arrow type, nullable) for each row of contract 1's table."""
    cols = []
    for line in _section(_page(), "## 1. Offset snapshot").splitlines():
        m = re.match(r"\|\s*(\w+)\s*\|\s*([^|]+?)\s*\|", line)
        if not m or m.group(1) in ("column",):
            continue
        raw_type = m.group(2)
        nullable = "nullable" in raw_type
        base = raw_type.replace(", nullable", "").strip()
        cols.append((m.group(1), _ARROW_TYPE_OF_PAGE[base], nullable))
    return cols


def test_snapshot_schema_matches_the_page():
    schema = contracts.snapshot_arrow_schema()
    got = [(f.name, str(f.type), f.nullable) for f in schema]
    assert got == page_snapshot_columns()


def test_group_states_match_the_page():
    line = next(l for l in _page().splitlines() if l.startswith("| group_state"))
    assert set(re.findall(r"\b[A-Z][A-Z_]+[A-Z]\b", line)) == set(contracts.GROUP_STATES)


@pytest.mark.parametrize(
    "constant, heading_line_start",
    [
        (contracts.DIAGNOSES, "| diagnosis |"),
        (contracts.PATTERNS, "| pattern |"),
    ],
)
def test_finding_vocabularies_match_the_page(constant, heading_line_start):
    line = next(l for l in _page().splitlines() if l.startswith(heading_line_start))
    # every value of the page, and beyond it only the extensions the code names as such
    assert set(re.findall(r"`(\w+)`", line)) == set(constant) - set(contracts.DIAGNOSIS_EXTENSIONS)


def _table_fields(section: str) -> set[str]:
    cells = re.findall(r"^\|\s*([\w, ]+?)\s*\|", section, flags=re.M)
    return {n.strip() for cell in cells for n in cell.split(",")} - {"field", "column"}


@pytest.mark.parametrize(
    "heading, constant",
    [
        ("### findings.jsonl", contracts.FINDING_FIELDS),
        ("### partition_status.jsonl", contracts.PARTITION_STATUS_FIELDS),
    ],
)
def test_output_fields_match_the_page(heading, constant):
    assert _table_fields(_section(_page(), heading)) == set(constant)


def test_dag_ids_match_the_page():
    section = _section(_page(), "## 5. DAGs")
    assert set(re.findall(r"^\| `(kafka_\w+)`", section, flags=re.M)) == {contracts.SWEEP_DAG_ID, contracts.INCIDENT_DAG_ID}


def page_optional_columns() -> list[str]:
    section = _section(_page(), "## 1. Offset snapshot")
    start = section.index("Optional columns a reader must tolerate")
    paragraph = section[start: section.index("\n\n", start)]
    return re.findall(r"`(\w+)`", paragraph)


def test_optional_columns_extend_the_page_and_never_redefine_it():
    ours = {name: (t, nullable) for name, t, nullable in contracts.SNAPSHOT_OPTIONAL_COLUMNS}
    # Every optional column the page names is known here ...
    assert set(page_optional_columns()) <= set(ours)
    # ... and anything added is an optional, nullable extension, never a contract column again.
    assert all(nullable for _, nullable in ours.values())
    assert not set(ours) & set(contracts.SNAPSHOT_COLUMN_NAMES)
    assert ours["read_error"] == ("string", True)


def test_writer_schema_is_the_contract_with_offsets_nullable_only_for_read_errors():
    """The collector writes contract 1's columns, in order and with their types; only the
    two offsets a failed ListOffsets leaves unknown are declared nullable, then the extras."""
    from lagdoctor.kafka.collector import snapshot_schema

    contract = contracts.snapshot_arrow_schema()
    written = snapshot_schema()
    assert written.names[: len(contract)] == contract.names
    # every optional column, the committed record's included (null where not fetched)
    assert written.names[len(contract):] == [c[0] for c in contracts.SNAPSHOT_OPTIONAL_COLUMNS]
    for f in contract:
        w = written.field(f.name)
        assert w.type == f.type
        assert w.nullable == (f.nullable or f.name in contracts.SNAPSHOT_NULL_ON_READ_ERROR)
    assert set(contracts.SNAPSHOT_NULL_ON_READ_ERROR) == {"log_start_offset", "log_end_offset"}
