"""Compaction of closed hour folders: the rows a reader sees never change, nothing
is read twice, nothing vanishes under a reader, and racing compactors agree."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lagdoctor import store
from lagdoctor.contracts import snapshot_arrow_schema

H3 = datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc)
HOUR3 = "cluster=prod/date=2026-11-21/hour=03"
LATER = H3 + timedelta(hours=6)  # hour 03 long closed


def snapshot(ts, lags=(5, 7), cluster="prod", group="g", topic="t"):
    rows = [dict(snapshot_ts=ts, cluster=cluster, group_id=group, group_state="STABLE", topic=topic, partition=p,
                 log_start_offset=0, log_end_offset=100, committed_offset=100 - lag, lag=lag, member_id="m",
                 client_id="c", host="h", group_members=1)
            for p, lag in reversed(list(enumerate(lags)))]  # partitions out of order: compaction sorts
    return pa.Table.from_pylist(rows, schema=snapshot_arrow_schema())


def fill_hour(root, start=H3, samples=4, cluster="prod", keyed=False):
    paths = []
    for k in range(samples):
        ts = start + timedelta(minutes=5 * k)
        paths.append(store.write_snapshot(snapshot(ts, lags=(k, 10 + k), cluster=cluster), str(root), cluster, ts,
                                          key=f"run-{start:%H}-{k}" if keyed else None))
    return paths


def rows(root):
    table = store.read_snapshots(str(root))
    return sorted(table.to_pylist(), key=lambda r: (r["snapshot_ts"], r["cluster"], r["group_id"], r["partition"]))


def visible(root, under=""):
    base = root / under if under else root
    return sorted(str(p.relative_to(root)) for p in base.rglob("*.parquet")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts))


def compacted_in(root, under=HOUR3):
    return [p for p in visible(root, under) if p.rsplit("/", 1)[-1].startswith("compacted-")]


def test_a_closed_hour_becomes_one_file_and_reads_the_same(tmp_path):
    originals = fill_hour(tmp_path)
    fill_hour(tmp_path, start=H3 + timedelta(hours=1))  # hour 04: closed too
    before = rows(tmp_path)
    result = store.compact_snapshots(str(tmp_path), LATER)
    assert (len(result.compacted_hours), result.files_folded, result.rows, result.files_removed) == (2, 8, 16, 0)
    (name,) = compacted_in(tmp_path)
    assert re.fullmatch(HOUR3 + r"/compacted-20261121T03-[0-9a-f]{16}\.parquet", name)
    # the originals stay for the grace period, yet every row is read once
    assert all(os.path.exists(p) for p in originals)
    assert rows(tmp_path) == before
    assert [p.rsplit("/", 1)[-1] for p in store.list_snapshot_files(str(tmp_path / HOUR3))] == [
        name.rsplit("/", 1)[-1]]

    # the file itself: rows sorted, zstd, the originals' names and keys in its footer
    parquet = pq.ParquetFile(tmp_path / name)
    table = parquet.read()
    order = [(r["snapshot_ts"], r["group_id"], r["topic"], r["partition"]) for r in table.to_pylist()]
    assert order == sorted(order)
    assert parquet.metadata.row_group(0).column(0).compression == "ZSTD"
    meta = parquet.metadata.metadata
    assert json.loads(meta[b"lagdoctor.compaction.covers"]) == sorted(p.rsplit("/", 1)[-1] for p in originals)
    assert table.schema.field("snapshot_ts").type == pa.timestamp("us", tz="UTC")

    # within the grace period nothing more happens; after it the originals go
    assert store.compact_snapshots(str(tmp_path), LATER + timedelta(minutes=59)).files_removed == 0
    assert all(os.path.exists(p) for p in originals)
    done = store.compact_snapshots(str(tmp_path), LATER + timedelta(hours=1))
    assert (done.files_removed, done.files_folded, done.compacted_hours) == (8, 0, [])
    assert visible(tmp_path, HOUR3) == [name]
    assert rows(tmp_path) == before
    again = store.compact_snapshots(str(tmp_path), LATER + timedelta(hours=5))  # idempotent
    assert (again.files_removed, again.files_folded) == (0, 0) and rows(tmp_path) == before


@pytest.mark.parametrize(
    "now, closed",
    [
        (H3 + timedelta(hours=2, minutes=59, seconds=59), False),  # hour 03 ended at 04:00; 2 h later is 06:00
        (H3 + timedelta(hours=3), True),
    ],
)
def test_only_hours_closed_for_min_age_are_compacted(tmp_path, now, closed):
    fill_hour(tmp_path)
    result = store.compact_snapshots(str(tmp_path), now)
    assert bool(result.compacted_hours) is closed
    assert len(compacted_in(tmp_path)) == int(closed)


def test_a_late_file_is_read_then_folded_with_the_compacted_file(tmp_path):
    fill_hour(tmp_path)
    store.compact_snapshots(str(tmp_path), LATER)
    (first,) = compacted_in(tmp_path)
    late_ts = H3 + timedelta(minutes=58)
    late = store.write_snapshot(snapshot(late_ts, lags=(99, 98)), str(tmp_path), "prod", late_ts)
    assert sum(r["lag"] == 99 for r in rows(tmp_path)) == 1  # not covered: read beside the compacted file
    before = rows(tmp_path)
    second = store.compact_snapshots(str(tmp_path), LATER + timedelta(minutes=10))
    assert (second.files_folded, second.rows) == (2, 10)  # the compacted file and the late one
    assert len(compacted_in(tmp_path)) == 2 and rows(tmp_path) == before
    # after the new file's grace: only it is left, holding every row
    store.compact_snapshots(str(tmp_path), LATER + timedelta(hours=2))
    (last,) = visible(tmp_path, HOUR3)
    assert last != first and not os.path.exists(late)
    assert rows(tmp_path) == before


def test_an_unreadable_file_is_left_alone_and_named(tmp_path):
    fill_hour(tmp_path, samples=2)
    broken = tmp_path / HOUR3 / "snapshot-20261121T031000000000Z-broken.parquet"
    broken.write_bytes(b"PAR1 half a file")
    result = store.compact_snapshots(str(tmp_path), LATER)
    assert result.files_folded == 2
    assert len(result.left_alone) == 1 and result.left_alone[0].startswith(f"{broken}: not a readable Parquet file")
    store.compact_snapshots(str(tmp_path), LATER + timedelta(hours=2))  # past grace: originals go, not it
    assert broken.exists() and str(broken) in store.list_snapshot_files(str(tmp_path))
    assert len(visible(tmp_path, HOUR3)) == 2


def test_columns_differ_between_files_union_with_nulls(tmp_path):
    from lagdoctor.kafka.collector import snapshot_schema

    fill_hour(tmp_path, samples=1)  # an older file: no read_error, no leader_broker
    ts = H3 + timedelta(minutes=30)
    row = dict(snapshot_ts=ts, cluster="prod", group_id="g", group_state="STABLE", topic="t", partition=0,
               log_start_offset=None, log_end_offset=None, committed_offset=95, lag=None, member_id=None,
               client_id=None, host=None, group_members=None, leader_broker=1, read_error="log end offset: timeout")
    store.write_snapshot(pa.Table.from_pylist([row], schema=snapshot_schema()), str(tmp_path), "prod", ts)
    before = rows(tmp_path)
    store.compact_snapshots(str(tmp_path), LATER)
    (name,) = compacted_in(tmp_path)
    table = pq.read_table(tmp_path / name)
    assert {"read_error", "leader_broker"} <= set(table.column_names)
    assert table.column("read_error").to_pylist() == [None, None, "log end offset: timeout"]
    assert rows(tmp_path) == before


def test_a_crash_while_writing_leaves_the_hour_as_it_was(tmp_path, monkeypatch):
    fill_hour(tmp_path)
    before = rows(tmp_path)
    written = []
    real_write = pq.ParquetWriter.write_table

    def crash(self, table, *args, **kwargs):  # the second file's rows: the temp file holds the first
        if written:
            raise KeyboardInterrupt
        written.append(table.num_rows)
        return real_write(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", crash)
    with pytest.raises(KeyboardInterrupt):
        store.compact_snapshots(str(tmp_path), LATER)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", real_write)
    assert written  # it crashed mid-way, not before starting
    assert compacted_in(tmp_path) == [] and rows(tmp_path) == before
    assert not (tmp_path / HOUR3 / ".compact.lock").exists()  # released: the next run is not blocked
    assert store.compact_snapshots(str(tmp_path), LATER).compacted_hours and rows(tmp_path) == before


def test_keys_survive_compaction_in_the_footer(tmp_path):
    fill_hour(tmp_path, keyed=True)
    store.compact_snapshots(str(tmp_path), LATER)
    store.compact_snapshots(str(tmp_path), LATER + timedelta(hours=1))  # originals deleted
    assert store.find_keyed_snapshots(str(tmp_path), "prod", ["run-03-1"]) == {}  # default: names only
    found = store.find_keyed_snapshots(str(tmp_path), "prod", ["run-03-1", "run-03-9"], include_compacted=True)
    assert list(found) == ["run-03-1"] and "/compacted-20261121T03-" in found["run-03-1"]


def test_retention_removes_old_days_with_hour_folders_and_compacted_files(tmp_path):
    fill_hour(tmp_path)
    fill_hour(tmp_path, start=H3 + timedelta(days=9))
    store.compact_snapshots(str(tmp_path), H3 + timedelta(days=9, hours=6))
    removed = store.prune_snapshots(str(tmp_path), keep_days=7, today=H3 + timedelta(days=9))
    assert [r.rsplit("/", 1)[-1] for r in removed] == ["date=2026-11-21"]
    assert {r["snapshot_ts"].day for r in rows(tmp_path)} == {30}


def test_cluster_option_compacts_only_that_cluster(tmp_path):
    fill_hour(tmp_path)
    fill_hour(tmp_path, cluster="dr")
    result = store.compact_snapshots(str(tmp_path), LATER, cluster="dr")
    assert [h.split("/")[-3] for h in result.compacted_hours] == ["cluster=dr"]
    assert compacted_in(tmp_path) == []


def test_a_held_lock_skips_the_hour_and_an_expired_one_is_taken_over(tmp_path):
    fill_hour(tmp_path)
    lock = tmp_path / HOUR3 / ".compact.lock"
    lock.write_text(json.dumps({"owner": "other", "expires": (LATER + timedelta(minutes=5)).isoformat()}))
    busy = store.compact_snapshots(str(tmp_path), LATER)
    assert busy.busy_hours == [str(tmp_path / HOUR3)] and compacted_in(tmp_path) == []
    assert lock.exists()  # another compactor's lock is not ours to remove
    taken = store.compact_snapshots(str(tmp_path), LATER + timedelta(minutes=6))  # its holder died
    assert taken.compacted_hours == [str(tmp_path / HOUR3)] and not lock.exists()


def test_fsspec_filesystem_root(tmp_path):
    import uuid

    root = f"memory://lagdoctor-{uuid.uuid4().hex[:8]}/snapshots"
    for k in range(3):
        ts = H3 + timedelta(minutes=k)
        store.write_snapshot(snapshot(ts, lags=(k, k)), root, "prod", ts)
    before = sorted(store.read_snapshots(root).to_pylist(), key=lambda r: (r["snapshot_ts"], r["partition"]))
    assert store.compact_snapshots(root, LATER).files_folded == 3
    store.compact_snapshots(root, LATER + timedelta(hours=1))
    files = store.list_snapshot_files(root)
    assert len(files) == 1 and "/compacted-" in files[0]
    after = sorted(store.read_snapshots(root).to_pylist(), key=lambda r: (r["snapshot_ts"], r["partition"]))
    assert after == before


# -- racing compactors --------------------------------------------------------------------


def _compact_in_child(root: str, now: str) -> tuple[int, int]:
    result = store.compact_snapshots(root, datetime.fromisoformat(now))
    return len(result.compacted_hours), result.files_folded


def _racing_store(root, hours=6):
    for h in range(hours):
        fill_hour(root, start=H3 + timedelta(hours=h), samples=3)
    return [f"cluster=prod/date=2026-11-21/hour={3 + h:02d}" for h in range(hours)]


def test_two_compacting_threads_make_one_file_per_hour(tmp_path):
    hours = _racing_store(tmp_path)
    before = rows(tmp_path)
    now = H3 + timedelta(hours=12)
    start = threading.Barrier(2)
    results = []

    def run():
        start.wait()
        results.append(store.compact_snapshots(str(tmp_path), now))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(h for r in results for h in r.compacted_hours) == [str(tmp_path / h) for h in hours]
    assert all(len(compacted_in(tmp_path, h)) == 1 for h in hours)
    assert rows(tmp_path) == before


def test_two_compacting_processes_make_one_file_per_hour(tmp_path):
    hours = _racing_store(tmp_path)
    before = rows(tmp_path)
    now = (H3 + timedelta(hours=12)).isoformat()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = [pool.submit(_compact_in_child, str(tmp_path), now) for _ in range(2)]
        results = [f.result(timeout=120) for f in done]
    assert sum(n for n, _ in results) == len(hours)  # each hour compacted exactly once
    assert sum(folded for _, folded in results) == 3 * len(hours)
    assert all(len(compacted_in(tmp_path, h)) == 1 for h in hours)
    assert rows(tmp_path) == before
    # and once the grace has passed, the same two racing again leave one file per hour
    later = (H3 + timedelta(hours=14)).isoformat()
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compact_in_child, [str(tmp_path)] * 2, [later] * 2))
    assert all(len(visible(tmp_path, h)) == 1 for h in hours)
    assert rows(tmp_path) == before


def test_coverage_rule_never_reads_a_row_twice():
    # nested: the newer file holds the older one; overlapping (a race without the lock): one wins
    assert store.covered_names({"c1": frozenset({"a", "b"}), "c2": frozenset({"c1", "a", "b", "late"})}) == {
        "c1", "a", "b", "late"}
    skipped = store.covered_names({"x": frozenset({"a", "b"}), "y": frozenset({"b", "c", "d"})})
    assert skipped == {"x", "b", "c", "d"}  # y wins (larger); a is read as it is, x is not read


def test_an_hour_is_folded_one_file_at_a_time(tmp_path, monkeypatch):
    """Memory follows one sample file, not the hour: at 10,000 groups x 20 partitions an
    hour is 36 files of 200k rows. No read ever returns more than one file's rows."""
    fill_hour(tmp_path, samples=6)
    before = rows(tmp_path)
    biggest = []
    real_read = pq.read_table

    def read(source, *args, **kwargs):
        table = real_read(source, *args, **kwargs)
        biggest.append(table.num_rows)
        return table

    monkeypatch.setattr(pq, "read_table", read)
    done = store.compact_snapshots(str(tmp_path), LATER)
    monkeypatch.setattr(pq, "read_table", real_read)
    assert done.files_folded == 6 and done.rows == 12
    assert max(biggest) == 2  # one snapshot's two partitions
    assert rows(tmp_path) == before


def test_a_file_whose_data_cannot_be_read_is_named_and_nothing_is_folded(tmp_path):
    """A readable footer over corrupt pages: the hour stays as it was, the file is named."""
    paths = fill_hour(tmp_path, samples=3)
    victim = paths[1]
    data = bytearray(open(victim, "rb").read())
    data[4:40] = b"\xff" * 36  # the first data page, not the footer
    open(victim, "wb").write(bytes(data))
    done = store.compact_snapshots(str(tmp_path), LATER)
    assert done.compacted_hours == [] and compacted_in(tmp_path) == []
    assert any(victim.rsplit("/", 1)[-1] in line for line in done.left_alone)
    assert len(visible(tmp_path, HOUR3)) == 3 and not list((tmp_path / HOUR3).glob(".*.tmp"))


def test_retention_deleting_a_day_mid_compaction_is_not_a_failure(tmp_path, monkeypatch):
    """The sweep runs retention and compaction at once: a day folder that vanishes between
    its listing and its hours is skipped, and the other days are still compacted."""
    import shutil

    fill_hour(tmp_path)
    old_day = H3 - timedelta(days=8)
    fill_hour(tmp_path, start=old_day)
    real_ls = store._ls_or_gone
    doomed = tmp_path / "cluster=prod" / f"date={old_day:%Y-%m-%d}"

    def ls(fs, folder):
        if folder.rstrip("/").endswith(doomed.name):
            shutil.rmtree(doomed)  # retention, right between the listings
        return real_ls(fs, folder)

    monkeypatch.setattr(store, "_ls_or_gone", ls)
    done = store.compact_snapshots(str(tmp_path), LATER)
    assert done.compacted_hours and all(doomed.name not in h for h in done.compacted_hours)
    assert len(compacted_in(tmp_path)) == 1
