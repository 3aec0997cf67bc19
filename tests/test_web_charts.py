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
    ([1000, 1100, 1200], [900, 1000, 1100], [10, 10, 10], "committed before the window: extrapolated at 10 msg/s"),
    ([1000, 1000, 1000], [900, 900, 900], [None, None, None], "nothing produced in the window: unknown, not zero"),
    ([0, 100, 200], [0, None, 200], [0, None, 0], "no committed offset: no value"),
    ([0, 100, 90, 300], [0, 100, 100, 300], [0, 0, 0, 0], "a low read of the log end does not break the search"),
])
def test_time_lag_estimate(log_end, committed, expected, why):
    got = history(log_end, committed).time_lag()
    assert [None if v is None else round(v, 6) for v in got] == expected, why


def test_time_lag_uses_committed_record_timestamp_when_collected():
    h = history([0, 100, 200], [0, 50, 50], crt=[None, T0 - timedelta(seconds=30), T0 - timedelta(seconds=30)])
    assert h.time_lag() == [0.0, 40.0, 50.0]


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
