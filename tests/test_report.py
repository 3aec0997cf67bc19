"""Incident reports: one self-contained HTML file per non-healthy finding, linked from Slack."""

from __future__ import annotations

import json
import os
import re

import pytest

from lagdoctor.notify.render import render_incident
from lagdoctor.settings import Settings
from lagdoctor.web.report import report_name, report_url, write_incident_report
from tests.fixtures.web import XSS_GROUP, lag_data_root  # noqa: F401  (fixture)


@pytest.fixture
def sweep(lag_data_root):
    settings = Settings(data_root=str(lag_data_root.root))
    run_dir = str(lag_data_root.findings_root / lag_data_root.sweep_run_key)
    return settings, run_dir


def _report(paths, group):
    path = next(p for p in paths if p.rsplit("/", 1)[-1].startswith(group))
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def test_one_report_per_problem_under_reports_root(sweep, lag_data_root):
    settings, run_dir = sweep
    paths = write_incident_report(run_dir, settings=settings, base_url="")
    folder = lag_data_root.root / "reports" / lag_data_root.sweep_run_key
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.rsplit("/", 1)[-1] for p in paths)
    # Three problems (imbalance, rebalance loop, the hostile-named stall); healthy groups get none.
    assert len(paths) == 3
    assert not any("billing" in p or "search-indexer" in p for p in paths)
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_report_holds_charts_evidence_table_and_runbook(sweep):
    settings, run_dir = sweep
    html = _report(write_incident_report(run_dir, settings=settings, base_url=""), "orders-processor")
    assert "Partition imbalance" in html and "falls behind" in html
    # Lag per partition, time lag, and produce vs consume: three inline SVG charts with drawn lines.
    assert html.count('<svg class="chart"') == 3
    assert 'data-series="produced"' in html and 'data-series="consumed"' in html
    assert len(re.findall(r'<path d="M', html)) > 6
    # The evidence table: kafka-consumer-groups.sh --describe columns, worst partition first.
    header = re.findall(r"<th[^>]*>([A-Z/-]+)</th>", html)
    assert header[:9] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                          "HOST", "CLIENT-ID"]
    first_row = re.search(r'<tr class="involved"><td>orders-processor</td><td>orders</td><td class="num">4</td>', html)
    assert first_row and html.index(first_row.group(0)) < html.index('<td class="num">0</td>')
    # The runbook's steps, from plans.json.
    assert "Next steps" in html and "Diagnostic steps" in html
    assert "kafka-consumer-groups.sh --bootstrap-server &lt;broker&gt; --describe --group orders-processor" in html
    assert "restart_consumers" in html


def test_report_is_self_contained_and_escaped(sweep, monkeypatch):
    settings, run_dir = sweep
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)  # no Airflow URL: no link out either
    paths = write_incident_report(run_dir, settings=settings, base_url="")
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            html = fh.read()
        assert "<script" not in html and "<link" not in html and "src=" not in html
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)  # nothing fetched from anywhere
    evil = next(p for p in paths if "stalled_consumer" in p)
    with open(evil, encoding="utf-8") as fh:
        html = fh.read()
    assert XSS_GROUP not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "/" not in evil.rsplit("/", 1)[-1] and "<" not in evil


def test_rewrite_is_idempotent_and_atomic(sweep, monkeypatch):
    from datetime import datetime, timezone

    settings, run_dir = sweep
    now = datetime(2026, 11, 21, 14, 31, 59, tzinfo=timezone.utc)  # given, so no second boundary can differ
    first = write_incident_report(run_dir, settings=settings, base_url="", now=now)
    before = {p: open(p).read() for p in first}
    assert "2026-11-21 14:31:59" in next(iter(before.values()))
    assert write_incident_report(run_dir, settings=settings, base_url="", now=now) == first
    assert {p: open(p).read() for p in first} == before  # the same bytes, not only the same names

    # A crash between writing and renaming keeps the previous report whole and leaves no temporary file.
    import fsspec.implementations.local as local

    def crash(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(local.LocalFileSystem, "mv", crash)
    with pytest.raises(OSError, match="disk full"):
        write_incident_report(run_dir, settings=settings, base_url="",
                              now=datetime(2026, 11, 21, 15, 0, tzinfo=timezone.utc))
    monkeypatch.undo()
    for p, text in before.items():
        assert open(p).read() == text
    folder = first[0].rsplit("/", 1)[0]
    assert not [n for n in os.listdir(folder) if n.startswith(".")]


def test_base_url_links_reports_into_plans_and_slack(sweep, lag_data_root, monkeypatch):
    settings, run_dir = sweep
    monkeypatch.setenv("LAGDOCTOR_REPORT_BASE_URL", "https://airflow.example.com/lagdoctor/reports/")
    paths = write_incident_report(run_dir, settings=settings)
    items = json.loads((lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text())
    linked = {i["finding"]["group_id"]: i["finding"].get("report_url") for i in items}
    assert linked["billing"] is None  # healthy: no report
    orders_url = linked["orders-processor"]
    assert orders_url == report_url(next(p for p in paths if "orders-processor" in p),
                                    "https://airflow.example.com/lagdoctor/reports")
    assert orders_url.startswith(
        f"https://airflow.example.com/lagdoctor/reports/{lag_data_root.sweep_run_key}/orders-processor__orders__")
    # The Slack message (rendered from plans.json's finding) links to it.
    item = next(i for i in items if i["finding"]["group_id"] == "orders-processor")
    context = render_incident(item["finding"], item["plan"], run_id="r")["blocks"][-1]["elements"][0]["text"]
    assert context.endswith(f"<{orders_url}|HTML report>")


def test_no_base_url_no_link(sweep, lag_data_root, monkeypatch):
    settings, run_dir = sweep
    monkeypatch.delenv("LAGDOCTOR_REPORT_BASE_URL", raising=False)
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    write_incident_report(run_dir, settings=settings)
    items = json.loads((lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text())
    assert all("report_url" not in i["finding"] for i in items)
    context = render_incident(items[0]["finding"], items[0]["plan"])["blocks"][-1]["elements"][0]["text"]
    assert "report" not in context


@pytest.mark.parametrize(("url", "expected"), [
    ("https://a.example/r/x.html", "<https://a.example/r/x.html|HTML report>"),
    ("https://a.example/r?x=1&y=<2>|3", "<https://a.example/r?x=1&amp;y=%3C2%3E%7C3|HTML report>"),  # Slack syntax kept intact
    ("javascript:alert(1)", ""),  # only web links
    (None, ""),
])
def test_slack_report_link(url, expected):
    from lagdoctor.notify.render import report_link

    assert report_link(url) == expected


def test_report_names_stay_apart_and_safe():
    a = report_name({"cluster": "c", "group_id": "a/b", "topic": "t", "diagnosis": "slow_consumer"})
    b = report_name({"cluster": "c", "group_id": "a_b", "topic": "t", "diagnosis": "slow_consumer"})
    assert a != b and a.startswith("a_b__t__slow_consumer-") and "/" not in a
    assert report_url("/x/reports/run_1/a b.html", "https://h/lagdoctor/reports") == \
        "https://h/lagdoctor/reports/run_1/a%20b.html"
    assert report_url("/x/reports/run_1/a.html", None) is None


def test_report_links_default_to_airflows_base_url(sweep, lag_data_root, monkeypatch):
    """`make airflow` sets no LAGDOCTOR_REPORT_BASE_URL: Airflow's own base URL is enough for Slack's
    report link, the report's DAG run and its group's view."""
    settings, run_dir = sweep
    monkeypatch.delenv("LAGDOCTOR_REPORT_BASE_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080/")
    paths = write_incident_report(run_dir, settings=settings)
    items = json.loads((lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text())
    orders = next(i["finding"] for i in items if i["finding"]["group_id"] == "orders-processor")
    assert orders["report_url"].startswith(
        f"http://airflow.example:8080/lagdoctor/reports/{lag_data_root.sweep_run_key}/orders-processor__orders__")
    html = _report(paths, "orders-processor")
    run = ('<a href="http://airflow.example:8080/dags/kafka_lag_health_sweep/runs/'
           'scheduled__2026-11-21T14%3A30%3A00%2B00%3A00" title="Open the DAG run in Airflow">'
           'kafka_lag_health_sweep · scheduled__2026-11-21T14:30:00+00:00</a>')
    assert run in html
    assert '<a class="group" href="http://airflow.example:8080/lagdoctor/group/prod/orders-processor"' in html
    # Links, never fetches: still nothing loaded from anywhere.
    assert "src=" not in html and "<link" not in html


def test_explicit_report_base_url_wins(sweep, lag_data_root):
    settings, run_dir = sweep
    write_incident_report(run_dir, settings=settings, environ={
        "AIRFLOW__API__BASE_URL": "http://airflow.example:8080", "LAGDOCTOR_REPORT_BASE_URL": "https://r.example/x/"})
    items = json.loads((lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text())
    urls = [i["finding"]["report_url"] for i in items if i["finding"].get("report_url")]
    assert len(urls) == 3 and all(u.startswith("https://r.example/x/") for u in urls)


@pytest.mark.parametrize("base", ["", "not-a-url", "ftp://airflow.example"])
def test_without_a_usable_airflow_url_nothing_is_linked(sweep, lag_data_root, base):
    settings, run_dir = sweep
    paths = write_incident_report(run_dir, settings=settings, environ={"AIRFLOW__API__BASE_URL": base})
    items = json.loads((lag_data_root.findings_root / lag_data_root.sweep_run_key / "plans.json").read_text())
    assert all("report_url" not in i["finding"] for i in items)
    html = _report(paths, "orders-processor")
    assert "<a " not in html  # never a broken link
    assert "<dt>DAG run</dt><dd>kafka_lag_health_sweep · scheduled__2026-11-21T14:30:00+00:00</dd>" in html


def test_report_says_once_that_the_broker_lists_no_members(sweep):
    settings, run_dir = sweep
    paths = write_incident_report(run_dir, settings=settings, environ={})
    staging = next(p for p in paths if "stalled_consumer" in p)  # the staging group: no member list
    with open(staging, encoding="utf-8") as fh:
        html = fh.read()
    assert html.count("lists no consumer-group members") == 1
    assert "<dt>Members</dt><dd>unknown</dd>" in html
    assert "lists no consumer-group members" not in _report(paths, "orders-processor")


def test_an_incomplete_run_gets_no_report_and_no_plan(sweep, lag_data_root, tmp_path):
    """A diagnosis stopped after findings.jsonl: the report writer and the plan refuse the
    folder in one line (the same rule as the page), and nothing is written for it."""
    from lagdoctor.diagnosis import output
    from lagdoctor.stages.notify import write_reports
    from lagdoctor.stages.plan import plan_findings

    settings, run_dir = sweep
    killed = tmp_path / "killed-run"
    output.begin_outputs(str(killed), now="2026-11-21T14:35:00+00:00")
    output.write_text(str(killed), "findings.jsonl", (lag_data_root.findings_root / lag_data_root.sweep_run_key
                                                      / "findings.jsonl").read_text())
    with pytest.raises(ValueError) as raised:
        write_incident_report(str(killed), settings=settings, base_url="")
    assert str(raised.value) == (f"run folder {killed} is incomplete: the diagnosis did not finish writing it: "
                                 "no _SUCCESS")
    with pytest.raises(ValueError, match=r"^diagnosis output .*killed-run is incomplete: the diagnosis did not"):
        plan_findings(str(killed))
    # The task fails (the run shows it) after handing over the line the Slack post's task logs.
    said: list[str] = []
    with pytest.raises(ValueError):
        write_reports(str(killed), on_failure=said.append)
    assert said == [f"report not written: ValueError: run folder {killed} is incomplete: the diagnosis did not "
                    "finish writing it: no _SUCCESS"]
    assert not (lag_data_root.root / "reports" / "killed-run").exists()
    assert sorted(p.name for p in killed.iterdir()) == ["_WRITING", "findings.jsonl"]


def test_reports_list_the_store_once_per_cluster_not_once_per_group(sweep, lag_data_root, monkeypatch):
    """Three problem groups (two on prod, one on staging): the store is listed once per
    cluster for the whole run, so report writing does not slow down with the groups."""
    from fsspec.implementations.local import LocalFileSystem

    snapshots = str(lag_data_root.root / "snapshots")
    listed: list[str] = []
    find = LocalFileSystem.find

    def counting_find(self, path, *args, **kwargs):
        if str(path).startswith(snapshots):
            listed.append(str(path))
        return find(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "find", counting_find)
    settings, run_dir = sweep
    paths = write_incident_report(run_dir, settings=settings, base_url="")
    assert len(paths) == 3
    assert sorted(p.rsplit("/", 1)[-1] for p in listed) == ["cluster=prod", "cluster=staging"]


def test_reports_read_the_store_once_per_cluster_and_each_shows_its_own_group(sweep, lag_data_root, monkeypatch):
    """2,000 problems once meant 2,000 reads of every file in the window (the report task timed
    out at 10 minutes): the run's problems now share one read per cluster."""
    import pyarrow.dataset as ds

    opened: list[int] = []
    dataset = ds.dataset

    def counting_dataset(files, *args, **kwargs):
        opened.append(len(files))
        return dataset(files, *args, **kwargs)

    monkeypatch.setattr(ds, "dataset", counting_dataset)
    settings, run_dir = sweep
    # as the job writes them: every finding of a run carries the run's window
    path = os.path.join(run_dir, "findings.jsonl")
    findings = [json.loads(line) for line in open(path, encoding="utf-8")]
    start, end = min(f["window_start"] for f in findings), max(f["window_end"] for f in findings)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({**f, "window_start": start, "window_end": end}) + "\n" for f in findings)
    paths = write_incident_report(run_dir, settings=settings, base_url="")
    assert len(paths) == 3 and len(opened) == 2  # prod (two problems) and staging
    html = _report(paths, "orders-processor")
    assert re.search(r'<tr class="involved"><td>orders-processor</td><td>orders</td>', html)
    # the shared read's other groups stay out of this group's evidence table
    assert set(re.findall(r'<tr[^>]*><td>([^<]+)</td><td>[^<]+</td><td class="num">', html)) == {"orders-processor"}
