"""Burrow-compatible partition status (contract 3), and how snapshots feed it.

This is LinkedIn Burrow's caching evaluator (``core/internal/evaluator/
caching.go``, v1.9.5) as pure functions: a window of commits in, one status
out, the current time passed in. No clock, no I/O, stdlib only, so the Spark
job, the DAGs and the tests all run exactly the same rules.

Statuses, least to most bad (``contracts.PARTITION_STATUSES``):
OK < WARN < ERR < STOP < STALL < REWIND. Burrow's evaluator never gives a
partition ERR (ERR is a group-level status there); lagdoctor's comes from
rules E2 and E5 below.

The correctness proof
---------------------
``partition_status`` applies these rules top to bottom; the first that
matches decides. Numbers are the ones used in the tests; rule names are
Burrow's, in snake case. "Zero lag" means lag <= ``allowed_lag``.

Rule  Status  Condition, and why
 0.   OK      The window holds no commits: nothing to judge.
 1.   OK      current lag <= allowed_lag: a partition caught up now is never
              in error, whatever its history says.
 2.   STOP    check_if_offsets_stopped (now - last commit > last commit -
              first commit) and not check_if_recent_lag_zero (no recent log
              end offset <= the last committed offset): silent for longer
              than it took to fill the window. Checked before rule 4 so an
              old zero-lag commit cannot hide a dead consumer (Burrow #290);
              waived while recent log end offsets show it was caught up
              (#303).
 3.   REWIND  check_if_offsets_rewind finds a commit below its predecessor
              and not check_if_rewind_recovered (no later commit reaches the
              offset before the fall): offsets were reset or replayed.
              Checked before rule 4 because a caught-up consumer reset to
              earliest has zero lag in its past (#714). A rewind it has
              worked back past is a rebalance re-commit: harmless.
 4.   OK      not is_lag_always_not_zero (some commit had zero lag): it
              caught up inside the window, so it keeps up.
 5.   STALL   check_if_offsets_stalled (every commit has the same offset):
              committing but not moving while lag waits.
 6.   WARN    check_if_lag_not_decreasing (lag never drops between two
              commits): moving, but slower than the producers.
 7.   OK      Otherwise: moving, and lag drops somewhere.

Commits whose lag is null (Burrow stores none for commits it learns out of
order) are skipped by rules 4 and 6: an unknown lag is neither zero nor a
drop. ``None`` entries in the window (empty ring slots) are dropped first.

From offset snapshots to Burrow's window
----------------------------------------
Burrow stores *commits*: every OffsetCommit read from ``__consumer_offsets``,
in a ring of ``storage.intervals`` (10) slots, plus a ring of the same size of
broker log end offsets. Contract 1 gives *polls*: one row per snapshot with the
committed offset as it stood then. ``window_from_snapshots`` rebuilds the
commit window from them:

M1. Rows are sorted by ``snapshot_ts_ms``; rows with a null committed offset
    store no commit (their log end offset still counts for M5).
M2. A row whose committed offset differs from the previous committed row's
    (up or down) is a commit at that row's ``snapshot_ts_ms``: the commit
    happened since the last snapshot, so the time is late by at most one
    snapshot interval. A drop is a commit too, so rewinds stay visible.
M3. A row repeating the previous committed offset is not a new commit: a
    dead group polled every minute would otherwise look like a live one
    committing the same offset. It is merged into the newest entry the way
    Burrow's ``addConsumerOffset`` merges a commit that arrives within
    ``storage.min-distance`` of the previous one
    (``mergeFrequentCommitIntoPrevious``): the entry takes the newer lag but
    keeps its stored timestamp. The lag, so the newest entry says how far
    behind the partition is now: the window stops moving when commits stop,
    and a commit first seen with zero lag would otherwise pass rule 4
    forever. The timestamp, because it is when the offset last moved:
    moving it to every poll would make rule 2 impossible (Burrow keeps it for
    the same reason: else frequent commits never open a new slot). A null
    lag does not overwrite a known one.
M4. The newest ``window_len`` commits form the window (Burrow's
    ``storage.intervals``, default 10).
M5. ``broker_offsets`` are the log end offsets of the newest ``window_len``
    snapshots, oldest first (Burrow's broker-offset ring).
M6. ``current_lag`` is the newest row's lag. If that is null, it is the
    newest log end offset minus the last committed offset, floored at 0:
    how Burrow computes CurrentLag when it is asked. None when the group
    never committed.

Evaluating a partition (``evaluate_partition``)
-----------------------------------------------
E1. Rows after ``now_ms`` are ignored: an as-of evaluation sees no future.
E2. No committed offset in any row: ERR when the log holds records the group
    has no position for (log end offset > log start offset, or > 0 when the
    row has no log start offset), else OK. Burrow never sees such a partition
    (its storage learns partitions from commits). ERR is its generic "this is
    wrong" status; nothing more specific fits, as the offset never moved to
    stop or stall.
E3. Fewer than two snapshots with a committed offset: OK. One observation
    shows neither movement nor its absence (Burrow's ``minimum-complete``
    guard plays this role); the rules would call any lag STALL or STOP.
E4. Otherwise Burrow's rules judge the window. STALL versus STOP: Burrow's
    STOP means the last commit is older than the window's span, i.e. nothing
    is committing at all; its STALL means a live consumer keeps committing
    the same offset. Polls cannot tell the two apart (M3), membership can.
    So a STOP whose group has live members (``group_has_members=True``) is
    STALL: someone owns the partition, its offset stays and lag waits (hung
    handler, poison record). No members (False) is STOP. Unknown membership
    (None) is STOP, Burrow's own answer.
E5. The newest row's committed offset below its ``log_start_offset``: at
    least ERR, since retention deleted records the group never read
    (contract 1). Combined with ``worst_status`` so it never hides a worse
    status.

Group status: ``worst_status`` of the partitions, as ``contracts`` defines it.
Burrow's HTTP API additionally reports any group worse than ERR as ERR.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypedDict

from lagdoctor.contracts import PARTITION_STATUSES

OK: Final = "OK"
WARN: Final = "WARN"
ERR: Final = "ERR"
STOP: Final = "STOP"
STALL: Final = "STALL"
REWIND: Final = "REWIND"

_SEVERITY: Final[dict[str, int]] = {status: rank for rank, status in enumerate(PARTITION_STATUSES)}

# Burrow's storage.intervals default.
DEFAULT_WINDOW_LEN: Final = 10
# E3: observations of a committed offset needed before the rules may judge.
_MIN_OBSERVATIONS: Final = 2


class CommitEntry(TypedDict):
    """One slot of the commit window, as contract 3 spells it."""

    offset: int
    timestamp_ms: int
    lag: int | None


Window = Sequence[Mapping[str, Any]]


# --- Burrow's rules --------------------------------------------------------


def is_lag_always_not_zero(offsets: Window, allowed_lag: int = 0) -> bool:
    """True unless some commit in the window had lag <= allowed_lag."""
    return not any(o["lag"] is not None and o["lag"] <= allowed_lag for o in offsets)


def check_if_offsets_rewind(offsets: Window) -> int:
    """Index of the first commit below its predecessor, or -1."""
    for i in range(1, len(offsets)):
        if offsets[i]["offset"] < offsets[i - 1]["offset"]:
            return i
    return -1


def check_if_rewind_recovered(offsets: Window, rewind_index: int) -> bool:
    """True if a commit from rewind_index on reaches the offset before the fall."""
    high_water = offsets[rewind_index - 1]["offset"]
    return any(o["offset"] >= high_water for o in offsets[rewind_index:])


def check_if_offsets_stopped(offsets: Window, now_ms: int) -> bool:
    """True if the last commit is older than the window's span (strictly)."""
    first_ms = offsets[0]["timestamp_ms"]
    last_ms = offsets[-1]["timestamp_ms"]
    return now_ms - last_ms > last_ms - first_ms


def check_if_offsets_stalled(offsets: Window) -> bool:
    """True if every commit in the window has the same offset."""
    return all(o["offset"] == offsets[0]["offset"] for o in offsets)


def check_if_lag_not_decreasing(offsets: Window) -> bool:
    """True unless lag drops between two consecutive known-lag commits."""
    known = [o["lag"] for o in offsets if o["lag"] is not None]
    return all(later >= earlier for earlier, later in zip(known, known[1:]))


def check_if_recent_lag_zero(offsets: Window, broker_offsets: Iterable[int]) -> bool:
    """True if a recent log end offset was at or below the last commit.

    That is, the consumer was caught up within the broker-offset window, which
    holds off STOP for a few minutes (Burrow #303). Order does not matter.
    """
    last_committed = offsets[-1]["offset"]
    return any(log_end <= last_committed for log_end in broker_offsets)


def partition_status(
    offsets: Sequence[Mapping[str, Any] | None],
    broker_offsets: Iterable[int],
    current_lag: int,
    now_ms: int,
    allowed_lag: int = 0,
) -> str:
    """Burrow's status for one partition's commit window (contract 3).

    ``offsets`` oldest first, each ``{"offset", "timestamp_ms", "lag"}``;
    ``broker_offsets`` recent log end offsets in any order; ``current_lag``
    is used as given, never recomputed. Rules: the module docstring's table.
    """
    window = [o for o in offsets if o is not None]
    if not window:  # rule 0
        return OK
    if current_lag <= allowed_lag:  # rule 1
        return OK
    if check_if_offsets_stopped(window, now_ms) and not check_if_recent_lag_zero(
        window, broker_offsets
    ):  # rule 2
        return STOP
    rewind_index = check_if_offsets_rewind(window)
    if rewind_index != -1 and not check_if_rewind_recovered(window, rewind_index):  # rule 3
        return REWIND
    if not is_lag_always_not_zero(window, allowed_lag):  # rule 4
        return OK
    if check_if_offsets_stalled(window):  # rule 5
        return STALL
    if check_if_lag_not_decreasing(window):  # rule 6
        return WARN
    return OK  # rule 7


def worst_status(statuses: Iterable[str]) -> str:
    """The most severe status in Burrow's order; OK when there are none."""
    worst = OK
    for status in statuses:
        if status not in _SEVERITY:
            raise ValueError(f"unknown partition status {status!r}; expected one of {PARTITION_STATUSES}")
        if _SEVERITY[status] > _SEVERITY[worst]:
            worst = status
    return worst


# --- Snapshots -> window ---------------------------------------------------


def window_from_snapshots(
    rows: Iterable[Mapping[str, Any]], window_len: int = DEFAULT_WINDOW_LEN
) -> tuple[list[CommitEntry], list[int], int | None]:
    """Rebuild Burrow's commit window from one partition's snapshot rows.

    ``rows`` are one (cluster, group, topic, partition)'s snapshots, each with
    ``snapshot_ts_ms``, ``committed_offset``, ``log_end_offset`` and ``lag``.
    Returns ``(offsets, broker_offsets, current_lag)`` for
    ``partition_status``, by rules M1-M6 of the module docstring.
    """
    if window_len < 1:
        raise ValueError(f"window_len must be at least 1, got {window_len}")
    ordered = sorted(rows, key=lambda row: row["snapshot_ts_ms"])  # M1

    commits: deque[CommitEntry] = deque(maxlen=window_len)  # M4
    for row in ordered:
        committed = row["committed_offset"]
        if committed is None:  # M1
            continue
        lag = row.get("lag")
        if commits and commits[-1]["offset"] == committed:  # M3
            if lag is not None:
                commits[-1]["lag"] = lag
            continue
        commits.append({"offset": committed, "timestamp_ms": row["snapshot_ts_ms"], "lag": lag})  # M2

    broker_offsets = [  # M5
        row["log_end_offset"] for row in ordered[-window_len:] if row.get("log_end_offset") is not None
    ]
    return list(commits), broker_offsets, _current_lag(ordered, commits)


def _current_lag(ordered: Sequence[Mapping[str, Any]], commits: Sequence[CommitEntry]) -> int | None:
    """M6: the newest row's lag, else log end minus last commit, else None."""
    if not ordered:
        return None
    newest = ordered[-1]
    if newest.get("lag") is not None:
        return newest["lag"]
    if not commits or newest.get("log_end_offset") is None:
        return None
    # The collector's read race can put a commit past the log end: that is lag 0.
    return max(0, newest["log_end_offset"] - commits[-1]["offset"])


# --- Snapshots -> status ---------------------------------------------------


def evaluate_partition(
    rows: Iterable[Mapping[str, Any]],
    now_ms: int,
    allowed_lag: int = 0,
    window_len: int = DEFAULT_WINDOW_LEN,
    group_has_members: bool | None = None,
) -> str:
    """Contract 2's status for one partition's snapshot rows, as of ``now_ms``.

    One of OK, WARN, ERR, STOP, STALL, REWIND, by rules E1-E5 of the module
    docstring. ``group_has_members`` is whether the group had live members at
    ``now_ms`` (None when unknown); it turns STOP into STALL (E4).
    """
    visible = sorted(
        (row for row in rows if row["snapshot_ts_ms"] <= now_ms),  # E1
        key=lambda row: row["snapshot_ts_ms"],
    )
    if not visible:
        return OK
    newest = visible[-1]
    offsets, broker_offsets, current_lag = window_from_snapshots(visible, window_len)

    # E2 (a newest row without a log end offset leaves no lag to judge either).
    if not offsets or current_lag is None:
        return ERR if _log_holds_records(newest) else OK

    observations = sum(1 for row in visible if row["committed_offset"] is not None)
    if observations < _MIN_OBSERVATIONS:  # E3
        status = OK
    else:  # E4
        status = partition_status(offsets, broker_offsets, current_lag, now_ms, allowed_lag)
        if status == STOP and group_has_members:
            status = STALL

    if _committed_below_log_start(newest):  # E5
        status = worst_status((status, ERR))
    return status


def _log_holds_records(row: Mapping[str, Any]) -> bool:
    log_end = row.get("log_end_offset")
    if log_end is None:
        return False
    log_start = row.get("log_start_offset")
    return log_end > (log_start if log_start is not None else 0)


def _committed_below_log_start(row: Mapping[str, Any]) -> bool:
    committed = row.get("committed_offset")
    log_start = row.get("log_start_offset")
    return committed is not None and log_start is not None and committed < log_start
