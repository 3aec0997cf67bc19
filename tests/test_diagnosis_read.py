"""Reading the snapshot store: layouts users have, and inputs the job must refuse."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def contract_table(n=3, cluster="prod", optional=False, drop=()):
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    schema = snapshot_arrow_schema(include_optional=optional)
    rows = []
    for k in range(n):
        row = {"snapshot_ts": T0 + timedelta(minutes=k), "cluster": cluster, "group_id": "g", "group_state": "STABLE",
               "topic": "t", "partition": 0, "log_start_offset": 0, "log_end_offset": 100 * k,
               "committed_offset": 90 * k, "lag": 10 * k, "member_id": "m-1", "client_id": "m", "host": "h",
               "group_members": 1}
        if optional:
            row.update(committed_record_ts=T0 + timedelta(minutes=k, seconds=-5), leader_broker=3)
        rows.append(row)
    table = pa.Table.from_pylist(rows, schema=schema)
    return table.drop_columns(list(drop)) if drop else table


def write(table, path):
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return path


def test_hive_tree_with_and_without_optional_columns(spark, tmp_path):
    from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES
    from lagdoctor.diagnosis.snapshots import read_snapshots

    # cluster "1": the folder value must stay a string like the column in the file
    write(contract_table(cluster="1"), str(tmp_path / "cluster=1/date=2026-11-21/a.parquet"))
    write(contract_table(cluster="1", optional=True), str(tmp_path / "cluster=1/date=2026-11-22/b.parquet"))
    df = read_snapshots(spark, str(tmp_path))
    assert list(df.columns) == [*SNAPSHOT_COLUMN_NAMES, "committed_record_ts", "leader_broker"]
    rows = df.collect()
    assert len(rows) == 6 and {r["cluster"] for r in rows} == {"1"}
    assert sum(r["committed_record_ts"] is not None for r in rows) == 3  # absent in one file: null there


def test_a_single_parquet_file(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import read_snapshots

    path = write(contract_table(n=4), str(tmp_path / "one.parquet"))
    df = read_snapshots(spark, path)
    assert df.count() == 4 and df.where("committed_record_ts is not null").count() == 0


def test_missing_column_is_named(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, read_snapshots

    write(contract_table(drop=("committed_offset",)), str(tmp_path / "cluster=prod/date=2026-11-21/a.parquet"))
    with pytest.raises(SnapshotInputError, match="lack required column.*committed_offset") as err:
        read_snapshots(spark, str(tmp_path))
    assert "\n" not in str(err.value)


def test_corrupt_file_is_one_line(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, read_snapshots

    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(SnapshotInputError) as err:
        read_snapshots(spark, str(tmp_path))
    assert "\n" not in str(err.value) and "bad.parquet" in str(err.value)  # names the file


def test_missing_path_fails_before_spark(tmp_path):
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, check_input_path

    with pytest.raises(SnapshotInputError, match="does not exist"):
        check_input_path(str(tmp_path / "nope"))


def test_empty_directory_is_empty_input(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import read_snapshots, resolve_window

    df = read_snapshots(spark, str(tmp_path))
    assert df.count() == 0
    assert resolve_window(df, None, None) is None  # nothing to diagnose: the job writes empty outputs


def test_window_from_as_of_and_minutes(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import parse_as_of, read_snapshots, resolve_window, select_window

    write(contract_table(n=10), str(tmp_path / "a.parquet"))
    df = read_snapshots(spark, str(tmp_path))
    assert resolve_window(df, None, None) == (T0, T0 + timedelta(minutes=9))
    as_of = parse_as_of("2026-11-21T12:06:00Z")
    start, end = resolve_window(df, as_of, 3)
    assert (start, end) == (T0 + timedelta(minutes=3), T0 + timedelta(minutes=6))
    assert select_window(df, start, end).count() == 4  # minutes 3, 4, 5, 6
