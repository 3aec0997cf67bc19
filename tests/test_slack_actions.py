"""Slack's buttons, end to end on loopback: the request URL app under uvicorn, the
loopback Slack (threads, ephemeral replies, user groups), and a loopback fake of
Airflow's HITL endpoint (PATCH/GET .../taskInstances/{task}/{map_index}/hitlDetails,
409 once answered; its path is checked against Airflow's own router below; a real
api-server per test would cost ~15 s and 1.5 GB). State on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlencode, urlparse

import httpx
import pytest
import sqlalchemy as sa

from lagdoctor.notify import interactive
from lagdoctor.notify.approvals import post_approval_request
from lagdoctor.notify.incidents import post_incident_run, post_or_update_incident
from lagdoctor.settings import Settings
from lagdoctor.state import StateDB, slack_interactions
from tests.fixtures.loopback import serve_loopback
from tests.fixtures.slack import SLACK_TEST_TOKEN, FakeSlack, SlackRequest, _handler

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
AIRFLOW_TOKEN = "airflow-api-token-for-tests-7Hq"
APPROVER, OTHER_APPROVER, STRANGER, GROUP_MEMBER = "U0APPROVE1", "U0APPROVE2", "U0STRANGER", "U0INGROUP"
DAG, RUN, TASK = "kafka_lag_incident", "manual__2026-11-21T10:00:00+00:00", "remediate_restart_consumers.approve"


# ---------------------------------------------------------------- loopback doubles

def slack_handler(fake: FakeSlack, groups: dict[str, list[str]]):
    base = _handler(fake)

    class Handler(base):
        def _extra(self, method: str, body: dict) -> None:
            fake.requests.append(SlackRequest(method, dict(self.headers), body, 200, time.monotonic()))
            if method == "chat.postEphemeral":
                self._send(200, {"ok": True, "message_ts": fake.next_ts()})
            else:
                self._send(200, {"ok": True, "users": groups.get(body.get("usergroup"), [])})

        def do_GET(self) -> None:  # slack-sdk lists a user group with GET
            parsed = urlparse(self.path)
            self._extra(parsed.path.rsplit("/", 1)[-1], {k: v[0] for k, v in parse_qs(parsed.query).items()})

        def do_POST(self) -> None:
            parsed = urlparse(self.path)
            method = parsed.path.rsplit("/", 1)[-1]
            if method not in ("chat.postEphemeral", "usergroups.users.list"):
                return super().do_POST()
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            body = json.loads(raw) if "json" in (self.headers.get("Content-Type") or "") else \
                {k: v[0] for k, v in parse_qs(raw).items()}
            self._extra(method, {**{k: v[0] for k, v in parse_qs(parsed.query).items()}, **body})

    return Handler


class FakeAirflow:
    """Airflow's HITL endpoint for one waiting task instance."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict, str]] = []  # method, path, body, authorization
        self.answer: dict | None = None
        self.lock = threading.Lock()

    def handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                fake.requests.append((method, self.path, body, self.headers.get("Authorization", "")))
                expected = f"/api/v2/dags/{DAG}/dagRuns/{RUN}/taskInstances/{TASK}/-1/hitlDetails"
                if unquote(self.path) != expected:
                    return self._send(404, {"detail": "not found"})
                if self.headers.get("Authorization") != f"Bearer {AIRFLOW_TOKEN}":
                    return self._send(401, {"detail": "Not authenticated"})
                with fake.lock:
                    if method == "GET":
                        a = fake.answer or {}
                        return self._send(200, {"chosen_options": a.get("chosen_options"),
                                                "responded_by_user": a.get("responded_by"),
                                                "responded_at": a.get("responded_at"),
                                                "response_received": bool(a)})
                    if fake.answer is not None:
                        return self._send(409, {"detail": "already been updated"})
                    fake.answer = {"chosen_options": body["chosen_options"],
                                   "responded_by": {"id": "lagdoctor-slack", "name": "lagdoctor-slack"},
                                   "responded_at": "2026-11-21T10:00:01+00:00"}
                    return self._send(200, {**fake.answer, "params_input": {}})

            def do_PATCH(self):
                self._route("PATCH")

            def do_GET(self):
                self._route("GET")

        return Handler

    @property
    def patches(self) -> list[dict]:
        return [body for method, _p, body, _a in self.requests if method == "PATCH"]


def serve_app(app):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------- fixtures

class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def slack(monkeypatch):
    fake = FakeSlack()
    groups = {"S0ONCALL": [GROUP_MEMBER]}
    with serve_loopback(slack_handler(fake, groups)) as base:
        fake.url = base + "/api/"
        conn = {"conn_type": "slack", "password": SLACK_TEST_TOKEN,
                "extra": {"base_url": fake.url, "signing_secret": SECRET}}
        monkeypatch.setenv("AIRFLOW_CONN_SLACK_API_DEFAULT", json.dumps(conn))
        yield fake


@pytest.fixture
def airflow_api(monkeypatch):
    fake = FakeAirflow()
    with serve_loopback(fake.handler()) as base:
        monkeypatch.setenv("LAGDOCTOR_AIRFLOW_API_URL", base)
        monkeypatch.setenv("LAGDOCTOR_AIRFLOW_API_TOKEN", AIRFLOW_TOKEN)
        monkeypatch.setenv("LAGDOCTOR_SLACK_HITL_IDENTITY", "service")
        # The service identity answers only for Slack users mapped to its own Airflow user.
        monkeypatch.setenv("LAGDOCTOR_AIRFLOW_API_USER", "lagdoctor-slack")
        monkeypatch.setenv("LAGDOCTOR_SLACK_AIRFLOW_USERS", ",".join(
            f"{u}=lagdoctor-slack" for u in (APPROVER, OTHER_APPROVER, GROUP_MEMBER)))
        yield fake


@pytest.fixture
def env(monkeypatch, tmp_path, state_url, slack, airflow_api):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com")
    monkeypatch.setenv("LAGDOCTOR_SLACK_APPROVERS", f"{APPROVER}, {OTHER_APPROVER},S0ONCALL")
    monkeypatch.delenv(interactive.SIGNING_SECRET_ENV, raising=False)
    return Settings(data_root=str(tmp_path))


@pytest.fixture
def clock():
    return Clock(T0)


@pytest.fixture
def app_url(env, clock):
    from fastapi import FastAPI

    from lagdoctor.web.slack_actions import create_app

    api_server = FastAPI()  # mounted as Airflow mounts a plugin's app
    api_server.mount(interactive.URL_PREFIX, create_app(clock=clock, settings_factory=lambda: env))
    server, thread, url = serve_app(api_server)
    yield url + interactive.URL_PREFIX + interactive.ACTIONS_PATH
    server.should_exit = True
    thread.join(timeout=10)


# ---------------------------------------------------------------- helpers

def finding(severity="critical", pattern="steady_climb", group="orders-eu", partitions=(1,)):
    return {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": list(partitions),
            "diagnosis": "crashed_consumer", "pattern": pattern, "severity": severity,
            "summary": "no live members while lag grows", "evidence": {"lag_total": 5000},
            "window_start": "2026-11-21T09:30:00Z", "window_end": "2026-11-21T10:00:00Z"}


def buttons_of(message: dict) -> dict[str, str]:
    """What a person sees as buttons: label -> the value Slack would send back."""
    return {e["text"]["text"]: e["value"] for b in message.get("blocks", []) if b["type"] == "actions"
            for e in b["elements"]}


def signed(body: bytes, ts: int, secret: str = SECRET) -> dict[str, str]:
    sig = "v0=" + hmac.new(secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": sig,
            "Content-Type": "application/x-www-form-urlencoded"}


_clicks = iter(range(1, 10_000))


def click_body(action_id: str, value: str, user: str, name: str = "alice", thread_ts: str | None = None) -> bytes:
    payload = {"type": "block_actions", "user": {"id": user, "username": name, "team_id": "T0"},
               "channel": {"id": "C0LAGDOC"},
               "container": {"type": "message", "channel_id": "C0LAGDOC", "message_ts": "1700000000.000002",
                             "thread_ts": thread_ts},
               "actions": [{"action_id": action_id, "value": value, "type": "button",
                            "action_ts": f"1763719200.{next(_clicks):06d}"}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


def click(url: str, clock: Clock, action_id: str, value: str, user: str, name: str = "alice",
          body: bytes | None = None, ts: int | None = None, secret: str = SECRET) -> httpx.Response:
    body = body if body is not None else click_body(action_id, value, user, name)
    ts = int(clock.now.timestamp()) if ts is None else ts
    return httpx.post(url, content=body, headers=signed(body, ts, secret), timeout=30)


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def ephemerals(slack: FakeSlack, user: str) -> list[str]:
    return [r.body["text"] for r in slack.requests if r.method == "chat.postEphemeral" and r.body.get("user") == user]


def thread_posts(slack: FakeSlack, text: str) -> list[SlackRequest]:
    return [p for p in slack.posts if text in (p.body.get("text") or "")]


@pytest.fixture
def waiting_approval(env, slack):
    """An incident run's thread and, in it, a HITL approval waiting; its Approve/Reject values."""
    post_incident_run([{"finding": finding(), "plan": None}], run_id=RUN, scope="prod / orders-.*",
                      settings=env, now=T0, dag_id=DAG)
    post_approval_request(dag_id=DAG, run_id=RUN, task_id=TASK, subject="lagdoctor: approve restart_consumers?",
                          body="lagdoctor proposes `restart_consumers` for:\n- prod / orders-eu / orders: no members",
                          settings=env, now=T0)
    header, request = slack.posts[0], slack.posts[-1]
    assert request.body["thread_ts"] == header.ts
    return header, buttons_of(request.body)


# ---------------------------------------------------------------- approve / reject

def test_a_signed_approve_answers_airflow_and_says_who_in_the_thread(app_url, clock, slack, airflow_api,
                                                                     waiting_approval):
    header, buttons = waiting_approval
    assert set(buttons) == {"Approve", "Reject"}
    approval_id, _, nonce = buttons["Approve"].partition(".")  # the row's id and nonce, nothing else
    assert approval_id.isdigit() and len(nonce) == 32 and int(nonce, 16) >= 0

    response = click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, "alice")

    assert response.status_code == 200 and response.json()["outcome"] == "done"
    assert airflow_api.patches == [{"chosen_options": ["Approve"]}]
    assert airflow_api.requests[0][3] == f"Bearer {AIRFLOW_TOKEN}"
    (post,) = wait_for(lambda: thread_posts(slack, "Approved"))
    assert post.body["thread_ts"] == header.ts
    assert f"slack:{APPROVER} (alice)" in post.body["text"] and "goes ahead" in post.body["text"]


def test_reject_through_a_slack_user_group(app_url, clock, slack, airflow_api, waiting_approval):
    _header, buttons = waiting_approval
    response = click(app_url, clock, interactive.REJECT, buttons["Reject"], GROUP_MEMBER, "gus")
    assert response.json()["outcome"] == "done"
    assert airflow_api.patches == [{"chosen_options": ["Reject"]}]
    (post,) = wait_for(lambda: thread_posts(slack, "Rejected"))
    assert f"slack:{GROUP_MEMBER} (gus)" in post.body["text"] and "is skipped" in post.body["text"]


def test_a_wrong_signature_is_401_and_does_nothing(app_url, clock, slack, airflow_api, waiting_approval):
    _header, buttons = waiting_approval
    posts_before = len(slack.posts)
    response = click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, secret="not-the-secret")
    assert response.status_code == 401
    body = click_body(interactive.APPROVE, buttons["Approve"], APPROVER)
    headers = signed(body, int(clock.now.timestamp()))
    tampered = body.replace(b"alice", b"mallory")  # signed body, then changed on the way
    assert httpx.post(app_url, content=tampered, headers=headers).status_code == 401
    assert httpx.post(app_url, content=body).status_code == 401  # unsigned
    time.sleep(0.3)
    assert airflow_api.requests == [] and len(slack.posts) == posts_before


def test_a_stale_timestamp_is_401(app_url, clock, airflow_api, waiting_approval):
    _header, buttons = waiting_approval
    old = int((clock.now - timedelta(seconds=301)).timestamp())
    assert click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, ts=old).status_code == 401
    ahead = int((clock.now + timedelta(seconds=301)).timestamp())
    assert click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, ts=ahead).status_code == 401
    assert airflow_api.requests == []


def test_a_replayed_request_is_acted_on_once(app_url, clock, slack, airflow_api, waiting_approval):
    _header, buttons = waiting_approval
    body = click_body(interactive.APPROVE, buttons["Approve"], APPROVER)
    ts = int(clock.now.timestamp())
    first = httpx.post(app_url, content=body, headers=signed(body, ts))
    clock.now += timedelta(seconds=30)
    again = httpx.post(app_url, content=body, headers=signed(body, ts))  # the same request, captured
    retried = httpx.post(app_url, content=body, headers=signed(body, ts + 30))  # Slack's retry: new ts, same click
    assert first.json()["outcome"] == "done"
    assert again.status_code == 200 and again.json()["outcome"] == "replayed"
    assert retried.json()["outcome"] == "replayed"
    assert len(airflow_api.patches) == 1
    wait_for(lambda: thread_posts(slack, "Approved"))
    time.sleep(0.3)
    assert len(thread_posts(slack, "Approved")) == 1


def test_an_unknown_user_is_refused_privately_and_audited(app_url, clock, slack, airflow_api, waiting_approval,
                                                          env):
    _header, buttons = waiting_approval
    response = click(app_url, clock, interactive.APPROVE, buttons["Approve"], STRANGER, "eve")
    assert response.json()["outcome"] == "refused"
    (note,) = wait_for(lambda: ephemerals(slack, STRANGER))
    assert note == (f"You are not an approver for {DAG} on * (LAGDOCTOR_SLACK_APPROVERS); nothing was done.")
    assert airflow_api.requests == [] and not thread_posts(slack, "Approved")
    with StateDB.from_settings(env).engine.connect() as conn:
        rows = conn.execute(sa.select(slack_interactions)).mappings().all()
    assert [(r["user_id"], r["action"], r["outcome"]) for r in rows] == [(STRANGER, "approve", "refused")]


def test_a_double_click_answers_already_approved_and_does_nothing_more(app_url, clock, slack, airflow_api,
                                                                       waiting_approval):
    _header, buttons = waiting_approval
    assert click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, "alice").json()["outcome"] == "done"
    clock.now += timedelta(seconds=5)
    same = click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, "alice")
    other = click(app_url, clock, interactive.REJECT, buttons["Reject"], OTHER_APPROVER, "bob")
    assert same.json()["outcome"] == other.json()["outcome"] == "already"
    (note,) = wait_for(lambda: ephemerals(slack, OTHER_APPROVER))
    assert note.startswith(f"Already approved by slack:{APPROVER} (alice) at 2026-11-21 10:00 UTC")
    assert len(airflow_api.patches) == 1
    time.sleep(0.3)
    assert len(thread_posts(slack, "Approved")) == 1 and not thread_posts(slack, "Rejected")


def test_an_answer_given_in_the_airflow_ui_first_is_reported_not_overwritten(app_url, clock, slack, airflow_api,
                                                                             waiting_approval):
    _header, buttons = waiting_approval
    airflow_api.answer = {"chosen_options": ["Reject"], "responded_by": {"id": "admin", "name": "admin"},
                          "responded_at": "2026-11-21T09:59:00+00:00"}
    response = click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER)
    assert response.json()["outcome"] == "already"
    assert response.json()["text"].startswith("Already rejected by admin at 2026-11-21 09:59 UTC")
    assert "answered in Airflow" in response.json()["text"]


def test_the_signing_secret_never_reaches_a_log_line(app_url, clock, airflow_api, waiting_approval, caplog):
    _header, buttons = waiting_approval
    with caplog.at_level(logging.DEBUG):
        click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER, secret="wrong")
        click(app_url, clock, interactive.APPROVE, buttons["Approve"], APPROVER)
    assert caplog.records
    assert SECRET not in caplog.text and AIRFLOW_TOKEN not in caplog.text and SLACK_TEST_TOKEN not in caplog.text


# ---------------------------------------------------------------- per target, scoped, re-run (issue 17)

def targets(*clusters: str) -> list[dict]:
    """Targets as stages.plan.approval_form lists them: one per group, the last blocked now."""
    out = [{"key": f"k{i}", "option": f"Approve {i}: orders-{i} on {c} / orders", "cluster": c,
            "group_id": f"orders-{i}", "topic": "orders", "blocked": None, "does": f"rollout restart shop/o{i}"}
           for i, c in enumerate(clusters, start=1)]
    out.append({"key": "kb", "option": None, "cluster": clusters[0], "group_id": "pay`\n*ments* <!here>",
                "topic": "orders", "blocked": "deny_list: group matches deny pattern 'pay*'", "does": "x"})
    return out


def ask(env, slack, target_list, try_number: int = 1):
    post_approval_request(dag_id=DAG, run_id=RUN, task_id=TASK, subject="lagdoctor: restart_consumers for 2 groups?",
                          body="(Markdown for Airflow)", settings=env, now=T0, targets=target_list,
                          try_number=try_number)
    return slack.posts[-1]


def test_each_group_has_its_own_button_and_a_click_approves_that_group_alone(app_url, clock, slack, airflow_api,
                                                                            env):
    prompt = ask(env, slack, targets("prod", "prod"))
    buttons = buttons_of(prompt.body)
    assert list(buttons) == ["Approve 1 only", "Approve 2 only", "Approve all 2", "Reject all"]
    text = prompt.body["blocks"][0]["text"]["text"]
    # The blocked group is shown with why, on one line, escaped; it has no button.
    assert ("\n:no_entry: `pay' *ments* &lt;!here&gt;` on prod / `orders`: *blocked now*: deny_list: group matches "
            "deny pattern 'pay*' (not offered)") in text
    assert "<!here>" not in json.dumps(prompt.body)

    response = click(app_url, clock, interactive.APPROVE, buttons["Approve 2 only"], APPROVER, "alice")
    assert response.json()["outcome"] == "done"
    assert airflow_api.patches == [{"chosen_options": ["Approve 2: orders-2 on prod / orders"]}]
    (post,) = wait_for(lambda: thread_posts(slack, "Approved"))
    assert ("goes ahead for `orders-2` on prod; the other 1 are rejected. Airflow records the answer as "
            "lagdoctor-slack.") in post.body["text"]
    assert f"slack:{APPROVER} (alice)" in post.body["text"]


def test_reject_all_answers_with_reject_all(app_url, clock, slack, airflow_api, env):
    buttons = buttons_of(ask(env, slack, targets("prod", "prod")).body)
    assert click(app_url, clock, interactive.REJECT, buttons["Reject all"], APPROVER).json()["outcome"] == "done"
    assert airflow_api.patches == [{"chosen_options": ["Reject all"]}]
    (post,) = wait_for(lambda: thread_posts(slack, "Rejected"))
    assert "is rejected for every group" in post.body["text"]


def test_approvers_are_scoped_by_dag_and_cluster(app_url, clock, slack, airflow_api, env, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_SLACK_APPROVERS", json.dumps([
        {"dags": [DAG], "clusters": ["prod"], "approvers": [APPROVER, OTHER_APPROVER]},
        {"dags": [DAG], "clusters": ["eu-*"], "approvers": [OTHER_APPROVER, "S0ONCALL"]},
        {"dags": ["some_other_dag"], "clusters": ["*"], "approvers": [STRANGER]},
    ]))
    monkeypatch.setenv("LAGDOCTOR_SLACK_AIRFLOW_USERS", json.dumps(
        {u: "lagdoctor-slack" for u in (APPROVER, OTHER_APPROVER, GROUP_MEMBER, STRANGER)}))
    buttons = buttons_of(ask(env, slack, targets("prod", "eu-1")).body)
    # An approver for prod may not approve what touches eu-1 ("all"), nor reject everything.
    for button, action in (("Approve all 2", interactive.APPROVE), ("Approve 2 only", interactive.APPROVE),
                           ("Reject all", interactive.REJECT)):
        response = click(app_url, clock, action, buttons[button], APPROVER)
        assert response.json()["outcome"] == "refused", button
    assert response.json()["text"] == (f"You are not an approver for {DAG} on eu-1, prod (LAGDOCTOR_SLACK_APPROVERS); "
                                       "nothing was done.")
    # An approver of another DAG is no approver here.
    assert click(app_url, clock, interactive.APPROVE, buttons["Approve 1 only"], STRANGER).json()["outcome"] == "refused"
    assert airflow_api.requests == []
    with StateDB.from_settings(env).engine.connect() as conn:
        rows = conn.execute(sa.select(slack_interactions)).mappings().all()
    assert [r["outcome"] for r in rows] == ["refused"] * 4
    assert "not an approver for DAG kafka_lag_incident on eu-1" in rows[1]["detail"]
    # Their own cluster alone is not enough: approving eu-1's target would reject prod's.
    response = click(app_url, clock, interactive.APPROVE, buttons["Approve 2 only"], GROUP_MEMBER)
    assert response.json()["outcome"] == "refused"
    assert response.json()["text"] == ("Approving only these would reject the other groups on prod, which you are "
                                       "not an approver for (LAGDOCTOR_SLACK_APPROVERS): answer in Airflow; "
                                       "nothing was done.")
    assert wait_for(lambda: ephemerals(slack, GROUP_MEMBER)) == [response.json()["text"]]
    assert airflow_api.requests == []
    with StateDB.from_settings(env).engine.connect() as conn:
        last = conn.execute(sa.select(slack_interactions).order_by(slack_interactions.c.id.desc())).mappings().first()
    assert (last["user_id"], last["outcome"]) == (GROUP_MEMBER, "refused")
    # An approver for both clusters may approve one alone (the other is rejected).
    response = click(app_url, clock, interactive.APPROVE, buttons["Approve 2 only"], OTHER_APPROVER)
    assert response.json()["outcome"] == "done"
    assert airflow_api.patches == [{"chosen_options": ["Approve 2: orders-2 on eu-1 / orders"]}]


def test_a_button_whose_id_names_another_approval_is_refused_and_changes_nothing(app_url, clock, slack,
                                                                                 airflow_api, env):
    from lagdoctor.state import slack_approvals as a

    db = StateDB.from_settings(env)
    old = buttons_of(ask(env, slack, targets("prod", "prod")).body)
    old_id = int(old["Reject all"].partition(".")[0])
    with db.transaction() as conn:  # retention emptied the table
        conn.execute(sa.delete(a))
    ask(env, slack, targets("prod", "prod"))
    with db.engine.connect() as conn:
        (current,) = conn.execute(sa.select(a)).mappings().all()
    assert current["id"] != old_id  # never reused (SQLite: AUTOINCREMENT)
    # A recreated database: the current approval has the old message's id.
    with db.transaction() as conn:
        conn.execute(sa.update(a).where(a.c.id == current["id"]).values(id=old_id))

    for button, action in (("Approve 1 only", interactive.APPROVE), ("Reject all", interactive.REJECT)):
        response = click(app_url, clock, action, old[button], APPROVER)
        assert (response.json()["outcome"], response.json()["text"]) == (
            "unknown_target", "This button no longer matches a waiting approval; nothing was done. Answer in Airflow.")
    # A value from before buttons carried a nonce: the id alone.
    assert click(app_url, clock, interactive.REJECT, str(old_id), APPROVER).json()["outcome"] == "unknown_target"
    assert len(wait_for(lambda: len(ephemerals(slack, APPROVER)) == 3 and ephemerals(slack, APPROVER))) == 3
    assert airflow_api.requests == []
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(a.c.status)).scalar_one() == interactive.WAITING
        rows = conn.execute(sa.select(slack_interactions)).mappings().all()
    assert [r["outcome"] for r in rows] == ["unknown_target"] * 3
    old_nonce = old["Reject all"].partition(".")[2]
    assert all(old_nonce not in json.dumps(dict(r), default=str) for r in rows)  # the audit keeps no nonce
    # The current approval's own button still works.
    response = click(app_url, clock, interactive.APPROVE, f"{old_id}.{current['nonce']}:1", APPROVER)
    assert response.json()["outcome"] == "done"


def test_the_service_identity_never_answers_for_an_unmapped_slack_user(app_url, clock, slack, airflow_api,
                                                                       waiting_approval, env, monkeypatch):
    _header, buttons = waiting_approval
    monkeypatch.setenv("LAGDOCTOR_SLACK_AIRFLOW_USERS", f"{OTHER_APPROVER}=bob")
    for user in (APPROVER, OTHER_APPROVER):  # unmapped; mapped to someone the service is not
        response = click(app_url, clock, interactive.APPROVE, buttons["Approve"], user)
        assert response.json()["outcome"] == "refused"
    assert response.json()["text"].startswith("Airflow cannot record this answer as you (your Slack user maps to "
                                              "Airflow user bob, not the service identity lagdoctor answers as)")
    assert airflow_api.requests == []
    with StateDB.from_settings(env).engine.connect() as conn:
        rows = conn.execute(sa.select(slack_interactions)).mappings().all()
    assert [(r["user_id"], r["outcome"]) for r in rows] == [(APPROVER, "refused"), (OTHER_APPROVER, "refused")]


def test_a_rerun_approval_posts_a_new_prompt_and_the_old_buttons_say_superseded(app_url, clock, slack,
                                                                               airflow_api, env):
    old = buttons_of(ask(env, slack, targets("prod", "prod"), try_number=1).body)
    # Approved once; then the task is cleared and asks again (Airflow takes a new answer).
    assert click(app_url, clock, interactive.APPROVE, old["Approve 2 only"], OTHER_APPROVER, "bob").json()[
        "outcome"] == "done"
    airflow_api.answer, airflow_api.requests[:] = None, []
    new = buttons_of(ask(env, slack, targets("prod", "prod"), try_number=2).body)
    assert old["Approve 1 only"] != new["Approve 1 only"]  # a new message, with its own buttons
    assert len([p for p in slack.posts if "Approval needed" in (p.body.get("text") or "")]) == 2

    response = click(app_url, clock, interactive.APPROVE, old["Approve 1 only"], APPROVER)
    assert response.json()["outcome"] == "superseded"
    assert response.json()["text"].startswith("Superseded by a newer request")
    assert airflow_api.requests == []
    assert click(app_url, clock, interactive.APPROVE, new["Approve 1 only"], APPROVER).json()["outcome"] == "done"

    # The action's result names the newest try's approver.
    from lagdoctor.notify.approvals import slack_answer

    assert slack_answer(DAG, RUN, TASK, settings=env) == {"slack": f"slack:{APPROVER} (alice)",
                                                          "airflow_user": "lagdoctor-slack"}


def test_the_timeline_credits_the_newest_tries_approver(env):
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.state import slack_approvals
    from lagdoctor.web.timeline import read_actions

    db = StateDB.from_settings(env)
    ActionLog(db).append({"cluster": "prod", "group_id": "orders-eu", "topic": "orders", "action": "restart_consumers",
                          "idempotency_key": "k", "run_id": RUN, "dry_run": False, "message": "m",
                          "ts": T0.isoformat(), "status": "awaiting_approval"})
    with db.transaction() as conn:
        for try_number, by in ((2, "slack:U2 (bob)"), (1, "slack:U1 (alice)")):
            conn.execute(sa.insert(slack_approvals).values(
                dag_id=DAG, run_id=RUN, task_id=TASK, map_index=-1, try_number=try_number, subject="s",
                status="approved", answered_by=by, answered_at=T0, created_at=T0))
    (record,) = read_actions(env, "prod", "orders-eu")
    assert record["approval"]["by"] == "slack:U2 (bob)"


class SlowHITL:
    """Airflow's API, answering while something else writes to the state database."""

    def __init__(self, db, approval_id: int) -> None:
        self.db, self.approval_id, self.write_error = db, approval_id, None

    def acts_as(self, _user):
        return True

    def respond(self, dag_id, run_id, task_id, map_index, option, *, responder):
        from lagdoctor.notify.airflow_api import HITLAnswer

        engine = sa.create_engine(self.db.engine.url, connect_args={"timeout": 1} if self.db.dialect == "sqlite"
                                  else {"options": "-c lock_timeout=1000"})
        try:
            with engine.begin() as conn:  # another click, the outbox, a task: any writer
                from lagdoctor.state import slack_approvals as a

                conn.execute(sa.update(a).where(a.c.id == self.approval_id).values(subject=a.c.subject))
        except Exception as exc:  # noqa: BLE001
            self.write_error = exc
        finally:
            engine.dispose()
        return HITLAnswer(True, False, list(option), "lagdoctor-slack", T0)


def test_no_write_lock_is_held_while_airflow_is_called(env, slack, waiting_approval):
    _header, buttons = waiting_approval
    db = StateDB.from_settings(env)
    hitl = SlowHITL(db, interactive.parse_approval_ref(buttons["Approve"])[0])
    outcome = interactive.handle_click(
        interactive.Click(user_id=APPROVER, user_name="alice", action_id=interactive.APPROVE,
                          value=buttons["Approve"]), db=db, now=T0, hitl=hitl)
    assert outcome.outcome == "done"
    assert hitl.write_error is None, f"the state database was locked during the HTTP call: {hitl.write_error}"


class MintingHITL:
    """Airflow's API behind an auth manager that mints a token per user (SimpleAuthManager)."""

    service = None

    def __init__(self) -> None:
        self.responders: list[str] = []

    def acts_as(self, _user):
        return True

    def respond(self, dag_id, run_id, task_id, map_index, option, *, responder):
        from lagdoctor.notify.airflow_api import HITLAnswer

        self.responders.append(responder)
        return HITLAnswer(True, False, list(option), responder, T0)


@pytest.mark.parametrize("mapping, recorded_as", [(f"{APPROVER}=alice.smith", "alice.smith"),
                                                  ("", f"slack:{APPROVER} (alice)")])
def test_a_minted_answer_is_recorded_as_the_mapped_airflow_user(env, slack, waiting_approval, monkeypatch,
                                                               mapping, recorded_as):
    _header, buttons = waiting_approval
    monkeypatch.setenv("LAGDOCTOR_SLACK_AIRFLOW_USERS", mapping)
    hitl = MintingHITL()
    db = StateDB.from_settings(env)
    outcome = interactive.handle_click(
        interactive.Click(user_id=APPROVER, user_name="alice", action_id=interactive.APPROVE,
                          value=buttons["Approve"]), db=db, now=T0, hitl=hitl)
    assert outcome.outcome == "done" and hitl.responders == [recorded_as]
    assert f"Airflow records the answer as {recorded_as}." in outcome.posted


# ---------------------------------------------------------------- the endpoint itself

def test_a_body_over_64_kib_is_413_without_reading_it_all(app_url, clock):
    big = b"payload=" + b"x" * (64 * 1024)
    declared = httpx.post(app_url, content=big, headers=signed(big, int(clock.now.timestamp())), timeout=30)
    assert declared.status_code == 413

    sent = []

    def chunks():  # no Content-Length: read as it streams
        for _ in range(64):
            sent.append(1)
            yield b"x" * 4096

    streamed = httpx.post(app_url, content=chunks(), headers={"X-Slack-Request-Timestamp": "1"}, timeout=30)
    assert streamed.status_code == 413
    assert streamed.text == '{"ok":false,"error":"body over 65536 bytes"}'


def test_a_signed_payload_with_fields_of_the_wrong_json_type_is_400(app_url, clock, waiting_approval):
    _header, buttons = waiting_approval
    good = json.loads(parse_qs(click_body(interactive.APPROVE, buttons["Approve"], APPROVER).decode())["payload"][0])
    for field, value in (("actions", "approve"), ("actions", ["approve"]), ("user", [APPROVER]),
                         ("user", {"id": 42}), ("container", "C0"), ("channel", ["C0"])):
        body = urlencode({"payload": json.dumps({**good, field: value})}).encode()
        response = httpx.post(app_url, content=body, headers=signed(body, int(clock.now.timestamp())), timeout=30)
        assert (response.status_code, response.json()) == (400, {"ok": False, "error": "not a block_actions payload"}), \
            (field, value)


def test_an_unsigned_request_costs_no_connection_lookup(app_url, clock, monkeypatch):
    looked_up = []
    real = interactive.signing_secret
    monkeypatch.setattr(interactive, "signing_secret", lambda *a, **k: looked_up.append(1) or real(*a, **k))
    body = click_body(interactive.APPROVE, "1", APPROVER)
    for headers in ({}, {"X-Slack-Request-Timestamp": "1", "X-Slack-Signature": "v0=00"},
                    {"X-Slack-Request-Timestamp": str(int(clock.now.timestamp()))}):
        assert httpx.post(app_url, content=body, headers=headers, timeout=30).status_code == 401
    assert looked_up == []
    # A well-formed one is checked against the secret.
    assert click(app_url, clock, interactive.APPROVE, "1", APPROVER, secret="wrong").status_code == 401
    assert looked_up == [1]


# ---------------------------------------------------------------- acknowledge / snooze

def test_acknowledge_silences_updates_until_the_severity_changes(app_url, clock, slack, env):
    post_or_update_incident(finding("warning"), run_id="r1", settings=env, now=T0)
    root = slack.posts[0]
    assert set(buttons_of(root.body)) == {"Acknowledge", "Snooze 1 h"}

    response = click(app_url, clock, interactive.ACK, buttons_of(root.body)["Acknowledge"], STRANGER, "carol")
    assert response.json()["outcome"] == "done"  # anyone in the channel may acknowledge
    (ack,) = wait_for(lambda: thread_posts(slack, "Acknowledged"))
    assert ack.body["thread_ts"] == root.ts and "slack:U0STRANGER (carol)" in ack.body["text"]
    again = click(app_url, clock, interactive.ACK, buttons_of(root.body)["Acknowledge"], APPROVER, "alice")
    assert again.json()["text"].startswith("Already acknowledged by slack:U0STRANGER (carol)")

    count = len(slack.posts)
    # news (another partition lags) that an acknowledgement holds back
    quiet = post_or_update_incident(finding("warning", partitions=(1, 2)), run_id="r2", settings=env, now=T0)
    assert quiet["decision"] == "quiet" and len(slack.posts) == count
    loud = post_or_update_incident(finding("critical", "plateau"), run_id="r3", settings=env, now=T0)
    assert loud["decision"] == "replied"
    assert "severity warning → critical" in slack.posts[-1].body["text"]


def test_snooze_silences_every_update_for_an_hour(app_url, clock, slack, env):
    post_or_update_incident(finding("warning"), run_id="r1", settings=env, now=T0)
    root = slack.posts[0]
    assert click(app_url, clock, interactive.SNOOZE_ACTION, buttons_of(root.body)["Snooze 1 h"],
                 STRANGER, "carol").json()["outcome"] == "done"
    (snooze,) = wait_for(lambda: thread_posts(slack, "Snoozed"))
    assert "until 2026-11-21 11:00 UTC" in snooze.body["text"]
    count = len(slack.posts)
    during = post_or_update_incident(finding("critical"), run_id="r2", settings=env, now=T0 + timedelta(minutes=59))
    assert during["decision"] == "quiet" and len(slack.posts) == count
    after = post_or_update_incident(finding("critical", partitions=(1, 2)), run_id="r3", settings=env,
                                    now=T0 + timedelta(minutes=61))
    assert after["decision"] == "replied" and slack.posts[-1].body["thread_ts"] == root.ts


# ---------------------------------------------------------------- when there are no buttons

def test_without_a_signing_secret_no_buttons_and_every_request_is_refused(monkeypatch, env, slack, clock, app_url):
    conn = {"conn_type": "slack", "password": SLACK_TEST_TOKEN, "extra": {"base_url": slack.url}}
    monkeypatch.setenv("AIRFLOW_CONN_SLACK_API_DEFAULT", json.dumps(conn))
    post_or_update_incident(finding(), run_id="r1", settings=env, now=T0)
    assert buttons_of(slack.posts[0].body) == {}
    assert click(app_url, clock, interactive.ACK, "whatever", APPROVER).status_code == 401


def test_without_a_public_base_url_no_buttons(monkeypatch, env, slack):
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    monkeypatch.setattr("lagdoctor.web.links.airflow_base_url", lambda environ=None: None)
    post_or_update_incident(finding(), run_id="r1", settings=env, now=T0)
    post_approval_request(dag_id=DAG, run_id=RUN, task_id=TASK, subject="approve?", settings=env, now=T0)
    assert all(buttons_of(p.body) == {} for p in slack.posts)
    assert "Answer in the Airflow UI" in str(slack.posts[-1].body["blocks"])


# ---------------------------------------------------------------- Airflow's side (no database needed)

def test_the_fake_serves_the_path_airflow_routes_hitl_answers_on():
    from starlette.routing import compile_path

    from airflow.api_fastapi.core_api.routes.public.hitl import task_instances_hitl_router
    from lagdoctor.notify.airflow_api import hitl_path

    patch = next(r for r in task_instances_hitl_router.routes if "PATCH" in r.methods)
    regex, _fmt, _conv = compile_path("/api/v2" + patch.path)
    match = regex.match(hitl_path(DAG, RUN, TASK, -1))
    assert match and unquote(match["dag_run_id"]) == RUN and match["task_id"] == TASK and match["map_index"] == "-1"


def test_a_minted_token_names_the_slack_user_as_airflow_sees_it():
    import asyncio

    from airflow.api_fastapi.app import create_auth_manager
    from lagdoctor.notify.airflow_api import minted_token_provider

    manager = create_auth_manager()
    mint = minted_token_provider({})
    assert mint is not None
    claims = asyncio.run(manager._get_token_validator().avalidated_claims(mint("slack:U0APPROVE1 (alice)")))
    user = manager.deserialize_user(claims)
    # What the HITL endpoint stores as responded_by: the Airflow UI shows the Slack user.
    assert (user.get_id(), user.get_name(), user.role) == ("slack:U0APPROVE1 (alice)",) * 2 + ("USER",)
