"""Answering a waiting HITL task through Airflow's own REST API (Airflow 3.3):

    PATCH {base}/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails
          {"chosen_options": ["Approve"]}      -> 200 {responded_by: {id, name}, responded_at, chosen_options}
                                                   409 once anybody answered (UI, API, a second click)
    GET   (same path)                          -> the detail, with responded_by_user once answered

(airflow/api_fastapi/core_api/routes/public/hitl.py). Airflow records the
answer as the user the bearer token belongs to, so who approved shows in the
Airflow UI. How we get a token (LAGDOCTOR_SLACK_HITL_IDENTITY):

  slack_user (default)  inside the API server (the plugin's own process) with an
                        auth manager whose users live in the token's claims
                        (SimpleAuthManager): a 60-second token for the user
                        ``slack:U123 (alice)`` with role LAGDOCTOR_SLACK_AIRFLOW_ROLE
                        (default USER, the least that may answer). Airflow then
                        shows the Slack user as the responder. Any other auth
                        manager falls back to the service identity below.
  service               one Airflow identity: the connection
                        ``lagdoctor_airflow_api`` (http; host = Airflow's URL;
                        password = an API token, or login + password exchanged
                        at /auth/token) or LAGDOCTOR_AIRFLOW_API_TOKEN (its user
                        named in LAGDOCTOR_AIRFLOW_API_USER). It answers only for
                        a Slack user that LAGDOCTOR_SLACK_AIRFLOW_USERS maps to
                        that very Airflow user: a click is never silently recorded
                        as the service account; any other click is refused.

Who a Slack user is in Airflow: LAGDOCTOR_SLACK_AIRFLOW_USERS, ``U123=alice,U456=bob``
(or JSON ``{"U123": "alice"}``). With slack_user, a mapped user is minted as that
Airflow user, an unmapped one as ``slack:U123 (alice)``.

The base URL: LAGDOCTOR_AIRFLOW_API_URL, else the connection's host, else
Airflow's [api] base_url. No token ever reaches a log line or an error.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping
from urllib.parse import quote

from lagdoctor.notify.redact import one_line

log = logging.getLogger(__name__)

API_CONN_ID = "lagdoctor_airflow_api"
API_URL_ENV = "LAGDOCTOR_AIRFLOW_API_URL"
API_TOKEN_ENV = "LAGDOCTOR_AIRFLOW_API_TOKEN"
IDENTITY_ENV = "LAGDOCTOR_SLACK_HITL_IDENTITY"
ROLE_ENV = "LAGDOCTOR_SLACK_AIRFLOW_ROLE"
API_USER_ENV = "LAGDOCTOR_AIRFLOW_API_USER"
USERS_ENV = "LAGDOCTOR_SLACK_AIRFLOW_USERS"


def airflow_users(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Slack user id -> Airflow user name, from LAGDOCTOR_SLACK_AIRFLOW_USERS
    (``U123=alice,U456=bob`` or a JSON object); a malformed value maps nobody."""
    import json

    env = os.environ if environ is None else environ
    raw = (env.get(USERS_ENV) or "").strip()
    if not raw:
        return {}
    if raw.startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError:
            log.warning("%s: not valid JSON; no Slack user is mapped to an Airflow user", USERS_ENV)
            return {}
        return {str(k).strip(): str(v).strip() for k, v in data.items() if isinstance(v, str) and v.strip()} \
            if isinstance(data, dict) else {}
    pairs = (t.partition("=") for t in raw.split(","))
    return {k.strip(): v.strip() for k, _, v in pairs if k.strip() and v.strip()}
TIMEOUT_S = 10.0


def hitl_path(dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
    q = lambda v: quote(str(v), safe="")  # noqa: E731 - run ids hold ':' and '+'
    return f"/api/v2/dags/{q(dag_id)}/dagRuns/{q(run_id)}/taskInstances/{q(task_id)}/{int(map_index)}/hitlDetails"


@dataclass
class HITLAnswer:
    answered: bool  # this call answered it
    conflict: bool = False  # somebody had answered already
    chosen_options: list[str] = field(default_factory=list)
    responded_by: str | None = None  # Airflow's name for the responder
    responded_at: datetime | None = None
    error: str | None = None  # one line, when neither


def _parse_time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


class HITLClient:
    """Answer one HITL task; ``token_for(responder)`` gives the bearer token to use.

    ``acts_as(airflow_user)``: whether an answer can be recorded as that Airflow user
    (None: the Slack user has no mapping); ``service`` is set when every answer goes
    through one identity, whose user name is ``service`` (or "" when unknown)."""

    def __init__(self, base_url: str, token_for: Callable[[str], str], *, timeout: float = TIMEOUT_S,
                 service: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_for = token_for
        self.timeout = timeout
        self.service = service

    def acts_as(self, airflow_user: str | None) -> bool:
        if self.service is None:
            return True  # tokens minted per user
        return bool(airflow_user) and airflow_user == self.service

    def respond(self, dag_id: str, run_id: str, task_id: str, map_index: int, option: str | list[str], *,
                responder: str) -> HITLAnswer:
        import httpx

        url = self.base_url + hitl_path(dag_id, run_id, task_id, map_index)
        token = ""
        try:
            token = self.token_for(responder)
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(timeout=self.timeout) as client:
                options = [option] if isinstance(option, str) else list(option)
                response = client.patch(url, json={"chosen_options": options}, headers=headers)
                if response.status_code == 409:
                    detail = client.get(url, headers=headers)
                    data = detail.json() if detail.status_code == 200 else {}
                    user = data.get("responded_by_user") or {}
                    return HITLAnswer(False, True, list(data.get("chosen_options") or []),
                                      user.get("name") or user.get("id"), _parse_time(data.get("responded_at")))
        except Exception as exc:  # noqa: BLE001 - one line, token scrubbed
            return HITLAnswer(False, error=one_line(exc, [token]))
        if response.status_code == 200:
            data = response.json()
            user = data.get("responded_by") or {}
            return HITLAnswer(True, False, list(data.get("chosen_options") or options),
                              user.get("name") or user.get("id"), _parse_time(data.get("responded_at")))
        reason = {401: "Airflow refused lagdoctor's credentials", 403: "the Airflow identity may not answer",
                  404: "no approval waits for this task (cleared, or the run is gone)"}.get(
            response.status_code, f"Airflow answered HTTP {response.status_code}")
        return HITLAnswer(False, error=reason)


# ---------------------------------------------------------------- configuration

def _connection() -> Any | None:
    from lagdoctor.connections import connection_exists

    if not connection_exists(API_CONN_ID):
        return None
    from airflow.sdk.bases.hook import BaseHook

    return BaseHook.get_connection(API_CONN_ID)


def _conn_url(conn: Any) -> str | None:
    host = (conn.host or "").rstrip("/")
    if not host:
        return None
    if "://" not in host:
        host = f"{conn.schema or 'http'}://{host}"
    return f"{host}:{conn.port}" if conn.port else host


def api_base_url(environ: Mapping[str, str] | None = None, conn: Any = None) -> str | None:
    from lagdoctor.web.links import airflow_base_url

    env = os.environ if environ is None else environ
    explicit = (env.get(API_URL_ENV) or "").strip()
    if explicit:
        return explicit.rstrip("/")
    if conn is not None and _conn_url(conn):
        return _conn_url(conn)
    return airflow_base_url(environ)


def service_token_provider(environ: Mapping[str, str] | None = None, conn: Any = None,
                           base_url: str | None = None) -> Callable[[str], str] | None:
    """A token for the one service identity, or None when none is configured."""
    env = os.environ if environ is None else environ
    token = (env.get(API_TOKEN_ENV) or "").strip()
    if token:
        return lambda _who: token
    if conn is None:
        return None
    if conn.password and not conn.login:
        password = conn.password
        return lambda _who: password
    if conn.login and conn.password and base_url:
        login, password = conn.login, conn.password

        def exchange(_who: str) -> str:
            import httpx

            response = httpx.post(f"{base_url}/auth/token", json={"username": login, "password": password},
                                  timeout=TIMEOUT_S)
            if response.status_code not in (200, 201):
                raise RuntimeError(f"Airflow /auth/token answered HTTP {response.status_code}")
            return str(response.json()["access_token"])

        return exchange
    return None


def minted_token_provider(environ: Mapping[str, str] | None = None) -> Callable[[str], str] | None:
    """Tokens for ``slack:U123 (alice)`` from the API server's own auth manager, when its
    users are the token's claims (SimpleAuthManager); None anywhere else."""
    env = os.environ if environ is None else environ
    try:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

        manager = get_auth_manager()
    except Exception:  # not inside the API server (a task, the CLI): no auth manager to ask
        return None
    if not isinstance(manager, SimpleAuthManager):
        return None
    role = (env.get(ROLE_ENV) or "USER").strip().upper()

    def mint(who: str) -> str:
        # `who`: the mapped Airflow user, else "slack:U123 (alice)" (handle_click chooses)
        return manager.generate_jwt(SimpleAuthManagerUser(username=who, role=role), expiration_time_in_seconds=60)

    return mint


def hitl_client(environ: Mapping[str, str] | None = None) -> HITLClient | None:
    """The client the request URL uses, or None (then the click says: answer in Airflow)."""
    env = os.environ if environ is None else environ
    try:
        conn = _connection()
    except Exception as exc:  # a malformed connection: said once, never its password
        log.warning("Airflow API connection %r unusable: %s", API_CONN_ID, type(exc).__name__)
        conn = None
    base = api_base_url(env, conn)
    if not base:
        return None
    if (env.get(IDENTITY_ENV) or "slack_user").strip().lower() != "service":
        minted = minted_token_provider(env)
        if minted is not None:
            return HITLClient(base, minted)
    provider = service_token_provider(env, conn, base)
    if provider is None:
        return None
    # The service's own user: only a Slack user mapped to it may answer through it.
    service = (env.get(API_USER_ENV) or "").strip() or (getattr(conn, "login", None) or "").strip()
    return HITLClient(base, provider, service=service)
