"""Issue 33: the backtest's sweeps, all in one job, say what sweeps run one at a time would have said.

The reference is the diagnosis itself, one window at a time, each sweep carrying the
surges of the one before (rule case 27), as the sweep DAG runs it; the backtest must
give every sweep's every finding, field for field, including where a surge outlasts
the window and its baseline comes down the carry chain.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lagdoctor.diagnosis import replay
from lagdoctor.diagnosis.thresholds import Thresholds

pytestmark = pytest.mark.spark

START = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)
# a surge from the first minute (its start leaves a 10-minute window early: carried), one
# that starts mid-range, a slow consumer, a healthy group, a loop
SCENARIOS = ("producer_surge_early", "producer_surge", "slow_consumer", "healthy_steady", "rebalance_loop_staircase")
WINDOW_MINUTES = 10.0


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    import numpy as np
    import pyarrow as pa

    from lagdoctor.lab.sim import simulate_group, write_table

    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("backtest") / "store"
    tables = [simulate_group(rng, name, "sim", f"{name}-0", f"t-{name}", START, cadence="sweep",
                             sweep=(60.0, 1, 10.0), window_seconds=3600.0)[0] for name in SCENARIOS]
    tables.append(recreated(simulate_group(rng, "healthy_steady", "sim", RECREATED, f"t-{RECREATED}", START,
                                           cadence="sweep", sweep=(60.0, 1, 10.0), window_seconds=3600.0)[0]))
    write_table(pa.concat_tables(tables), str(path), "sim")
    return str(path)


RECREATED = "recreated-0"
RECREATED_AT = datetime(2026, 11, 21, 9, 25, 10, tzinfo=timezone.utc)


def recreated(table):
    """Partition 0's topic recreated at RECREATED_AT: its offsets start again near 0 (the consumer
    reset with it), so the windows that hold the fall leave its rows before it out of the totals."""
    import pyarrow as pa
    import pyarrow.compute as pc

    after = pc.and_(pc.equal(table["partition"], 0), pc.greater(table["snapshot_ts"], pa.scalar(
        RECREATED_AT, pa.timestamp("us", tz="UTC"))))
    schema = table.schema
    drop = pc.min(pc.filter(table["committed_offset"], after)).as_py()
    assert drop > 1000, "the partition had too little history to fall"
    for name in ("log_start_offset", "log_end_offset", "committed_offset"):
        col = table[name]
        moved = pc.max_element_wise(pc.subtract(col, pa.scalar(drop, col.type)), pa.scalar(0, col.type))
        table = table.set_column(table.schema.get_field_index(name), name, pc.if_else(after, moved, col))
    return table.cast(schema)


def one_sweep_at_a_time(spark, snapshots, ends, thresholds):
    """{sweep end: findings} as the sweep DAG makes them: a window each, carrying from the run before."""
    from datetime import timedelta

    from lagdoctor.diagnosis.classify import carried_baselines, findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.output import findings_records
    from lagdoctor.diagnosis.window import select_window

    out, previous = {}, None
    for end in ends:
        start = end - timedelta(minutes=WINDOW_MINUTES)
        rows = select_window(snapshots, start, end)
        parts = partition_features(rows, thresholds).localCheckpoint()
        groups = group_features(group_series(rows, parts), thresholds).localCheckpoint()
        carried = carried_baselines(previous) if previous is not None else None
        found = findings(parts, groups, thresholds, start, end, carried=carried).localCheckpoint()
        out[end] = findings_records(found)
        previous = found
    return out


def by_sweep(found):
    from lagdoctor.diagnosis.output import findings_records

    out: dict[str, list[dict]] = {}
    for r in findings_records(replay.unlabel(found)):
        out.setdefault(r.pop("sweep_end"), []).append(r)
    return out


def test_every_sweep_of_the_backtest_equals_that_sweep_run_alone_carry_chain_included(spark, store, monkeypatch):
    from lagdoctor.diagnosis.snapshots import read_snapshot_store

    snapshots = read_snapshot_store(spark, store, datetime.now(timezone.utc)).snapshots.localCheckpoint()
    ends = replay.sweep_ends(datetime(2026, 11, 21, 9, 14, 30, tzinfo=timezone.utc),
                             datetime(2026, 11, 21, 9, 38, 30, tzinfo=timezone.utc), 3.0)
    thresholds = Thresholds()
    (found, plan), = replay.replay_sets(spark, snapshots, ends, WINDOW_MINUTES, [thresholds])
    replayed = by_sweep(found)
    alone = one_sweep_at_a_time(spark, snapshots, ends, thresholds)

    assert plan.settled and plan.passes >= 2, "no surge was carried: the chain was not exercised"
    carried = [f for fs in alone.values() for f in fs if f["evidence"].get("baseline_source") == "previous run"]
    assert carried, "the reference carried no surge baseline: the scenario does not test the chain"
    reset = [f for fs in alone.values() for f in fs if f["group_id"] == RECREATED and f["evidence"].get(
        "offset_reset_partitions")]
    assert 0 < len(reset) < len(ends), "no window (or every one) held the recreated topic's fall"
    for end in ends:
        iso = end.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert replayed.get(iso, []) == alone[end], f"sweep {iso} differs"

    # findings.jsonl collected a few sweeps at a time (a week's cannot be held whole) is the same file
    ends_us = [replay.micros(e) for e in ends]
    whole, timeline = replay.set_outputs(found, ends_us)
    whole = list(whole)
    monkeypatch.setattr(replay, "FINDINGS_PER_COLLECT", 7)
    pieces, _ = replay.set_outputs(found, ends_us)
    assert list(pieces) == whole and len(whole) > 20 and timeline


def test_a_regular_schedule_and_an_irregular_list_of_ends_copy_each_row_into_the_same_windows(spark, store):
    """The arithmetic for a schedule and the filter for the ends real runs had agree, and a row
    exactly on a window's start belongs to it (select_window: start <= ts <= end)."""
    from pyspark.sql import functions as F

    from lagdoctor.diagnosis.snapshots import read_snapshot_store

    snapshots = read_snapshot_store(spark, store, datetime.now(timezone.utc)).snapshots
    ends = [replay.micros(e) for e in replay.sweep_ends(datetime(2026, 11, 21, 9, 30, tzinfo=timezone.utc),
                                                         datetime(2026, 11, 21, 9, 40, tzinfo=timezone.utc), 1.0)]
    window = 600_000_000
    edge = snapshots.limit(1).withColumns({"group_id": F.lit("edge-row"),
                                           "snapshot_ts": F.timestamp_micros(F.lit(ends[3] - window))})
    rows = snapshots.unionByName(edge)

    def labelled(given):
        return sorted(tuple(r) for r in replay.relabel(rows, given, window).select(
            "cluster", "group_id", "partition", "snapshot_ts").collect())

    regular = labelled(ends)
    irregular = labelled(ends + [ends[-1] + 1])  # one more end, 1 µs later: the filter's branch
    assert [r for r in irregular if not r[0].startswith(f"{ends[-1] + 1}|")] == regular
    assert len(irregular) > len(regular)
    # 09:23:00 is the start of the 09:33 window, and inside the 09:30-09:32 ones
    assert sorted(r[0] for r in regular if r[1] == "edge-row") == [f"{e}|sim" for e in ends[:4]]


def test_the_command_runs_two_threshold_sets_side_by_side_and_the_stricter_one_alerts_less(store, tmp_path, capsys,
                                                                                            monkeypatch):
    """`lagdoctor backtest --set`: the current thresholds and the proposed ones in one job; a loop that
    must change owners twice as often before it is named gives fewer alerts, and says which verdicts moved."""
    import json

    from lagdoctor.cli import main

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    out = tmp_path / "report"
    code = main(["backtest", "--snapshots", store, "--from", "2026-11-21T09:20:00Z", "--to", "2026-11-21T09:50:00Z",
                 "--window-minutes", "10", "--set", f"rebalance_loop_min={2 * Thresholds().rebalance_loop_min}",
                 "--output", str(out), "--master", "local[2]"])
    text = capsys.readouterr().out
    assert code == 0, text
    report = json.loads((out / "report.json").read_text())
    current, proposed = report["sets"]
    assert report["sweeps"] == 31 and current["name"] == "current" and proposed["name"] == "proposed"
    assert proposed["alerts"] < current["alerts"]
    (cmp,) = report["comparisons"]
    assert cmp["alerts"] == proposed["alerts"] - current["alerts"] and cmp["verdicts_changed"] > 0
    assert {c["group_id"] for c in cmp["changed"]} == {"rebalance_loop_staircase-0"}
    assert f"{current['alerts'] - proposed['alerts']} fewer alerts" in text
    assert (out / "report.html").read_text().count('class="strip"') >= 2
    assert not (tmp_path / "data" / "state").exists(), "the backtest wrote lagdoctor's real state"
