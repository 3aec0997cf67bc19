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
    from lagdoctor.diagnosis.snapshots import optional_columns, read_snapshots

    # cluster "1": the folder value must stay a string like the column in the file
    write(contract_table(cluster="1"), str(tmp_path / "cluster=1/date=2026-11-21/a.parquet"))
    write(contract_table(cluster="1", optional=True), str(tmp_path / "cluster=1/date=2026-11-22/b.parquet"))
    df = read_snapshots(spark, str(tmp_path))
    assert list(df.columns) == [*SNAPSHOT_COLUMN_NAMES, *[c[0] for c in optional_columns()]]
    assert {"committed_record_ts", "leader_broker", "read_error"} <= set(df.columns)
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


def test_the_sweeps_window_is_known_without_a_scan_and_footers_tell_an_empty_one():
    from lagdoctor.diagnosis.snapshots import parse_as_of, resolve_window

    as_of = parse_as_of("2026-11-21T12:30:00Z")
    start = as_of - timedelta(minutes=30)
    # no DataFrame at all: a scan would fail here
    assert resolve_window(None, as_of, 30) == (start, as_of)
    assert resolve_window(None, as_of, 30, ts_range=(start - timedelta(hours=1), start + timedelta(minutes=1))) == (
        start, as_of)
    # every file read ends before the window, or starts after it: nothing to diagnose
    assert resolve_window(None, as_of, 30, ts_range=(start - timedelta(hours=1), start - timedelta(seconds=1))) is None
    assert resolve_window(None, as_of, 30, ts_range=(as_of + timedelta(seconds=1), as_of + timedelta(hours=1))) is None


# -- files that differ, and files that cannot be read ------------------------------------------


def test_integer_widths_and_timestamp_units_are_not_poison(spark, tmp_path):
    import pyarrow as pa

    from lagdoctor.diagnosis.snapshots import read_snapshots

    base = contract_table(n=3)
    write(base, str(tmp_path / "cluster=prod/date=2026-11-21/a.parquet"))
    # another writer: partition as int64, offsets as uint32, snapshot_ts in ns (pyarrow's pandas default)
    other = base.set_column(base.schema.get_field_index("partition"), "partition",
                            base["partition"].cast(pa.int64()))
    other = other.set_column(other.schema.get_field_index("log_end_offset"), "log_end_offset",
                             other["log_end_offset"].cast(pa.uint32()))
    shifted = pa.array([t.value * 1000 + 60_000_000_000 * 10 for t in base["snapshot_ts"]], pa.int64())
    other = other.set_column(0, pa.field("snapshot_ts", pa.timestamp("ns", tz="UTC")),
                             shifted.cast(pa.timestamp("ns", tz="UTC")))
    write(other, str(tmp_path / "cluster=prod/date=2026-11-21/b.parquet"))
    df = read_snapshots(spark, str(tmp_path))  # no CANNOT_MERGE_SCHEMAS
    rows = sorted(df.collect(), key=lambda r: r["snapshot_ts"])
    assert len(rows) == 6 and {r["partition"] for r in rows} == {0}
    assert [r["snapshot_ts"].replace(tzinfo=None) for r in rows][3:] == [
        (T0 + timedelta(minutes=10 + k)).replace(tzinfo=None) for k in range(3)]
    assert [r["log_end_offset"] for r in rows][3:] == [0, 100, 200]


def test_a_bad_file_names_file_and_column(spark, tmp_path):
    import pyarrow as pa

    from lagdoctor.diagnosis.snapshots import SnapshotInputError, read_snapshots

    write(contract_table(), str(tmp_path / "cluster=prod/date=2026-11-21/a.parquet"))
    table = contract_table()
    bad = table.set_column(table.schema.get_field_index("lag"), "lag", table["lag"].cast(pa.string()))
    write(bad, str(tmp_path / "cluster=prod/date=2026-11-21/b.parquet"))
    with pytest.raises(SnapshotInputError) as err:
        read_snapshots(spark, str(tmp_path))
    assert str(err.value) == (f"cannot read snapshot file {tmp_path}/cluster=prod/date=2026-11-21/b.parquet: "
                              "column lag is string where contract 1 has int64 (not a number)")


def test_int64_partition_too_large_is_named(spark, tmp_path):
    import pyarrow as pa

    from lagdoctor.diagnosis.snapshots import SnapshotInputError, read_snapshots

    table = contract_table()
    big = table.set_column(table.schema.get_field_index("partition"), "partition",
                           pa.array([0, 1, 2**40], pa.int64()))
    write(big, str(tmp_path / "a.parquet"))
    with pytest.raises(SnapshotInputError, match=r"a\.parquet: column partition is int64 where contract 1 has "
                                                 r"int32 \(values do not fit"):
        read_snapshots(spark, str(tmp_path))


def test_store_quarantines_bad_files_and_reads_the_rest(spark, tmp_path):
    import pyarrow as pa

    from lagdoctor.diagnosis.snapshots import read_snapshot_store

    root = tmp_path / ".demo" / "snapshots"  # the root may live in a dot-folder; names below it may not
    good = write(contract_table(), str(root / "cluster=prod/date=2026-11-21/good.parquet"))
    corrupt = root / "cluster=prod/date=2026-11-21/corrupt.parquet"
    corrupt.write_bytes(b"PAR1 half a file")
    table = contract_table()
    write(table.set_column(table.schema.get_field_index("group_state"), "group_state",
                           pa.array([1, 2, 3], pa.int32())),
          str(root / "cluster=prod/date=2026-11-21/typed.parquet"))
    (root / "cluster=prod/date=2026-11-21/.snapshot.tmp").write_bytes(b"in flight")  # a writer's temp: untouched
    now = datetime(2026, 11, 21, 13, 0, tzinfo=timezone.utc)
    read = read_snapshot_store(spark, str(root), now)
    assert read.snapshots.count() == 3 and os.path.exists(good)
    assert [(q["path"].rsplit("/", 1)[-1], q["moved_to"]) for q in read.quarantined] == [
        ("corrupt.parquet", f"{root}/_quarantine/cluster=prod/date=2026-11-21/corrupt.parquet"),
        ("typed.parquet", f"{root}/_quarantine/cluster=prod/date=2026-11-21/typed.parquet"),
    ]
    assert read.quarantined[1]["reason"] == "column group_state is int32 where contract 1 has string (not a string)"
    reason = (root / "_quarantine/cluster=prod/date=2026-11-21/typed.parquet.reason.txt").read_text()
    assert reason == ("column group_state is int32 where contract 1 has string (not a string); "
                      "quarantined at 2026-11-21T13:00:00Z by diagnose_lag\n")
    assert not corrupt.exists() and (root / "_quarantine/cluster=prod/date=2026-11-21/corrupt.parquet").exists()
    assert (root / "cluster=prod/date=2026-11-21/.snapshot.tmp").exists()
    again = read_snapshot_store(spark, str(root), now)  # _quarantine is not read: nothing more moves
    assert again.quarantined == [] and again.snapshots.count() == 3


def test_missing_column_in_every_file_names_column_and_file(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, read_snapshot_store

    write(contract_table(drop=("group_state",)), str(tmp_path / "cluster=prod/date=2026-11-21/a.parquet"))
    (tmp_path / "cluster=prod/date=2026-11-21/z.parquet").write_bytes(b"not parquet")
    with pytest.raises(SnapshotInputError, match=r"lack required column\(s\): group_state \(e\.g\. .*a\.parquet\)"):
        read_snapshot_store(spark, str(tmp_path), T0)
    assert (tmp_path / "cluster=prod/date=2026-11-21/z.parquet").exists()  # a failed run moves nothing


def test_only_day_folders_of_the_window_are_inspected(tmp_path):
    from lagdoctor.diagnosis.snapshots import inspect_store, parse_as_of, window_bounds

    for day in ("2026-11-19", "2026-11-20", "2026-11-21"):
        (tmp_path / f"cluster=prod/date={day}").mkdir(parents=True)
        (tmp_path / f"cluster=prod/date={day}/a.parquet").write_bytes(b"corrupt")
    window = window_bounds(parse_as_of("2026-11-21T00:10:00Z"), 30)  # reaches back into the 20th
    inspection = inspect_store(str(tmp_path), window=window)
    assert sorted(b.file.relative for b in inspection.bad) == [
        "cluster=prod/date=2026-11-20/a.parquet", "cluster=prod/date=2026-11-21/a.parquet"]
    assert len(inspect_store(str(tmp_path)).bad) == 3  # unbounded window: every day


# -- right-sized shuffles (issue 9) ------------------------------------------------------------


@pytest.mark.parametrize(
    "input_bytes, cores, expected",
    [
        (0, 2, 4),                # empty store: still a few per core
        (40_000, 2, 4),           # a sweep window of kilobytes: no 200-task stages
        (89 * 2**20, 2, 6),       # 10M rows of zstd Parquet: one per 16 MiB
        (89 * 2**20, 16, 32),     # same bytes on a 16-core cluster: a few per core wins
        (10 * 2**40, 2, 2_000),   # huge: capped
    ],
)
def test_shuffle_partitions_follow_input_size(input_bytes, cores, expected):
    from lagdoctor.diagnosis.session import shuffle_partitions_for

    assert shuffle_partitions_for(input_bytes, cores) == expected


def test_store_read_reports_bytes_and_explicit_shuffle_setting_wins(spark, tmp_path):
    from lagdoctor.diagnosis.session import right_size_shuffle
    from lagdoctor.diagnosis.snapshots import read_snapshot_store

    a = write(contract_table(), str(tmp_path / "cluster=prod" / "date=2026-11-21" / "a.parquet"))
    b = write(contract_table(), str(tmp_path / "cluster=prod" / "date=2026-11-21" / "b.parquet"))
    read = read_snapshot_store(spark, str(tmp_path), T0)
    assert read.input_bytes == os.path.getsize(a) + os.path.getsize(b)
    # the test session was started with spark.sql.shuffle.partitions=4: the user's value stays
    assert right_size_shuffle(spark, read.input_bytes) is None
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.conf.get("spark.sql.optimizer.canChangeCachedPlanOutputPartitioning") == "true"


def test_a_small_input_runs_without_whole_stage_codegen_unless_the_user_set_it(spark):
    from lagdoctor.diagnosis.session import SMALL_INPUT_BYTES, WHOLE_STAGE_CODEGEN, right_size_codegen

    small, big, mine = spark.newSession(), spark.newSession(), spark.newSession()
    assert right_size_codegen(small, 800_000) is False  # a sweep window of 200 groups: nothing to compile
    assert small.conf.get(WHOLE_STAGE_CODEGEN) == "false"
    assert right_size_codegen(big, SMALL_INPUT_BYTES * 3) is True
    assert big.conf.get(WHOLE_STAGE_CODEGEN) == "true"
    mine.conf.set(WHOLE_STAGE_CODEGEN, "true")
    assert right_size_codegen(mine, 1_000) is None
    assert mine.conf.get(WHOLE_STAGE_CODEGEN) == "true"


# -- hour folders, window pruning, compaction, --clusters (issue 9) -----------------------------


def hour_store(root, hours, cluster="prod", per_hour=2, day="2026-11-21"):
    """Snapshot files written by lagdoctor.store: `per_hour` samples in each hour of `hours`."""
    from lagdoctor import store

    base = datetime.fromisoformat(f"{day}T00:00:00+00:00")
    written = []
    for hour in hours:
        for k in range(per_hour):
            ts = base + timedelta(hours=hour, minutes=20 * k)
            table = _at(contract_table(n=1, cluster=cluster), ts)
            written.append(store.write_snapshot(table, str(root), cluster, ts))
    return written


def _at(table, ts):
    """`table` with every snapshot_ts set to `ts`."""
    import pyarrow as pa

    return table.set_column(0, table.schema.field(0), pa.array([ts] * table.num_rows, table.schema.field(0).type))


def garbage(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"PAR1 not a parquet file")
    return path


@pytest.mark.parametrize(
    "as_of, minutes, expected",
    [
        # a window that ends exactly on the hour holds a snapshot taken at that instant: hour 12 is listed
        ("2026-11-21T12:00:00Z", 30, ["date=2026-11-21/hour=11", "date=2026-11-21/hour=12"]),
        # and one that starts exactly on the hour does not need the hour before
        ("2026-11-21T12:30:00Z", 30, ["date=2026-11-21/hour=12"]),
        ("2026-11-21T13:00:00Z", 60, ["date=2026-11-21/hour=12", "date=2026-11-21/hour=13"]),
        # across midnight: the last hour of one day and the first of the next
        ("2026-11-22T00:10:00Z", 30, ["date=2026-11-21/hour=23", "date=2026-11-22/hour=00"]),
    ],
)
def test_only_hour_folders_of_the_window_are_opened(tmp_path, as_of, minutes, expected):
    from lagdoctor.diagnosis.snapshots import inspect_store, parse_as_of, window_bounds

    for day, hours in (("2026-11-21", range(10, 24)), ("2026-11-22", range(0, 3))):
        for hour in hours:
            garbage(str(tmp_path / f"cluster=prod/date={day}/hour={hour:02d}/a.parquet"))
    inspection = inspect_store(str(tmp_path), window=window_bounds(parse_as_of(as_of), minutes))
    assert sorted(b.file.relative.rsplit("/", 1)[0] for b in inspection.bad) == [f"cluster=prod/{e}" for e in expected]
    assert sorted(inspection.opened) == sorted(b.file.relative for b in inspection.bad)


def test_flat_day_folders_are_listed_whole_beside_hour_folders(tmp_path):
    from lagdoctor.diagnosis.snapshots import inspect_store, parse_as_of, window_bounds

    garbage(str(tmp_path / "cluster=prod/date=2026-11-21/old.parquet"))  # before issue 9
    garbage(str(tmp_path / "cluster=prod/date=2026-11-20/old.parquet"))
    garbage(str(tmp_path / "cluster=prod/date=2026-11-21/hour=05/new.parquet"))
    garbage(str(tmp_path / "cluster=prod/date=2026-11-21/hour=12/new.parquet"))
    inspection = inspect_store(str(tmp_path), window=window_bounds(parse_as_of("2026-11-21T12:10:00Z"), 20))
    assert sorted(b.file.relative for b in inspection.bad) == [
        "cluster=prod/date=2026-11-21/hour=12/new.parquet", "cluster=prod/date=2026-11-21/old.parquet"]


def test_mixed_layouts_read_once_and_the_file_keeps_its_cluster_value(spark, tmp_path):
    from lagdoctor.contracts import SNAPSHOT_COLUMN_NAMES
    from lagdoctor.diagnosis.snapshots import optional_columns, read_snapshots

    # folder cluster=my_cluster, rows "my cluster": the folder value must never override the file's
    write(contract_table(cluster="my cluster"), str(tmp_path / "cluster=my_cluster/date=2026-11-21/old.parquet"))
    hour_store(tmp_path, [12, 13], cluster="my cluster")
    # a file that lacks the cluster column still gets it from its folder
    write(contract_table(drop=("cluster",)), str(tmp_path / "cluster=dr/date=2026-11-21/hour=12/x.parquet"))
    df = read_snapshots(spark, str(tmp_path))
    assert list(df.columns) == [*SNAPSHOT_COLUMN_NAMES, *[c[0] for c in optional_columns()]]  # no date, no hour
    counts = {r["cluster"]: r["count"] for r in df.groupBy("cluster").count().collect()}
    assert counts == {"my cluster": 3 + 4, "dr": 3}


def test_out_of_window_files_are_never_opened_not_even_to_quarantine(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import parse_as_of, read_snapshot_store, resolve_window, window_bounds

    hour_store(tmp_path, [10, 11, 12])
    old = garbage(str(tmp_path / "cluster=prod/date=2026-11-21/hour=09/snapshot-bad.parquet"))
    as_of = parse_as_of("2026-11-21T12:20:00Z")
    read = read_snapshot_store(spark, str(tmp_path), T0, window=window_bounds(as_of, 60), quarantine=True)
    assert read.quarantined == [] and os.path.exists(old)
    start, end = resolve_window(read.snapshots, as_of, 60)
    assert (start, end) == (as_of - timedelta(minutes=60), as_of)
    # files in the listed folders but outside the window by their statistics are not read either
    assert sorted(r["snapshot_ts"].hour * 60 + r["snapshot_ts"].minute for r in read.snapshots.collect()) == [
        11 * 60 + 20, 12 * 60, 12 * 60 + 20]


def test_without_as_of_the_end_comes_from_footers_and_old_folders_stay_closed(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import inspect_store, read_snapshot_store, resolve_window, window_bounds

    hour_store(tmp_path, [9, 10, 11, 12])
    old = garbage(str(tmp_path / "cluster=prod/date=2026-11-21/hour=08/snapshot-bad.parquet"))
    window = window_bounds(None, 30)
    inspection = inspect_store(str(tmp_path), window=window)
    # the newest hour holds the end (12:20); hour 11 may hold 11:50-12:00; older hours are never opened
    assert {f.rsplit("/", 2)[-2] for f in inspection.opened} == {"hour=11", "hour=12"}
    assert sum(len(files) for files in inspection.groups.values()) == 2  # 11:00 and 11:20: out, by statistics
    read = read_snapshot_store(spark, str(tmp_path), T0, window=window, quarantine=True)
    assert read.quarantined == [] and os.path.exists(old)
    end = datetime(2026, 11, 21, 12, 20, tzinfo=timezone.utc)
    assert read.ts_range == (datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc), end)
    assert resolve_window(read.snapshots, None, 30, ts_range=read.ts_range) == (end - timedelta(minutes=30), end)
    # the same answer Spark's scan of everything gives
    everything = read_snapshot_store(spark, str(tmp_path / "cluster=prod/date=2026-11-21/hour=12"), T0)
    assert resolve_window(everything.snapshots, None, 30) == (end - timedelta(minutes=30), end)
    # a 90-minute window (from 10:50) reaches into hour 10, not hour 9
    wider = inspect_store(str(tmp_path), window=window_bounds(None, 90))
    assert {f.rsplit("/", 2)[-2] for f in wider.opened} == {"hour=10", "hour=11", "hour=12"}
    assert sum(len(files) for files in wider.groups.values()) == 4  # 10:00 and 10:20 are before 10:50


def test_a_file_without_statistics_falls_back_to_spark(spark, tmp_path):
    import pyarrow.parquet as pq

    from lagdoctor.diagnosis.snapshots import read_snapshot_store, resolve_window, window_bounds

    hour_store(tmp_path, [11])
    late = _at(contract_table(n=1), datetime(2026, 11, 21, 12, 40, tzinfo=timezone.utc))
    path = tmp_path / "cluster=prod/date=2026-11-21/hour=12/no-stats.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(late, path, write_statistics=False)
    read = read_snapshot_store(spark, str(tmp_path), T0, window=window_bounds(None, 30))
    assert read.ts_range is None  # unknown from footers: Spark finds it
    end = datetime(2026, 11, 21, 12, 40, tzinfo=timezone.utc)
    assert resolve_window(read.snapshots, None, 30, ts_range=read.ts_range) == (end - timedelta(minutes=30), end)


def test_a_compacted_hour_is_read_instead_of_its_originals(spark, tmp_path):
    from lagdoctor import store
    from lagdoctor.diagnosis.snapshots import inspect_store, read_snapshot_store

    hour_store(tmp_path, [10, 11], per_hour=3)
    before = sorted(tuple(r) for r in read_snapshot_store(spark, str(tmp_path), T0).snapshots.collect())
    store.compact_snapshots(str(tmp_path), datetime(2026, 11, 21, 20, 0, tzinfo=timezone.utc))
    inspection = inspect_store(str(tmp_path))
    assert sorted(f.rsplit("/", 1)[-1][:10] for f in inspection.opened) == ["compacted-"] * 2  # originals unopened
    after = sorted(tuple(r) for r in read_snapshot_store(spark, str(tmp_path), T0).snapshots.collect())
    assert after == before and len(after) == 6


def test_clusters_limit_the_folders_listed_and_the_rows_kept(spark, tmp_path):
    from lagdoctor.diagnosis.snapshots import inspect_store, read_snapshot_store

    hour_store(tmp_path, [12], cluster="prod")
    garbage(str(tmp_path / "cluster=dr/date=2026-11-21/hour=12/bad.parquet"))  # never listed
    read = read_snapshot_store(spark, str(tmp_path), T0, clusters=["prod", "nowhere"], quarantine=False)
    assert {r["cluster"] for r in read.snapshots.collect()} == {"prod"} and read.snapshots.count() == 2
    assert read.missing_clusters == ["nowhere"]
    assert inspect_store(str(tmp_path), clusters=["nowhere"]).opened == []
    # a loose file (no cluster= folder) holding two clusters: rows of others are dropped
    loose = tmp_path.parent / f"{tmp_path.name}-loose"
    import pyarrow as pa

    write(pa.concat_tables([contract_table(cluster="prod"), contract_table(cluster="dr")]), str(loose / "all.parquet"))
    read = read_snapshot_store(spark, str(loose), T0, clusters=["dr"])
    assert {r["cluster"] for r in read.snapshots.collect()} == {"dr"} and read.missing_clusters == []


def test_mixed_layouts_read_by_spark_alone(spark, tmp_path, monkeypatch):
    from lagdoctor.diagnosis import snapshots

    # a path handed to Spark whole (not listed here): mixed layouts must not conflict
    monkeypatch.setattr(snapshots, "inspect_store", lambda path, **kwargs: None)
    write(contract_table(), str(tmp_path / "cluster=prod/date=2026-11-21/old.parquet"))
    hour_store(tmp_path, [12])
    df = snapshots.read_snapshots(spark, str(tmp_path))
    assert df.count() == 5 and {r["cluster"] for r in df.collect()} == {"prod"}
