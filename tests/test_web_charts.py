"""Series behind the charts (time lag, rates) and the SVG they are drawn as."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from lagdoctor.web import charts
from lagdoctor.web.data import GroupHistory, PartitionHistory

T0 = datetime(2026, 11, 21, 14, 0, tzinfo=timezone.utc)


def history(log_end, committed, step=10.0, crt=None) -> PartitionHistory:
    ts = [T0 + timedelta(seconds=i * step) for i in range(len(log_end))]
    return PartitionHistory(0, ts, list(log_end), list(committed),
                            [None if c is None else max(0, e - c) for e, c in zip(log_end, committed)],
                            list(crt or [None] * len(ts)))


@pytest.mark.parametrize(("log_end", "committed", "expected", "why"), [
    ([0, 100, 200, 300], [0, 100, 200, 300], [0, 0, 0, 0], "caught up: no time lag"),
    ([0, 100, 200, 300, 400, 500, 600], [0, 100, 150, 150, 150, 150, 150], [0, 0, 5, 15, 25, 35, 45],
     "stuck at 150, written at t=15 s (halfway between the 100 and 200 samples)"),
    ([1000, 1100, 1200], [900, 1000, 1100], [0, 10, 10],
     "committed before the first snapshot: at least the time since it (0 s there), then interpolated"),
    ([1000, 1000, 1000], [900, 900, 900], [0, 10, 20], "nothing produced: at least the time since the first snapshot"),
    ([0, 100, 200, 50, 150], [0, 50, 150, 0, 100], [0, 5, 5, 0, 5],
     "the log end fell (topic recreated): counted from the fall, as the job does"),
    ([0, 100, 200], [0, None, 200], [0, None, 0], "no committed offset: no value"),
    ([0, 100, 90, 300], [0, 100, 100, 300], [0, 0, 0, 0], "a low read of the log end does not break the search"),
])
def test_time_lag_estimate(log_end, committed, expected, why):
    got = history(log_end, committed).time_lag()
    assert [None if v is None else round(v, 6) for v in got] == expected, why


def test_time_lag_uses_committed_record_timestamp_when_collected():
    h = history([0, 100, 200], [0, 50, 50], crt=[None, T0 - timedelta(seconds=30), T0 - timedelta(seconds=30)])
    assert h.time_lag() == [0.0, 40.0, 50.0]


def test_time_lag_is_never_extrapolated_beyond_what_the_snapshots_saw():
    """Issue 17: a consumer far behind on a 17-minute-old topic (1 msg/s, 60 s snapshots, the commit
    older than the window). Extrapolating at the produce rate said 33 min; the table said 13m16s,
    exact, from the record read at the last snapshot. Each point now has one source: at least the time
    since the first snapshot until a record time is known, then that exact value."""
    log_end = [1000 + 60 * k for k in range(8)]
    crt = [None] * 7 + [T0 + timedelta(seconds=420 - 796)]  # read at the last snapshot: 13m16s behind
    h = history(log_end, [20] * 8, step=60.0, crt=crt)
    points = h.time_lag_points()
    assert points[-1] == (796.0, "record")
    assert points[:-1] == [(60.0 * k, "lower_bound") for k in range(7)]
    assert max(h.time_lag()) == 796.0  # nothing above what the table says


def test_time_lag_is_zero_when_only_transaction_markers_follow_the_commit():
    h = history([0, 100, 200], [0, 100, 199])
    h.committed_record_error = [None, None, "nothing to read: only transaction markers after offset 199"]
    assert h.time_lag_points()[-1] == (0.0, "caught_up")


def test_rates_produce_vs_consume():
    g = GroupHistory(("c", "g", "t"))
    g.partitions[0] = history([0, 100, 200, 300], [0, 50, 100, 10])  # a rewind at the end
    g.partitions[1] = history([0, 100, 200, 300], [0, 100, 200, 300])
    times, produce, consume = g.rates()
    assert times == [T0 + timedelta(seconds=s) for s in (10, 20, 30)]
    assert produce == [20.0, 20.0, 20.0]
    assert consume == [15.0, 15.0, None]  # offsets going back are no rate


def test_chart_draws_one_line_per_series_and_breaks_at_gaps():
    pts = [(T0 + timedelta(seconds=10 * i), float(i)) for i in range(10)]
    gap = pts[:5] + [(t + timedelta(minutes=10), v) for t, v in pts[5:]]
    svg = str(charts.time_chart([charts.Series("p0", pts), charts.Series("p1", gap)], title="Lag"))
    assert svg.startswith('<svg class="chart"') and svg.endswith("</svg>")
    p0 = svg[svg.index('data-series="p0"'):svg.index('data-series="p1"')]
    p1 = svg[svg.index('data-series="p1"'):]
    assert p0.count("<path") == 1 and p1.count("<path") == 2  # the collector's gap is not drawn over
    assert re.search(r">14:00<", svg) and re.search(r">p0<", svg)  # a time axis and a legend


def test_chart_escapes_text_and_handles_no_data():
    svg = str(charts.time_chart([charts.Series("<b>&", [(T0, 1.0), (T0 + timedelta(seconds=5), 2.0)])],
                                title='"><script>x</script>'))
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "&lt;b&gt;&amp;" in svg
    empty = str(charts.time_chart([charts.Series("p0", [(T0, None)])], title="t", empty_text="no snapshots"))
    assert "no snapshots" in empty and "<path" not in empty


@pytest.mark.parametrize(("value", "text"), [(0, "0"), (950, "950"), (1200, "1.2k"), (4_442_768, "4.4M"), (2.5, "2.5")])
def test_axis_numbers_are_short(value, text):
    assert charts.fmt_count(value) == text


def test_ticks_cover_the_range():
    ticks = charts.nice_ticks(0, 4_442_768)
    assert ticks[0] == 0 and ticks[-1] >= 4_442_768 and len(ticks) <= 7
    assert charts.duration_ticks(370) == [0, 120, 240, 360, 480]
    assert charts.fmt_seconds(90) == "1m30s" and charts.fmt_seconds(7200) == "2h"


# -- the chart's last point is the table's value ---------------------------------------

@pytest.mark.spark
def test_the_charts_last_point_is_the_diagnosis_jobs_time_lag(spark):
    """The time-lag chart (PartitionHistory, from the snapshots) against the job's partition
    features (the table's time_lag_seconds and source), on the same rows, one case per rule."""
    from lagdoctor.contracts import NOTHING_TO_READ
    from lagdoctor.diagnosis.features import partition_features
    from lagdoctor.diagnosis.snapshots import snapshot_schema_with_optional
    from pyspark.sql import types as T

    names = [f.name for f in snapshot_schema_with_optional()]
    cases = {  # partition: (log ends, committed, record time (s from T0) at the last snapshot, record error)
        0: ([1000 + 600 * k for k in range(4)], [1000, 1000, 1000, 1900], None, None),  # interpolated
        1: ([1000 + 600 * k for k in range(4)], [500] * 4, None, None),  # lower bound
        2: ([1000 + 600 * k for k in range(4)], [1000, 1000, 1000, 1900], 180 - 42, None),  # record
        3: ([1000 + 600 * k for k in range(4)], [1000, 1600, 2200, 2807], None, None),  # caught up
        4: ([1000 + 600 * k for k in range(4)], [1000, 1600, 2200, 2799], None, NOTHING_TO_READ + " markers"),
        5: ([1000 + 60 * k for k in range(4)], [20] * 4, 180 - 796, None),  # the issue's: exact, 13m16s
        6: ([0, 100, 200, 50, 150, 250], [0, 50, 150, 0, 100, 120], None, None),  # the log end fell
    }
    rows, histories = [], {}
    for p, (ends, committed, record_t, error) in cases.items():
        ts = [T0 + timedelta(seconds=60 * k) for k in range(len(ends))]
        crt = [None] * (len(ends) - 1) + [None if record_t is None else T0 + timedelta(seconds=record_t)]
        errors = [None] * (len(ends) - 1) + [error]
        lags = [max(0, e - c) for e, c in zip(ends, committed)]
        h = PartitionHistory(p, ts, ends, committed, lags, crt)
        h.committed_record_error = errors
        histories[p] = h
        for k in range(len(ends)):
            values = dict(snapshot_ts=ts[k], cluster="c", group_id="g", group_state="STABLE", topic="t",
                          partition=p, log_start_offset=0, log_end_offset=ends[k], committed_offset=committed[k],
                          lag=lags[k], member_id="m-1", client_id="m", host="h", group_members=1,
                          committed_record_ts=crt[k], committed_record_error=errors[k])
            rows.append(tuple(values.get(n) for n in names))
    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in snapshot_schema_with_optional()])
    table = {r["partition"]: (r["time_lag_seconds"], r["time_lag_source"]) for r in partition_features(
        spark.createDataFrame(rows, schema)).select("partition", "time_lag_seconds", "time_lag_source").collect()}
    chart = {p: h.time_lag_points()[-1] for p, h in histories.items()}
    assert {p: (round(v, 3), src) for p, (v, src) in chart.items()} == \
        {p: (round(v, 3), src) for p, (v, src) in table.items()}
    assert table[5] == (796.0, "record") and table[4] == (0.0, "caught_up")
