"""The lag page and its JSON through FastAPI's TestClient, as a signed-in user
(the auth dependency overridden; tests/test_web_airflow.py covers the real one)."""

from __future__ import annotations

import html as htmllib
import json
import re
import shutil
from datetime import datetime

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from lagdoctor.settings import Settings
from lagdoctor.web.app import create_app
from lagdoctor.web.auth import dag_run_reader
from tests.fixtures.web import (  # noqa: F401  (fixtures)
    INCIDENT_DAG, SWEEP_DAG, XSS_GROUP, api_severities, exported_severities, lag_app, lag_client, lag_data_root,
    shown_severities,
)


def client_for(root, can_read=lambda dag_id: True, clock=None) -> TestClient:
    app = create_app(lambda: Settings(data_root=str(root)), **({"clock": clock} if clock else {}))
    app.dependency_overrides[dag_run_reader] = lambda: can_read
    return TestClient(app)


def test_page_shows_each_group_with_severity_diagnosis_owners_and_charts(lag_client):
    r = lag_client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    card = html[html.index('data-group="orders-processor"'):html.index('data-group="payments-ledger"')]
    assert 'class="badge critical"' in card and "Partition imbalance" in card and "pattern steady_climb" in card
    assert re.search(r"consumer-5-\w+ on 10\.0\.1\.18 falls behind", card)
    assert card.count('<svg class="chart"') == 2  # lag and time lag
    assert '<tr class="involved">' in card  # the hot partition is marked in the table
    assert "consumer-5" in card and "10.0.1.18" in card  # its owner
    # The staging groups' broker lists no members: said once at the top, not guessed, not per row.
    assert html.count("lists no consumer-group members") == 1
    assert re.search(r'class="note broker-members">The broker of cluster <code>staging</code>', html)
    staging = html[html.index('data-group="search-indexer"'):]
    assert "<dt>Members</dt><dd>unknown</dd>" in staging and '<span class="unknown">unknown</span>' in staging
    # Healthy groups are listed, collapsed.
    assert re.search(r'<details class="healthy"[^>]*data-group="billing"', html)


def test_latest_run_per_group_wins(lag_client, lag_data_root):
    html = lag_client.get("/").text
    assert "older run: lag building" not in html
    findings = lag_client.get("/api/findings").json()["findings"]
    orders = [f for f in findings if f["group_id"] == "orders-processor"]
    assert [f["run_key"] for f in orders] == [lag_data_root.sweep_run_key]
    assert orders[0]["severity"] == "critical"


def test_dag_run_links_are_relative_and_escaped(lag_client):
    html = lag_client.get("/").text
    href = "/dags/kafka_lag_health_sweep/runs/scheduled__2026-11-21T14%3A30%3A00%2B00%3A00"
    assert f'href="{href}" target="_top"' in html  # inside the UI's iframe the run opens in the whole window
    run = lag_client.get("/api/findings").json()["runs"][0]
    assert run["dag_run_url"] == href and run["dag_id"] == SWEEP_DAG


def test_links_follow_the_mount_point(lag_app):
    """Mounted at /lagdoctor under an API server with base path /airflow, links keep the base path."""
    outer = FastAPI(root_path="/airflow")
    outer.mount("/lagdoctor", lag_app)
    with TestClient(outer) as client:
        r = client.get("/airflow/lagdoctor/api/findings")
    assert r.status_code == 200
    assert r.json()["findings"][0]["dag_run_url"].startswith("/airflow/dags/kafka_lag_health_sweep/runs/")


def test_api_findings_shape(lag_client):
    body = lag_client.get("/api/findings").json()
    assert set(body) == {"generated_at", "runs", "findings", "sweep_cadence"}
    assert {f["group_id"] for f in body["findings"]} == {
        "orders-processor", "payments-ledger", "billing", "search-indexer", XSS_GROUP}
    f = next(f for f in body["findings"] if f["group_id"] == "orders-processor")
    for field in ("cluster", "group_id", "topic", "partitions", "diagnosis", "pattern", "severity", "summary",
                  "evidence", "window_start", "window_end", "run_key", "dag_id", "run_id", "dag_run_url"):
        assert field in f, field
    # Per-partition status rides along in the evidence, as the Slack table reads it.
    assert len(f["evidence"]["partitions"]) == 6
    assert {"partition", "lag", "time_lag_seconds", "status"} <= set(f["evidence"]["partitions"][0])


@pytest.mark.parametrize(("query", "groups"), [
    ("cluster=staging", {"search-indexer", XSS_GROUP}),
    ("cluster=prod&group=billing", {"billing"}),
    ("group=payments-ledger", {"payments-ledger"}),
    ("cluster=nope", set()),
])
def test_filters(lag_client, query, groups):
    body = lag_client.get(f"/api/findings?{query}").json()
    assert {f["group_id"] for f in body["findings"]} == groups
    html = lag_client.get(f"/?{query}").text
    for g in {"orders-processor", "billing", "search-indexer"} - groups:
        assert f'data-group="{g}"' not in html
    if not groups:
        assert "Nothing matches this filter" in html


def test_hostile_names_render_as_text(lag_client):
    html = lag_client.get("/").text
    assert XSS_GROUP not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<b>markup</b>" not in html and "&lt;b&gt;markup&lt;/b&gt; &amp; an ampersand" in html
    # And even if something slipped through, the page may run no script at all.
    csp = lag_client.get("/").headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp
    # JSON carries the name as data.
    assert XSS_GROUP in {f["group_id"] for f in lag_client.get("/api/findings").json()["findings"]}


def test_read_only(lag_client):
    for method in ("post", "put", "delete", "patch"):
        assert getattr(lag_client, method)("/api/findings").status_code == 405
        assert getattr(lag_client, method)("/").status_code == 405


def test_empty_data_root(tmp_path):
    with client_for(tmp_path / "nothing-here") as client:
        r = client.get("/")
        assert r.status_code == 200 and "No diagnosis has run yet" in r.text
        assert client.get("/api/findings").json()["findings"] == []


def test_run_without_snapshots_still_shows_its_findings(lag_data_root):
    shutil.rmtree(lag_data_root.root / "snapshots")
    with client_for(lag_data_root.root) as client:
        html = client.get("/").text
    assert "Partition imbalance" in html and "no snapshots in the window" in html


def test_runs_of_unreadable_dags_are_hidden(lag_data_root):
    """A user who may read the incident DAG but not the sweep sees the incident run's (older) view only."""
    with client_for(lag_data_root.root, can_read=lambda dag_id: dag_id == INCIDENT_DAG) as client:
        body = client.get("/api/findings").json()
        html = client.get("/").text
    assert [f["group_id"] for f in body["findings"]] == ["orders-processor"]
    assert body["findings"][0]["dag_id"] == INCIDENT_DAG
    assert "older run: lag building" in html and "payments-ledger" not in html
    with client_for(lag_data_root.root, can_read=lambda dag_id: False) as client:
        body = client.get("/api/findings").json()
        assert (body["findings"], body["runs"]) == ([], [])
        assert "No diagnosis has run yet" in client.get("/").text


def test_folder_written_outside_airflow_needs_access_to_all_dags(lag_data_root):
    run_json = lag_data_root.findings_root / lag_data_root.sweep_run_key / "run.json"
    run_json.write_text(json.dumps({"planned_at": "2026-11-21T14:31:00+00:00"}))  # no dag_id: a CLI run
    asked = []
    with client_for(lag_data_root.root, can_read=lambda d: asked.append(d) or d is not None) as client:
        groups = {f["group_id"] for f in client.get("/api/findings").json()["findings"]}
    assert None in asked and groups == {"orders-processor"}  # only the incident run is readable


def test_reports_route(lag_data_root):
    from lagdoctor.web.report import write_incident_report

    paths = write_incident_report(str(lag_data_root.findings_root / lag_data_root.sweep_run_key),
                                  settings=Settings(data_root=str(lag_data_root.root)))
    name = paths[0].rsplit("/", 1)[-1]
    url = f"/reports/{lag_data_root.sweep_run_key}/{name}"
    with client_for(lag_data_root.root) as client:
        r = client.get(url)
        assert r.status_code == 200 and "<svg" in r.text
        for bad in ("/reports/..%2F..%2Fetc/passwd", f"/reports/{lag_data_root.sweep_run_key}/..%2Frun.json",
                    f"/reports/{lag_data_root.sweep_run_key}/.hidden.html", f"/reports/{lag_data_root.sweep_run_key}/x.html"):
            assert client.get(bad).status_code == 404, bad
    with client_for(lag_data_root.root, can_read=lambda d: d != SWEEP_DAG) as client:
        assert client.get(url).status_code == 404  # not even confirmed to exist


def test_each_problem_gets_one_report_of_its_own_group_and_healthy_groups_none(lag_data_root):
    """Reports are written for the three problems only, and each carries its own group's plan and
    evidence, never another group's (the run's files are grouped by key once, not per group)."""
    from lagdoctor.web.report import write_incident_report

    paths = write_incident_report(str(lag_data_root.findings_root / lag_data_root.sweep_run_key),
                                  settings=Settings(data_root=str(lag_data_root.root)), base_url="")
    pages = {p.rsplit("/", 1)[-1]: open(p, encoding="utf-8").read() for p in paths}
    assert len(pages) == 3 and sum("stalled_consumer" in n for n in pages) == 1  # the third: XSS_GROUP's
    by_group = {g: [t for n, t in pages.items() if g in n] for g in ("orders-processor", "payments-ledger")}
    assert all(len(v) == 1 for v in by_group.values()), sorted(pages)
    orders, ledger = by_group["orders-processor"][0], by_group["payments-ledger"][0]
    assert "partition_imbalance" in orders and "partition_imbalance" not in ledger
    assert "payments-ledger" not in orders and "orders-processor" not in ledger
    assert not any(g in n for n in pages for g in ("billing", "search-indexer"))


def test_a_run_with_threshold_overrides_is_shown_but_never_replaces_the_sweeps_verdict(lag_data_root):
    """An incident run with {"warning_lag": 1} after the sweep turns nothing red: every card reads as before,
    and the run is listed, labelled."""
    from datetime import timedelta

    from tests.fixtures.web import END, write_run

    client = client_for(lag_data_root.root)
    before = {(f["group_id"], f["topic"], f["diagnosis"], f["severity"])
              for f in client.get("/api/findings").json()["findings"]}
    sweep = lag_data_root.findings_root / lag_data_root.sweep_run_key
    findings = [dict(json.loads(line), severity="critical", summary="critical at warning_lag=1")
                for line in (sweep / "findings.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (sweep / "partition_status.jsonl").read_text().splitlines()]
    folder = write_run(lag_data_root.findings_root, "kafka_lag_incident__manual__x-0123456789", findings, rows,
                       dag_id=INCIDENT_DAG, run_id="manual__x", planned_at=END + timedelta(minutes=5))
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, "kind": "incident", "threshold_overrides": {"warning_lag": 1}}))

    body = client.get("/api/findings").json()
    after = {(f["group_id"], f["topic"], f["diagnosis"], f["severity"]) for f in body["findings"]}
    assert after == before
    assert {f["run_key"] for f in body["findings"]} == {lag_data_root.sweep_run_key}
    listed = [r for r in body["runs"] if r["run_id"] == "manual__x"]
    assert listed and listed[0]["threshold_overrides"] == {"warning_lag": 1} and listed[0]["kind"] == "incident"
    html = client.get("/").text
    assert "critical at warning_lag=1" not in html
    assert "Runs with threshold overrides" in html and "threshold overrides: warning_lag=1" in html

    # Without overrides the same run is the newest verdict: the assertions above could fail.
    (folder / "run.json").write_text(json.dumps({**meta, "kind": "incident", "threshold_overrides": {}}))
    assert "critical at warning_lag=1" in client.get("/").text


def test_a_group_the_newest_sweep_did_not_collect_says_so_on_page_group_view_and_api(lag_data_root):
    """Issue 17: the next sweep of cluster prod sees billing only; orders-processor (critical) and
    payments-ledger are no longer collected. Their last verdicts are shown as such, never as current."""
    from datetime import datetime, timedelta

    from tests.fixtures.web import END, write_run

    sweep = lag_data_root.findings_root / lag_data_root.sweep_run_key
    keep = [json.loads(line) for line in (sweep / "findings.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (sweep / "partition_status.jsonl").read_text().splitlines()]
    folder = write_run(lag_data_root.findings_root, "kafka_lag_health_sweep__scheduled__next",
                       [f for f in keep if f["group_id"] == "billing"], [r for r in rows if r["group_id"] == "billing"],
                       dag_id=SWEEP_DAG, run_id="scheduled__next", planned_at=END + timedelta(minutes=5, seconds=40))
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, "kind": "sweep", "clusters": ["prod"], "clusters_unread": []}))
    client = client_for(lag_data_root.root)

    findings = client.get("/api/findings").json()["findings"]
    since = {f["group_id"]: f["not_collected_since"] for f in findings}
    for f in findings:
        if f["group_id"] in ("orders-processor", "payments-ledger"):  # since its data's end
            assert datetime.fromisoformat(since[f["group_id"]]) == datetime.fromisoformat(f["window_end"]), f
    assert since["billing"] is None and since["search-indexer"] is None  # collected; another cluster's sweep
    assert [f["severity"] for f in findings if f["group_id"] == "orders-processor"] == ["critical"]  # its last

    html = client.get("/").text
    card = html[html.index('data-group="orders-processor"'):html.index('data-group="payments-ledger"')]
    assert 'class="card critical stale"' in html[html.rindex("<article", 0, html.index('data-group="orders-processor"')):]
    assert "Not collected since 2026-11-21 14:29 UTC" in card and "(2026-11-21 14:35 UTC)" in card
    # The tiles count current verdicts: the stale critical group is counted apart.
    assert re.search(r'data-count="critical">0<', html) and re.search(r'data-count="not_collected">2<', html)
    assert "Not collected since" not in html[html.index('data-group="billing"'):html.index('data-group="search-indexer"')]

    group = client.get("/group/prod/orders-processor").text
    assert "Not collected since 2026-11-21 14:29 UTC" in group

    # The sweep after that sees it again: current again.
    later = write_run(lag_data_root.findings_root, "kafka_lag_health_sweep__scheduled__later", keep, rows,
                      dag_id=SWEEP_DAG, run_id="scheduled__later", planned_at=END + timedelta(minutes=10, seconds=40))
    (later / "run.json").write_text(json.dumps({**meta, "run_id": "scheduled__later", "kind": "sweep",
                                                "planned_at": (END + timedelta(minutes=10, seconds=40)).isoformat(),
                                                "clusters": ["prod"], "clusters_unread": []}))
    assert all(f["not_collected_since"] is None for f in client.get("/api/findings").json()["findings"])


# -- only complete runs are read (issue 17) ---------------------------------------------------------

def _severities(client, root) -> tuple[dict, dict, dict]:
    """{group: severity} as the page's cards, the API and the exporter each say it."""
    from lagdoctor.metrics import render_metrics

    return (shown_severities(client.get("/").text), api_severities(client.get("/api/findings").json()),
            exported_severities(render_metrics(str(root / "findings"))))


def _healthy_copy(findings: list[dict]) -> list[dict]:
    return [{**f, "diagnosis": "healthy", "severity": "ok", "pattern": "flat", "partitions": [],
             "summary": "consumers keep up"} for f in findings]


def test_a_diagnosis_killed_mid_write_never_replaces_the_last_complete_run(lag_data_root):
    """The job's own writer stopped after findings.jsonl (as SIGKILL leaves it): the page, the
    API and the exporter keep the previous complete run's verdicts, agree, and say what was skipped."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.diagnosis import output

    root = lag_data_root.root
    sweep = lag_data_root.findings_root / lag_data_root.sweep_run_key
    before = [json.loads(line) for line in (sweep / FINDINGS_FILE).read_text().splitlines()]
    killed = lag_data_root.findings_root / "kafka_lag_health_sweep__scheduled__later-0123456789"
    output.begin_outputs(str(killed), now="2026-11-21T14:35:00+00:00")
    output.write_text(str(killed), FINDINGS_FILE, "".join(json.dumps(f) + "\n" for f in _healthy_copy(before)))
    assert sorted(p.name for p in killed.iterdir()) == ["_WRITING", FINDINGS_FILE]

    with client_for(root) as client:
        page, api, exported = _severities(client, root)
        assert page["orders-processor"] == api["orders-processor"] == exported["orders-processor"] == "critical"
        assert page["payments-ledger"] == api["payments-ledger"] == exported["payments-ledger"] == "warning"
        assert page == api and {g: s for g, s in api.items() if g in exported} == exported
        note = f"1 incomplete run skipped: {killed} (the diagnosis did not finish writing it: no _SUCCESS)"
        assert note in htmllib.unescape(client.get("/").text)
        body = client.get("/api/findings").json()
        assert body["incomplete_runs_text"] == note
        assert [r["run_key"] for r in body["incomplete_runs"]] == [killed.name]
        assert all(f["run_key"] == lag_data_root.sweep_run_key for f in body["findings"]
                   if f["group_id"] == "orders-processor")
        group = client.get("/group/prod/orders-processor").text
        assert note in htmllib.unescape(group) and "recovered" not in re.findall(r'data-kind="(\w+)"', group)

        # The same writer finishing: the run is complete, read, and nothing is said any more.
        output.write_text(str(killed), "partition_status.jsonl", (sweep / "partition_status.jsonl").read_text())
        output.finish_outputs(str(killed), {FINDINGS_FILE: {"bytes": (killed / FINDINGS_FILE).stat().st_size},
                                            "partition_status.jsonl": {
                                                "bytes": (killed / "partition_status.jsonl").stat().st_size}},
                              now="2026-11-21T14:35:01+00:00")
        page, api, exported = _severities(client, root)
        assert page["orders-processor"] == api["orders-processor"] == exported["orders-processor"] == "ok"
        assert "incomplete run" not in client.get("/").text and "incomplete_runs" not in client.get(
            "/api/findings").json()


def test_a_retried_diagnosis_rewriting_a_complete_run_is_skipped_until_it_finishes(lag_data_root):
    """A cleared diagnose task writes into the same folder: its old _SUCCESS goes first, so new
    findings beside the old status rows are never read as one run."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.diagnosis import output

    root = lag_data_root.root
    sweep = lag_data_root.findings_root / lag_data_root.sweep_run_key
    findings = [json.loads(line) for line in (sweep / FINDINGS_FILE).read_text().splitlines()]
    status = (sweep / PARTITION_STATUS_FILE).read_text()
    later = lag_data_root.findings_root / "a-later-sweep"
    later.mkdir()
    (later / PARTITION_STATUS_FILE).write_text(status)
    (later / "run.json").write_text(json.dumps({"dag_id": SWEEP_DAG, "run_id": "later",
                                                "planned_at": "2026-11-21T14:36:00+00:00"}))
    output.write_text(str(later), FINDINGS_FILE, "".join(json.dumps(f) + "\n" for f in findings))
    written = {name: {"bytes": (later / name).stat().st_size} for name in (FINDINGS_FILE, PARTITION_STATUS_FILE)}
    output.finish_outputs(str(later), written, now="2026-11-21T14:35:30+00:00")
    with client_for(root) as client:
        assert _severities(client, root)[1]["orders-processor"] == "critical"
        assert {f["run_key"] for f in client.get("/api/findings").json()["findings"]} == {"a-later-sweep"}
        # the retry: _WRITING, the old _SUCCESS removed, new (healthy) findings, then killed
        output.begin_outputs(str(later), now="2026-11-21T14:40:00+00:00")
        output.write_text(str(later), FINDINGS_FILE, "".join(json.dumps(f) + "\n" for f in _healthy_copy(findings)))
        page, api, exported = _severities(client, root)
        assert page["orders-processor"] == api["orders-processor"] == exported["orders-processor"] == "critical"
        assert {f["run_key"] for f in client.get("/api/findings").json()["findings"]} == {
            lag_data_root.sweep_run_key}
        # a marker that does not match its files (a copy cut short) is skipped too
        (later / "_WRITING").unlink()
        output.finish_outputs(str(later), {**written, FINDINGS_FILE: {"bytes": 10}}, now="2026-11-21T14:41:00+00:00")
        body = client.get("/api/findings").json()
        assert "does not match the files: findings.jsonl is" in body["incomplete_runs"][0]["reason"]
        assert _severities(client, root)[2]["orders-processor"] == "critical"


def test_a_run_whose_diagnose_task_failed_is_never_read_even_when_a_late_job_finished_it(lag_data_root):
    """A diagnose try timed out, and a job it could not stop wrote the folder whole afterwards:
    the task's failure decides. The page, API and exporter keep the last good run and say why;
    the next try of the same task clears the mark and its run is read."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.diagnosis import output
    from lagdoctor.runindex import clear_failed, mark_failed

    root = lag_data_root.root
    sweep = lag_data_root.findings_root / lag_data_root.sweep_run_key
    findings = [json.loads(line) for line in (sweep / FINDINGS_FILE).read_text().splitlines()]
    failed = lag_data_root.findings_root / "kafka_lag_health_sweep__scheduled__timed-out"
    output.begin_outputs(str(failed), now="2026-11-21T14:35:00+00:00")
    mark_failed(str(failed), "the diagnose task failed: AirflowTaskTimeout: Timeout, PID: 4242")
    # the late job: every output, then _SUCCESS, after the task gave up
    output.write_text(str(failed), FINDINGS_FILE, "".join(json.dumps(f) + "\n" for f in _healthy_copy(findings)))
    output.write_text(str(failed), PARTITION_STATUS_FILE, (sweep / PARTITION_STATUS_FILE).read_text())
    output.finish_outputs(str(failed), {name: {"bytes": (failed / name).stat().st_size}
                                        for name in (FINDINGS_FILE, PARTITION_STATUS_FILE)},
                          now="2026-11-21T14:36:00+00:00")
    with client_for(root) as client:
        page, api, exported = _severities(client, root)
        assert page["orders-processor"] == api["orders-processor"] == exported["orders-processor"] == "critical"
        note = (f"1 incomplete run skipped: {failed} "
                f"(the diagnose task failed: AirflowTaskTimeout: Timeout, PID: 4242)")
        assert note in htmllib.unescape(client.get("/").text)
        clear_failed(str(failed))  # a new try of the task, which then wrote the same folder
        page, api, exported = _severities(client, root)
        assert page["orders-processor"] == api["orders-processor"] == exported["orders-processor"] == "ok"


def test_a_failed_try_that_wrote_nothing_leaves_no_folder(tmp_path):
    from lagdoctor.runindex import mark_failed

    mark_failed(str(tmp_path / "never-begun"), "the diagnose task failed: AirflowTaskTimeout")
    assert list(tmp_path.iterdir()) == []


def _window_end_of(lag_data_root) -> datetime:
    path = lag_data_root.findings_root / lag_data_root.sweep_run_key / "findings.jsonl"
    end = json.loads(path.read_text().splitlines()[0])["window_end"]
    return datetime.fromisoformat(end.replace("Z", "+00:00"))


def _make_orders_processor_provisional(lag_data_root, decided_by: str) -> list[dict]:
    """Rewrite the sweep's findings with orders-processor provisional, its decision promised
    by `decided_by` (HH:MM:SS UTC) on the window's day; returns the findings written."""
    path = lag_data_root.findings_root / lag_data_root.sweep_run_key / "findings.jsonl"
    findings = [json.loads(line) for line in path.read_text().splitlines()]
    for f in findings:
        if f["group_id"] == "orders-processor":
            f.update(provisional=True, deciding_between=["partition_imbalance", "stalled_consumer"],
                     decided_by=f["window_end"][:11] + decided_by + "Z", samples_needed=2,
                     undecided_because="the commit on partition 1 has stood still for 1m00s")
    path.write_text("".join(json.dumps(f) + "\n" for f in findings))
    return findings


def test_a_provisional_finding_is_shown_as_such_on_the_page_and_in_the_api(lag_data_root):
    """Issue 18: the page names no cause for a provisional finding; the API passes its fields through."""
    # the page looked at before the promised 14:40
    client = client_for(lag_data_root.root, clock=lambda: _window_end_of(lag_data_root).replace(hour=14, minute=30))
    assert "Partition imbalance" in client.get("/").text
    _make_orders_processor_provisional(lag_data_root, "14:40:00")
    html = client.get("/").text
    card = html[html.index('data-group="orders-processor"'):html.index('data-group="payments-ledger"')]
    assert "Still deciding: partition imbalance or stalled consumer" in card
    assert "provisional · will know at the first sweep after 14:40 UTC" in card
    assert "Partition imbalance" not in card
    (api,) = [f for f in client.get("/api/findings").json()["findings"] if f["group_id"] == "orders-processor"]
    assert api["provisional"] is True and api["deciding_between"] == ["partition_imbalance", "stalled_consumer"]
    assert api["provisional_label"] == ("Still deciding: partition imbalance or stalled consumer · "
                                        "will know at the first sweep after 14:40 UTC")


def test_a_provisional_finding_whose_promised_time_passed_says_overdue_on_page_group_view_and_api(lag_data_root):
    """Issue 18 review: "will know at the first sweep after 14:40 UTC" read at 15:05 is a stale promise."""
    day = _window_end_of(lag_data_root)
    findings = _make_orders_processor_provisional(lag_data_root, "14:39:30")
    late = client_for(lag_data_root.root, clock=lambda: day.replace(hour=15, minute=5, second=0, microsecond=0))
    card = late.get("/").text
    card = card[card.index('data-group="orders-processor"'):card.index('data-group="payments-ledger"')]
    assert "provisional · was due at the first sweep after 14:40 UTC: overdue" in card
    assert "will know" not in card
    (api,) = [f for f in late.get("/api/findings").json()["findings"] if f["group_id"] == "orders-processor"]
    assert api["provisional_label"].endswith("· was due at the first sweep after 14:40 UTC: overdue")
    assert api["decision_overdue"] is True
    (cluster,) = {f["cluster"] for f in findings if f["group_id"] == "orders-processor"}
    group_page = late.get(f"/group/{cluster}/orders-processor").text
    assert "was due at the first sweep after 14:40 UTC: overdue" in group_page
    # at 14:39:50 the rounded-up 14:40 has not passed yet
    early = client_for(lag_data_root.root, clock=lambda: day.replace(hour=14, minute=39, second=50, microsecond=0))
    (api,) = [f for f in early.get("/api/findings").json()["findings"] if f["group_id"] == "orders-processor"]
    assert api["provisional_label"].endswith("· will know at the first sweep after 14:40 UTC")
    assert api["decision_overdue"] is False


# ---------------------------------------------------------------- how often sweeps really run

def _sweeps(minutes):
    from datetime import timedelta

    from tests.fixtures.web import END, SWEEP_DAG

    return [{"dag_id": SWEEP_DAG, "kind": "sweep", "planned_at": (END - timedelta(minutes=m)).isoformat()}
            for m in minutes]


@pytest.mark.parametrize("minutes,expected,why", [
    (range(0, 60), "every 1m00s (median) over the last hour: 60 run(s) of the 60 scheduled", "keeping up"),
    (range(0, 60, 2), "every 2m00s (median) over the last hour: 30 run(s) of the 60 scheduled",
     "seen live: runs took 1-2 minutes, every other one skipped late, the launcher said 'one every minute'"),
    ([0, 1, 2, 30], "longest gap 28m00s", "a stall shows as its gap"),
    ([5], "1 sweep in the last hour, 5m00s ago", "one sweep: no cadence to state"),
    ([90], "No sweep ran in the last hour", "older sweeps do not count"),
])
def test_the_sweep_cadence_line_says_how_often_sweeps_really_ran(minutes, expected, why):
    from lagdoctor.runindex import cadence_text, sweep_cadence
    from tests.fixtures.web import END

    assert expected in cadence_text(sweep_cadence(_sweeps(minutes), END))


def test_the_lag_page_and_api_say_how_often_sweeps_ran(lag_data_root):
    from datetime import timedelta

    from lagdoctor.web.auth import dag_run_reader
    from tests.fixtures.web import END, SWEEP_DAG, write_run

    for m in range(2, 60, 2):  # a sweep every other minute before the seeded ones
        write_run(lag_data_root.findings_root, f"{SWEEP_DAG}__every2__{m:02d}", [], [], dag_id=SWEEP_DAG,
                  run_id=f"scheduled__{m}", planned_at=END - timedelta(minutes=m))
    app = create_app(lambda: Settings(data_root=str(lag_data_root.root)), clock=lambda: END + timedelta(minutes=1))
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: True)
    with TestClient(app) as client:
        page = htmllib.unescape(client.get("/").text)
        body = client.get("/api/findings").json()
    assert re.search(r"Sweeps ran every 2m00s \(median\) over the last hour: \d+ run\(s\) of the 60 scheduled", page)
    assert body["sweep_cadence"]["median_gap_seconds"] == 120 and body["sweep_cadence"]["text"] in page
