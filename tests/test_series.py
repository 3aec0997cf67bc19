"""The per-partition aggregates over Arrow batches (series.py) against the Spark SQL reference.

The diagnosis reads its partition features from series.py; the SQL windows in
features.partition_aggregates_sql are the reference. Both run here on random
histories made to hold what a real store holds now and then: failed reads
(null offsets, a read_error), a log end offset that falls (a recreated topic),
transactions holding the last stable offset, records read at the commit,
rebalances, owners that leave, commits above the log end. The two must agree
on every column of every partition, to the last bit, and so must the features
and the findings built on them.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pytest

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
KEY = ("cluster", "group_id", "topic", "partition")


def _history(seed: int, partitions: int, longest: int) -> list[dict]:
    """Rows of `partitions` series, each of 1..longest snapshots at jittered times."""
    rng = random.Random(seed)
    rows = []
    for p in range(partitions):
        group, topic = f"g{p % 7}", f"t{p % 3}"
        n = rng.choice([1, 2, 3, rng.randint(4, longest)])
        t = rng.uniform(0, 30)
        leo, committed, lso = rng.randint(0, 10_000), None, None
        committed = leo - rng.randint(0, 50)
        shape = rng.choice(["steady", "stall", "surge", "batch", "reset", "txn", "errors"])
        for i in range(n):
            t += rng.choice([1.0, 5.0, 30.0, 60.0, rng.uniform(0.5, 90)])
            leo += rng.randint(0, 40) * (3 if shape == "surge" and i > n // 2 else 1)
            if shape == "reset" and i == n // 2:
                leo = rng.randint(0, 20)  # the topic was recreated: the log end falls
                committed = min(committed, leo)
            if shape == "stall" and i > n // 3:
                pass  # the commit stands still
            elif shape == "batch" and i % 4:
                pass
            else:
                committed = min(leo, committed + rng.randint(0, 45))
            if rng.random() < 0.03:
                committed = leo + rng.randint(1, 5_000)  # a commit above the log end
            lso = leo - rng.randint(1, 10) if shape == "txn" and i % 5 else leo
            failed = shape == "errors" and rng.random() < 0.3
            member = None if rng.random() < 0.05 else f"consumer-{p % 3}-abc"
            row = dict(
                snapshot_ts=T0 + timedelta(seconds=round(t, 6)), cluster="c", group_id=group,
                group_state=rng.choice(["STABLE"] * 8 + ["PREPARING_REBALANCE", None]),
                topic=topic, partition=p, log_start_offset=None if failed else max(0, leo - 20_000 + i * 10),
                log_end_offset=None if failed and rng.random() < 0.7 else leo,
                committed_offset=None if failed and rng.random() < 0.5 else committed,
                member_id=member, client_id=member and member.rsplit("-", 1)[0], host=member and "10.0.0.1",
                group_members=rng.choice([1, 1, 1, 0, None]),
                read_error="offsets: timed out" if failed else None,
                last_stable_offset=None if failed else lso,
                retention_ms=rng.choice([None, 604_800_000, -1]),
                cleanup_policy=rng.choice([None, "delete", "compact", "compact,delete"]),
            )
            row["lag"] = (None if row["log_end_offset"] is None or row["committed_offset"] is None
                          else max(0, row["log_end_offset"] - row["committed_offset"]))
            if rng.random() < 0.2 and row["committed_offset"] is not None:
                nothing = rng.random() < 0.3
                row.update(committed_record_offset=None if nothing else row["committed_offset"] + rng.randint(0, 2),
                           committed_record_ts=None if nothing else T0 + timedelta(seconds=t - rng.uniform(0, 600)),
                           committed_record_key_sha256=None if nothing else "ab" * 32,
                           committed_record_size=None if nothing else rng.randint(1, 900),
                           committed_record_headers=rng.choice(["", "trace-id,retries", None]),
                           committed_record_error="nothing to read: end of log" if nothing else None)
            rows.append(row)
    rng.shuffle(rows)  # the store's order is not the series' order
    return rows


@pytest.fixture(scope="module")
def frame(spark):
    from pyspark.sql import types as T

    from lagdoctor.diagnosis.snapshots import snapshot_schema_with_optional

    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in snapshot_schema_with_optional()])

    def build(rows):
        return spark.createDataFrame([tuple(r.get(f.name) for f in schema) for r in rows], schema)

    return build


def _by_key(df, key):
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: [str(r[k]) for k in key])


def _aggregates(df, engine):
    from lagdoctor.diagnosis import features as fz
    from lagdoctor.diagnosis import forecast, series, timelag
    from lagdoctor.diagnosis.thresholds import Thresholds

    df = forecast.with_input_columns(timelag.with_record_columns(fz._with_stable_offset(fz._with_read_error(df))))
    if engine == "sql":
        return fz.partition_aggregates_sql(fz._series_rows(df), Thresholds())
    agg = series.partition_aggregates(fz._series_rows(df, fz.OWNER_COLUMNS), Thresholds())
    return agg.drop(*fz.OWNER_COLUMNS)  # compared with the owners join in the features test below


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_arrow_aggregates_equal_the_sql_reference_on_every_column(frame, seed):
    df = frame(_history(seed, partitions=120, longest=40))
    sql, arrow = _aggregates(df, "sql"), _aggregates(df, "arrow")
    assert arrow.schema.simpleString() == sql.schema.simpleString()
    want, got = _by_key(sql, ["pk"]), _by_key(arrow, ["pk"])
    assert len(got) == len(want) == 120
    for w, g in zip(want, got):
        assert g == w, {k: (w[k], g[k]) for k in w if w[k] != g[k]}


def test_series_longer_than_a_batch_and_split_across_batches_agree(spark, frame):
    # batches of 7 rows: most series span two or more, and a few long ones take
    # the sequential-sum path for few long series (through Spark's shuffle)
    df = frame(_history(11, partitions=9, longest=400))
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        got = _by_key(_aggregates(df, "arrow"), ["pk"])
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert got == _by_key(_aggregates(df, "sql"), ["pk"])


def test_rows_in_any_order_and_any_slicing_give_the_same_aggregates(frame):
    """A task's rows come from the shuffle in no order and are cut into slices of whole
    series: shuffled rows in batches of 5, and slices of 1, 9 or 10,000 rows, all agree."""
    import functools

    import numpy as np
    import pyarrow as pa

    from lagdoctor.diagnosis import features as fz
    from lagdoctor.diagnosis import forecast, series, timelag
    from lagdoctor.diagnosis.thresholds import Thresholds

    df = forecast.with_input_columns(timelag.with_record_columns(fz._with_stable_offset(fz._with_read_error(
        frame(_history(6, partitions=25, longest=60))))))
    rows = fz._series_rows(df, fz.OWNER_COLUMNS).orderBy("pk", "t").toArrow()
    params = series.thresholds_params(Thresholds())

    def run(table, chunk_rows, batch_rows):
        task = functools.partial(series.aggregate_batches, params=params, chunk_rows=chunk_rows)
        return pa.Table.from_batches(list(task(iter(table.to_batches(max_chunksize=batch_rows))))).sort_by("pk")

    want = run(rows, series.CHUNK_ROWS, rows.num_rows)
    shuffled = rows.take(pa.array(np.random.default_rng(6).permutation(rows.num_rows)))
    assert want.num_rows == 25
    for chunk_rows in (1, 9, 10_000):
        assert run(shuffled, chunk_rows, 5).equals(want), chunk_rows


def test_every_window_of_a_series_aggregates_as_that_window_alone(frame):
    """The backtest's pass (series.window_batches): each (series, sweep) pair equals the aggregates of
    the rows its window holds, taken alone, a row on the window's start or end included; in any
    chunking of the copies, from shuffled rows; a window that holds no row of a series gives none."""
    import functools

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from lagdoctor.diagnosis import features as fz
    from lagdoctor.diagnosis import forecast, series, timelag
    from lagdoctor.diagnosis.thresholds import Thresholds

    df = forecast.with_input_columns(timelag.with_record_columns(fz._with_stable_offset(fz._with_read_error(
        frame(_history(8, partitions=12, longest=50))))))
    rows = fz._series_rows(df, fz.OWNER_COLUMNS).orderBy("pk", "t").toArrow()
    params = series.thresholds_params(Thresholds())
    ts = pc.cast(rows["snapshot_ts"], pa.int64()).to_numpy()
    window = 600_000_000
    ends = np.unique(np.r_[ts[5], ts[17] + window, np.linspace(ts.min(), ts.max() + 2 * window, 9).astype(np.int64)])

    want = []
    for k, end in enumerate(ends):
        held = rows.filter(pa.array((ts >= end - window) & (ts <= end)))
        if held.num_rows:
            out = pa.Table.from_batches(list(series.aggregate_batches(iter(held.to_batches()), params)))
            label = pc.binary_join_element_wise(pa.array([str(end)] * out.num_rows), out["cluster"], "|")
            want.append(out.set_column(out.schema.get_field_index("cluster"), "cluster", label))
    want = pa.concat_tables(want).drop_columns(["pk"]).sort_by([("cluster", "ascending"), ("partition", "ascending"),
                                                                ("group_id", "ascending")])
    shuffled = rows.take(pa.array(np.random.default_rng(8).permutation(rows.num_rows)))
    assert want.num_rows > len(ends)
    for chunk_rows in (1, 9, 10_000):
        task = functools.partial(series.window_batches, params=params, ends_us=ends, window_us=window,
                                 chunk_rows=chunk_rows)
        got = pa.Table.from_batches(list(task(iter(shuffled.to_batches(max_chunksize=7))))).drop_columns(["pk"])
        got = got.sort_by([("cluster", "ascending"), ("partition", "ascending"), ("group_id", "ascending")])
        assert got.equals(want), chunk_rows


@pytest.mark.parametrize("pk, size, want", [
    ([1, 1, 2, 2, 2, 3], 3, [(0, 2), (2, 5), (5, 6)]),  # a slice ends where a series starts
    ([1, 1, 1, 1, 2], 2, [(0, 4), (4, 5)]),  # a series longer than the size goes whole
    ([1, 2, 3, 4], 2, [(0, 2), (2, 4)]),
    ([7], 5, [(0, 1)]),
])
def test_slices_hold_whole_series(pk, size, want):
    import numpy as np

    from lagdoctor.diagnosis.series import _slices

    assert list(_slices(np.array(pk), size)) == want


def test_features_and_findings_are_the_same_from_either_engine(frame):
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.thresholds import Thresholds

    df = frame(_history(5, partitions=60, longest=30))
    th = Thresholds()
    out = {}
    for engine in ("sql", "arrow"):
        pf = partition_features(df, th, engine=engine)
        gf = group_features(group_series(df, pf), th)
        out[engine] = (_by_key(pf, KEY), _by_key(findings(pf, gf, th), ["cluster", "group_id", "topic", "diagnosis"]))
    assert out["arrow"][0] == out["sql"][0]
    assert out["arrow"][1] == out["sql"][1]
    assert any(f["diagnosis"] != "healthy" for f in out["arrow"][1])  # the histories hold problems to find


def test_the_workers_run_the_aggregates_without_lagdoctor_installed(frame, tmp_path):
    """The function Spark ships to its Python workers carries its own code: a Connect
    server or a cluster needs numpy and pyarrow, not lagdoctor."""
    import functools
    import subprocess
    import sys
    import sysconfig

    import pyarrow as pa
    from pyspark import cloudpickle

    from lagdoctor.diagnosis import features as fz
    from lagdoctor.diagnosis import forecast, series, timelag
    from lagdoctor.diagnosis.thresholds import Thresholds

    df = forecast.with_input_columns(timelag.with_record_columns(fz._with_stable_offset(fz._with_read_error(
        frame(_history(4, partitions=30, longest=20))))))
    rows = fz._series_rows(df, fz.OWNER_COLUMNS).orderBy("pk", "t").toArrow()
    series.partition_aggregates(fz._series_rows(df, fz.OWNER_COLUMNS), Thresholds())  # registers by-value pickling
    task = functools.partial(series.aggregate_batches, params=series.thresholds_params(Thresholds()))
    (tmp_path / "task.pickle").write_bytes(cloudpickle.dumps(task))
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as writer:
        writer.write_table(rows, max_chunksize=7)
    worker = (
        "import pickle, sys\n"
        "import pyarrow as pa\n"
        "task = pickle.load(open('task.pickle', 'rb'))\n"
        "rows = pa.ipc.open_file('rows.arrow').read_all()\n"
        "out = pa.Table.from_batches(list(task(iter(rows.to_batches()))))\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'lagdoctor'], 'lagdoctor imported'\n"
        "with pa.OSFile('out.arrow', 'wb') as sink, pa.ipc.new_file(sink, out.schema) as writer:\n"
        "    writer.write_table(out)\n"
    )
    # -S: no site, so no .pth file puts lagdoctor's editable install on the path; only the
    # packages a worker's Python has (numpy, pyarrow, pyspark)
    done = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.append({sysconfig.get_path('purelib')!r}); "
                           + "exec(" + repr(worker) + ")"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    got = pa.ipc.open_file(str(tmp_path / "out.arrow")).read_all()
    want = pa.Table.from_batches(list(task(iter(rows.to_batches(max_chunksize=7)))))
    assert got.num_rows == 30 and got.equals(want)


def test_an_unknown_engine_is_a_one_line_error(monkeypatch):
    from lagdoctor.diagnosis.features import FEATURES_ENGINE_ENV, features_engine

    monkeypatch.setenv(FEATURES_ENGINE_ENV, "pandas")
    with pytest.raises(ValueError, match="LAGDOCTOR_FEATURES_ENGINE='pandas': expected one of arrow, sql"):
        features_engine()
    monkeypatch.delenv(FEATURES_ENGINE_ENV)
    assert features_engine() == "arrow"
