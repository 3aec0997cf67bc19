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
import re
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


# Names that travel as path segments unchanged (Kafka's legal topic characters); "." and ".."
# would be resolved away by browsers.
_PATH_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _path_safe(name: str) -> bool:
    return bool(_PATH_SAFE_NAME.fullmatch(name)) and name not in (".", "..")


def group_path(cluster: str, group_id: str) -> str:
    """The group view's path under the app's mount point, for any group id a broker accepts.

    Plain names: /group/<cluster>/<group>. Anything else (a newline, '/', '?', '#', '%',
    spaces, unicode, an empty cluster): /group?cluster=...&group=..., which carries any
    text exactly (a path segment cannot hold a newline: the route would not match it).
    """
    cluster = cluster or ""
    if _path_safe(cluster) and _path_safe(group_id):
        return f"/group/{cluster}/{group_id}"
    return "/group?" + urlencode({"cluster": cluster, "group": group_id}, quote_via=quote, safe="")


def group_url(cluster: str, group_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The lag page's view of one consumer group (its incident timeline across runs)."""
    base = airflow_base_url(environ)
    if not base or not group_id:
        return None
    return f"{base}{URL_PREFIX}{group_path(cluster, group_id)}"


def page_url(query: str | None = None, severity: str | None = None,
             environ: Mapping[str, str] | None = None) -> str | None:
    """The lag page filtered by a group regex and a minimum severity (shareable)."""
    base = airflow_base_url(environ)
    if not base:
        return None
    params = {k: v for k, v in (("q", query), ("severity", severity)) if v}
    return f"{base}{URL_PREFIX}/" + (f"?{urlencode(params)}" if params else "")
