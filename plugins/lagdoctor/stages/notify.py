"""Telling people: the reports, the Slack posts of a run's findings and quarantine, what Slack kept back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from lagdoctor.contracts import COLLECTING_HISTORY
from lagdoctor.settings import Settings
from lagdoctor.stages.common import read_plans
from lagdoctor.stages.diagnose import read_quarantined

log = logging.getLogger(__name__)


def write_reports(output: str, *, on_failure: Callable[[str], None] | None = None) -> int:
    """One HTML report per problem (linked from Slack when LAGDOCTOR_REPORT_BASE_URL is set).

    A report is an extra: when writing fails or times out, this raises (its task
    fails, so the run shows it) after handing `on_failure` one line, "report not
    written: <reason>", for the Slack post that runs after it anyway."""
    from lagdoctor.notify.redact import one_line
    from lagdoctor.runindex import record_run
    from lagdoctor.web.report import write_incident_report

    record_run(output)  # the lag page and the exporter find this run without a scan (never raises)

    try:
        paths = write_incident_report(output)
    except BaseException as exc:  # the task's timeout too: AirflowTaskTimeout is a BaseException
        line = f"report not written: {one_line(exc)}"
        log.error("%s", line)
        if on_failure is not None:
            on_failure(line)
        raise
    for path in paths:
        log.info("report: %s", path)
    return len(paths)


class SlackUndelivered(RuntimeError):
    """Slack did not take some messages; they wait in the outbox for the next run."""


def undelivered(results: list[Mapping[str, Any]]) -> tuple[int | None, str | None]:
    """(messages still in the outbox, why) after the last call: each call tries the
    whole outbox, so the last one's count is the outbox's, not a share to add up.
    None: some wait, how many is unknown (the state database went away mid-call)."""
    reported = [r for r in results if isinstance(r, Mapping) and "undelivered" in r]
    if not reported:
        return 0, None
    raw = reported[-1].get("undelivered")
    count = None if raw is None else int(raw)
    error = reported[-1].get("delivery_error") or next(
        (r.get("delivery_error") for r in reversed(reported) if r.get("delivery_error")), None)
    return count, error


def raise_ifundelivered(results: list[Mapping[str, Any]]) -> None:
    """After everything was queued: one line when Slack kept some of it back. A rate limit
    alone is a warning, not a failure: the messages go out, in order, at the next run, and
    a failed task would page people and retry work that was done."""
    from lagdoctor.notify.redact import one_line

    count, error = undelivered(results)
    reported = [r for r in results if isinstance(r, Mapping) and "undelivered" in r]
    if count and reported[-1].get("rate_limited"):
        log.warning("Slack: %d message(s) wait in the outbox, in order, for the next run: %s",
                    count, one_line(error) if error else "rate limited")
        return
    if count is None or count:
        how_many = "an unknown number of" if count is None else str(count)
        raise SlackUndelivered(f"Slack: {how_many} message(s) not delivered, kept in the outbox: "
                               f"{one_line(error) if error else 'no reason given'}")


def post_quarantine_notice(output: str, *, settings: Settings | None = None) -> dict[str, Any] | None:
    """One Slack notice for the files this run's diagnosis moved aside; None when none were."""
    from lagdoctor.notify.incidents import post_notice
    from lagdoctor.notify.render import render_quarantine_notice

    entries = read_quarantined(output)
    if not entries:
        return None
    # Keyed by the run's folder: a retried task does not post it again.
    key = "quarantine:" + output.rstrip("/").rsplit("/", 1)[-1]
    return post_notice(render_quarantine_notice(entries), dedupe_key=key, settings=settings)


def short_history(finding: Mapping[str, Any]) -> bool:
    """The finding was given on fewer snapshots than the rules need (classify's rule case 28):
    collecting_history, or a crash called on its first snapshots (evidence decides_at set)."""
    evidence = finding.get("evidence") or {}
    return finding.get("diagnosis") == COLLECTING_HISTORY or bool(
        isinstance(evidence, Mapping) and evidence.get("decides_at"))


def post_watching_notices(findings: list[Mapping[str, Any]], *, settings: Settings | None = None,
                          ) -> list[dict[str, Any]]:
    """A new deployment says once, per cluster, which groups it watches and when their first
    verdicts come: on a sweep where every finding of the cluster still collects history.
    Keyed by the cluster (``watching:<cluster>``), so later sweeps post nothing; a cluster with
    any decided group is not new, and posts nothing either."""
    from lagdoctor.notify.incidents import post_notice
    from lagdoctor.notify.render import render_watching_notice

    by_cluster: dict[str, list[Mapping[str, Any]]] = {}
    for f in findings:
        by_cluster.setdefault(str(f.get("cluster") or ""), []).append(f)
    results = []
    for cluster, found in sorted(by_cluster.items()):
        if found and all(short_history(f) for f in found):
            results.append(post_notice(render_watching_notice(cluster, found), dedupe_key=f"watching:{cluster}",
                                       settings=settings))
    return results


def _finding_key(finding: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(finding.get(k) or "") for k in ("cluster", "group_id", "topic"))


def recent_own_actions(settings: Settings | None, now: datetime) -> list[dict[str, Any]]:
    """lagdoctor's own executed actions whose effect a sweep can still check or explain; [] (and one
    log line) when the state database cannot say: the findings then go out without that line."""
    from lagdoctor.remediation.audit import ActionLog
    from lagdoctor.remediation.postcheck import ATTRIBUTION_SECONDS, CHECKED_ACTIONS
    from lagdoctor.state import is_unavailable, unavailable_line

    try:
        from lagdoctor.notify.incidents import batch_state_db

        records = ActionLog(batch_state_db(settings)).executed_since(now - timedelta(seconds=ATTRIBUTION_SECONDS))
    except Exception as exc:
        if not is_unavailable(exc):
            raise
        from lagdoctor.notify.incidents import note_state_unavailable

        line = unavailable_line(exc)
        log.warning("lagdoctor's own recent actions unknown: %s", line)
        note_state_unavailable(line)
        return []
    return [r for r in records if r.get("action") in CHECKED_ACTIONS and not r.get("dry_run")]


def _explains(record: Mapping[str, Any], finding: Mapping[str, Any]) -> bool:
    """Partitions added to a topic change every group on it; the other actions, their own group."""
    if (record.get("cluster"), record.get("topic")) != (finding.get("cluster"), finding.get("topic")):
        return False
    return record.get("action") == "add_partitions" or record.get("group_id") == finding.get("group_id")


def with_own_actions(finding: Mapping[str, Any], records: list[Mapping[str, Any]], now: datetime) -> Mapping[str, Any]:
    """The finding with ``evidence.own_actions``: a line per recent action of lagdoctor's that explains
    part of it (postcheck.attribution); the finding itself when none does."""
    from lagdoctor.remediation.postcheck import attribution

    lines = [line for r in records if _explains(r, finding) for line in [attribution(r, finding, now)] if line]
    if not lines:
        return finding
    evidence = finding.get("evidence") if isinstance(finding.get("evidence"), Mapping) else {}
    return {**finding, "evidence": {**evidence, "own_actions": lines}}


def check_own_actions(items: list[Mapping[str, Any]], records: list[Mapping[str, Any]], now: datetime, *,
                      settings: Settings | None) -> list[Mapping[str, Any]]:
    """Say once in each action's thread whether it worked, from this run's finding of its group
    (postcheck rules 1-6); nothing while pending or not yet decided."""
    from lagdoctor.notify.incidents import post_action_check
    from lagdoctor.remediation.postcheck import GIVE_UP_SECONDS, post_check

    results = []
    by_key: dict[tuple[str, ...], Mapping[str, Any]] = {}
    for item in items:
        by_key.setdefault(_finding_key(item["finding"]), item["finding"])
    for record in records:
        finding = by_key.get(_finding_key(record))
        check = post_check(record, finding, now) if finding is not None else None
        if check is not None and check.verdict in ("worked", "failed"):
            results.append(post_action_check(record, check.verdict, check.text, after_seconds=GIVE_UP_SECONDS,
                                             settings=settings, now=now))
    return results


def post_findings(
    plans_path: str, run_id: str, *, incident_scope: str | None = None, settings: Settings | None = None,
    report_error: str | None = None, now: datetime | None = None, executor: str | None = None,
) -> dict[str, int]:
    """Tell Slack. A sweep posts, updates or closes each incident key's own thread;
    a manual incident run (`incident_scope` set) keeps the whole run in one thread.
    Both are deduplicated by their stores, so a retried task posts nothing twice.

    Everything is handed to the notify layer first; only then, if Slack kept
    messages back (they wait in the outbox), SlackUndelivered says how many;
    for a rate limit, one warning line says it instead (see raise_ifundelivered).
    `report_error`: write_reports' line when it failed, said once here (the findings go out without links).
    `executor`: Airflow's; a distributed one with the spool on this worker's disk is refused
    (SpoolNotShared) before anything is posted.
    """
    from lagdoctor.notify.incidents import (delivery_batch, findings_without_news, post_incident_run,
                                            post_or_update_incident)
    from lagdoctor.notify.spool import check_shared

    settings = settings or Settings.from_env()  # one object: the batch resolves the state database once for it
    check_shared(settings, executor=executor)
    if report_error:
        log.warning("%s", report_error)

    now = now or datetime.now(timezone.utc)
    items = read_plans(plans_path)
    results: list[Mapping[str, Any]] = []
    # One delivery as the batch ends; Slack down: queue everything, retry it once, not once per finding.
    with delivery_batch(now=now) as batch:
        own = recent_own_actions(settings, now) if items else []
        # What lagdoctor itself changed is said beside what it explains, never as a new unexplained problem.
        items = [{**i, "finding": with_own_actions(i["finding"], own, now)} for i in items]
        results.extend(check_own_actions(items, own, now, settings=settings))
        notice = post_quarantine_notice(plans_path.rstrip("/").rsplit("/", 1)[0], settings=settings)
        if notice is not None:
            results.append(notice)
        if incident_scope is not None:
            result = post_incident_run(items, run_id=run_id, scope=incident_scope, settings=settings, now=now)
            results.append(result)
            summary = {"problems": result["problems"], "findings": result["findings"]}
        else:
            summary = {}
            # issue 29: the groups a new deployment watches, once; then nothing per collecting group
            results += post_watching_notices([item["finding"] for item in items], settings=settings)
            collecting = [i for i in items if i["finding"].get("diagnosis") == COLLECTING_HISTORY]
            if collecting:
                summary["collecting"] = len(collecting)
            items = [i for i in items if i["finding"].get("diagnosis") != COLLECTING_HISTORY]
            # each finding with its sweep's others of the same (cluster, group, topic): a provisional thread
            # one of them still lands in is not superseded by another (notify.threads rule 8)
            sweeps: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
            for item in items:
                sweeps.setdefault(_finding_key(item["finding"]), []).append(item["finding"])
            # most findings of a big sweep are healthy groups with no thread: one query says so, no call each
            quiet = findings_without_news([item["finding"] for item in items], settings=settings)
            for n, item in enumerate(items):
                result = quiet.get(n) or post_or_update_incident(
                    item["finding"], item["plan"], run_id=run_id, settings=settings,
                    sweep=sweeps[_finding_key(item["finding"])], now=now)
                results.append(result)
                summary[result["decision"]] = summary.get(result["decision"], 0) + 1
    if batch.delivery is not None:
        results.append(batch.delivery)
    log.info("slack: %s", summary)
    raise_ifundelivered(results)
    return summary


def incident_scope(params: Mapping[str, Any]) -> str:
    """How an incident run names what it looked at, e.g. `kafka_default / orders-.* / orders`."""
    clusters = params.get("clusters") or [params.get("cluster", "")]
    parts = [", ".join(str(c) for c in clusters), str(params.get("group_pattern") or ".*")]
    if params.get("topic"):
        parts.append(str(params["topic"]))
    return " / ".join(parts)
