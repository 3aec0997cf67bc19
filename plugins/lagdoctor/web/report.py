"""Incident reports: one self-contained HTML file per non-healthy finding of a run.

    paths = write_incident_report(run_dir)          # after plan_findings, before the Slack post
    report_url(paths[0], "https://airflow.example.com/lagdoctor/reports/")

Files land at ``<reports_root>/<run_key>/<group>__<topic>__<diagnosis>-<hash>.html``
(hidden temporary name, then rename: a reader never sees half a report, and a
retried task rewrites the same files). Each holds inline CSS and SVG only, so
it opens from a disk, an attachment or the API server's
``/lagdoctor/reports/<run_key>/<file>`` route alike.

With a base URL (argument, else lagdoctor.web.links.report_base_url():
LAGDOCTOR_REPORT_BASE_URL, else Airflow's [api] base_url + /lagdoctor/reports)
each finding in the run's plans.json gets ``report_url``, which the Slack
message links to. Without one nothing is linked: never a broken link. The
report's DAG run and group name link into Airflow the same way, when it has a base URL.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from datetime import datetime, timezone
from typing import Any, Mapping
from urllib.parse import quote

from lagdoctor.contracts import NO_PROBLEM_DIAGNOSES
from lagdoctor.settings import Settings, join
from lagdoctor.web import links
from lagdoctor.web.links import REPORT_BASE_URL_ENV  # noqa: F401  (kept importable from here)


def report_name(finding: Mapping[str, Any]) -> str:
    """A readable, filesystem-safe file name; the hash keeps two names apart that
    the sanitising made equal (``a/b`` and ``a_b``)."""
    key = "\x00".join(str(finding.get(k, "")) for k in ("cluster", "group_id", "topic", "diagnosis"))
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]

    def safe(value: Any, n: int) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(value or "")).strip("._")[:n] or "x"

    return f"{safe(finding.get('group_id'), 60)}__{safe(finding.get('topic'), 40)}__" \
           f"{safe(finding.get('diagnosis'), 30)}-{digest}.html"


def report_url(path: str, base_url: str | None) -> str | None:
    """The URL of a report under ``base_url`` (the app's /lagdoctor/reports/ route), or None without one."""
    if not base_url:
        return None
    run_key, name = path.rstrip("/").rsplit("/", 2)[-2:]
    return f"{base_url.rstrip('/')}/{quote(run_key, safe='')}/{quote(name, safe='')}"


def _write_atomic(path: str, text: str) -> None:
    import fsspec

    from lagdoctor.objectstore import is_s3

    fs, target = fsspec.core.url_to_fs(path)
    if is_s3(path):
        # an object's PUT is atomic: a reader sees the old report or the new one. A temporary
        # object and a move would be a copy and a delete more, per report
        with fs.open(target, "wt", encoding="utf-8") as fh:
            fh.write(text)
        return
    directory, name = target.rsplit("/", 1)
    tmp = f"{directory}/.{name}.{uuid.uuid4().hex[:8]}.tmp"
    fs.makedirs(directory, exist_ok=True)
    try:
        with fs.open(tmp, "wt", encoding="utf-8") as fh:
            fh.write(text)
        fs.mv(tmp, target)
    except BaseException:
        if fs.exists(tmp):
            fs.rm(tmp)
        raise


def render_report(finding: Mapping[str, Any], view, *, plan: Mapping[str, Any] | None = None,
                  generated_at: datetime | None = None, environ: Mapping[str, str] | None = None) -> str:
    """One report's HTML; ``environ`` (default os.environ, then Airflow's config) gives the links' base URL."""
    from lagdoctor.web.html import render
    from lagdoctor.web.views import DESCRIBE_HEADER, FindingView, display_summary, stuck_record_of, title_of

    plan = {"title": "", "next_steps": [], "diagnostic_steps": [], "actions": [], **(plan or {})}
    f = FindingView(diagnosis=str(finding.get("diagnosis") or ""), title=title_of(str(finding.get("diagnosis") or "")),
                    severity=str(finding.get("severity") or "ok"), pattern=str(finding.get("pattern") or "-"),
                    summary=display_summary(str(finding.get("summary") or "")),
                    partitions=list(finding.get("partitions") or []), report_url=None, plan=plan, raw=finding)
    when = (generated_at or datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M:%S")
    run = view.run
    return render("report.html", f=f, v=view, plan=plan, describe_header=DESCRIBE_HEADER, generated_at=when,
                  stuck=stuck_record_of(finding),
                  run_href=links.run_url(run.dag_id or "", run.run_id or "", environ),
                  group_href=links.group_url(view.cluster, view.group_id, environ),
                  unknown_member_clusters=[view.cluster] if view.members_unknown else [])


def write_incident_report(run_dir: str, *, settings: Settings | None = None, base_url: str | None = None,
                          now: datetime | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Write a report for every non-healthy finding of the run in ``run_dir``; return their paths.

    Reads the run's findings, partition status and plans, and the offset
    history of each group over its finding's window from the snapshot store.
    Idempotent: the same run writes the same file names again (and, given the
    same ``now``, the same bytes: ``now`` is the "generated" stamp, default the clock).
    ``base_url`` "" links nothing; None takes links.report_base_url(environ).
    """
    from lagdoctor.web.data import finding_key, read_history, read_run, run_of, states_of_run
    from lagdoctor.web.views import group_view

    settings = settings or Settings.from_env()
    base_url = base_url if base_url is not None else (links.report_base_url(environ) or "")
    run = run_of(run_dir)
    # a problem to report: not healthy, and not still collecting history (issue 29: no verdict)
    data = read_run(run)
    states = states_of_run(data, {finding_key(f) for f in data.findings
                                  if f.get("diagnosis") not in NO_PROBLEM_DIAGNOSES})
    paths: list[str] = []
    urls: dict[tuple[str, str, str, str], str] = {}
    listings: dict[str, list[str]] = {}  # one store listing per cluster for the whole run, not one per group
    # one read of the store per window (a run's findings share theirs), not one per problem:
    # 2,000 problems once took 2,000 reads of every file in the window
    by_window: dict[tuple, list] = {}
    for state in states:
        by_window.setdefault(tuple(state.window), []).append(state.key)
    histories = {window: read_history(settings.snapshots_root, keys, *window, listings=listings)
                 for window, keys in by_window.items()}
    for state in states:
        view = group_view(state, histories[tuple(state.window)][state.key], with_rates=True)
        for finding in state.findings:
            if finding.get("diagnosis") in NO_PROBLEM_DIAGNOSES:
                continue
            path = join(settings.reports_root, run.run_key, report_name(finding))
            _write_atomic(path, render_report(finding, view, plan=state.plans.get(str(finding.get("diagnosis"))),
                                              generated_at=now, environ=environ))
            paths.append(path)
            url = report_url(path, base_url)
            if url:
                urls[(*state.key, str(finding.get("diagnosis")))] = url
    if urls:
        link_reports(run_dir, urls)
    return paths


def link_reports(run_dir: str, urls: Mapping[tuple[str, str, str, str], str]) -> int:
    """Stamp ``report_url`` on the findings of the run's plans.json (atomic rewrite);
    returns how many were linked. Keys are (cluster, group_id, topic, diagnosis)."""
    import fsspec

    from lagdoctor.web.data import PLANS_FILE

    path = join(run_dir, PLANS_FILE)
    try:
        with fsspec.open(path, "rt") as fh:
            items = json.load(fh)
    except FileNotFoundError:
        return 0
    linked = 0
    for item in items:
        f = item.get("finding") or {}
        url = urls.get((f.get("cluster"), f.get("group_id"), f.get("topic"), f.get("diagnosis")))
        if url:
            f["report_url"] = url
            linked += 1
    _write_atomic(path, json.dumps(items))
    return linked
