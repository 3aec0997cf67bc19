"""What the page and the report show, built from a run's files and the offset history.

Plain data for the Jinja templates; every number is formatted here with the
Slack renderer's helpers so Slack, the page and the report read the same.
Nothing here escapes HTML: the templates autoescape every value.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import quote

from markupsafe import Markup

from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES
from lagdoctor.notify.formatting import fmt_int, fmt_rate
from lagdoctor.notify.lag_text import (
    DATA_LOSS_BASIS,
    catch_up_text,
    data_loss_state,
    data_loss_text,
    is_lower_bound,
    retention_text,
    stuck_record_parts,
    table_time_lag,
    time_lag_source_of,
    time_lag_text,
)
from lagdoctor.notify.render import DESCRIBE_COLUMNS, EXTRA_COLUMNS
from lagdoctor.notify.workload_text import run_wide_reason, workload_lines
from lagdoctor.web import charts
from lagdoctor.web.data import SEVERITY_RANK, GroupHistory, GroupState, Run

CHART_PARTITIONS = 8  # lines drawn one per partition; the rest are summed into "others"
# Where the broker lists no group members (some Kafka-compatible brokers) every
# group's owner is unknown: the page and the report say why once, in a note,
# and each row just says "unknown".
UNKNOWN_MEMBERS = "unknown"
BROKER_NO_MEMBERS = "unknown (the broker lists no members)"  # the job's owner text (diagnosis.classify)
SEVERITIES = ("ok", "warning", "critical")  # least to most bad: the page's minimum-severity filter
MAX_FILTER_LENGTH = 512
# What a partition or group with too few snapshots shows instead of a status or "healthy" (issue 29).
COLLECTING_LABEL = "collecting history"
STATUS_RANK = {"OK": 0, "WARN": 1, "REWIND": 2, "STALL": 3, "STOP": 4, "ERR": 5}
TIME_LAG_NOTES = {"record": "exact, from the timestamp of the record at the committed offset",
                  "next_record": "exact, from the timestamp of the first data record after the committed offset",
                  "lower_bound": "at least: the committed offset is older than the window",
                  "interpolated": "estimated from the log end offsets over the window"}


def display_summary(summary: str) -> str:
    """A finding's summary as shown: the broker's missing member list is said once per page, not per row."""
    return summary.replace(BROKER_NO_MEMBERS, UNKNOWN_MEMBERS)


def group_href(page_root: str, cluster: str, group_id: str) -> str:
    """The group view under the app's mount point (links.group_url's shape, relative to the UI)."""
    from lagdoctor.web.links import group_path

    return f"{page_root.rstrip('/')}{group_path(cluster, group_id)}"


def group_matcher(pattern: str | None) -> Callable[[str], bool] | None:
    """The page's group filter: a regex found anywhere in the group id (anchor with ^ and $).

    RE2 (linear time, as --groups is), else Python's re with the length cap
    only. None for no filter; ValueError with one line when it does not compile.
    """
    if not pattern:
        return None
    shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
    if len(pattern) > MAX_FILTER_LENGTH:
        raise ValueError(f"group filter {shown!r} is {len(pattern)} characters long, at most {MAX_FILTER_LENGTH}")
    try:
        import re2
    except ImportError:
        try:
            return re.compile(pattern).search
        except re.error as exc:
            raise ValueError(f"group filter {shown!r} is not a valid regex: {exc}") from None
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own line to stderr
    try:
        return re2.compile(pattern, options).search
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(f"group filter {shown!r} is not a valid regex: {' '.join(reason.split())}") from None


def minimum_severity(value: str | None) -> str | None:
    """The page's severity filter (ok, warning, critical); ValueError with one line for anything else."""
    if not value:
        return None
    if value not in SEVERITIES:
        raise ValueError(f"unknown severity {value[:40]!r}: one of {', '.join(SEVERITIES)}")
    return value


def at_least(severity: str, minimum: str | None) -> bool:
    return minimum is None or SEVERITY_RANK.get(severity, 0) >= SEVERITY_RANK[minimum]


def title_of(diagnosis: str) -> str:
    return diagnosis.replace("_", " ").capitalize() if diagnosis else "Finding"


def provisional_label(finding: Mapping[str, Any], now: datetime | None = None) -> tuple[str, str]:
    """("Still deciding: partition imbalance or stalled consumer", "will know at the first sweep after 10:40 UTC")
    for a provisional finding (issue 18), ("", "") for a decided one. Once that time passed by ``now``
    the note says so: "was due at the first sweep after 10:40 UTC: overdue"."""
    from lagdoctor.notify.provisional import deciding_between_text, is_provisional, promise_text

    if not is_provisional(finding):
        return "", ""
    return "Still deciding: " + deciding_between_text(finding).replace(" and ", " or "), promise_text(finding, now)


def finding_title(finding: Mapping[str, Any]) -> str:
    return provisional_label(finding)[0] or title_of(str(finding.get("diagnosis") or ""))


def dag_run_href(run: Run, airflow_base: str = "") -> str | None:
    """The Airflow 3 UI page of the run behind a findings folder (/dags/{dag_id}/runs/{run_id})."""
    if not run.dag_id or not run.run_id:
        return None
    return f"{airflow_base.rstrip('/')}/dags/{quote(run.dag_id, safe='')}/runs/{quote(run.run_id, safe='')}"


def anchor_of(key: tuple[str, str, str]) -> str:
    """A stable HTML id for a (cluster, group, topic): names may hold any character."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", "-".join(key)).strip("-")[:48] or "group"
    digest = hashlib.sha1("\x00".join(key).encode()).hexdigest()[:8]
    return f"g-{slug}-{digest}"


@dataclass
class Owner:
    label: str  # member id, or why there is none
    client_id: str | None
    host: str | None
    partitions: list[int]
    known: bool = True
    # its pod and workload (lagdoctor.notify.workload_text): "known" or "unknown" (then `workload`
    # says why); "" when the plan traced no finding to this member (a healthy group, an older run)
    workload_kind: str = ""
    workload: str = ""


@dataclass
class PartitionRow:
    partition: int
    status: str | None
    lag: str
    time_lag: str
    produce_rate: str
    consume_rate: str
    current_offset: str
    log_end_offset: str
    member_id: str | None
    client_id: str | None
    host: str | None
    involved: bool = False
    lag_value: float = -1.0
    time_lag_note: str = ""  # how the time lag is known (a tooltip), "" when the run did not say
    owner: str = "-"  # host, else member id, else why there is none
    collecting: bool = False  # too few snapshots: the status shown is COLLECTING_LABEL, never OK

    @property
    def status_text(self) -> str:
        return COLLECTING_LABEL if self.collecting else (self.status or "-")

    @property
    def status_class(self) -> str:
        if self.collecting:
            return "collecting"
        return {"OK": "ok", "WARN": "warning"}.get(self.status or "", "critical" if self.status else "none")


@dataclass
class FindingView:
    diagnosis: str
    title: str
    severity: str
    pattern: str
    summary: str
    partitions: list[int]
    report_url: str | None
    plan: Mapping[str, Any]
    raw: Mapping[str, Any]
    provisional_note: str = ""  # issue 18: "will know at the first sweep after 10:40 UTC" while undecided


@dataclass
class GroupView:
    cluster: str
    group_id: str
    topic: str
    anchor: str
    severity: str
    findings: list[FindingView]
    run: Run
    run_href: str | None
    window_start: str
    window_end: str
    lag_total: str
    time_lag: str
    group_state: str
    members: str
    owners: list[Owner]
    rows: list[PartitionRow]
    lag_chart: Markup
    time_lag_chart: Markup
    rate_chart: Markup | None = None
    describe_rows: list[list[str]] = field(default_factory=list)
    catch_up: str = ""  # "" for runs before the forecasts (issue 10): nothing is shown
    data_loss: str = ""
    data_loss_state: str = ""
    data_loss_basis: str = ""
    retention: str = ""
    members_unknown: bool = False  # the broker lists no members: the page's note explains "unknown"
    group_href: str | None = None  # the group view, on the page
    not_collected_since: str = ""  # "" while current; else the newest sweep of the cluster did not collect it
    last_sweep_at: str = ""
    workload_unavailable: str = ""  # the run could trace no member (no Kubernetes API): said once per run

    @property
    def stale(self) -> bool:
        return bool(self.not_collected_since)

    @property
    def healthy(self) -> bool:
        return all(f.diagnosis == "healthy" for f in self.findings)

    @property
    def collecting(self) -> bool:
        """Only collecting history (issue 29): no verdict yet, shown as such, never as healthy."""
        return bool(self.findings) and all(f.diagnosis == COLLECTING_HISTORY for f in self.findings)

    @property
    def folded(self) -> bool:
        """Shown folded, as a line: nothing to act on (healthy, or no verdict yet)."""
        return self.healthy or self.collecting


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _broker_lists_no_members(state: GroupState, history: GroupHistory) -> bool:
    """The member count is there and null (the broker's answer), not merely missing (an older run)."""
    latest = history.latest_rows()
    row = latest[-1] if latest else (state.findings[0].get("evidence") or {} if state.findings else {})
    return "group_members" in row and row["group_members"] is None


def _members_text(state: GroupState, history: GroupHistory) -> tuple[str, str]:
    latest = history.latest_rows()
    ev = state.findings[0].get("evidence") or {} if state.findings else {}
    if latest:
        members, group_state = latest[-1].get("group_members"), latest[-1].get("group_state")
    else:
        members, group_state = ev.get("group_members"), ev.get("group_state")
    text = UNKNOWN_MEMBERS if members is None else f"{members} live member{'s' if members != 1 else ''}"
    return text, str(group_state or "-")


def owners_of(state: GroupState, history: GroupHistory) -> list[Owner]:
    """Who owns which partition at the window's end, each with its pod and workload when traced."""
    owners = _owners(state, history)
    traced = {}
    for f in state.findings:  # worst first: the worst finding's words win for a shared owner
        ev = f.get("evidence") or {}
        lines = workload_lines(f)
        if lines:
            traced.setdefault((ev.get("owner_host"), ev.get("owner_client_id")), lines)
    for owner in owners:
        owner.workload_kind, owner.workload = traced.get((owner.host, owner.client_id), ("", ""))
    return owners


def workload_unavailable(state: GroupState) -> str:
    """Why no member of this group's run was traced to a pod ("no Kubernetes API: workload
    unknown"): the page says it once per run, not per member; "" otherwise."""
    return next(filter(None, map(run_wide_reason, state.findings)), "")


def _owners(state: GroupState, history: GroupHistory) -> list[Owner]:
    latest = history.latest_rows()
    if not latest:
        ev = state.findings[0].get("evidence") or {} if state.findings else {}
        if ev.get("owner_member_id") or ev.get("owner_host"):
            return [Owner(ev.get("owner_member_id") or "-", ev.get("owner_client_id"), ev.get("owner_host"),
                          [ev["partition"]] if isinstance(ev.get("partition"), int) else [])]
        if ev.get("group_members") is None:
            return [Owner(UNKNOWN_MEMBERS, None, None, [], known=False)]
        return []
    owners: dict[tuple[Any, Any, Any], Owner] = {}
    for row in latest:
        member = row.get("member_id")
        if member:
            key = (member, row.get("client_id"), row.get("host"))
            owner = owners.setdefault(key, Owner(member, row.get("client_id"), row.get("host"), []))
        else:
            if row.get("group_members") is None:
                why = UNKNOWN_MEMBERS
            elif row.get("group_members") == 0:
                why = f"no live member (group {row.get('group_state') or 'EMPTY'})"
            else:
                why = "unassigned"
            owner = owners.setdefault((None, why, None), Owner(why, None, None, [], known=False))
        owner.partitions.append(int(row["partition"]))
    return sorted(owners.values(), key=lambda o: (not o.known, o.partitions[:1]))


def partition_rows(state: GroupState, history: GroupHistory) -> list[PartitionRow]:
    status = {int(r["partition"]): r for r in state.status_rows if isinstance(r.get("partition"), int)}
    snap = {int(r["partition"]): r for r in history.latest_rows()}
    involved = {p for f in state.findings if f.get("diagnosis") not in NO_PROBLEM_DIAGNOSES
                for p in f.get("partitions") or []}
    rows = []
    for p in sorted(set(status) | set(snap)):
        s, h = status.get(p, {}), snap.get(p, {})
        lag = s.get("lag", h.get("lag"))
        owner = h.get("host") or h.get("member_id") or (UNKNOWN_MEMBERS if h and h.get("group_members") is None
                                                        else "-")
        rows.append(PartitionRow(
            partition=p, status=s.get("status"), lag=fmt_int(lag), time_lag=table_time_lag(s),
            time_lag_note=TIME_LAG_NOTES.get("lower_bound" if is_lower_bound(s) else str(s.get("time_lag_source")), ""),
            produce_rate=fmt_rate(s.get("produce_rate")), consume_rate=fmt_rate(s.get("consume_rate")),
            current_offset=fmt_int(h.get("committed_offset")), log_end_offset=fmt_int(h.get("log_end_offset")),
            member_id=h.get("member_id"), client_id=h.get("client_id"), host=h.get("host"),
            involved=p in involved, lag_value=_num(lag) if _num(lag) is not None else -1.0, owner=owner,
            collecting=s.get("collecting_history") is True,
        ))
    return rows


def _chart_partitions(history: GroupHistory) -> tuple[list[int], list[int]]:
    """The partitions drawn one by one (highest lag at the end) and the rest."""
    def last_lag(p: int) -> float:
        return next((float(v) for v in reversed(history.partitions[p].lag) if v is not None), -1.0)

    ranked = sorted(history.partitions, key=lambda p: (-last_lag(p), p))
    if len(ranked) <= CHART_PARTITIONS:
        return sorted(ranked), []
    return sorted(ranked[: CHART_PARTITIONS - 1]), sorted(ranked[CHART_PARTITIONS - 1:])


def _combined(history: GroupHistory, parts: list[int], values_of, how) -> list[tuple[datetime, float | None]]:
    by_t: dict[datetime, list[float]] = {}
    for p in parts:
        h = history.partitions[p]
        for t, v in zip(h.ts, values_of(h)):
            if v is not None:
                by_t.setdefault(t, []).append(float(v))
    return [(t, how(vs)) for t, vs in sorted(by_t.items())]


def lag_charts(history: GroupHistory, title: str, x_range=None) -> tuple[Markup, Markup]:
    shown, rest = _chart_partitions(history)
    lag_series = [charts.Series(f"p{p}", list(zip(history.partitions[p].ts, history.partitions[p].lag))) for p in shown]
    tl_series = [charts.Series(f"p{p}", list(zip(history.partitions[p].ts, history.partitions[p].time_lag())))
                 for p in shown]
    if rest:
        lag_series.append(charts.Series(f"{len(rest)} others (sum)", _combined(history, rest, lambda h: h.lag, sum),
                                        color="#8895a7", dashed=True))
        tl_series.append(charts.Series(f"{len(rest)} others (max)",
                                       _combined(history, rest, lambda h: h.time_lag(), max),
                                       color="#8895a7", dashed=True))
    lag = charts.time_chart(lag_series, title=f"Lag per partition (messages): {title}", x_range=x_range)
    tl = charts.time_chart(tl_series, title=f"Time lag per partition: {title}", y_format=charts.fmt_seconds,
                           y_ticks=lambda lo, hi: charts.duration_ticks(hi), x_range=x_range)
    return lag, tl


def rate_chart(history: GroupHistory, title: str, x_range=None) -> Markup:
    times, produce, consume = history.rates()
    return charts.time_chart(
        [charts.Series("produced", list(zip(times, produce)), color="#4e79a7"),
         charts.Series("consumed", list(zip(times, consume)), color="#f28e2b")],
        title=f"Produce vs consume rate (msg/s): {title}", y_format=charts.fmt_rate, x_range=x_range,
        empty_text="fewer than two complete snapshots in the window",
    )


def describe_rows(state: GroupState, history: GroupHistory) -> list[list[str]]:
    """The evidence table, worst partition first: kafka-consumer-groups.sh --describe plus time lag and rates."""
    rows = sorted(partition_rows(state, history), key=lambda r: (-r.lag_value, r.partition))
    return [[state.group_id, state.topic, str(r.partition), r.current_offset, r.log_end_offset, r.lag,
             r.member_id or "-", r.host or "-", r.client_id or "-", r.time_lag, r.produce_rate, r.consume_rate]
            for r in rows]


DESCRIBE_HEADER = list(DESCRIBE_COLUMNS + EXTRA_COLUMNS)


def _lag_total(state: GroupState) -> Any:
    for f in state.findings:
        ev = f.get("evidence") or {}
        for k in ("lag_total", "lag"):
            if _num(ev.get(k)) is not None:
                return ev[k]
    lags = [r.get("lag") for r in state.status_rows if _num(r.get("lag")) is not None]
    return sum(lags) if lags else None


def _time_lag(state: GroupState) -> Any:
    values = [(f.get("evidence") or {}).get(k) for f in state.findings for k in ("max_time_lag_seconds", "time_lag_seconds")]
    values += [r.get("time_lag_seconds") for r in state.status_rows]
    values = [v for v in values if _num(v) is not None]
    return max(values) if values else None


def _time_lag_text(state: GroupState) -> str:
    seconds = _time_lag(state)
    rows = [*state.status_rows, *((f.get("evidence") or {}) for f in state.findings)]
    return time_lag_text(seconds, time_lag_source_of(seconds, rows))


def _forecast_evidence(state: GroupState, key: str) -> Mapping[str, Any]:
    """The evidence of the worst finding that carries ``key`` (the group's forecasts are
    the same in each of its findings), or {}."""
    return next((ev for ev in ((f.get("evidence") or {}) for f in state.findings)
                 if isinstance(ev.get(key), Mapping)), {})


@dataclass
class StuckRecord:
    """The record a stalled consumer is stuck on, as the collector saw it (never its payload)."""

    partition: str | None
    offset: str | None = None
    key: str | None = None
    size: str | None = None
    headers: str | None = None
    produced: str | None = None
    error: str | None = None


def stuck_record_of(finding: Mapping[str, Any]) -> StuckRecord | None:
    """A stalled_consumer finding's committed record, or None (other diagnoses, older runs)."""
    ev = finding.get("evidence") or {}
    rec = ev.get("committed_record")
    if finding.get("diagnosis") != "stalled_consumer" or not isinstance(rec, Mapping):
        return None
    partition = str(ev["partition"]) if isinstance(ev.get("partition"), int) else None
    parts = stuck_record_parts(ev)
    if parts is None:
        return StuckRecord(partition, error=str(rec["error"])) if rec.get("error") else None
    headers = [str(h) for h in rec.get("headers") or [] if h is not None]
    return StuckRecord(
        partition, offset=fmt_int(rec.get("offset")), key=str(rec["key_sha256"]) if rec.get("key_sha256") else "no key",
        size=f"{fmt_int(rec['size'])} bytes" if _num(rec.get("size")) is not None else None,
        headers=", ".join(headers) if headers else None,
        produced=next((p.removeprefix("produced ") for p in parts if p.startswith("produced ")), None),
    )


def group_view(state: GroupState, history: GroupHistory, *, airflow_base: str = "", with_rates: bool = False,
               page_root: str | None = None, now: datetime | None = None) -> GroupView:
    """``page_root``: the app's mount path, to link the group's view; None (the report) links nothing.
    ``now``: the page's time, to mark a provisional finding's promise overdue (None: never)."""
    start, end = state.window
    x_range = (start, end) if start and end else None
    name = f"{state.group_id} on {state.topic}"
    lag_svg, tl_svg = lag_charts(history, name, x_range)
    members, group_state = _members_text(state, history)
    loss = _forecast_evidence(state, "data_loss")
    findings = [
        FindingView(diagnosis=str(f.get("diagnosis") or ""), title=finding_title(f),
                    severity=str(f.get("severity") or "ok"), pattern=str(f.get("pattern") or "-"),
                    summary=display_summary(str(f.get("summary") or "")), partitions=list(f.get("partitions") or []),
                    report_url=f.get("report_url"), plan=state.plans.get(str(f.get("diagnosis")), {}), raw=f,
                    provisional_note=provisional_label(f, now)[1])
        for f in state.findings
    ]
    return GroupView(
        cluster=state.cluster, group_id=state.group_id, topic=state.topic, anchor=anchor_of(state.key),
        severity=state.severity, findings=findings, run=state.run, run_href=dag_run_href(state.run, airflow_base),
        window_start=f"{start:%Y-%m-%d %H:%M:%S}" if start else "-", window_end=f"{end:%H:%M:%S} UTC" if end else "-",
        lag_total=fmt_int(_lag_total(state)), time_lag=_time_lag_text(state),
        group_state=group_state, members=members, owners=owners_of(state, history),
        rows=partition_rows(state, history), lag_chart=lag_svg, time_lag_chart=tl_svg,
        rate_chart=rate_chart(history, name, x_range) if with_rates else None,
        describe_rows=describe_rows(state, history) if with_rates else [],
        catch_up=catch_up_text(_forecast_evidence(state, "catch_up")),
        data_loss=data_loss_text(loss), data_loss_state=data_loss_state(loss) or "",
        data_loss_basis=DATA_LOSS_BASIS.get(str((loss.get("data_loss") or {}).get("basis")), ""),
        retention=retention_text(loss),
        members_unknown=_broker_lists_no_members(state, history)
        or any(BROKER_NO_MEMBERS in str(f.get("summary") or "") for f in state.findings),
        # group_id "": the cluster's group listing failed (contracts.LISTING_ROW_GROUP), no group to link to
        group_href=group_href(page_root, state.cluster, state.group_id)
        if page_root is not None and state.group_id else None,
        not_collected_since=f"{state.not_collected_since:%Y-%m-%d %H:%M} UTC" if state.not_collected_since else "",
        last_sweep_at=f"{state.last_sweep_at:%Y-%m-%d %H:%M} UTC" if state.last_sweep_at else "",
        workload_unavailable=workload_unavailable(state),
    )


def severity_counts(views: Sequence[GroupView]) -> dict[str, int]:
    """Current verdicts by severity; a group no longer collected counts apart ("not_collected"):
    its last verdict is not current, whatever it was; one still collecting history too ("collecting"):
    it has no verdict yet."""
    counts = {"critical": 0, "warning": 0, "ok": 0, "not_collected": 0, "collecting": 0}
    for v in views:
        key = "not_collected" if v.stale else "collecting" if _collecting_state(v) else v.severity
        counts[key] = counts.get(key, 0) + 1
    return counts


def _collecting_state(state) -> bool:
    """A GroupState or GroupView whose every finding is collecting_history."""
    diagnoses = [f.diagnosis if isinstance(f, FindingView) else f.get("diagnosis") for f in state.findings]
    return bool(diagnoses) and all(d == COLLECTING_HISTORY for d in diagnoses)


def workload_notes(views: Sequence[GroupView]) -> list[tuple[Run, str]]:
    """(run, why) for each run shown whose members could not be traced at all: one line per run."""
    notes: dict[str, tuple[Run, str]] = {}
    for v in views:
        if v.workload_unavailable:
            notes.setdefault(v.run.run_key, (v.run, v.workload_unavailable))
    return sorted(notes.values(), key=lambda n: n[0].planned_at, reverse=True)
