"""Per-partition aggregates of the offset history, vectorised over Arrow batches.

The same aggregates as features.partition_aggregates_sql (the Spark SQL
reference), in one pass: Spark clusters the rows by the partition's hash; each
task sorts its rows by (hash, time) and works on them in slices of whole
series, as whole columns, numpy over segments of one partition each. There is
no Python loop per partition and no window expression per feature.

A task holds its rows in memory while it sorts them: one shuffle partition's,
about 16 MiB of Parquet input (session.BYTES_PER_SHUFFLE_PARTITION).

This module is pickled by value into the Python workers (see
`partition_aggregates`): the functions travel with the values of the globals
they use (constants, the thresholds as plain numbers), so the workers need
numpy and pyarrow, not lagdoctor (tests/test_series.py runs them without it).

Exactness: integers are exact in any order; sums of doubles are added in time
order, one row after another, as Spark's aggregate adds them, so the results
are the reference's to the last bit (tests/test_series.py compares the two).
"""

from __future__ import annotations

import functools
import sys
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lagdoctor.contracts import NOTHING_TO_READ
from lagdoctor.diagnosis.timelag import RECORD_COLUMNS, committed_record

# Output columns and Spark types, in the reference's order (committed_record aside).
OUTPUT = (
    ("pk", "bigint"), ("snapshots", "bigint"), ("t_first", "double"), ("t_last", "double"),
    ("leo_first", "bigint"), ("log_end_offset_end", "bigint"), ("log_start_offset_end", "bigint"),
    ("tl_first", "double"), ("tl_last", "double"), ("c_first", "bigint"), ("committed_end", "bigint"),
    ("tc_first", "double"), ("tc_last", "double"), ("lag_start", "bigint"), ("lag_peak", "bigint"),
    ("lag_known_end", "bigint"), ("read_error", "string"), ("lag_null_at_end", "boolean"),
    ("offset_reset_t", "double"), ("late_produced", "bigint"), ("late_consumed", "bigint"),
    ("late_seconds", "double"), ("early_produce_rate", "double"), ("early_consume_rate", "double"),
    ("late_advances", "bigint"), ("recent_produced", "bigint"), ("recent_consumed", "bigint"),
    ("recent_seconds", "double"), ("recent_advances", "bigint"), ("recent_unsettled", "bigint"),
    ("base_produced", "bigint"), ("base_consumed", "bigint"), ("base_seconds", "double"),
    ("base_all_produced", "bigint"), ("base_all_consumed", "bigint"), ("base_all_seconds", "double"),
    ("rise_produced", "bigint"), ("rise_consumed", "bigint"), ("rise_seconds", "double"), ("rise_from_t", "double"),
    ("stuck_episodes_done", "bigint"), ("still_intervals", "bigint"), ("waiting_intervals", "bigint"),
    ("cleared_backlog", "bigint"), ("open_run_unsettled", "bigint"), ("last_adv_t", "double"),
    ("frozen_snapshots", "bigint"), ("max_commit_gap_seconds", "double"), ("last_stable_offset_end", "bigint"),
    ("lso_since_t", "double"), ("lso_frozen_snapshots", "bigint"), ("max_lso_gap_seconds", "double"),
    ("status_window", "array<struct<snapshot_ts_us:bigint,committed_offset:bigint,log_end_offset:bigint,"
                      "log_start_offset:bigint,lag:bigint>>"),
    ("tl_t_at", "double"), ("tl_record_t", "double"), ("tl_record_after", "boolean"), ("nothing_to_read", "boolean"),
    ("fc_ls_first", "bigint"), ("fc_ls_t_first", "double"), ("fc_ls_t_last", "double"), ("retention_ms", "bigint"),
    ("retention_bytes", "bigint"), ("cleanup_policy", "string"),
    # the last row's, for the committed_record struct
    ("committed_record_offset", "bigint"), ("committed_record_ts", "timestamp"),
    ("committed_record_key_sha256", "string"), ("committed_record_size", "bigint"),
    ("committed_record_headers", "string"), ("committed_record_error", "string"),
    ("committed_offset_last", "bigint"),
)
# The names and the owner at the last row (features.OWNER_COLUMNS), carried in the rows as they are.
OWNERS = (("cluster", "string"), ("group_id", "string"), ("topic", "string"), ("partition", "int"),
          ("member_id", "string"), ("client_id", "string"), ("host", "string"))


def output_ddl() -> str:
    return ", ".join(f"{name} {kind}" for name, kind in (*OUTPUT, *OWNERS))


def thresholds_params(th) -> dict:
    """The numbers the aggregates read from a Thresholds (plain values: they are pickled)."""
    return {name: getattr(th, name) for name in
            ("baseline_lag_share", "stall_min_seconds", "stall_min_snapshots", "status_window")}


def partition_aggregates(rows, th):
    """features._series_rows' rows -> one row per partition hash (OUTPUT's columns)."""
    from pyspark import cloudpickle

    # by value: the workers of a Connect server or a cluster need no lagdoctor installed
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # No sortWithinPartitions: each task sorts its rows on the two numbers in numpy,
    # which costs a fraction of Spark sorting the wide rows (the series pass at
    # 10,000 x 20 partitions, 3.6M rows, local[2]: 14.9 -> 10.7 s)
    agg = rows.repartition("pk").mapInArrow(
        functools.partial(aggregate_batches, params=thresholds_params(th)), output_ddl())
    return _features_order(agg)


def _features_order(agg):
    """OUTPUT's columns in the reference's order, the committed_record struct built, the owners last."""
    names = [name for name, _ in OUTPUT]
    cut, last = names.index("nothing_to_read") + 1, names.index("cleanup_policy") + 1
    return agg.select(*names[:cut], committed_record("committed_offset_last").alias("committed_record"),
                      *names[cut:last], *(name for name, _ in OWNERS))


# Rows per aggregate_table call (whole series: a longer one goes whole): bounds the
# working arrays, which are several times the rows' size.
CHUNK_ROWS = 65_536


def aggregate_batches(batches: Iterator, params: dict, chunk_rows: int = CHUNK_ROWS) -> Iterator:
    """One task's record batches, in any order -> aggregate batches of whole series."""
    table = _sorted(batches)
    if table is None:
        return
    for start, stop in _slices(table.column("pk").to_numpy(), chunk_rows):
        yield aggregate_table(table.slice(start, stop - start), params)


# -- many windows of one series (the backtest) ----------------------------------------------

LABEL_SEP = "|"  # a backtest sweep's cluster label: "<window end, epoch µs>|<cluster>" (never in a connection id)


def window_aggregates(rows, th, ends_us: list[int], window_us: int):
    """features._series_rows' rows of a whole range -> one row per (partition, sweep) whose window
    [end - window, end] holds some of its rows, as partition_aggregates gives for the rows of that
    sweep alone, its cluster labelled with the sweep's end. Spark moves each row once; the copies
    into each window are made here, in numpy, a chunk at a time."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    agg = rows.repartition("pk").mapInArrow(
        functools.partial(window_batches, params=thresholds_params(th), ends_us=np.asarray(ends_us, np.int64),
                          window_us=int(window_us)), output_ddl())
    return _features_order(agg)


def window_batches(batches: Iterator, params: dict, ends_us, window_us: int,
                   chunk_rows: int = CHUNK_ROWS) -> Iterator:
    """One task's record batches -> the aggregate batches of every (series, window) pair."""
    table = _sorted(batches)
    if table is None:
        return
    ts = pc.cast(table.column("snapshot_ts"), pa.int64()).to_numpy()
    pk = table.column("pk").to_numpy()
    starts = np.flatnonzero(np.r_[True, pk[1:] != pk[:-1]])
    stops = np.r_[starts[1:], len(pk)]
    lo_edge, hi_edge = ends_us - window_us, ends_us
    # per series, per window: the rows [lo, hi) it holds (select_window: start <= ts <= end)
    pieces = []
    for a, b in zip(starts, stops):
        lo = a + np.searchsorted(ts[a:b], lo_edge, side="left")
        hi = a + np.searchsorted(ts[a:b], hi_edge, side="right")
        keep = np.flatnonzero(hi > lo)
        if len(keep):
            pieces.append((lo[keep], hi[keep], keep))
    if not pieces:
        return
    lo = np.concatenate([p[0] for p in pieces])
    hi = np.concatenate([p[1] for p in pieces])
    window = np.concatenate([p[2] for p in pieces])
    size = hi - lo
    total = np.cumsum(size)
    first = 0
    while first < len(lo):
        # whole (series, window) pairs, about chunk_rows copied rows at a time
        done = total[first - 1] if first else 0
        last = max(first + 1, int(np.searchsorted(total, done + chunk_rows, side="right")))
        sel = slice(first, last)
        n = size[sel]
        rows = np.repeat(lo[sel] - np.r_[0, np.cumsum(n)[:-1]], n) + np.arange(int(n.sum()))
        copied = table.take(pa.array(rows)).set_column(
            table.schema.get_field_index("pk"), "pk", pa.array(np.repeat(np.arange(first, last), n)))
        out = aggregate_table(copied, params)
        labels = pc.binary_join_element_wise(
            pa.array(ends_us[window[sel]]).cast(pa.string()), out.column(out.schema.get_field_index("cluster")),
            LABEL_SEP)
        yield out.set_column(out.schema.get_field_index("cluster"), "cluster", labels)
        first = last


def _sorted(batches: Iterator):
    """One task's record batches as one table sorted by (pk, t); None for no row."""
    tables = [pa.Table.from_batches([batch]) for batch in batches if batch.num_rows]
    if not tables:
        return None
    table = pa.concat_tables(tables)
    del tables  # the sorted copy below replaces these rows: one copy held, not two
    # stable, like the order the rows came in for rows of one time (as Spark's sort left them)
    order = np.lexsort((table.column("t").to_numpy(), table.column("pk").to_numpy()))
    return table.take(pa.array(order))


def _slices(pk, size: int) -> Iterator[tuple[int, int]]:
    """[start, stop) ranges of sorted `pk` of at most `size` rows, each of whole series;
    a series longer than `size` is a range of its own."""
    n = len(pk)
    starts = np.flatnonzero(np.r_[True, pk[1:] != pk[:-1]])
    start = 0
    while start < n:
        if start + size >= n:
            stop = n
        else:
            k = int(np.searchsorted(starts, start + size, side="right")) - 1  # last series start within size
            stop = int(starts[k]) if starts[k] > start else (int(starts[k + 1]) if k + 1 < len(starts) else n)
        yield start, stop
        start = stop


class _Segments:
    """Rows sorted by (pk, t) seen as segments, one per partition series."""

    def __init__(self, pk):
        n = len(pk)
        self.n = n
        self.first = np.ones(n, bool)
        self.first[1:] = pk[1:] != pk[:-1]
        self.starts = np.flatnonzero(self.first)
        self.ends = np.r_[self.starts[1:], n] - 1
        self.seg = np.cumsum(self.first) - 1
        self.row_start = self.starts[self.seg]
        self.length = self.ends - self.starts + 1
        self.rn = np.arange(n) - self.row_start + 1  # row_number(), 1-based
        self.n_rows = self.length[self.seg]
        self.last = np.zeros(n, bool)
        self.last[self.ends] = True

    # -- rows: window functions ------------------------------------------------------
    def prev(self, values, valid):
        """lag(1): the previous row's value in the series (invalid at a series' first row)."""
        pv = np.empty_like(values)
        pv[1:] = values[:-1]
        pv[:1] = values[:1]
        pvalid = np.zeros(self.n, bool)
        pvalid[1:] = valid[:-1]
        pvalid &= ~self.first
        return pv, pvalid

    def next(self, values, valid):
        """lead(1)."""
        nv = np.empty_like(values)
        nv[:-1] = values[1:]
        nv[-1:] = values[-1:]
        nvalid = np.zeros(self.n, bool)
        nvalid[:-1] = valid[1:]
        nvalid &= ~self.last
        return nv, nvalid

    def last_before(self, valid):
        """(index, found): the last row before each row in its series where `valid` (last ignorenulls, -1 frame)."""
        at = np.maximum.accumulate(np.where(valid, np.arange(self.n), -1))
        before = np.empty_like(at)
        before[0] = -1
        before[1:] = at[:-1]
        found = before >= self.row_start
        return np.where(found, before, 0), found

    def cumsum(self, values):
        """Sum from the series' first row to this one, inclusive (integers: exact)."""
        total = np.cumsum(values)
        before = np.r_[0, total][self.row_start]
        return total - before

    # -- series: aggregates ----------------------------------------------------------
    def first_index(self, valid):
        """(index, found) per series: its first row where `valid`."""
        at = np.minimum.accumulate(np.where(valid, np.arange(self.n), self.n)[::-1])[::-1]
        idx = at[self.starts]
        found = idx <= self.ends
        return np.where(found, idx, 0), found

    def last_index(self, valid):
        at = np.maximum.accumulate(np.where(valid, np.arange(self.n), -1))
        idx = at[self.ends]
        found = idx >= self.starts
        return np.where(found, idx, 0), found

    def count(self, mask):
        return np.add.reduceat(mask.astype(np.int64), self.starts)

    def sum_int(self, values, mask):
        """(sum, valid): Spark's sum of the rows where `mask` (null when none)."""
        return np.add.reduceat(np.where(mask, values, 0).astype(np.int64), self.starts), self.count(mask) > 0

    def max_of(self, values, mask, fill):
        return np.maximum.reduceat(np.where(mask, values, fill), self.starts), self.count(mask) > 0

    def sum_double(self, values, mask):
        """(sum, valid) of doubles, added in row order (as Spark's aggregate adds them)."""
        vals = np.where(mask, values, 0.0)
        out = np.zeros(len(self.starts))
        positions = self._positions()
        if positions is not None:
            for sel, rows in positions:  # one step per position: all series at once
                out[sel] += vals[rows]
        else:  # few long series: one sequential accumulate each
            for s, (a, b) in enumerate(zip(self.starts, self.ends)):
                out[s] = np.add.accumulate(vals[a:b + 1])[-1]
        return out, self.count(mask) > 0

    def _positions(self):
        """[(series that reach position p, their rows at p)] for each p, computed once and
        shared by every sum_double of the table; None when the series are fewer than the
        longest is long. (Not functools.cached_property: its lock does not pickle.)"""
        if hasattr(self, "_positions_cache"):
            return self._positions_cache
        longest = int(self.length.max()) if len(self.length) else 0
        if longest > len(self.starts):
            self._positions_cache = None
            return None
        positions = []
        for p in range(longest):
            sel = np.flatnonzero(self.length > p)
            positions.append((sel, self.starts[sel] + p))
        self._positions_cache = positions
        return positions


def _column(table, name, dtype):
    """(values, valid) numpy arrays of a nullable numeric column."""
    col = table.column(name)
    valid = col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else np.ones(len(col), bool)
    values = pc.fill_null(col, 0).to_numpy(zero_copy_only=False) if col.null_count else col.to_numpy(
        zero_copy_only=False)
    return np.asarray(values).astype(dtype, copy=False), valid


def aggregate_table(table, params: dict):
    """One table of whole series sorted by (pk, t) -> its aggregates (one RecordBatch)."""
    i64, f64 = np.int64, np.float64
    # The series restarts where the log end offset last fell below the last known one:
    # the rows before are not read. Each series keeps that row at least, so the series
    # (and their order) stay the same.
    segs = _Segments(table.column("pk").to_numpy())
    t = table.column("t").to_numpy().astype(f64)
    leo, leo_ok = _column(table, "log_end_offset", i64)
    before, before_ok = segs.last_before(leo_ok)
    fell = leo_ok & before_ok & (leo < leo[before])
    reset_t, reset_ok = segs.max_of(t, fell, -np.inf)
    keep = ~reset_ok[segs.seg] | (t >= reset_t[segs.seg])
    if not keep.all():
        table = table.filter(pa.array(keep))
        segs = _Segments(table.column("pk").to_numpy())
        t = table.column("t").to_numpy().astype(f64)
        leo, leo_ok = _column(table, "log_end_offset", i64)
    s = segs
    com, com_ok = _column(table, "committed_offset", i64)
    lag, lag_ok = _column(table, "lag", i64)
    lso, lso_ok = _column(table, "last_stable_offset", i64)
    ls, ls_ok = _column(table, "log_start_offset", i64)
    uns, uns_ok = _column(table, "unsettled", i64)
    th_share, stall_s = params["baseline_lag_share"], params["stall_min_seconds"]
    stall_n, status_n = params["stall_min_snapshots"], params["status_window"]

    # layer 1: neighbours and whole-series values
    prev_t, prev_t_ok = s.prev(t, np.ones(s.n, bool))
    prev_leo, prev_leo_ok = s.prev(leo, leo_ok)
    prev_com, prev_com_ok = s.prev(com, com_ok)
    prev_lag, prev_lag_ok = s.prev(lag, lag_ok)
    prev_lso, prev_lso_ok = s.prev(lso, lso_ok)
    next_com, next_com_ok = s.next(com, com_ok)
    lag_max, lag_max_ok = s.max_of(lag, lag_ok, np.iinfo(i64).min)
    lso_last_i, lso_last_ok = s.last_index(lso_ok)
    c_end_i, c_end_ok = s.last_index(com_ok)
    s_first, s_last = t[s.starts], t[s.ends]
    c_end, c_end_row_ok = com[c_end_i][s.seg], c_end_ok[s.seg]
    lso_last, lso_last_row_ok = lso[lso_last_i][s.seg], lso_last_ok[s.seg]

    # layer 2
    dt_ok = prev_t_ok
    dt = np.where(dt_ok, t - prev_t, 0.0)
    dleo_ok = leo_ok & prev_leo_ok
    dleo = np.where(dleo_ok, leo - prev_leo, 0)
    dcom_ok = com_ok & prev_com_ok
    dcom = np.where(dcom_ok, com - prev_com, 0)
    dlso_ok = lso_ok & prev_lso_ok
    dlso = np.where(dlso_ok, lso - prev_lso, 0)
    span = (s_last - s_first)[s.seg]
    x_ok = span > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(x_ok, (t - s_first[s.seg]) / np.where(x_ok, span, 1.0), 0.0)
    bracket = prev_leo_ok & c_end_row_ok & leo_ok & (prev_leo <= c_end) & (c_end < leo)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (c_end - prev_leo).astype(f64) / np.where(bracket, leo - prev_leo, 1).astype(f64)
    tl_t_at = prev_t + frac * (t - prev_t)
    run_start = com_ok & (~prev_com_ok | (com != prev_com))
    run_end = com_ok & (~next_com_ok | (com != next_com))
    above = lag_ok & lag_max_ok[s.seg] & (lag.astype(f64) > th_share * lag_max[s.seg].astype(f64))
    risen = s.cumsum(above.astype(i64)) > 0
    uns_cum = s.cumsum(np.where(uns_ok, uns, 0))
    uns_cum_ok = s.cumsum(uns_ok.astype(i64)) > 0

    # layer 3
    advanced = dcom_ok & (dcom > 0)
    lso_advanced = dlso_ok & (dlso > 0)
    late = x_ok & (x > 2.0 / 3.0)
    early = x_ok & (x <= 1.0 / 3.0)
    lso_before, lso_before_ok = s.last_before(lso_advanced)
    lso_gap = t - np.where(lso_before_ok, t[lso_before], s_first[s.seg])
    starts_total = s.count(run_start)
    runs_after = starts_total[s.seg] - s.cumsum(run_start.astype(i64))
    adv_before, adv_before_ok = s.last_before(advanced)
    run_rn = np.where(adv_before_ok, s.rn[adv_before], 1)
    run_t = np.where(adv_before_ok, t[adv_before], s_first[s.seg])
    uns_before, uns_before_ok = s.last_before(advanced & uns_cum_ok)
    run_uns = np.where(uns_before_ok, uns_cum[uns_before], 0)
    next_risen, next_risen_ok = s.next(risen, np.ones(s.n, bool))
    base_row = ~risen & ~(next_risen_ok & next_risen)
    gap = np.where(s.rn - run_rn >= 2, t - run_t, 0.0)
    stuck = (advanced & (prev_t_ok & (prev_t - run_t >= stall_s)) & (s.rn - 1 - run_rn >= stall_n)
             & uns_cum_ok & uns_ok & (uns_cum - uns - run_uns == 0)
             & prev_lag_ok & (prev_lag > 0) & lag_ok & (lag.astype(f64) >= 0.5 * prev_lag.astype(f64))
             & com_ok & prev_leo_ok & (com < prev_leo))
    keep_status = (s.n_rows - s.rn < status_n) | ((run_start | run_end) & (runs_after < status_n))
    at_end = com_ok & c_end_row_ok & (com == c_end)
    recent = (s.n_rows - s.rn < stall_n) | (t > s_last[s.seg] - stall_s)

    out: dict[str, object] = {"pk": table.column("pk").to_numpy()[s.starts]}

    def value_at(values, idx, found, kind):
        return pa.array(values[idx], type=kind, mask=~found)

    def nullable(values, valid, kind):
        return pa.array(values, type=kind, mask=~valid)

    out["snapshots"] = pa.array(s.length.astype(i64))
    out["t_first"], out["t_last"] = pa.array(s_first), pa.array(s_last)
    i, ok = s.first_index(leo_ok)
    out["leo_first"] = value_at(leo, i, ok, pa.int64())
    tl_first = value_at(t, i, ok, pa.float64())
    i, ok = s.last_index(leo_ok)
    out["log_end_offset_end"] = value_at(leo, i, ok, pa.int64())
    tl_last = value_at(t, i, ok, pa.float64())
    ls_last_i, ls_last_ok = s.last_index(ls_ok)
    out["log_start_offset_end"] = value_at(ls, ls_last_i, ls_last_ok, pa.int64())
    out["tl_first"], out["tl_last"] = tl_first, tl_last
    i, ok = s.first_index(com_ok)
    out["c_first"] = value_at(com, i, ok, pa.int64())
    tc_first = value_at(t, i, ok, pa.float64())
    out["committed_end"] = value_at(com, c_end_i, c_end_ok, pa.int64())
    out["tc_first"], out["tc_last"] = tc_first, value_at(t, c_end_i, c_end_ok, pa.float64())
    i, ok = s.first_index(lag_ok)
    out["lag_start"] = pa.array(np.where(ok, lag[i], 0))
    out["lag_peak"] = nullable(lag_max, lag_max_ok, pa.int64())
    i, ok = s.last_index(lag_ok)
    out["lag_known_end"] = value_at(lag, i, ok, pa.int64())
    out["read_error"] = table.column("read_error").take(pa.array(s.ends))
    out["lag_null_at_end"] = pa.array(~lag_ok[s.ends])
    out["offset_reset_t"] = nullable(reset_t, reset_ok, pa.float64())

    def sums(prefix, mask):
        produced = s.sum_int(dleo, mask & dleo_ok)
        consumed = s.sum_int(dcom, mask & dcom_ok)
        seconds = s.sum_double(dt, mask & dt_ok)
        out[f"{prefix}_produced"] = nullable(*produced, pa.int64())
        out[f"{prefix}_consumed"] = nullable(*consumed, pa.int64())
        out[f"{prefix}_seconds"] = nullable(*seconds, pa.float64())
        return produced, consumed, seconds

    def ratio(num, den):
        (n, n_ok), (d, d_ok) = num, den
        ok = n_ok & d_ok & (d > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return nullable(n.astype(f64) / np.where(ok, d, 1.0), ok, pa.float64())

    sums("late", late)
    e_seconds = s.sum_double(dt, early & dt_ok)
    out["early_produce_rate"] = ratio(s.sum_int(dleo, early & dleo_ok), e_seconds)
    out["early_consume_rate"] = ratio(s.sum_int(dcom, early & dcom_ok), e_seconds)
    out["late_advances"] = pa.array(s.count(late & advanced))
    sums("recent", recent)
    out["recent_advances"] = pa.array(s.count(recent & advanced))
    out["recent_unsettled"] = nullable(*s.sum_int(uns, recent & uns_ok), pa.int64())
    sums("base", base_row)
    sums("base_all", ~risen)
    sums("rise", risen)
    i, ok = s.last_index(~risen)
    out["rise_from_t"] = value_at(t, i, ok, pa.float64())
    out["stuck_episodes_done"] = pa.array(s.count(stuck))
    waiting = prev_lag_ok & (prev_lag > 0)
    out["still_intervals"] = pa.array(s.count(dcom_ok & (dcom == 0) & waiting))
    out["waiting_intervals"] = pa.array(s.count(dcom_ok & waiting))
    cleared = advanced & waiting & com_ok & prev_leo_ok & (com >= prev_leo)
    out["cleared_backlog"] = nullable(*s.max_of(prev_lag, cleared, np.iinfo(i64).min), pa.int64())
    cum_max, cum_max_ok = s.max_of(uns_cum, uns_cum_ok, np.iinfo(i64).min)
    adv_max, adv_max_ok = s.max_of(uns_cum, advanced & uns_cum_ok, np.iinfo(i64).min)
    out["open_run_unsettled"] = nullable(cum_max - np.where(adv_max_ok, adv_max, 0), cum_max_ok, pa.int64())
    i, ok = s.first_index(at_end)
    out["last_adv_t"] = value_at(t, i, ok, pa.float64())
    out["frozen_snapshots"] = pa.array(np.maximum(s.count(at_end) - 1, 0))
    gap_max, gap_ok = s.max_of(gap, advanced, -np.inf)
    out["max_commit_gap_seconds"] = pa.array(np.where(gap_ok, gap_max, 0.0))
    out["last_stable_offset_end"] = value_at(lso, lso_last_i, lso_last_ok, pa.int64())
    at_lso = lso_ok & lso_last_row_ok & (lso == lso_last)
    i, ok = s.first_index(at_lso)
    out["lso_since_t"] = value_at(t, i, ok, pa.float64())
    out["lso_frozen_snapshots"] = pa.array(np.maximum(s.count(at_lso) - 1, 0))
    lso_gap_max, lso_gap_ok = s.max_of(lso_gap, lso_advanced, -np.inf)
    out["max_lso_gap_seconds"] = pa.array(np.where(lso_gap_ok, lso_gap_max, 0.0))
    out["status_window"] = _status_window(table, s, keep_status)
    out["tl_t_at"] = nullable(*s.max_of(tl_t_at, bracket, -np.inf), pa.float64())
    last = pa.array(s.ends)
    rec_ts = table.column("committed_record_ts").take(last)
    rec_ts_us = pc.cast(rec_ts, pa.int64())
    out["tl_record_t"] = pc.divide(pc.cast(rec_ts_us, pa.float64()), 1e6)
    rec_offset = table.column("committed_record_offset").take(last)
    com_last = table.column("committed_offset").take(last)
    out["tl_record_after"] = pc.greater(rec_offset, com_last)
    rec_error = table.column("committed_record_error").take(last)
    out["nothing_to_read"] = pc.fill_null(pc.starts_with(rec_error, NOTHING_TO_READ), False)
    i, ok = s.first_index(ls_ok)
    out["fc_ls_first"] = value_at(ls, i, ok, pa.int64())
    out["fc_ls_t_first"] = value_at(t, i, ok, pa.float64())
    out["fc_ls_t_last"] = value_at(t, ls_last_i, ls_last_ok, pa.float64())
    for name in ("retention_ms", "retention_bytes", "cleanup_policy"):
        col = table.column(name)
        i, ok = s.last_index(col.is_valid().to_numpy(zero_copy_only=False))
        out[name] = col.take(pa.array(i, mask=~ok))
    for name, _ in RECORD_COLUMNS:  # features builds the committed_record struct from them
        out[name] = table.column(name).take(last)
    out["committed_offset_last"] = com_last
    for name, _ in OWNERS:
        out[name] = table.column(name).take(last)
    # in the declared schema's order: mapInArrow matches columns by position
    names = [name for name, _ in (*OUTPUT, *OWNERS)]
    return pa.RecordBatch.from_arrays([_chunk(out[name]) for name in names], names=names)


def _chunk(values):
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values if isinstance(values, pa.Array) else pa.array(values)


def _status_window(table, s, keep):
    """collect_list of (snapshot_ts_us, committed, log end, log start, lag) over the kept rows, in order."""
    rows = pa.array(np.flatnonzero(keep))
    ts_us = pc.cast(table.column("snapshot_ts").take(rows), pa.int64())
    fields = [ts_us] + [table.column(name).take(rows) for name in
                        ("committed_offset", "log_end_offset", "log_start_offset", "lag")]
    struct = pa.StructArray.from_arrays(
        [_chunk(f) for f in fields],
        names=["snapshot_ts_us", "committed_offset", "log_end_offset", "log_start_offset", "lag"])
    counts = s.count(keep)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), struct)
