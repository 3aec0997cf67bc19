"""lagdoctor.status: Burrow's evaluator, checked against Burrow's own test cases,
and the snapshot -> commit-window mapping it is fed through."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from lagdoctor import status as status_module
from lagdoctor.status import (
    check_if_lag_not_decreasing,
    check_if_offsets_rewind,
    check_if_offsets_stalled,
    check_if_offsets_stopped,
    check_if_recent_lag_zero,
    check_if_rewind_recovered,
    evaluate_partition,
    is_lag_always_not_zero,
    partition_status,
    window_from_snapshots,
    worst_status,
)

VECTORS_PATH = Path(__file__).resolve().parents[2] / "shared" / "bench" / "burrow_vectors.json"
MINUTE_MS = 60_000


def _burrow_vectors(with_rule_results: bool = False) -> list[Any]:
    if not VECTORS_PATH.exists():
        return [
            pytest.param(
                None,
                id="burrow-vectors-missing",
                marks=pytest.mark.skip(reason=f"Burrow test vectors not found at {VECTORS_PATH}"),
            )
        ]
    vectors = json.loads(VECTORS_PATH.read_text())
    if with_rule_results:
        vectors = [v for v in vectors if v.get("expected_rule_results")]
    return [pytest.param(v, id=v["name"]) for v in vectors]


# --- Burrow's own cases ----------------------------------------------------


@pytest.mark.skipif(not VECTORS_PATH.exists(), reason=f"Burrow test vectors not found at {VECTORS_PATH}")
def test_vector_file_holds_all_18_cases():
    # A truncated file would otherwise pass by testing less.
    assert len(json.loads(VECTORS_PATH.read_text())) == 18


@pytest.mark.parametrize("vector", _burrow_vectors())
def test_partition_status_matches_burrow(vector):
    result = partition_status(
        vector["offsets"],
        vector["broker_offsets"],
        vector["current_lag"],
        vector["time_now_ms"],
        vector["allowed_lag"],
    )
    assert result == vector["expected_status"], vector["notes"]


@pytest.mark.parametrize("vector", _burrow_vectors(with_rule_results=True))
def test_each_rule_matches_burrow(vector):
    offsets, now_ms = vector["offsets"], vector["time_now_ms"]
    actual = {
        "isLagAlwaysNotZero": is_lag_always_not_zero(offsets, vector["allowed_lag"]),
        "checkIfOffsetsRewind_index": check_if_offsets_rewind(offsets),
        "checkIfOffsetsStopped": check_if_offsets_stopped(offsets, now_ms),
        "checkIfOffsetsStalled": check_if_offsets_stalled(offsets),
        "checkIfLagNotDecreasing": check_if_lag_not_decreasing(offsets),
        "checkIfRecentLagZero": check_if_recent_lag_zero(offsets, vector["broker_offsets"]),
    }
    assert actual == vector["expected_rule_results"], vector["notes"]


# --- Rules and edges Burrow's table does not pin down -----------------------


def _window(*commits: tuple[int, int, int | None]) -> list[dict[str, Any]]:
    """(offset, timestamp_s, lag) triples -> a contract-3 window."""
    return [{"offset": o, "timestamp_ms": t * 1000, "lag": lag} for o, t, lag in commits]


@pytest.mark.parametrize(
    ("offsets", "rewind_index", "recovered"),
    [
        # Back at the pre-rewind offset counts as recovered ("reaches", not "passes").
        (_window((3000, 1, 5), (2000, 2, 5), (3000, 3, 5)), 1, True),
        # One short of the pre-rewind offset is still a rewind.
        (_window((3000, 1, 5), (2000, 2, 5), (2999, 3, 5)), 1, False),
        # Only the first rewind is judged, against the offset just before it.
        (_window((1000, 1, 5), (4000, 2, 5), (3000, 3, 5), (3500, 4, 5)), 2, False),
    ],
)
def test_rewind_recovery_is_judged_against_the_offset_before_the_fall(offsets, rewind_index, recovered):
    assert check_if_offsets_rewind(offsets) == rewind_index
    assert check_if_rewind_recovered(offsets, rewind_index) is recovered


@pytest.mark.parametrize(
    ("offsets", "current_lag", "now_s", "allowed_lag", "expected", "reason"),
    [
        pytest.param(
            [], 500, 600, 0, "OK", "rule 0: an empty window cannot be judged", id="empty-window"
        ),
        pytest.param(
            [None, None, *_window((1000, 100, 100), (1000, 200, 150), (1000, 300, 200))],
            200, 300, 0, "STALL",
            "empty ring slots are dropped, the rest is judged",
            id="leading-empty-slots",
        ),
        pytest.param(
            _window((1000, 100, 100), (1000, 200, 150), (1000, 300, 200)),
            5, 300, 5, "OK",
            "rule 1: current lag within allowed_lag wins over a stalled window",
            id="current-lag-within-allowed",
        ),
        pytest.param(
            _window((1000, 100, None), (1000, 200, None), (1000, 300, None)),
            200, 300, 0, "STALL",
            "unknown lags are not zero lags: rule 4 must not call this OK",
            id="all-lags-null",
        ),
        pytest.param(
            _window((1000, 100, 300), (2000, 200, None), (3000, 300, 400), (4000, 400, None)),
            400, 400, 0, "WARN",
            "rule 6 compares known lags only: 300 -> 400 never drops",
            id="null-lags-skipped-by-warn",
        ),
    ],
)
def test_partition_status_edges(offsets, current_lag, now_s, allowed_lag, expected, reason):
    assert partition_status(offsets, [], current_lag, now_s * 1000, allowed_lag) == expected, reason


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ([], "OK"),
        (["OK", "WARN", "OK"], "WARN"),
        (["WARN", "ERR"], "ERR"),
        (["STOP", "ERR", "WARN"], "STOP"),
        (["STALL", "STOP"], "STALL"),
        (["REWIND", "STALL", "OK"], "REWIND"),
    ],
)
def test_worst_status_follows_burrows_order(statuses, expected):
    assert worst_status(statuses) == expected


def test_worst_status_rejects_unknown_statuses():
    with pytest.raises(ValueError, match="LAGGING"):
        worst_status(["OK", "LAGGING"])


# --- Snapshots -> window ----------------------------------------------------

_DERIVED = object()


def snap(
    minute: int,
    committed: int | None,
    log_end: int,
    *,
    lag: Any = _DERIVED,
    log_start: int = 0,
) -> dict[str, Any]:
    """One contract-1 row; lag as the collector computes it unless given."""
    if lag is _DERIVED:
        lag = None if committed is None else max(0, log_end - committed)
    return {
        "snapshot_ts_ms": minute * MINUTE_MS,
        "committed_offset": committed,
        "log_end_offset": log_end,
        "lag": lag,
        "log_start_offset": log_start,
    }


def test_repeated_offset_is_merged_keeping_first_seen_time_and_newest_lag():
    rows = [snap(0, 100, 150), snap(1, 100, 180), snap(2, 100, 210)]
    offsets, broker_offsets, current_lag = window_from_snapshots(rows)
    assert offsets == [{"offset": 100, "timestamp_ms": 0, "lag": 110}]
    assert broker_offsets == [150, 180, 210]
    assert current_lag == 110


def test_changes_are_commits_including_drops_and_null_commits_are_skipped():
    rows = [snap(0, 100, 200), snap(1, None, 210), snap(2, 100, 220), snap(3, 90, 230), snap(4, 120, 240)]
    offsets, broker_offsets, _ = window_from_snapshots(rows)
    assert [(o["offset"], o["timestamp_ms"]) for o in offsets] == [
        (100, 0),
        (90, 3 * MINUTE_MS),
        (120, 4 * MINUTE_MS),
    ]
    assert broker_offsets == [200, 210, 220, 230, 240]


def test_window_keeps_the_newest_commits_and_log_end_offsets():
    rows = [snap(i, 100 * i, 100 * i + 7) for i in range(15)]
    offsets, broker_offsets, _ = window_from_snapshots(rows, window_len=5)
    assert [o["offset"] for o in offsets] == [1000, 1100, 1200, 1300, 1400]
    assert broker_offsets == [1007, 1107, 1207, 1307, 1407]


def test_rows_are_sorted_before_mapping():
    rows = [snap(2, 300, 400), snap(0, 100, 400), snap(1, 200, 400)]
    offsets, broker_offsets, current_lag = window_from_snapshots(rows)
    assert [o["offset"] for o in offsets] == [100, 200, 300]
    assert current_lag == 100


def test_null_lag_on_a_repeat_does_not_erase_the_known_lag():
    rows = [snap(0, 100, 150), snap(1, 100, 180, lag=None)]
    offsets, _, current_lag = window_from_snapshots(rows)
    assert offsets[0]["lag"] == 50
    # Newest lag unknown: Burrow's current lag, log end minus the last commit.
    assert current_lag == 80


def test_no_rows_and_never_committed_give_no_window_and_no_lag():
    assert window_from_snapshots([]) == ([], [], None)
    assert window_from_snapshots([snap(0, None, 500), snap(1, None, 600)]) == ([], [500, 600], None)


def test_window_len_must_be_positive():
    with pytest.raises(ValueError, match="window_len"):
        window_from_snapshots([snap(0, 1, 2)], window_len=0)


# Scenarios, one snapshot a minute. Offsets chosen so every lag is spelled out.

# Log end +100/min, lag wobbling between 20 and 90: keeping up.
STEADY = [
    snap(i, 1000 + 100 * i - lag, 1000 + 100 * i)
    for i, lag in enumerate([30, 80, 20, 60, 40, 90, 20, 70, 30, 80, 50, 60])
]
# Log end +100/min, commits +80/min: lag 50, 70, 90, ... never drops.
SLOW = [snap(i, 950 + 80 * i, 1000 + 100 * i) for i in range(12)]
# Moves for 5 minutes (lag 100), then the committed offset freezes at 1400
# for 15 minutes while the log end keeps growing.
FROZEN = [snap(i, 900 + 100 * i, 1000 + 100 * i) for i in range(6)] + [
    snap(i, 1400, 1000 + 100 * i) for i in range(6, 21)
]
# 1000..5000 with lag 100, then reset to 2000 and crawling.
REWOUND = [snap(i, 1000 * (i + 1), 1000 * (i + 1) + 100) for i in range(5)] + [
    snap(5, 2000, 5600),
    snap(6, 2200, 5700),
    snap(7, 2400, 5800),
]
# Lag climbs 20, 70, ... 370, catches up to 0, then is a little behind again.
RECOVERED = [snap(i, 980 + 50 * i, 1000 + 100 * i) for i in range(8)] + [
    snap(8, 1800, 1800),
    snap(9, 1880, 1900),
]
# Nothing produced, consumer caught up and idle.
IDLE = [snap(i, 500, 500) for i in range(20)]


def _last_minute(rows: list[dict[str, Any]]) -> int:
    return max(r["snapshot_ts_ms"] for r in rows) // MINUTE_MS


@pytest.mark.parametrize(
    ("rows", "now_minute", "members", "expected", "reason"),
    [
        pytest.param(STEADY, 11, True, "OK",
                     "commits every snapshot and lag drops somewhere (rule 7)", id="steady-consumer"),
        pytest.param(SLOW, 11, True, "WARN",
                     "offsets advance but lag never drops (rule 6)", id="slow-consumer"),
        pytest.param(FROZEN, 20, True, "STALL",
                     "live members hold the partition, offset frozen 15 min > 5 min span (E4)",
                     id="frozen-with-live-members"),
        pytest.param(FROZEN, 20, False, "STOP",
                     "no members: nothing commits for longer than the window span (rule 2)",
                     id="frozen-with-no-members"),
        pytest.param(FROZEN, 20, None, "STOP",
                     "unknown membership keeps Burrow's own answer (E4)", id="frozen-membership-unknown"),
        pytest.param(FROZEN, 8, True, "WARN",
                     "frozen 3 min < 5 min span is not STOP yet; its growing lag warns (rule 6)",
                     id="frozen-shorter-than-span"),
        pytest.param(list(reversed(FROZEN)), 20, True, "STALL",
                     "row order does not matter (M1)", id="frozen-rows-unsorted"),
        pytest.param(REWOUND, 7, True, "REWIND",
                     "committed offset fell 5000 -> 2000 and has not climbed back (rule 3)",
                     id="committed-offset-rewinds"),
        pytest.param(REWOUND + [snap(8, 5200, 5900)], 8, True, "OK",
                     "worked back past 5000 after the rewind, lag drops: recovered (rule 3)",
                     id="rewind-recovered"),
        pytest.param(RECOVERED, 9, True, "OK",
                     "lag hit zero inside the window (rule 4)", id="lag-zero-recovery"),
        pytest.param(RECOVERED[:8] + [snap(8, 1900, 1900)], 8, True, "OK",
                     "caught up right now (rule 1)", id="caught-up-now"),
        pytest.param(IDLE, 19, False, "OK",
                     "no members and no new commits, but nothing waits: lag 0 (rule 1)",
                     id="idle-topic-no-members"),
        pytest.param([snap(i, None, 500 + 10 * i) for i in range(5)], 4, True, "ERR",
                     "never committed while records wait (E2)", id="never-committed-data-waits"),
        pytest.param([snap(i, None, 0) for i in range(5)], 4, True, "OK",
                     "never committed, empty partition: nothing to consume (E2)",
                     id="never-committed-empty-log"),
        pytest.param([snap(i, None, 800, log_start=800) for i in range(5)], 4, False, "OK",
                     "never committed, retention emptied the log: nothing waits (E2)",
                     id="never-committed-log-expired"),
        pytest.param([{**r, "lag": None} if i % 2 else r for i, r in enumerate(STEADY)], 11, True, "OK",
                     "null lags in the middle are skipped, not read as zero or as a climb",
                     id="null-lags-midwindow"),
        pytest.param([{**r, "lag": None} if i >= 6 else r for i, r in enumerate(FROZEN)], 20, True, "STALL",
                     "null newest lags are not zero lag: current lag comes from log end - commit (M6)",
                     id="null-lags-on-newest-rows"),
        pytest.param(STEADY[:-1] + [snap(11, 2040, 2100, log_start=2050)], 11, True, "ERR",
                     "committed below log start: retention deleted unread records (E5)",
                     id="committed-below-log-start"),
        pytest.param(FROZEN[:-1] + [snap(20, 1400, 3000, log_start=1500)], 20, True, "STALL",
                     "E5's ERR never hides a worse status", id="below-log-start-and-stalled"),
        pytest.param([snap(0, 100, 5000)], 0, True, "OK",
                     "one observation shows no movement or lack of it (E3)", id="single-snapshot"),
        pytest.param(STEADY + [snap(30, 100, 9000)], 11, True, "OK",
                     "a rewind after now is not seen (E1)", id="future-rows-ignored"),
        pytest.param([], 0, True, "OK", "no rows, nothing to report", id="no-rows"),
    ],
)
def test_evaluate_partition_from_snapshots(rows, now_minute, members, expected, reason):
    status = evaluate_partition(rows, now_minute * MINUTE_MS, group_has_members=members)
    assert status == expected, reason


def test_allowed_lag_reaches_the_rules_through_evaluate_partition():
    # SLOW warns with lag 50..270; allowing 300 makes every commit "caught up".
    now_ms = _last_minute(SLOW) * MINUTE_MS
    assert evaluate_partition(SLOW, now_ms, group_has_members=True) == "WARN"
    assert evaluate_partition(SLOW, now_ms, allowed_lag=300, group_has_members=True) == "OK"


def test_window_len_reaches_the_rules_through_evaluate_partition():
    # STEADY's last two commits have lag 50 then 60: a 2-commit window sees
    # only that climb, the default one also sees lag drop.
    now_ms = _last_minute(STEADY) * MINUTE_MS
    assert evaluate_partition(STEADY, now_ms, group_has_members=True) == "OK"
    assert evaluate_partition(STEADY, now_ms, window_len=2, group_has_members=True) == "WARN"


# --- Purity -----------------------------------------------------------------


def test_status_module_imports_only_the_stdlib_and_no_clock():
    tree = ast.parse(Path(status_module.__file__).read_text())
    roots = {
        name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""])
    }
    assert roots <= set(sys.stdlib_module_names) | {"__future__", "lagdoctor"}, roots
    assert not roots & {"time", "datetime", "os", "io", "socket", "random"}, roots
