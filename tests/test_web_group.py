"""The group view (an incident's timeline across runs, with the action log's
decisions and who approved them), the page's shareable filter, the links
between page, group and report, and the broker's missing member list said once.

Through FastAPI's TestClient as a signed-in user (auth overridden); the state
database is a throwaway SQLite file written through lagdoctor's own ActionLog.
"""

from __future__ import annotations

import html as htmllib
import json
import os
import re
from datetime import datetime, timedelta, timezone

import pytest
from fastapi.testclient import TestClient

from lagdoctor.settings import Settings
from lagdoctor.web.app import create_app
from lagdoctor.web.auth import dag_run_reader
from tests.fixtures.web import END, INCIDENT_DAG, SWEEP_DAG, XSS_GROUP, lag_data_root, write_run  # noqa: F401

NOW = END + timedelta(minutes=5)
INCIDENT_RUN_ID = "manual__2026-11-21T14:00:00+00:00"  # the fixture's older incident run
SWEEP_RUN_ID = "scheduled__2026-11-21T14:30:00+00:00"


def client_for(root, can_read=lambda dag_id: True, now=NOW) -> TestClient:
    app = create_app(lambda: Settings(data_root=str(root)), clock=lambda: now)
    app.dependency_overrides[dag_run_reader] = lambda: can_read
    return TestClient(app)


def _findings(root, run_key: str) -> list[dict]:
    return [json.loads(line) for line in (root / "findings" / run_key / "findings.jsonl").read_text().splitlines()]


def _status(root, run_key: str) -> list[dict]:
    return [json.loads(line) for line in (root / "findings" / run_key / "partition_status.jsonl").read_text().splitlines()]


def _sweep(root, hours_ago: float, orders: dict | None):
    """An older sweep of prod: orders-processor as given (None: healthy), the other groups as they are."""
    from lagdoctor.stages.common import run_key

    base = _findings(root, run_key(SWEEP_RUN_ID))
    template = next(f for f in base if f["group_id"] == "orders-processor")
    when = END - timedelta(hours=hours_ago)
    orders_finding = {**template, **(orders or {"diagnosis": "healthy", "severity": "ok", "pattern": "flat",
                                              "partitions": [], "summary": "consumers keep up"})}
    rest = [f for f in base if f["group_id"] not in ("orders-processor",)]
    run_id = f"scheduled__{when.isoformat()}"
    write_run(root / "findings", run_key(run_id), [orders_finding, *rest], _status(root, run_key(SWEEP_RUN_ID)),
              dag_id=SWEEP_DAG, run_id=run_id, planned_at=when)
    return run_id


@pytest.fixture
def history(lag_data_root, tmp_path, monkeypatch):
    """orders-processor: warning 3 h ago (first seen), healthy 2 h ago (recovered), the fixture's
    incident run 30 min ago (warning: seen again), the sweep now (critical: changed); and the
    action log: a dry run, a restart that waited for approval and was approved by oncall."""
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.state import StateDB, dispose_engines

    root = lag_data_root.root
    _sweep(root, 3, {"severity": "warning", "summary": "first: lag building on one partition"})
    _sweep(root, 2, None)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", url)
    log = ActionLog(StateDB.from_url(url))
    base = {"cluster": "prod", "group_id": "orders-processor", "topic": "orders", "diagnosis": "partition_imbalance",
            "target": "shop/orders-consumer"}

    def rec(minutes_before_end: float, status: str, key: str, run_id: str, **extra):
        ts = END - timedelta(minutes=minutes_before_end)
        log.append({**base, "ts": ts.isoformat(), "status": status, "idempotency_key": key, "run_id": run_id,
                    "action": extra.pop("action", "restart_consumers"), "dry_run": extra.pop("dry_run", False),
                    "message": extra.pop("message", status), **extra})

    rec(29, "dry_run", "k-dry", INCIDENT_RUN_ID, dry_run=True, message="would rollout restart shop/orders-consumer")
    rec(28, "awaiting_approval", "k-real", INCIDENT_RUN_ID, message="needs approval: rollout restart shop/orders-consumer")
    rec(22, "started", "k-real", INCIDENT_RUN_ID, approved_by="oncall",
        approved_at=(END - timedelta(minutes=23)).isoformat())
    rec(21, "executed", "k-real", INCIDENT_RUN_ID, message="rollout restart shop/orders-consumer",
        approved_by="oncall", approved_at=(END - timedelta(minutes=23)).isoformat())
    rec(1, "blocked", "k-sweep", SWEEP_RUN_ID, message="cooldown: restarted 29 minutes ago")
    log.append({**base, "group_id": "payments-ledger", "ts": END.isoformat(), "status": "executed",
                "idempotency_key": "k-other", "run_id": SWEEP_RUN_ID, "action": "scale_consumers",
                "dry_run": False, "message": "another group's action"})
    yield lag_data_root
    dispose_engines()


def timeline_of(page: str) -> list[tuple[str, str, str]]:
    """(kind, time, text) of each timeline entry, as shown."""
    box = page[page.index('<ol class="timeline">'):page.index("</ol>", page.index('<ol class="timeline">'))]
    out = []
    for kind, body in re.findall(r'<li class="[^"]*" data-kind="([^"]+)">(.*?)</li>', box, re.S):
        when = re.search(r"<time[^>]*>([^<]+)</time>", body).group(1)
        text = " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", body.replace(when, "", 1))).split())
        out.append((kind, when, text))
    return out


def test_group_view_shows_the_incident_timeline_in_order_with_who_approved(history):
    with client_for(history.root) as client:
        r = client.get("/group/prod/orders-processor")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    entries = timeline_of(r.text)
    assert [(k, w) for k, w, _ in entries] == [
        ("first_seen", "2026-11-21 11:30 UTC"),
        ("recovered", "2026-11-21 12:30 UTC"),
        ("seen_again", "2026-11-21 14:00 UTC"),
        ("action", "2026-11-21 14:01 UTC"),  # the dry run
        ("action", "2026-11-21 14:02 UTC"),  # waiting for approval
        ("approval", "2026-11-21 14:07 UTC"),
        ("action", "2026-11-21 14:09 UTC"),  # executed
        ("action", "2026-11-21 14:29 UTC"),  # blocked by the cooldown
        ("changed", "2026-11-21 14:30 UTC"),
    ]
    text = [t for _, _, t in entries]
    assert text[0].startswith("warning first seen warning partition imbalance on orders")
    assert text[1].startswith("healthy recovered healthy again after 1h 00m")
    assert "restart_consumers: dry run would rollout restart shop/orders-consumer" in text[3]
    assert "restart_consumers: waiting for approval" in text[4]
    assert text[5] == "restart_consumers approved by oncall"
    assert text[6].startswith("restart_consumers: executed rollout restart")
    assert "blocked" in text[7] and "cooldown" in text[7]
    assert "critical partition imbalance on orders (was warning partition imbalance on orders)" in text[8]
    assert "another group's action" not in r.text
    # Ongoing since it was seen again; "now" is the app's clock.
    assert "ongoing for 35m 00s" in r.text
    # Each run event links its DAG run in Airflow.
    assert 'href="/dags/kafka_lag_health_sweep/runs/scheduled__2026-11-21T14%3A30%3A00%2B00%3A00" target="_top"' in r.text


def test_group_view_has_the_groups_charts_and_current_findings(history):
    with client_for(history.root) as client:
        page = client.get("/group/prod/orders-processor").text
    card = page[page.index('<article class="card'):page.index("</article>")]
    assert "Partition imbalance" in card and 'class="badge critical"' in card
    # Lag, time lag, and produce vs consume: one line per partition (6) in the first two.
    assert card.count('<svg class="chart"') == 3
    assert len(re.findall(r'<g class="series" data-series="p\d+">', card)) == 12
    assert 'data-series="produced"' in card and 'data-series="consumed"' in card


def test_group_view_hides_actions_and_runs_the_caller_may_not_read(history):
    with client_for(history.root, can_read=lambda dag_id: dag_id == INCIDENT_DAG) as client:
        entries = timeline_of(client.get("/group/prod/orders-processor").text)
    kinds = [k for k, _, _ in entries]
    # The sweeps are hidden: the incident run alone, and only its run's actions (not the sweep's blocked one).
    assert kinds == ["first_seen", "action", "action", "approval", "action"]
    assert not any("cooldown" in t for _, _, t in entries)


@pytest.mark.parametrize(("path", "why"), [
    ("/group/prod/nobody-here", "no such group"),
    ("/group/nope/orders-processor", "a group on another cluster"),
])
def test_unknown_group_is_a_one_line_404(history, path, why):
    with client_for(history.root) as client:
        r = client.get(path)
    assert r.status_code == 404, why
    assert r.text.count("\n") == 1 and r.text.startswith("no consumer group")


def test_unreadable_group_is_the_same_404(history):
    with client_for(history.root, can_read=lambda dag_id: False) as client:
        assert client.get("/group/prod/orders-processor").status_code == 404


def test_page_links_each_group_to_its_view_and_the_view_back(history):
    from urllib.parse import quote

    with client_for(history.root) as client:
        page = client.get("/").text
        assert '<a class="group" href="/group/prod/orders-processor"' in page
        evil = f"/group?cluster=staging&group={quote(XSS_GROUP, safe='')}"
        assert f'<a class="group" href="{htmllib.escape(evil)}"' in page
        r = client.get(evil)
        assert r.status_code == 200 and XSS_GROUP not in r.text and "&lt;script&gt;" in r.text
        assert '<a class="back" href="/">all groups</a>' in client.get("/group/prod/billing").text


@pytest.mark.parametrize("group_id", [
    "team/ledger\nblue",  # a newline and a slash: the 404
    "a?b#c%2Fd e&group=x", "ünï/cødé", "..", "trailing\r\n",
])
def test_any_group_id_a_broker_accepts_has_a_working_link_from_the_page(history, group_id):
    from lagdoctor.stages.common import run_key

    root = history.root
    f = {**_findings(root, run_key(SWEEP_RUN_ID))[1], "group_id": group_id}
    write_run(root / "findings", "odd-name-run", [f], [], dag_id=SWEEP_DAG, run_id="scheduled__odd",
              planned_at=END + timedelta(minutes=1))
    with client_for(root) as client:
        page = client.get("/").text
        hrefs = [htmllib.unescape(h) for h in re.findall(r'<a class="group" href="([^"]+)"', page)]
        (href,) = [h for h in hrefs if h.startswith("/group?") and "script" not in h]  # not the XSS group's
        r = client.get(href)
        assert r.status_code == 200, href
        shown = htmllib.unescape(re.search(r'<h1><span class="group">(.*?)</span>', r.text, re.S).group(1))
        assert shown == group_id and "Rebalance loop" in r.text
        # a plain id keeps the readable path form
        assert "/group/prod/orders-processor" in hrefs


def test_links_built_for_slack_and_reports_take_the_same_form():
    from lagdoctor.web.links import group_url

    env = {"AIRFLOW__API__BASE_URL": "https://airflow.example.com/"}
    assert group_url("prod", "orders-processor", env) == "https://airflow.example.com/lagdoctor/group/prod/orders-processor"
    assert group_url("prod", "team/ledger\nblue", env) == (
        "https://airflow.example.com/lagdoctor/group?cluster=prod&group=team%2Fledger%0Ablue")


def test_an_older_path_link_to_a_group_id_with_a_slash_still_answers(history):
    from lagdoctor.stages.common import run_key

    root = history.root
    f = {**_findings(root, run_key(SWEEP_RUN_ID))[1], "group_id": "team/ledger"}
    write_run(root / "findings", "slash-run", [f], [], dag_id=SWEEP_DAG, run_id="scheduled__slash",
              planned_at=END + timedelta(minutes=1))
    with client_for(root) as client:
        assert 'href="/group?cluster=prod&amp;group=team%2Fledger"' in client.get("/").text
        r = client.get("/group/prod/team%2Fledger")  # the form Slack messages sent before carry
    assert r.status_code == 200 and "team/ledger" in r.text and "Rebalance loop" in r.text


def test_without_a_state_database_the_view_still_shows_runs(lag_data_root, monkeypatch):
    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    with client_for(lag_data_root.root) as client:
        r = client.get("/group/prod/orders-processor")
    assert r.status_code == 200
    assert [k for k, _, _ in timeline_of(r.text)] == ["first_seen", "changed"]
    # Read-only: the default SQLite file is not created by looking.
    assert not (lag_data_root.root / "state" / "lagdoctor.db").exists()


def test_an_unreadable_action_log_is_said_not_a_500(lag_data_root, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_STATE_URL", "not a url")
    with client_for(lag_data_root.root) as client:
        r = client.get("/group/prod/orders-processor")
    assert r.status_code == 200
    assert "The action log could not be read: LAGDOCTOR_STATE_URL is not a SQLAlchemy URL" in r.text


# ------------------------------------------------------------------ the page's filter

def groups_on(page: str) -> set[str]:
    return {htmllib.unescape(g) for g in re.findall(r'data-group="([^"]*)"', page)}


@pytest.mark.parametrize(("query", "groups"), [
    ("q=^pay", {"payments-ledger"}),
    ("q=ing", {"billing"}),  # found anywhere in the id
    ("q=processor%7Cledger&severity=critical", {"orders-processor"}),
    ("severity=warning", {"orders-processor", "payments-ledger", XSS_GROUP}),
    ("severity=critical", {"orders-processor"}),
    ("cluster=staging&severity=warning", {XSS_GROUP}),
    ("q=%5Eorders-processor%24&severity=ok", {"orders-processor"}),
])
def test_filter_in_the_address(lag_data_root, query, groups):
    with client_for(lag_data_root.root) as client:
        page = client.get(f"/?{query}").text
        assert groups_on(page) == groups
        body = client.get(f"/api/findings?{query}").json()
    assert {f["group_id"] for f in body["findings"]} == groups


def test_filter_form_keeps_what_the_address_says(lag_data_root):
    with client_for(lag_data_root.root) as client:
        page = client.get("/?q=%5Epay&severity=warning").text
    form = page[page.index('<form class="filters" method="get"'):page.index("</form>")]
    assert 'name="q" value="^pay"' in form
    assert '<option value="warning" selected>' in form
    assert '<a href="?">clear</a>' in form


@pytest.mark.parametrize(("query", "error"), [
    ("q=orders(", "Filter not applied: group filter &#39;orders(&#39; is not a valid regex: missing ): orders("),
    ("q=" + "a" * 600, "is 600 characters long, at most 512"),
    ("severity=bad", "Filter not applied: unknown severity &#39;bad&#39;: one of ok, warning, critical"),
])
def test_invalid_filter_is_one_visible_line_not_a_500(lag_data_root, query, error):
    with client_for(lag_data_root.root) as client:
        r = client.get(f"/?{query}")
        assert r.status_code == 200
        assert r.text.count('class="filter-error"') == 1 and error in r.text
        assert "orders-processor" in groups_on(r.text)  # the rest of the page still shows
        api = client.get(f"/api/findings?{query}")
    assert api.status_code == 400 and "detail" in api.json()


# ------------------------------------------------------------------ said once

def test_broker_without_member_list_is_said_once_and_rows_say_unknown(tmp_path):
    """Three groups on a broker that lists no members (as some Kafka-compatible brokers): the job's summaries name it each time;
    the page says it once, and every row and summary just says unknown."""
    from tests.fixtures.web import seed_data_root

    seeded = seed_data_root(tmp_path / "root")
    findings = _findings(seeded.root, seeded.sweep_run_key)
    template = next(f for f in findings if f["group_id"] == "search-indexer")
    stalls = [{**template, "group_id": f"indexer-{i}", "diagnosis": "stalled_consumer", "severity": "warning",
               "partitions": [0], "summary": "partition 0 stopped committing: no progress for 5m00s while lag grew "
                                             "to 1,200; owner unknown (the broker lists no members)"}
              for i in range(3)]
    rows = [dict(r, group_id=s["group_id"]) for s in stalls for r in _status(seeded.root, seeded.sweep_run_key)
            if r["group_id"] == "search-indexer"]
    write_run(seeded.findings_root, "tansu-run", stalls, rows, dag_id=SWEEP_DAG, run_id="scheduled__tansu",
              planned_at=END + timedelta(minutes=2))
    with client_for(seeded.root) as client:
        page = client.get("/?cluster=staging").text
        group_page = client.get("/group/staging/indexer-1").text
    assert page.count("lists no consumer-group members") == 1
    assert "the broker lists no members" not in page
    assert page.count("owner unknown</span>") == 3  # each summary, shortened
    assert page.count("<dt>Members</dt><dd>unknown</dd>") == 4  # the three stalls and search-indexer
    assert group_page.count("lists no consumer-group members") == 1 and "the broker lists no members" not in group_page


def test_known_members_need_no_note(lag_data_root):
    with client_for(lag_data_root.root) as client:
        assert "lists no consumer-group members" not in client.get("/?cluster=prod").text


# ------------------------------------------------------------------ reports

def test_page_links_reports_through_its_own_route(lag_data_root, monkeypatch):
    """Written without any base URL, a report is still one click away on the page, and the link works."""
    from lagdoctor.web.report import write_incident_report

    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    monkeypatch.delenv("LAGDOCTOR_REPORT_BASE_URL", raising=False)
    settings = Settings(data_root=str(lag_data_root.root))
    with client_for(lag_data_root.root) as client:
        assert ">report</a>" not in client.get("/").text  # none written yet: no link
        write_incident_report(str(lag_data_root.findings_root / lag_data_root.sweep_run_key), settings=settings)
        page = client.get("/").text
        hrefs = re.findall(r'<a href="([^"]+)" target="_blank" rel="noopener">report</a>', page)
        assert len(hrefs) == 3 and all(h.startswith(f"/reports/{lag_data_root.sweep_run_key}/") for h in hrefs)
        orders = next(h for h in hrefs if "orders-processor" in h)
        r = client.get(htmllib.unescape(orders))
    assert r.status_code == 200 and "Partition imbalance" in r.text and r.text.count('<svg class="chart"') == 3


# ------------------------------------------------------------------ the timeline's rules

def _look(at_minutes: int, *problems):
    from lagdoctor.web.data import Run
    from lagdoctor.web.timeline import RunLook

    run = Run(f"r{at_minutes}", f"/x/r{at_minutes}", SWEEP_DAG, f"run{at_minutes}",
              datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=at_minutes))
    findings = [{"topic": t, "diagnosis": d, "severity": s} for t, d, s in problems] or \
        [{"topic": "t", "diagnosis": "healthy", "severity": "ok"}]
    return RunLook(run, findings)


@pytest.mark.parametrize(("looks", "expected"), [
    # healthy throughout: nothing happened
    ([_look(0), _look(5)], []),
    # the same problem on every run: seen once, no change
    ([_look(0, ("t", "lag", "warning")), _look(5, ("t", "lag", "warning"))], ["first_seen"]),
    # worse, then a second topic: each change is an entry
    ([_look(0), _look(5, ("t", "lag", "warning")), _look(10, ("t", "lag", "critical")),
      _look(15, ("t", "lag", "critical"), ("u", "stall", "warning")), _look(20)],
     ["first_seen", "changed", "changed", "recovered"]),
    # back after recovering: seen again, not first seen
    ([_look(0, ("t", "lag", "warning")), _look(5), _look(10, ("t", "lag", "warning"))],
     ["first_seen", "recovered", "seen_again"]),
])
def test_run_events(looks, expected):
    from lagdoctor.web.timeline import run_events

    assert [e.kind for e in run_events(looks)] == expected


def test_first_seen_says_when_older_runs_were_not_read():
    from lagdoctor.web.timeline import run_events

    events = run_events([_look(0, ("t", "lag", "warning"))], oldest_is_first=False)
    assert events[0].title == "first seen (in the oldest run read)"


@pytest.mark.parametrize(("records", "expected"), [
    # the HITL operator's answer, as Airflow records who responded
    ([{"status": "awaiting_approval"}, {"status": "executed", "responded_by_user": {"id": "7", "name": "Ana"},
                                        "responded_at": "2026-01-01T00:03:00+00:00"}],
     [("action", "waiting for approval"), ("approval", "by Ana"), ("action", "executed")]),
    # approved, but the log does not name who: said so, not invented
    ([{"status": "awaiting_approval"}, {"status": "started"}, {"status": "executed"}],
     [("action", "waiting for approval"), ("approval", "by a person the action log does not name"),
      ("action", "executed")]),
    # rejected by a named person
    ([{"status": "awaiting_approval"}, {"status": "rejected", "rejected_by": "bo"}],
     [("action", "waiting for approval"), ("approval", "by bo"), ("action", "rejected")]),
    # a dry run and a blocked action asked nobody
    ([{"status": "dry_run", "dry_run": True}, {"status": "blocked", "idempotency_key": "k2"}],
     [("action", "dry run"), ("action", "blocked")]),
])
def test_action_events(records, expected):
    from lagdoctor.web.timeline import action_events

    full = [{"idempotency_key": "k1", "action": "restart_consumers", "message": "m",
             "ts": f"2026-01-01T00:0{i}:00+00:00", **r} for i, r in enumerate(records)]
    events = action_events(full)
    got = [(e.kind, e.detail if e.kind == "approval" else e.title.split(": ", 1)[1]) for e in events]
    assert got == expected


@pytest.mark.parametrize(("bound", "read"), [
    ({"max_runs": 2}, 2),
    ({"max_bytes": 1}, 1),  # the newest run is always read, whatever its size
    ({}, 4),
])
def test_the_timeline_reads_a_bounded_number_of_runs_and_says_so(history, bound, read):
    from lagdoctor.web.data import current_index
    from lagdoctor.web.timeline import group_timeline

    findings_root = str(history.findings_root)
    timeline = group_timeline(findings_root, "prod", "orders-processor", index=current_index(findings_root), **bound)
    assert (timeline.runs_read, timeline.runs_total, len(timeline.looks)) == (read, 4, read)
    assert timeline.truncated is (read < 4)
    first = next(e for e in timeline.events if e.kind in ("first_seen", "seen_again"))
    assert first.title == ("first seen" if read == 4 else "first seen (in the oldest run read)")


def test_an_approval_answered_with_slacks_buttons_names_who(history):
    """The action log says only that the restart waited and ran; the Slack approval row says who answered."""
    import sqlalchemy as sa

    from lagdoctor import state

    approvals = getattr(state, "slack_approvals", None)
    if approvals is None:
        pytest.skip("this state module records no Slack approvals")
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.state import StateDB

    db = StateDB.from_url(os.environ["LAGDOCTOR_STATE_URL"])
    log = ActionLog(db)
    base = {"cluster": "prod", "group_id": "orders-processor", "topic": "orders", "action": "skip_poison_pill",
            "idempotency_key": "k-slack", "run_id": "manual__slack", "dry_run": False, "message": "m"}
    log.append({**base, "ts": (END - timedelta(minutes=10)).isoformat(), "status": "awaiting_approval"})
    log.append({**base, "ts": (END - timedelta(minutes=5)).isoformat(), "status": "executed"})
    with db.transaction() as conn:
        conn.execute(sa.insert(approvals).values(
            dag_id=INCIDENT_DAG, run_id="manual__slack", task_id="remediate_skip_poison_pill.approve", map_index=-1,
            subject="s", status="approved", answered_by="Dana (U123)", answered_at=END - timedelta(minutes=7),
            created_at=END - timedelta(minutes=10)))
    with client_for(history.root) as client:
        entries = timeline_of(client.get("/group/prod/orders-processor").text)
    assert ("approval", "2026-11-21 14:23 UTC", "skip_poison_pill approved by Dana (U123)") in entries


# ------------------------------------------------------------------ the pod behind the lag

def _trace(root, run_key: str, workloads: dict[str, dict]) -> None:
    """As the sweep's plan step leaves it: each group's problem finding in plans.json carries its
    owner's pod and workload (evidence.workload); findings.jsonl, the job's output, does not."""
    path = root / "findings" / run_key / "plans.json"
    items = json.loads(path.read_text())
    for item in items:
        f = item["finding"]
        if f["group_id"] in workloads:
            f["evidence"]["workload"] = workloads[f["group_id"]]
    path.write_text(json.dumps(items))


def _owner_item(page: str, owner_text: str) -> str:
    """The text of the owners list's entry that holds `owner_text`, as a reader sees it."""
    items = re.findall(r"<li>(.*?)</li>", page, re.S)
    (item,) = [i for i in items if owner_text in i]
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", item)).split())


ORDERS_POD = {"namespace": "shop", "pod": "orders-7d9f-x2", "kind": "Deployment", "name": "orders", "unknown": None,
              "restarts": 3, "last_termination": {"reason": "OOMKilled", "exit_code": 137,
                                                  "finished_at": "2026-11-21T14:25:00Z"},
              "rolled_out_at": "2026-11-21T14:05:00Z", "ready_replicas": 2, "desired_replicas": 3,
              "autoscalers": [], "autoscalers_unknown": None}


def test_the_page_and_the_group_view_name_the_owners_pod_and_workload_beside_the_member(lag_data_root):
    root = lag_data_root.root
    owner = next(f for f in _findings(root, lag_data_root.sweep_run_key)
                 if f["group_id"] == "orders-processor")["evidence"]
    _trace(root, lag_data_root.sweep_run_key, {"orders-processor": ORDERS_POD})
    with client_for(root) as client:
        page = client.get("/").text
        group = client.get("/group/prod/orders-processor").text
        api = client.get("/api/findings?group=orders-processor").json()["findings"]
    said = ("runs in pod orders-7d9f-x2 of Deployment shop/orders; last OOMKilled (exit 137) at 14:25:00 UTC, "
            "in this window, 3 restarts in all; Deployment rolled out at 14:05:00 UTC, 5m 00s before this window; "
            "2 of 3 replicas ready")
    for shown in (page, group):
        item = _owner_item(shown, owner["owner_member_id"])
        assert item.startswith(f"{owner['owner_member_id']} {owner['owner_client_id']} @ {owner['owner_host']}")
        assert item.endswith(said)
        assert shown.count("runs in pod") == 1  # the other members were not traced: nothing is guessed
        assert "not traced" not in shown
    assert api[0]["evidence"]["workload"]["pod"] == "orders-7d9f-x2"


def test_a_member_traced_to_nothing_says_why_and_no_kubernetes_api_is_said_once_per_run(lag_data_root):
    from lagdoctor.workloads import NO_API

    root = lag_data_root.root
    owner = next(f for f in _findings(root, lag_data_root.sweep_run_key)
                 if f["group_id"] == "orders-processor")["evidence"]
    outside = (f"no pod on this cluster has IP {owner['owner_host'].lstrip('/')} or the name "
               f"'{owner['owner_client_id']}': the member runs outside this cluster (or behind NAT)")
    _trace(root, lag_data_root.sweep_run_key, {"orders-processor": {"unknown": outside}})
    with client_for(root) as client:
        group = client.get("/group/prod/orders-processor").text
    assert _owner_item(group, owner["owner_member_id"]).endswith(f"pod and workload unknown: {outside}")

    # the same run without any Kubernetes API: one line for the run, not one per member or group
    _trace(root, lag_data_root.sweep_run_key, {"orders-processor": {"unknown": NO_API},
                                              "payments-ledger": {"unknown": NO_API}})
    with client_for(root) as client:
        page = client.get("/").text
        group = client.get("/group/prod/orders-processor").text
    for shown in (page, group):
        notes = re.findall(r'<p class="note workloads-unknown"[^>]*>(.*?)</p>', shown, re.S)
        assert [" ".join(htmllib.unescape(re.sub(r"<[^>]+>", "", n)).split()) for n in notes] == [
            f"Pods and workloads of run {SWEEP_RUN_ID} not traced: no Kubernetes API: workload unknown."]
        assert "pod and workload unknown" not in shown and "runs in pod" not in shown
