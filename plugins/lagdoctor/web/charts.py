"""Time-series line charts as inline SVG, rendered on the server in pure Python.

No JavaScript library and nothing fetched from a CDN: the page and the incident
report must work offline and inside a closed network. Every text that reaches
the SVG (series names come from partition numbers, but titles may carry group
names) is XML-escaped here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Sequence

from markupsafe import Markup, escape

# Tableau 10: distinct, colour-blind friendly, readable on white.
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac")
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
GAP_FACTOR = 4.0  # a hole this many times the usual interval breaks the line: the collector missed runs
FONT = "system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[datetime, float | None]]
    color: str | None = None
    dashed: bool = False


def fmt_count(v: float) -> str:
    """0, 950, 1.2k, 45k, 4.4M: axis labels stay short."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            s = f"{v / div:.1f}".rstrip("0").rstrip(".")
            return s + suffix
    return f"{v:.1f}".rstrip("0").rstrip(".") if a and a < 10 and v != int(v) else f"{int(round(v))}"


def fmt_seconds(v: float) -> str:
    s = int(round(v))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f"{s % 60:02d}s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600}h" + (f"{s % 3600 // 60:02d}m" if s % 3600 // 60 else "")
    return f"{s // 86400}d" + (f"{s % 86400 // 3600}h" if s % 86400 // 3600 else "")


def fmt_rate(v: float) -> str:
    return fmt_count(v) + "/s"


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5, 5 x 10^n steps)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [round(math.floor(lo / step) * step, 10)]
    while ticks[-1] < hi:  # the top tick is at or above the highest value: nothing drawn off the plot
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def duration_ticks(hi: float, target: int = 5) -> list[float]:
    """Ticks on whole seconds/minutes/hours, so a time-lag axis reads 0, 30s, 1m, 1m30s."""
    step = next((s for s in TIME_STEPS if s * target >= hi), TIME_STEPS[-1])
    n = max(1, math.ceil(hi / step))
    return [float(i * step) for i in range(n + 1)]


def _time_ticks(t0: float, t1: float, target: int = 6) -> tuple[list[float], str]:
    span = max(1.0, t1 - t0)
    step = next((s for s in TIME_STEPS if span / s <= target), TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    ticks = []
    v = first
    while v <= t1 + 1e-6:
        ticks.append(v)
        v += step
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%b %d")
    return ticks, fmt


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Split a series at missing values and at collection gaps."""
    known = [(t, v) for t, v in points if v is not None and math.isfinite(v)]
    if not known:
        return []
    steps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]) if b[0] > a[0])
    usual = steps[len(steps) // 2] if steps else 0
    segs: list[list[tuple[float, float]]] = [[]]
    prev_t = None
    for t, v in points:
        if v is None or not math.isfinite(v):
            if segs[-1]:
                segs.append([])
            prev_t = t
            continue
        if prev_t is not None and usual and t - prev_t > GAP_FACTOR * usual and segs[-1]:
            segs.append([])
        segs[-1].append((t, v))
        prev_t = t
    return [s for s in segs if s]


def time_chart(
    series: Sequence[Series],
    *,
    title: str,
    y_format: Callable[[float], str] = fmt_count,
    y_ticks: Callable[[float, float], list[float]] | None = None,
    width: int = 640,
    height: int = 240,
    empty_text: str = "no snapshots in the window",
    x_range: tuple[datetime, datetime] | None = None,
) -> Markup:
    """A line chart of values over time, as an inline <svg> (scales to its container)."""
    left, right, top, bottom = 58, 14, 14, 26
    legend_rows = _legend_layout(series, width - left - right)
    legend_h = 18 * len(legend_rows)
    plot_w, plot_h = width - left - right, height - top - bottom - legend_h
    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'role="img" aria-label="{escape(title)}" font-family="{FONT}" font-size="11">',
           f"<title>{escape(title)}</title>",
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" stroke="#e3e8ee"/>']

    pts = [[(p[0].astimezone(timezone.utc).timestamp(), p[1]) for p in s.points] for s in series]
    values = [v for ps in pts for _, v in ps if v is not None and math.isfinite(v)]
    times = [t for ps in pts for t, _ in ps]
    if x_range:
        times += [x_range[0].timestamp(), x_range[1].timestamp()]
    if not values or not times:
        out.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" fill="#6b7785">'
                   f"{escape(empty_text)}</text></svg>")
        return Markup("".join(out))

    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t0, t1 = t0 - 30, t1 + 30
    vmax = max(values + [0.0])
    vmin = min(values + [0.0])
    ticks = (y_ticks or nice_ticks)(vmin, vmax if vmax > vmin else vmin + 1)
    y0, y1 = ticks[0], ticks[-1]

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return top + plot_h - (v - y0) / (y1 - y0) * plot_h

    for tv in ticks:  # horizontal grid and y labels
        yy = y(tv)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#eef1f4"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 3.5:.1f}" text-anchor="end" fill="#5b6673">{escape(y_format(tv))}</text>')
    xticks, tfmt = _time_ticks(t0, t1)
    for tv in xticks:
        xx = x(tv)
        label = datetime.fromtimestamp(tv, tz=timezone.utc).strftime(tfmt)
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" stroke="#9aa5b1"/>')
        # Labels at the plot's edges are anchored inwards so they are never cut off.
        anchor = "start" if xx - left < 18 else ("end" if left + plot_w - xx < 18 else "middle")
        out.append(f'<text x="{xx:.1f}" y="{top + plot_h + 16}" text-anchor="{anchor}" fill="#5b6673">{label}</text>')

    for i, (s, ps) in enumerate(zip(series, pts)):
        color = s.color or PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        last = next((v for _, v in reversed(ps) if v is not None), None)
        tip = f"{s.name}: {y_format(last)} at the end" if last is not None else s.name
        out.append(f'<g class="series" data-series="{escape(s.name)}"><title>{escape(tip)}</title>')
        for seg in _segments(ps):
            if len(seg) == 1:
                out.append(f'<circle cx="{x(seg[0][0]):.1f}" cy="{y(seg[0][1]):.1f}" r="2.5" fill="{color}"/>')
                continue
            d = "M" + " L".join(f"{x(t):.1f} {y(v):.1f}" for t, v in seg)
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8" '
                       f'stroke-linejoin="round" stroke-linecap="round"{dash}/>')
        out.append("</g>")

    ly = top + plot_h + bottom + 4
    for row in legend_rows:
        lx = left
        for i, label_w in row:
            s = series[i]
            color = s.color or PALETTE[i % len(PALETTE)]
            dash = ' stroke-dasharray="4 2"' if s.dashed else ""
            out.append(f'<line x1="{lx}" x2="{lx + 14}" y1="{ly + 5}" y2="{ly + 5}" stroke="{color}" '
                       f'stroke-width="2.5"{dash}/>')
            out.append(f'<text x="{lx + 18}" y="{ly + 9}" fill="#3c4650">{escape(s.name)}</text>')
            lx += label_w
        ly += 18
    out.append("</svg>")
    return Markup("".join(out))


def _legend_layout(series: Sequence[Series], width: float) -> list[list[tuple[int, float]]]:
    rows: list[list[tuple[int, float]]] = [[]]
    used = 0.0
    for i, s in enumerate(series):
        w = 18 + 6.2 * len(s.name) + 14  # swatch, text at about 6.2 px per character, spacing
        if rows[-1] and used + w > width:
            rows.append([])
            used = 0.0
        rows[-1].append((i, w))
        used += w
    return rows if rows[0] else []
