"""The lag page after a live sweep, in a real browser (issue 11's done-when): the embedded
broker, the sweep DAG (collector, spark-submit, reports) with its data root inside a
dot-folder as `make airflow` has it, then Debian's headless Chromium reads what the page
drew: non-empty SVG charts with one series per partition, and a report link that opens."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_sweep_clusters import parse_sweep
from tests.test_web_browser import CHROMIUM, chromium, serve

pytestmark = [pytest.mark.broker, pytest.mark.spark, pytest.mark.airflow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} not installed")]


def test_a_live_sweep_draws_charts_and_links_its_report(airflow_db, kafka_bootstrap, crashed_group, warm_engine,
                                                        tmp_path, monkeypatch):
    from airflow.utils.state import DagRunState

    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader

    topic, group = crashed_group  # an EMPTY group on 2 partitions while records keep arriving
    root = tmp_path / ".demo" / "lagdoctor"  # a dot-folder, as make airflow's .demo/
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(root))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")
    monkeypatch.delenv("LAGDOCTOR_REPORT_BASE_URL", raising=False)
    monkeypatch.delenv("LAGDOCTOR_SWEEP_CLUSTERS", raising=False)

    run = parse_sweep().test(run_conf={"group_pattern": re.escape(group), "samples": 3, "interval_seconds": 1,
                                       "window_minutes": 30, "dry_run": True})
    assert run.state == DagRunState.SUCCESS

    app = create_app(lambda: Settings(data_root=str(root)))
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id=None: True)
    with serve(app) as base:
        page = chromium(f"{base}/?q=^{re.escape(group)}$", tmp_path / "profile-page", "--dump-dom")
        assert page.returncode == 0, page.stderr[-2000:]
        html = page.stdout
        assert "Crashed consumer" in html and group in html
        card = html[html.index(f'data-group="{group}"'):]
        # lag and time lag per partition, each with one line per partition of the topic
        assert card.count('<svg class="chart"') >= 2
        series = re.findall(r'<g class="series" data-series="(p\d+)">', card)
        assert sorted(set(series)) == ["p0", "p1"] and len(series) >= 4
        assert re.search(r'<path d="M[\d. L]+"', card), "the charts drew no line"
        assert "no snapshots in the window" not in card

        # links are relative to where the app is mounted (here: the server's root)
        links = re.findall(r'href="(/reports/[^"]+\.html)"', card)
        assert links, "no report link on the group's card"
        report = chromium(base + links[0].replace("&amp;", "&"), tmp_path / "profile-report", "--dump-dom")
        assert report.returncode == 0 and "Crashed consumer" in report.stdout and group in report.stdout
