"""The lag page in a real browser: Debian's headless Chromium loads it from a
live server (uvicorn on loopback) and we read the DOM it rendered.

Skips when /usr/bin/chromium is absent (`apt-get install -y chromium`; the
Makefile installs it for CI). Set LAGDOCTOR_SCREENSHOT=path to also keep a PNG.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.web import lag_app, lag_data_root  # noqa: F401  (fixtures)

CHROMIUM = os.environ.get("LAGDOCTOR_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} not installed (apt-get install -y chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(app):
    """Run `app` with uvicorn on a free loopback port in a thread; yield its base URL."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def chromium(url: str, profile: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess:
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=timeout)


def test_chromium_renders_seeded_findings_and_charts(lag_app, tmp_path):
    shot = tmp_path / "lag-page.png"
    with serve(lag_app) as base:
        dom = chromium(f"{base}/", tmp_path / "profile-dom", "--dump-dom")
        png = chromium(f"{base}/", tmp_path / "profile-png", f"--screenshot={shot}", "--window-size=1280,1500")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout

    # The seeded findings, as a user reads them.
    assert "orders-processor" in html and "payments-ledger" in html
    assert "Partition imbalance" in html and "Rebalance loop" in html
    assert re.search(r'data-count="critical">\s*1<', html), "one critical group"
    assert "unknown (broker reports no member list)" in html
    assert "/dags/kafka_lag_health_sweep/runs/scheduled__2026-11-21T14%3A30%3A00%2B00%3A00" in html

    # The charts: inline SVG lines, one per partition, drawn in the browser's DOM.
    card = html[html.index('data-group="orders-processor"'):html.index('data-group="payments-ledger"')]
    assert card.count('<svg class="chart"') == 2
    assert len(re.findall(r'<g class="series" data-series="p\d+">', card)) == 12  # 6 partitions x 2 charts
    assert re.search(r'<path d="M[\d. L]+"', card)

    # A hostile group name stays text: the browser built no script element from it.
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html

    assert png.returncode == 0 and shot.stat().st_size > 20_000, png.stderr[-2000:]
    if os.environ.get("LAGDOCTOR_SCREENSHOT"):
        shutil.copy(shot, os.environ["LAGDOCTOR_SCREENSHOT"])
