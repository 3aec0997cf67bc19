"""The backtest report as a page: each set's counts, what the proposed thresholds change, and
per group a timeline strip of its verdicts with the messages Slack would have had."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# How many groups get a strip, worst first (the rest are in report.json)
MAX_STRIPS = 200


def _tone(verdict: str | None) -> str:
    if not verdict or verdict.startswith("collecting_history"):
        return "none"
    if verdict == "healthy":
        return "ok"
    return "warning" if "(deciding)" in verdict else "critical"


def strips(set_report: Mapping[str, Any], sweeps: list[str]) -> list[dict[str, Any]]:
    """Per (cluster, group, topic) with a verdict change, its segments (same verdict in a row,
    width in sweeps) and the sweeps where a message went out."""
    from lagdoctor.backtest import verdicts_per_sweep

    timeline = [{**r, "verdict": [{"diagnosis": r["verdict"], "provisional": False}]}
                for r in set_report["timeline"]]
    per = verdicts_per_sweep(timeline, sweeps)
    keys = sorted({(r["cluster"], r["group_id"], r["topic"]) for r in set_report["timeline"]})
    said: dict[tuple, list[Mapping[str, Any]]] = {}
    for e in set_report["episode_list"]:
        said.setdefault((e["cluster"], e["group_id"], e["topic"]), []).append(e)
    out = []
    for key in keys:
        segments: list[dict[str, Any]] = []
        for s in sweeps:
            v = per.get((s, *key))
            if segments and segments[-1]["verdict"] == v:
                segments[-1]["sweeps"] += 1
                segments[-1]["to"] = s
            else:
                segments.append({"verdict": v, "tone": _tone(v), "sweeps": 1, "from": s, "to": s})
        changes = sum(1 for _ in segments) - 1
        if changes == 0 and segments and segments[0]["tone"] in ("ok", "none"):
            continue  # healthy throughout: nothing to show
        eps = said.get(key, [])
        out.append({"key": " / ".join(key), "segments": segments, "changes": changes, "episodes": eps})
    out.sort(key=lambda s: (-len(s["episodes"]), -s["changes"], s["key"]))
    return out[:MAX_STRIPS]


def render_backtest(report: Mapping[str, Any]) -> str:
    from lagdoctor.backtest import _iso_z, summary_text
    from lagdoctor.web.html import render

    sweeps = [_iso_z(x) for x in report.get("sweep_list") or []]
    return render("backtest.html", r=report, text=summary_text(report),
                  strips={s["name"]: strips(s, sweeps) for s in report["sets"]})


def write_backtest_html(report: Mapping[str, Any], path: str) -> str:
    text = render_backtest(report)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path
