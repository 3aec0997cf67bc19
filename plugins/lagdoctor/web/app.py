"""The lag page's FastAPI app, mounted by the Airflow plugin at /lagdoctor (contract 6).

    GET /                       the lag page (HTML): current findings per cluster and group
    GET /api/findings           the same as JSON: {"generated_at", "runs", "findings"}, and
                                "runs_not_read" while the run index has older folders to read
    GET /reports/{run}/{file}   an incident report written by lagdoctor.web.report

All three are read-only and go through ``auth.dag_run_reader``: the caller
must be signed in to Airflow, and sees only findings of DAG runs they may read.
Routes are plain ``def``: file and Parquet reads run in FastAPI's thread pool,
never on the API server's event loop.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any, Callable

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

from lagdoctor.settings import Settings, join
from lagdoctor.web.auth import DagReadCheck, dag_run_reader

URL_PREFIX = "/lagdoctor"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def _airflow_base(request: Request, url_prefix: str) -> str:
    """The Airflow UI's base path, from where this app is mounted (works behind [api] base_url)."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root[: -len(url_prefix)] if url_prefix and root.endswith(url_prefix) else root


def _json_safe(value: Any) -> Any:
    # Findings are parsed JSON; Spark may have written NaN, which strict JSON cannot carry.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def create_app(
    settings_factory: Callable[[], Settings] = Settings.from_env,
    *,
    url_prefix: str = URL_PREFIX,
) -> FastAPI:
    """The app the plugin mounts. Settings are read per request, so a changed
    LAGDOCTOR_DATA_ROOT needs no restart and importing the plugin reads nothing."""
    app = FastAPI(title="lagdoctor", docs_url=None, redoc_url=None, openapi_url=None)

    def settings() -> Settings:
        return settings_factory()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def lag_page(
        request: Request,
        can_read: DagReadCheck = Depends(dag_run_reader),
        cluster: str | None = Query(None, max_length=256),
        group: str | None = Query(None, max_length=512),
    ) -> HTMLResponse:
        from lagdoctor.web.data import current_index, latest_states
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY, render
        from lagdoctor.web.views import group_view, severity_counts

        s = settings()
        index = current_index(s.findings_root)
        states, runs = latest_states(s.findings_root, cluster=cluster or None, group=group or None,
                                     can_read_dag=can_read, index=index)
        all_states = states if not (cluster or group) else latest_states(s.findings_root, can_read_dag=can_read,
                                                                         index=index)[0]
        history = _history(s, states)
        base = _airflow_base(request, url_prefix)
        views = [group_view(st, history[st.key], airflow_base=base) for st in states]
        body = render(
            "page.html", views=views, runs=runs, counts=severity_counts(views),
            clusters=sorted({st.cluster for st in all_states}), cluster=cluster, group=group,
            runs_not_read=index.not_read,
            generated_at=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            api_href="api/findings" + (f"?{request.url.query}" if request.url.query else ""),
        )
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    @app.get("/api/findings")
    def api_findings(
        request: Request,
        can_read: DagReadCheck = Depends(dag_run_reader),
        cluster: str | None = Query(None, max_length=256),
        group: str | None = Query(None, max_length=512),
    ) -> JSONResponse:
        from lagdoctor.web.data import current_index, latest_states
        from lagdoctor.web.views import dag_run_href

        s = settings()
        index = current_index(s.findings_root)
        states, runs = latest_states(s.findings_root, cluster=cluster or None, group=group or None,
                                     can_read_dag=can_read, index=index)
        base = _airflow_base(request, url_prefix)
        findings = [
            {**f, "run_key": st.run.run_key, "dag_id": st.run.dag_id, "run_id": st.run.run_id,
             "dag_run_url": dag_run_href(st.run, base)}
            for st in states for f in st.findings
        ]
        body = {
            "generated_at": datetime.now(timezone.utc).isoformat(),
            "runs": [{**r.as_dict(), "dag_run_url": dag_run_href(r, base)} for r in runs],
            "findings": findings,
        }
        if index.not_read:
            body["runs_not_read"] = index.not_read  # older run folders the index has not read yet
        return JSONResponse(_json_safe(body), headers=_NO_STORE)

    @app.get("/reports/{run_key}/{name}", response_class=HTMLResponse, include_in_schema=False)
    def report(run_key: str, name: str, can_read: DagReadCheck = Depends(dag_run_reader)) -> HTMLResponse:
        import fsspec

        from lagdoctor.web.data import find_run
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY

        # Names, not paths: nothing the caller sends can leave the reports folder.
        if not (_SAFE_NAME.match(run_key) and _SAFE_NAME.match(name) and name.endswith(".html")):
            raise HTTPException(404, "no such report")
        s = settings()
        run = find_run(s.findings_root, run_key)
        if not can_read(run.dag_id if run else None):
            raise HTTPException(404, "no such report")  # not 403: do not confirm it exists
        path = join(s.reports_root, run_key, name)
        try:
            with fsspec.open(path, "rt", encoding="utf-8") as fh:
                body = fh.read()
        except FileNotFoundError:
            raise HTTPException(404, "no such report") from None
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    return app


def _history(s: Settings, states) -> dict:
    """Offset history of every shown group over its own run's window: one read per
    (cluster, window), and a sweep's groups all share their run's window."""
    from lagdoctor.web.data import GroupHistory, read_history

    out = {st.key: GroupHistory(st.key) for st in states}
    batches: dict[tuple, list] = {}
    for st in states:
        if all(st.window):
            batches.setdefault((st.cluster, *st.window), []).append(st.key)
    for (_, start, end), keys in batches.items():
        out.update(read_history(s.snapshots_root, keys, start, end))
    return out
