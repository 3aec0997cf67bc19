"""The backtest report as a page: each set's counts, what the proposed thresholds change, and
per group a timeline strip of its verdicts with the messages Slack would have had."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

def render_backtest(report: Mapping[str, Any]) -> str:
    """The page of a report lagdoctor.backtest made (its "strips" and "text" included)."""
    from lagdoctor.web.html import render

    return render("backtest.html", r=report, text=report.get("text", ""), strips=report.get("strips", {}))


def write_backtest_html(report: Mapping[str, Any], path: str) -> str:
    text = render_backtest(report)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
    return path
