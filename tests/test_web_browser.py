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
    assert html.count("lists no consumer-group members") == 1  # the staging broker's gap, said once
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


def _dom(url: str, profile: Path) -> str:
    done = chromium(url, profile, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_chromium_follows_filter_group_and_report_links(lag_app, lag_data_root, tmp_path, monkeypatch):
    """Mounted at /lagdoctor as the plugin is, with Airflow's base URL set and nothing else: a filtered page
    from its address, its group link to the timeline, its report link to the report, and the report's links."""
    import html as htmllib
    from datetime import timedelta

    from fastapi import FastAPI

    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.settings import Settings
    from lagdoctor.state import StateDB, dispose_engines
    from lagdoctor.web.report import write_incident_report
    from tests.fixtures.web import END

    state_url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", state_url)
    monkeypatch.delenv("LAGDOCTOR_REPORT_BASE_URL", raising=False)
    ActionLog(StateDB.from_url(state_url)).append({
        "ts": (END - timedelta(minutes=20)).isoformat(), "status": "executed", "idempotency_key": "k1",
        "run_id": "manual__2026-11-21T14:00:00+00:00", "action": "restart_consumers", "cluster": "prod",
        "group_id": "orders-processor", "topic": "orders", "dry_run": False, "approved_by": "oncall",
        "approved_at": (END - timedelta(minutes=21)).isoformat(), "message": "rollout restart shop/orders-consumer"})
    outer = FastAPI()
    outer.mount("/lagdoctor", lag_app)
    try:
        with serve(outer) as base:
            monkeypatch.setenv("AIRFLOW__API__BASE_URL", base)
            write_incident_report(str(lag_data_root.findings_root / lag_data_root.sweep_run_key),
                                  settings=Settings(data_root=str(lag_data_root.root)))
            page = _dom(f"{base}/lagdoctor/?q=%5Eorders%7Cledger&severity=critical", tmp_path / "p1")
            group_href = htmllib.unescape(re.search(r'<a class="group" href="([^"]+)"', page).group(1))
            report_href = htmllib.unescape(
                re.search(r'<a href="([^"]+)" target="_blank" rel="noopener">report</a>', page).group(1))
            group = _dom(base + group_href, tmp_path / "p2")
            report = _dom(base + report_href, tmp_path / "p3")
    finally:
        dispose_engines()

    # The filter came from the address: one critical group of the two matching, and the form says so.
    assert set(re.findall(r'data-group="([^"]+)"', page)) == {"orders-processor"}
    assert 'name="q" value="^orders|ledger"' in page and '<option value="warning"' in page
    assert re.search(r'<option value="critical" selected(="")?>', page)

    # The group view: its timeline in order, who approved, and its charts drawn with one line per partition.
    assert group_href == "/lagdoctor/group/prod/orders-processor"
    kinds = re.findall(r'data-kind="([a-z_]+)"', group)
    assert kinds == ["first_seen", "approval", "action", "changed"]
    assert "restart_consumers approved" in group and "by oncall" in group
    card = group[group.index('<article class="card'):group.index("</article>")]
    assert card.count('<svg class="chart"') == 3
    assert len(re.findall(r'<g class="series" data-series="p\d+">', card)) == 12  # 6 partitions x lag, time lag
    assert len(re.findall(r'<g class="series" data-series="(produced|consumed)">', card)) == 2
    assert re.search(r'<path d="M[\d. L]+"', card)

    # The report link works, and the report links back to the DAG run and the group, absolutely.
    assert report_href.startswith(f"/lagdoctor/reports/{lag_data_root.sweep_run_key}/orders-processor__orders__")
    assert "Partition imbalance" in report and report.count('<svg class="chart"') == 3
    assert f'href="{base}/dags/kafka_lag_health_sweep/runs/scheduled__2026-11-21T14%3A30%3A00%2B00%3A00"' in report
    assert f'href="{base}/lagdoctor/group/prod/orders-processor"' in report
    plans = (lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text()
    assert f"{base}/lagdoctor/reports/{lag_data_root.sweep_run_key}/orders-processor__orders__" in plans


def test_a_signed_out_group_link_lands_on_airflows_login_page(airflow_db, lag_data_root, tmp_path):
    """A group-view link (as Slack and reports carry it), opened in a browser with no Airflow session:
    the real API server with the plugin redirects to Airflow's sign-in form, not a raw 401 JSON body."""
    from airflow.api_fastapi.app import create_app

    app = create_app(apps="all")  # the UI and the auth manager's login page, as `airflow api-server` serves them
    with serve(app) as base:
        # --virtual-time-budget lets the login page's script render its form before the DOM is dumped.
        done = chromium(f"{base}/lagdoctor/group/prod/orders-processor", tmp_path / "profile-login",
                        "--dump-dom", "--virtual-time-budget=15000")
    assert done.returncode == 0, done.stderr[-2000:]
    html = done.stdout
    assert "Sign into Airflow" in html and 'type="password"' in html
    assert "Not authenticated" not in html and "orders-processor" not in html
