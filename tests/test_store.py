"""The snapshot store: atomic, uniquely named, Hive-partitioned, read back whole."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lagdoctor import store
from lagdoctor.contracts import snapshot_arrow_schema

T0 = datetime(2026, 11, 21, 3, 14, tzinfo=timezone.utc)


def snapshot(ts: datetime, lags=(5, 7), cluster="prod"):
    rows = [
        dict(snapshot_ts=ts, cluster=cluster, group_id="g", group_state="STABLE", topic="t", partition=p,
             log_start_offset=0, log_end_offset=100, committed_offset=100 - lag, lag=lag,
             member_id="m", client_id="c", host="/10.0.0.1", group_members=1)
        for p, lag in enumerate(lags)
    ]
    return pa.Table.from_pylist(rows, schema=snapshot_arrow_schema())


def test_write_lays_out_cluster_and_date_folders(tmp_path):
    path = store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    assert f"/cluster=prod/date=2026-11-21/" in path
    assert store.list_snapshot_files(str(tmp_path)) == [path]


def test_two_snapshots_at_the_same_instant_do_not_collide(tmp_path):
    a = store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    b = store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    assert a != b and len(store.list_snapshot_files(str(tmp_path))) == 2


def test_keyed_write_is_idempotent(tmp_path):
    first = store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key="run-1-0")
    again = store.write_snapshot(snapshot(T0, lags=(9, 9)), str(tmp_path), "prod", T0, key="run-1-0")
    assert first is not None and again is None
    assert store.read_snapshots(str(tmp_path)).column("lag").to_pylist() == [5, 7]


def test_read_back_across_days_and_clusters(tmp_path):
    store.write_snapshot(snapshot(T0, cluster="prod"), str(tmp_path), "prod", T0)
    store.write_snapshot(snapshot(T0 + timedelta(days=1), cluster="dr"), str(tmp_path), "dr", T0 + timedelta(days=1))
    table = store.read_snapshots(str(tmp_path))
    assert table.num_rows == 4
    assert sorted(set(table.column("cluster").to_pylist())) == ["dr", "prod"]
    assert table.schema.field("snapshot_ts").type == pa.timestamp("us", tz="UTC")
    later = store.read_snapshots(str(tmp_path), since=T0 + timedelta(hours=1))
    assert set(later.column("cluster").to_pylist()) == {"dr"}


def test_interrupted_write_leaves_no_visible_or_temporary_file(tmp_path, monkeypatch):
    def crash_midway(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise KeyboardInterrupt  # the process is stopped mid-write

    monkeypatch.setattr(pq, "write_table", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    assert store.list_snapshot_files(str(tmp_path)) == []
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert leftovers == []
    assert store.read_snapshots(str(tmp_path)).num_rows == 0


def test_hidden_temporary_files_are_invisible_to_readers(tmp_path):
    store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    day = next(tmp_path.rglob("date=*"))
    (day / ".snapshot-x.parquet.abc.tmp").write_bytes(b"partial")
    (day / "_SUCCESS").write_bytes(b"")
    assert store.read_snapshots(str(tmp_path)).num_rows == 2


def test_fsspec_uri_root(tmp_path):
    root = f"file://{tmp_path}/store"
    path = store.write_snapshot(snapshot(T0), root, "prod", T0)
    assert path is not None
    assert store.read_snapshots(root).num_rows == 2


def test_reading_files_without_a_contract_column_names_it(tmp_path):
    bad = snapshot(T0).drop(["committed_offset"])
    d = tmp_path / "cluster=prod" / "date=2026-11-21"
    d.mkdir(parents=True)
    pq.write_table(bad, d / "x.parquet")
    with pytest.raises(store.StoreError, match="committed_offset"):
        store.read_snapshots(str(tmp_path))


def test_retention_prunes_old_days_only(tmp_path):
    for days_ago in (0, 3, 10):
        ts = T0 - timedelta(days=days_ago)
        store.write_snapshot(snapshot(ts), str(tmp_path), "prod", ts)
    removed = store.prune_snapshots(str(tmp_path), keep_days=7, today=T0)
    assert [r.rsplit("/", 1)[-1] for r in removed] == ["date=2026-11-11"]
    assert len(store.list_snapshot_files(str(tmp_path))) == 2


def test_keyed_write_finds_the_earlier_file_whatever_its_time_or_day(tmp_path):
    # A retried task stamps its own (later) time, possibly on the next day.
    first = store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key="run-1-0")
    later = T0 + timedelta(hours=23)
    assert store.write_snapshot(snapshot(later, lags=(9, 9)), str(tmp_path), "prod", later, key="run-1-0") is None
    assert store.list_snapshot_files(str(tmp_path)) == [first]
    assert store.read_snapshots(str(tmp_path)).column("lag").to_pylist() == [5, 7]


@pytest.mark.parametrize(
    "written, asked",
    [
        ("x-run-1", "run-1"),    # a key that ends another key is not that key
        ("run-1-10", "run-1-1"),  # nor is a longer sample index
        ("run-1-0", "run-2-0"),
    ],
)
def test_keys_are_matched_exactly(tmp_path, written, asked):
    store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key=written)
    assert store.find_keyed_snapshots(str(tmp_path), "prod", [asked]) == {}
    assert store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key=asked) is not None
    assert len(store.list_snapshot_files(str(tmp_path))) == 2


def test_keys_are_per_cluster(tmp_path):
    store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key="run-1-0")
    assert store.write_snapshot(snapshot(T0, cluster="dr"), str(tmp_path), "dr", T0, key="run-1-0") is not None
    found = store.find_keyed_snapshots(str(tmp_path), "prod", ["run-1-0", "run-1-1"])
    assert list(found) == ["run-1-0"] and "/cluster=prod/" in found["run-1-0"]


def test_read_error_rows_read_back_beside_older_files_without_the_column(tmp_path):
    from lagdoctor.kafka.collector import snapshot_schema

    # An older file first (no read_error column, offsets declared non-null) ...
    store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    # ... then a collector file with a failed ListOffsets: the row is kept, offsets unknown.
    later = T0 + timedelta(minutes=5)
    row = dict(snapshot_ts=later, cluster="prod", group_id="g", group_state="STABLE", topic="t", partition=0,
               log_start_offset=None, log_end_offset=None, committed_offset=95, lag=None, member_id=None,
               client_id=None, host=None, group_members=None, leader_broker=1,
               read_error="log end offset: Local: Timed out (_TIMED_OUT)")
    store.write_snapshot(pa.Table.from_pylist([row], schema=snapshot_schema()), str(tmp_path), "prod", later)
    rows = sorted(store.read_snapshots(str(tmp_path)).to_pylist(), key=lambda r: (r["snapshot_ts"], r["partition"]))
    assert [(r["partition"], r["log_end_offset"], r["lag"], r["read_error"]) for r in rows] == [
        (0, 100, 5, None),
        (1, 100, 7, None),
        (0, None, None, "log end offset: Local: Timed out (_TIMED_OUT)"),
    ]


# -- hour folders (issue 9) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "ts, folder",
    [
        (T0, "cluster=prod/date=2026-11-21/hour=03"),
        (datetime(2026, 11, 21, 23, 59, 59, 999999, tzinfo=timezone.utc), "cluster=prod/date=2026-11-21/hour=23"),
        (datetime(2026, 11, 22, 0, 0, tzinfo=timezone.utc), "cluster=prod/date=2026-11-22/hour=00"),
        # a local time is foldered by its UTC hour, as the rows' snapshot_ts is
        (datetime(2026, 11, 22, 1, 30, tzinfo=timezone(timedelta(hours=2))), "cluster=prod/date=2026-11-21/hour=23"),
    ],
)
def test_new_writes_go_to_the_utc_hour_folder(tmp_path, ts, folder):
    path = store.write_snapshot(snapshot(ts), str(tmp_path), "prod", ts)
    assert path.rsplit("/", 1)[0] == f"{tmp_path}/{folder}"


def test_old_flat_date_folders_and_hour_folders_read_together(tmp_path):
    # a store from before issue 9: files straight in date=; new files beside them in hour=
    old = tmp_path / "cluster=prod" / "date=2026-11-21" / "snapshot-20261121T020000000000Z-run-0-0.parquet"
    old.parent.mkdir(parents=True)
    pq.write_table(snapshot(T0 - timedelta(hours=1), lags=(1, 2)), old)
    store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0)
    assert sorted(store.read_snapshots(str(tmp_path)).column("lag").to_pylist()) == [1, 2, 5, 7]
    # the old file's key still makes a retried write a no-op
    assert store.find_keyed_snapshots(str(tmp_path), "prod", ["run-0-0"]) == {"run-0-0": str(old)}
    assert store.write_snapshot(snapshot(T0), str(tmp_path), "prod", T0, key="run-0-0") is None
    assert len(store.list_snapshot_files(str(tmp_path))) == 2


def test_a_store_inside_a_dot_folder_is_read(tmp_path):
    root = tmp_path / ".lagdoctor" / "data"  # e.g. /home/me/.lagdoctor/data
    store.write_snapshot(snapshot(T0), str(root), "prod", T0)
    (root / "_quarantine" / "cluster=prod").mkdir(parents=True)  # below the root: still skipped
    pq.write_table(snapshot(T0, lags=(9, 9)), root / "_quarantine" / "cluster=prod" / "x.parquet")
    assert len(store.list_snapshot_files(str(root))) == 1
    assert store.read_snapshots(str(root)).column("lag").to_pylist() == [5, 7]
    assert store.read_snapshots(f"file://{root}").num_rows == 2


def test_retention_prunes_days_with_hour_folders(tmp_path):
    for days_ago in (0, 10):
        ts = T0 - timedelta(days=days_ago)
        store.write_snapshot(snapshot(ts), str(tmp_path), "prod", ts)
    removed = store.prune_snapshots(str(tmp_path), keep_days=7, today=T0)
    assert [r.rsplit("/", 1)[-1] for r in removed] == ["date=2026-11-11"]
    assert [p.rsplit("/", 3)[-3:-1] for p in store.list_snapshot_files(str(tmp_path))] == [
        ["date=2026-11-21", "hour=03"]]
