"""The plugin inside Airflow's own API server app: loaded from plugins/, mounted
at /lagdoctor, linked in the UI's navigation, and guarded by Airflow's JWT
authentication (the auth manager configured here: SimpleAuthManager)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from tests.fixtures.web import lag_data_root  # noqa: F401  (fixture)


@pytest.fixture
def airflow_api(airflow_db, lag_data_root):
    from fastapi.testclient import TestClient

    from airflow.api_fastapi.app import create_app

    with TestClient(create_app(apps="core")) as client:
        yield client


def _token(role: str = "viewer") -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=role, role=role))


@pytest.mark.parametrize("path", ["/lagdoctor/", "/lagdoctor/api/findings"])
def test_without_credentials_nothing_is_shown(airflow_api, path):
    r = airflow_api.get(path, follow_redirects=False)
    assert r.status_code in (401, 303)
    assert "orders-processor" not in r.text


@pytest.mark.parametrize("path", ["/lagdoctor/?severity=critical", "/lagdoctor/group/prod/orders-processor",
                                  "/lagdoctor/reports/some-run/report.html"])
def test_a_signed_out_page_link_goes_to_airflows_login_and_back(airflow_api, path):
    """A link from Slack or a report, opened signed out: Airflow's login, then the page asked for."""
    r = airflow_api.get(path, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/api/v2/auth/login?next=" + quote(path, safe="/")
    # Airflow's own login route accepts that next= link and hands it to the auth manager's login page.
    login = airflow_api.get(r.headers["location"], follow_redirects=False)
    assert login.status_code == 307
    assert login.headers["location"] == "/auth/login?" + urlencode({"next": path})


def test_the_json_api_still_answers_401_signed_out(airflow_api):
    r = airflow_api.get("/lagdoctor/api/findings", follow_redirects=False)
    assert r.status_code == 401 and r.json() == {"detail": "Not authenticated"}


def test_a_forged_token_is_refused(airflow_api):
    r = airflow_api.get("/lagdoctor/api/findings", headers={"Authorization": "Bearer not.a.jwt"})
    assert r.status_code == 403 and "orders-processor" not in r.text


def test_bearer_token_like_the_rest_api(airflow_api):
    r = airflow_api.get("/lagdoctor/api/findings", headers={"Authorization": f"Bearer {_token()}"})
    assert r.status_code == 200
    assert "orders-processor" in {f["group_id"] for f in r.json()["findings"]}


def test_the_ui_session_cookie_is_enough(airflow_api):
    """A browser signed in to the Airflow UI holds the `_token` cookie; the page reads it."""
    airflow_api.cookies.set("_token", _token())
    r = airflow_api.get("/lagdoctor/")
    assert r.status_code == 200 and "orders-processor" in r.text


def test_plugin_registers_the_nav_link(airflow_api):
    r = airflow_api.get("/api/v2/plugins", headers={"Authorization": f"Bearer {_token('admin')}"})
    assert r.status_code == 200
    plugin = next(p for p in r.json()["plugins"] if p["name"] == "lagdoctor")
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/lagdoctor"
    view = plugin["external_views"][0]
    assert (view["name"], view["href"], view["category"], view["destination"]) == (
        "Kafka lag", "lagdoctor/", "browse", "nav")


def test_plugin_import_is_cheap():
    """The scheduler and DAG processor import plugins too: no pyarrow, no pyspark, no Airflow security module."""
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'plugins'); import lagdoctor_plugin; "
            "heavy = [m for m in ('pyarrow', 'pyspark', 'airflow.api_fastapi.core_api.security') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
