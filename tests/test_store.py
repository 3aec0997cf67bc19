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
