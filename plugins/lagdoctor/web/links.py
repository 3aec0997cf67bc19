"""Absolute URLs between the places an on-call engineer looks: the Airflow run,
the group's view on the lag page, the incident report.

Everything starts from Airflow's own base URL (`[api] base_url`, e.g.
AIRFLOW__API__BASE_URL=http://localhost:8080); without one there is no
absolute URL to give (Slack needs absolute links) and every function returns
None, so callers render no link rather than a broken one.
`LAGDOCTOR_REPORT_BASE_URL` still wins for reports (a reverse proxy, a bucket).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import quote, urlencode

URL_PREFIX = "/lagdoctor"
REPORT_BASE_URL_ENV = "LAGDOCTOR_REPORT_BASE_URL"


def airflow_base_url(environ: Mapping[str, str] | None = None) -> str | None:
    """Airflow's public base URL without a trailing slash, or None when not configured."""
    env = os.environ if environ is None else environ
    value = env.get("AIRFLOW__API__BASE_URL")
    if value is None and environ is None:
        try:
            from airflow.configuration import conf

            value = conf.get("api", "base_url", fallback=None)
        except Exception:  # no Airflow here (the CLI, a bare job): no links
            value = None
    value = (value or "").strip().rstrip("/")
    return value if value.startswith(("http://", "https://")) else None


def report_base_url(environ: Mapping[str, str] | None = None) -> str | None:
    """Where reports are served: LAGDOCTOR_REPORT_BASE_URL, else this plugin's report route."""
    env = os.environ if environ is None else environ
    explicit = (env.get(REPORT_BASE_URL_ENV) or "").strip()
    if explicit:
        return explicit.rstrip("/")
    base = airflow_base_url(environ)
    return f"{base}{URL_PREFIX}/reports" if base else None


def run_url(dag_id: str, run_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The Airflow UI's page of one DAG run."""
    base = airflow_base_url(environ)
    if not base or not dag_id or not run_id:
        return None
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def group_url(cluster: str, group_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The lag page's view of one consumer group (its incident timeline across runs)."""
    base = airflow_base_url(environ)
    if not base or not group_id:
        return None
    return f"{base}{URL_PREFIX}/group/{quote(cluster or '', safe='')}/{quote(group_id, safe='')}"


def page_url(query: str | None = None, severity: str | None = None,
             environ: Mapping[str, str] | None = None) -> str | None:
    """The lag page filtered by a group regex and a minimum severity (shareable)."""
    base = airflow_base_url(environ)
    if not base:
        return None
    params = {k: v for k, v in (("q", query), ("severity", severity)) if v}
    return f"{base}{URL_PREFIX}/" + (f"?{urlencode(params)}" if params else "")
