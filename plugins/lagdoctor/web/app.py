"""The lag page's FastAPI app, mounted by the Airflow plugin at /lagdoctor (contract 6).

    GET /                       the lag page (HTML): current findings per cluster and group;
                                ?cluster=, ?group= (exact), ?q= (group regex), ?severity= (minimum)
    GET /api/findings           the same as JSON: {"generated_at", "runs", "findings"}, and
                                "runs_not_read" while the run index has older folders to read,
                                "incomplete_runs" (+ "incomplete_runs_text") for run folders
                                skipped as incomplete (lagdoctor.runindex.run_completeness)
    GET /group/{cluster}/{group} one group: its current findings, charts, and incident timeline
    GET /group?cluster=&group=  the same, for any group id (links.group_path picks the form)
    GET /reports/{run}/{file}   an incident report written by lagdoctor.web.report

All are read-only and go through ``auth.dag_run_reader``: the caller
must be signed in to Airflow, and sees only findings of DAG runs they may read.
A signed-out browser asking for a page (not /api/) is sent to Airflow's login
with a next= link back; the JSON API answers 401 as Airflow's own API does.
Routes are plain ``def``: file and Parquet reads run in FastAPI's thread pool,
never on the API server's event loop.
"""

from __future__ import annotations

import json
import logging
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lagdoctor.contracts import NO_PROBLEM_DIAGNOSES
from lagdoctor.objectstore import retry_on_stale_credentials  # a rotated store key needs no restart
from lagdoctor.settings import Settings, join
from lagdoctor.web.auth import DagReadCheck, dag_run_reader
from lagdoctor.web.links import URL_PREFIX  # one mount point for the app and the links built to it

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")
MAX_NAME = 32767  # a Kafka protocol string's limit: no group id is longer
_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


def _airflow_base(request: Request, url_prefix: str) -> str:
    """The Airflow UI's base path, from where this app is mounted (works behind [api] base_url)."""
    root = request.scope.get("root_path", "").rstrip("/")
    return root[: -len(url_prefix)] if url_prefix and root.endswith(url_prefix) else root


def _page_root(request: Request) -> str:
    """This app's own mount path (e.g. /airflow/lagdoctor): links between its pages."""
    return request.scope.get("root_path", "").rstrip("/")


def _filters(states, q: str | None, severity: str | None) -> tuple[list, list, str]:
    """(states matching the group regex, those also at or above the severity, the error line or "").
    An invalid filter is said on the page and not applied: never a 500."""
    from lagdoctor.web.views import at_least, group_matcher, minimum_severity

    errors = []
    try:
        match = group_matcher(q)
    except ValueError as exc:
        match, errors = None, [str(exc)]
    try:
        minimum = minimum_severity(severity)
    except ValueError as exc:
        minimum = None
        errors.append(str(exc))
    matched = [st for st in states if match is None or match(st.group_id)]
    return matched, [st for st in matched if at_least(st.severity, minimum)], "; ".join(errors)


def login_redirect_url(request: Request, url_prefix: str) -> str:
    """Airflow's login route for whichever auth manager is configured, with a link back
    to the page asked for (a path: Airflow only follows next= links on its own host)."""
    here = request.url.path  # the full path, mount point included
    if request.url.query:
        here += "?" + request.url.query
    return f"{_airflow_base(request, url_prefix)}/api/v2/auth/login?next={quote(here, safe='/')}"


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
    clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
) -> FastAPI:
    """The app the plugin mounts. Settings are read per request, so a changed
    LAGDOCTOR_DATA_ROOT needs no restart and importing the plugin reads nothing.
    ``clock`` is "now" for the pages (tests pass their own)."""
    app = FastAPI(title="lagdoctor", docs_url=None, redoc_url=None, openapi_url=None)

    def settings() -> Settings:
        return settings_factory()

    @app.exception_handler(StarletteHTTPException)
    async def signed_out_pages_go_to_login(request: Request, exc: StarletteHTTPException):
        # A raw {"detail": "Not authenticated"} is a dead end for someone who followed a link.
        if exc.status_code == 401 and request.method in ("GET", "HEAD") and not request.url.path.startswith(
                f"{_page_root(request)}/api/"):
            return RedirectResponse(login_redirect_url(request, url_prefix), status_code=303,
                                    headers={"Cache-Control": "no-store"})
        return await http_exception_handler(request, exc)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    @retry_on_stale_credentials
    def lag_page(
        request: Request,
        can_read: DagReadCheck = Depends(dag_run_reader),
        cluster: str | None = Query(None, max_length=256),
        group: str | None = Query(None, max_length=512),
        q: str | None = Query(None, max_length=4096),
        severity: str | None = Query(None, max_length=64),
    ) -> HTMLResponse:
        from lagdoctor.web.data import current_index, incomplete_runs, incomplete_text, latest_states, read_shortfalls
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY, render
        from lagdoctor.web.views import SEVERITIES, group_view, severity_counts, workload_notes

        s = settings()
        index = current_index(s.findings_root)
        states, runs = latest_states(s.findings_root, cluster=cluster or None, group=group or None,
                                     can_read_dag=can_read, index=index)
        all_states = states if not (cluster or group) else latest_states(s.findings_root, can_read_dag=can_read,
                                                                         index=index)[0]
        matched, states, filter_error = _filters(states, q, severity)
        shown_runs = {st.run.run_key for st in states}
        runs = [r for r in runs if r.run_key in shown_runs or r.has_overrides]
        history = _history(s, states)  # after filtering: only the groups shown are read
        base = _airflow_base(request, url_prefix)
        root = _page_root(request)
        views = [group_view(st, history[st.key], airflow_base=base, page_root=root, now=clock()) for st in states]
        _link_local_reports(s, views, root)
        body = render(
            "page.html", views=views, runs=runs, counts=severity_counts(matched),
            clusters=sorted({st.cluster for st in all_states}), cluster=cluster, group=group,
            q=q or "", severity=severity or "", severities=SEVERITIES, filter_error=filter_error,
            filtered=bool(cluster or group or q or severity),
            unknown_member_clusters=sorted({v.cluster for v in views if v.members_unknown}),
            workload_notes=workload_notes(views),
            runs_not_read=index.not_read,
            incomplete=incomplete_text(incomplete_runs(s.findings_root, index, can_read)),
            cadence=_cadence(index, can_read)[1],
            shortfalls=read_shortfalls(s.data_root),
            generated_at=clock().strftime("%Y-%m-%d %H:%M:%S"),
            api_href="api/findings" + (f"?{request.url.query}" if request.url.query else ""),
        )
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    def _cadence(index, can_read: DagReadCheck) -> tuple[dict[str, Any] | None, str]:
        """How often sweeps really ran this last hour, and its line against the schedule (a skipped
        sweep writes nothing, so its gap shows)."""
        from lagdoctor.runindex import cadence_text, schedule_every_seconds
        from lagdoctor.stages.params import sweep_schedule

        cadence = index.sweep_cadence(clock(), can_read)
        return cadence, cadence_text(cadence, scheduled_every_seconds=schedule_every_seconds(sweep_schedule()))

    @app.get("/api/findings")
    @retry_on_stale_credentials
    def api_findings(
        request: Request,
        can_read: DagReadCheck = Depends(dag_run_reader),
        cluster: str | None = Query(None, max_length=256),
        group: str | None = Query(None, max_length=512),
        q: str | None = Query(None, max_length=4096),
        severity: str | None = Query(None, max_length=64),
    ) -> JSONResponse:
        from lagdoctor.web.data import current_index, incomplete_runs, incomplete_text, latest_states
        from lagdoctor.notify.provisional import is_provisional, promise_overdue
        from lagdoctor.web.views import dag_run_href, provisional_label

        s = settings()
        index = current_index(s.findings_root)
        states, runs = latest_states(s.findings_root, cluster=cluster or None, group=group or None,
                                     can_read_dag=can_read, index=index)
        _, states, filter_error = _filters(states, q, severity)
        if filter_error:
            return JSONResponse({"detail": filter_error}, status_code=400, headers=_NO_STORE)
        if q or severity:
            shown_runs = {st.run.run_key for st in states}
            runs = [r for r in runs if r.run_key in shown_runs or r.has_overrides]
        base = _airflow_base(request, url_prefix)
        now = clock()
        findings = [
            {**f, "run_key": st.run.run_key, "dag_id": st.run.dag_id, "run_id": st.run.run_id,
             "dag_run_url": dag_run_href(st.run, base),
             # issue 18: a provisional finding's short label (the fields themselves pass through)
             **({"provisional_label": " · ".join(provisional_label(f, now))} if provisional_label(f)[0] else {}),
             # issue 18: whether the time a provisional finding promised passed (the page says "overdue")
             **({"decision_overdue": promise_overdue(f.get("decided_by"), now)} if is_provisional(f) else {}),
             # null while current; else the newest sweep of the cluster did not collect it: a last verdict
             "not_collected_since": st.not_collected_since.isoformat() if st.not_collected_since else None}
            for st in states for f in st.findings
        ]
        body = {
            "generated_at": clock().isoformat(),
            "runs": [{**r.as_dict(), "dag_run_url": dag_run_href(r, base)} for r in runs],
            "findings": findings,
        }
        cadence, cadence_line = _cadence(index, can_read)
        body["sweep_cadence"] = {**(cadence or {}), "text": cadence_line}
        if index.not_read:
            body["runs_not_read"] = index.not_read  # older run folders the index has not read yet
        skipped = incomplete_runs(s.findings_root, index, can_read)
        if skipped:  # run folders not read because the diagnosis did not finish writing them
            body["incomplete_runs"] = [r.as_dict() for r in skipped]
            body["incomplete_runs_text"] = incomplete_text(skipped)
        return JSONResponse(_json_safe(body), headers=_NO_STORE)

    @app.get("/group/{cluster}/{group_id:path}", response_class=HTMLResponse, include_in_schema=False)
    def group_page(request: Request, cluster: str, group_id: str,
                   can_read: DagReadCheck = Depends(dag_run_reader)) -> HTMLResponse:
        return group_view_page(request, cluster, group_id, can_read)

    @app.get("/group", response_class=HTMLResponse, include_in_schema=False)
    def group_page_by_query(request: Request, cluster: str = Query(..., max_length=MAX_NAME),
                            group: str = Query(..., min_length=1, max_length=MAX_NAME),
                            can_read: DagReadCheck = Depends(dag_run_reader)) -> HTMLResponse:
        # Any group id a broker accepts (a newline, '/', '?', '#'): links.group_path's other form.
        return group_view_page(request, cluster, group, can_read)

    @retry_on_stale_credentials
    def group_view_page(request: Request, cluster: str, group_id: str, can_read: DagReadCheck) -> HTMLResponse:
        from lagdoctor.web.data import current_index, incomplete_runs, incomplete_text, latest_states, read_shortfalls
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY, render
        from lagdoctor.web.timeline import MAX_RUNS, group_timeline, problems_text, read_actions
        from lagdoctor.web.views import dag_run_href, group_view, workload_notes

        s = settings()
        index = current_index(s.findings_root)
        states, _ = latest_states(s.findings_root, cluster=cluster, group=group_id, can_read_dag=can_read,
                                  index=index)
        now = clock()
        timeline = group_timeline(s.findings_root, cluster, group_id, index=index, can_read_dag=can_read,
                                  actions=lambda: read_actions(s, cluster, group_id), now=now)
        if not states and not timeline.looks:
            # One line, and the same for a group the caller may not read: nothing confirmed.
            return PlainTextResponse(f"no consumer group {group_id[:200]!r} on cluster {cluster[:100]!r}\n",
                                     status_code=404, headers=_NO_STORE)
        history = _history(s, states)
        base = _airflow_base(request, url_prefix)
        root = _page_root(request)
        views = [group_view(st, history[st.key], airflow_base=base, with_rates=True, now=now) for st in states]
        _link_local_reports(s, views, root)
        body = render(
            "group.html", cluster=cluster, group_id=group_id, views=views, timeline=timeline,
            page_href=f"{root}/", run_href=lambda run: dag_run_href(run, base), problems_text=problems_text,
            max_runs=MAX_RUNS, incomplete=incomplete_text(incomplete_runs(s.findings_root, index, can_read)),
            unknown_member_clusters=sorted({v.cluster for v in views if v.members_unknown}),
            workload_notes=workload_notes(views),
            shortfalls={g: line for g, line in read_shortfalls(s.data_root).items() if g == group_id},
            generated_at=now.strftime("%Y-%m-%d %H:%M:%S"),
        )
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    @app.get("/reports/{run_key}/{name}", response_class=HTMLResponse, include_in_schema=False)
    @retry_on_stale_credentials
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

    @app.get("/backtests", response_class=HTMLResponse, include_in_schema=False)
    @retry_on_stale_credentials
    def backtests(can_read: DagReadCheck = Depends(dag_run_reader)) -> HTMLResponse:
        from html import escape

        from lagdoctor.backtest import BACKTEST_DAG_ID, BACKTESTS_FOLDER, LISTING_FILE
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY

        if not can_read(BACKTEST_DAG_ID):
            raise HTTPException(404, "no backtests")
        root = Path(join(settings().data_root, BACKTESTS_FOLDER))
        rows = []
        for folder in sorted(root.iterdir() if root.is_dir() else [], reverse=True)[:100]:
            try:
                r = json.loads((folder / LISTING_FILE).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # running, failed, or not a backtest
            sets = "; ".join(f"{s['name']}: {s['alerts']} alerts, {s['replies']} replies" for s in r.get("sets", []))
            rows.append(f'<tr><td><a href="backtests/{escape(folder.name)}">{escape(folder.name)}</a></td>'
                        f'<td>{escape(str(r.get("first_sweep", ""))[:16])} .. {escape(str(r.get("last_sweep", ""))[:16])}</td>'
                        f'<td>{r.get("sweeps", 0)}</td><td>{escape(sets)}</td></tr>')
        body = ("<!doctype html><html lang=en><head><meta charset=utf-8><title>backtests · lagdoctor</title></head>"
                "<body><h1>Backtests</h1><p>Trigger the kafka_lag_backtest DAG, or run <code>lagdoctor backtest</code>."
                "</p><table><tr><th>report</th><th>sweeps from .. to (UTC)</th><th>sweeps</th><th>sets</th></tr>"
                + "".join(rows) + "</table></body></html>")
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    @app.get("/backtests/{name}", response_class=HTMLResponse, include_in_schema=False)
    @retry_on_stale_credentials
    def backtest_report(name: str, can_read: DagReadCheck = Depends(dag_run_reader)) -> HTMLResponse:
        from lagdoctor.backtest import BACKTEST_DAG_ID, BACKTESTS_FOLDER, REPORT_HTML
        from lagdoctor.web.html import CONTENT_SECURITY_POLICY

        # a name, not a path: nothing the caller sends can leave the backtests folder
        if not _SAFE_NAME.match(name) or not can_read(BACKTEST_DAG_ID):
            raise HTTPException(404, "no such backtest")
        try:
            body = Path(join(settings().data_root, BACKTESTS_FOLDER, name, REPORT_HTML)).read_text(encoding="utf-8")
        except OSError:
            raise HTTPException(404, "no such backtest") from None
        return HTMLResponse(body, headers={**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY})

    return app


def _link_local_reports(s: Settings, views, root: str) -> None:
    """Link each finding's report through this app's route when the file exists: relative,
    so it works inside the Airflow UI whatever base URL the report was stamped with, if any.
    One listing per run shown."""
    import fsspec

    from lagdoctor.web.report import report_name

    fs, base = fsspec.core.url_to_fs(s.reports_root)
    written: dict[str, set[str]] = {}
    for v in views:
        for f in v.findings:
            if f.diagnosis in NO_PROBLEM_DIAGNOSES:
                continue
            run_key = v.run.run_key
            if run_key not in written:
                try:
                    written[run_key] = {p.rstrip("/").rsplit("/", 1)[-1]
                                        for p in fs.ls(f"{base.rstrip('/')}/{run_key}", detail=False)}
                except (FileNotFoundError, NotADirectoryError):
                    written[run_key] = set()
                except OSError as exc:  # the link is a convenience: the page shows without it
                    log.warning("reports of run %s not listed: %s", run_key, exc)
                    written[run_key] = set()
            name = report_name(f.raw)
            if name in written[run_key]:
                f.report_url = f"{root}/reports/{quote(run_key, safe='')}/{quote(name, safe='')}"


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
