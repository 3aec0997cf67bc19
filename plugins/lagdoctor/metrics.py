"""Prometheus metrics from the latest findings: rendering only, no server state.

Every diagnosis run leaves a folder `<findings_root>/<run_key>/` holding
findings.jsonl and partition_status.jsonl (contract 2) and, once planned,
run.json. The current state of a (cluster, group, topic) is what the newest
run that covered it says: newest by run.json `planned_at`, or by the folder's
modification time when a run has no run.json (a bare `lagdoctor diagnose`).
A run with threshold overrides (run.json `threshold_overrides`, an incident
run's experiment) is never exported.
A (cluster, group, topic) that the newest sweep of its cluster did not collect
(run.json `kind` "sweep", the cluster in `clusters` or `clusters_unread`,
newer than the run holding the key's verdict) is not current: its series are
dropped, and `lagdoctor_not_collected_since_timestamp_seconds` says since when
(so no alert rule keeps firing on an 8-day-old verdict).
A group still collecting history (issue 29: fewer snapshots than the rules
need) has no verdict: its partitions' status is 0 (unknown), never 1 OK, its
collecting_history finding sets no severity and no `lagdoctor_finding`, and
`lagdoctor_collecting_history` says when it decides; its lag is exported.
Only complete run folders are read (lagdoctor.runindex.run_completeness, the
rule the lag page uses too: the job's _SUCCESS marker, written last); folders
that are incomplete (being written, or the job was killed) or cannot be read
(bad JSON) are skipped and logged; the run before them keeps answering. Only the run index's candidate folders
are read (lagdoctor.runindex): the same samples as from every folder, for a
listing of the root per scrape.

Names follow kafka-lag-exporter for lag (`kafka_consumergroup_group_*`, same
labels, so its dashboards work) and Burrow for status codes (1 OK .. 6 REWIND,
0 when unknown, as Burrow's StatusConstant numbers them). lagdoctor's own
verdicts are `lagdoctor_*`; the forecasts (`lagdoctor_lag_catch_up_seconds`,
`lagdoctor_data_loss_seconds`) come from findings' evidence and are absent for
runs written before it held them. Member labels (member_host, consumer_id,
client_id) are the partition's owner at the window's end when the diagnosis
knows it, and empty otherwise (Prometheus reads an empty label as absent).

With no runs at all the output is every family's HELP and TYPE and no samples:
`lagdoctor_last_diagnosis_timestamp_seconds` is absent, not 0, so a staleness
alert needs `absent(...)` beside its age test (docs/prometheus/).

Nothing is imported beyond the standard library, lagdoctor.contracts, fsspec,
lagdoctor.objectstore and lagdoctor.runindex (lazily), so the Airflow plugin can serve `render_metrics` as a route too.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lagdoctor.contracts import COLLECTING_HISTORY

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RUN_FILE = "run.json"  # written by stages.plan.plan_findings

# Burrow's StatusConstant order (NOTFOUND is 0); contract 3 lists the rest.
STATUS_CODES: Mapping[str, int] = {
    "NOTFOUND": 0, "OK": 1, "WARN": 2, "ERR": 3, "STOP": 4, "STALL": 5, "REWIND": 6,
}
SEVERITY_CODES: Mapping[str, int] = {"ok": 0, "warning": 1, "critical": 2}

_PARTITION_LABELS = ("cluster_name", "group", "topic", "partition", "member_host", "consumer_id", "client_id")
_GROUP_LABELS = ("cluster_name", "group")


@dataclass(frozen=True)
class MetricFamily:
    name: str
    help: str
    labels: tuple[str, ...]
    kind: str = "gauge"


FAMILIES: tuple[MetricFamily, ...] = (
    MetricFamily(
        "kafka_consumergroup_group_lag",
        "Offset lag of the group on this partition at the end of the latest diagnosis window.",
        _PARTITION_LABELS,
    ),
    MetricFamily(
        "kafka_consumergroup_group_lag_seconds",
        "Time lag in seconds of the group on this partition (how far behind real time), "
        "at the end of the latest diagnosis window.",
        _PARTITION_LABELS,
    ),
    MetricFamily(
        "kafka_consumergroup_group_max_lag",
        "Largest partition offset lag of the group across its topics.",
        _GROUP_LABELS,
    ),
    MetricFamily(
        "kafka_consumergroup_group_max_lag_seconds",
        "Largest partition time lag in seconds of the group across its topics.",
        _GROUP_LABELS,
    ),
    MetricFamily(
        "kafka_consumergroup_group_sum_lag",
        "Sum of the group's partition offset lags across its topics.",
        _GROUP_LABELS,
    ),
    MetricFamily(
        "kafka_consumergroup_group_topic_sum_lag",
        "Sum of the group's partition offset lags on this topic (the lag lagdoctor's severity uses).",
        ("cluster_name", "group", "topic"),
    ),
    MetricFamily(
        "kafka_partition_latest_offset",
        "Log end offset of the partition at the end of the latest diagnosis window, "
        "when the diagnosis reports it.",
        ("cluster_name", "topic", "partition"),
    ),
    MetricFamily(
        "lagdoctor_partition_status",
        "Burrow status of the group on this partition: 0 NOTFOUND, 1 OK, 2 WARN, 3 ERR, "
        "4 STOP, 5 STALL, 6 REWIND.",
        _PARTITION_LABELS,
    ),
    MetricFamily(
        "lagdoctor_group_status",
        "Burrow status of the group: its worst partition's (0 NOTFOUND, 1 OK, 2 WARN, 3 ERR, "
        "4 STOP, 5 STALL, 6 REWIND).",
        _GROUP_LABELS,
    ),
    MetricFamily(
        "lagdoctor_group_severity",
        "Worst severity of the group's current findings: 0 ok, 1 warning, 2 critical.",
        _GROUP_LABELS,
    ),
    MetricFamily(
        "lagdoctor_finding",
        "1 for each current non-healthy finding, labelled by what lagdoctor diagnosed.",
        ("cluster_name", "group", "topic", "diagnosis", "severity", "pattern"),
    ),
    MetricFamily(
        "lagdoctor_collecting_history",
        "Present while lagdoctor collects history for the group on this topic (too few snapshots for a "
        "verdict: neither healthy nor a problem): the Unix time its first verdict is due.",
        ("cluster_name", "group", "topic"),
    ),
    MetricFamily(
        "lagdoctor_lag_catch_up_seconds",
        "Seconds until the group's lag on this topic clears at current rates: +Inf when consumers are "
        "slower than producers, 0 when caught up (no lag). Absent when unknown.",
        ("cluster_name", "group", "topic"),
    ),
    MetricFamily(
        "lagdoctor_data_loss_seconds",
        "Seconds until retention deletes records of this topic the group has not read yet, at current "
        "rates; 0 when it already has. Absent when no loss is expected or it is unknown.",
        ("cluster_name", "group", "topic"),
    ),
    MetricFamily(
        "lagdoctor_not_collected_since_timestamp_seconds",
        "Unix time of the last data of a group on a topic that the newest sweep of its cluster did not "
        "collect (the group is gone, or its offsets could not be read). Its other series are dropped "
        "while this one is present; last_severity is its last verdict's.",
        ("cluster_name", "group", "topic", "last_severity"),
    ),
    MetricFamily(
        "lagdoctor_last_diagnosis_timestamp_seconds",
        "Unix time of the newest diagnosis run with findings for the cluster "
        "(run.json planned_at, else the run folder's modification time). Absent before the first run.",
        ("cluster_name",),
    ),
)
METRIC_NAMES: frozenset[str] = frozenset(f.name for f in FAMILIES)
FAMILY_LABELS: Mapping[str, tuple[str, ...]] = {f.name: f.labels for f in FAMILIES}


# -- reading the findings folders ------------------------------------------------

@dataclass(frozen=True)
class DiagnosisRun:
    """One findings folder: when it ran, and what it found."""

    key: str
    ran_at: float  # Unix seconds
    findings: list[dict[str, Any]] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    threshold_overrides: dict[str, Any] = field(default_factory=dict)  # run.json; non-empty: not exported
    sweep_clusters: frozenset[str] = frozenset()  # run.json: clusters this sweep looked at (runindex.sweep_clusters)


def _filesystem(root: str):
    import fsspec

    url = "s3://" + root[len("s3a://"):] if root.startswith("s3a://") else root
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


def _parse_time(value: Any) -> float | None:
    from lagdoctor.runindex import parse_time

    ts = parse_time(value)
    return None if ts is None else ts.timestamp()


def _sweep_clusters(meta: Any) -> set[str]:
    from lagdoctor.runindex import sweep_clusters

    return sweep_clusters(meta) if isinstance(meta, Mapping) else set()


def _mtime(info: Mapping[str, Any]) -> float | None:
    value = info.get("mtime", info.get("LastModified"))
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)):
        return float(value)
    return None


def _read_jsonl(fs, path: str) -> list[dict[str, Any]]:
    with fs.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _read_run(fs, folder: Mapping[str, Any], files: Mapping[str, Mapping[str, Any]]) -> DiagnosisRun | None:
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.runindex import run_completeness

    path = folder["name"].rstrip("/")
    key = path.rsplit("/", 1)[-1]
    state = run_completeness(fs, path, {name: info.get("size") for name, info in files.items()})
    if not state.complete:
        if state.reason:
            log.info("metrics: %s is incomplete (%s); skipped", path, state.reason)
        return None
    try:
        findings = _read_jsonl(fs, f"{path}/{FINDINGS_FILE}")
        partitions = _read_jsonl(fs, f"{path}/{PARTITION_STATUS_FILE}")
        ran_at, overrides, swept = None, {}, frozenset()
        if RUN_FILE in files:
            with fs.open(f"{path}/{RUN_FILE}", "rt", encoding="utf-8") as fh:
                meta = json.load(fh) or {}
            ran_at = _parse_time(meta.get("planned_at"))
            overrides = meta.get("threshold_overrides") if isinstance(meta.get("threshold_overrides"), dict) else {}
            swept = frozenset(_sweep_clusters(meta))
        for row in [*findings, *partitions]:
            _key(row)  # a row without its key fields makes the whole folder unreadable
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
        log.warning("metrics: cannot read %s (%s); skipped", path, exc)
        return None
    if ran_at is None:
        ran_at = _mtime(folder) or _mtime(files[FINDINGS_FILE]) or 0.0
    return DiagnosisRun(key=key, ran_at=ran_at, findings=findings, partitions=partitions,
                        threshold_overrides=overrides, sweep_clusters=swept)


class RunCache:
    """Parsed runs by folder, reused while none of the folder's files changed.

    A server keeps one across scrapes, so a long history of run folders costs
    a directory listing each, not a parse each.
    """

    def __init__(self) -> None:
        self._runs: dict[str, tuple[tuple, DiagnosisRun | None]] = {}

    def get(self, fs, folder: Mapping[str, Any]) -> DiagnosisRun | None:
        path = folder["name"].rstrip("/")
        files = {
            entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry
            for entry in fs.ls(path, detail=True)
            if entry.get("type") == "file"
        }
        signature = (_mtime(folder), tuple(sorted(
            (name, _mtime(info), info.get("size")) for name, info in files.items()
        )))
        held = self._runs.get(path)
        if held is not None and held[0] == signature:
            return held[1]
        run = _read_run(fs, folder, files)
        self._runs[path] = (signature, run)
        return run

    def forget_except(self, paths: set[str]) -> None:
        for path in set(self._runs) - paths:
            del self._runs[path]


def read_runs(findings_root: str, cache: RunCache | None = None) -> list[DiagnosisRun]:
    """The readable run folders under `findings_root` (a path or URI) that can hold a
    current verdict, from the run index (lagdoctor.runindex); [] if there is none.

    The samples equal those of every folder (``read_all_runs``); a scrape costs
    one listing of the root and, with `cache`, reads only candidate runs whose
    files changed since the last scrape.
    """
    return read_indexed(findings_root, cache)[0]


def read_indexed(findings_root: str, cache: RunCache | None = None) -> tuple[list[DiagnosisRun], dict[str, float]]:
    """``read_runs``, and per cluster the Unix time of the newest sweep that looked at it,
    from the index's record of every folded run (a sweep naming none of a cluster's
    groups is no candidate, yet says they were not collected); one refresh of the index."""
    from lagdoctor.runindex import refresh

    fs, root = _filesystem(findings_root)
    if not fs.exists(root):
        return [], {}
    index = refresh(findings_root)
    runs = _cached_runs(fs, [index.folders[name] for name in index.candidates()], cache or RunCache())
    return runs, {c: at.timestamp() for c, at in index.last_sweeps().items()}


def read_all_runs(findings_root: str, cache: RunCache | None = None) -> list[DiagnosisRun]:
    """Every readable run folder under `findings_root`: what ``read_runs`` is checked against."""
    fs, root = _filesystem(findings_root)
    if not fs.exists(root):
        return []
    entries = [e for e in fs.ls(root, detail=True) if e.get("type") == "directory"
               and not e["name"].rstrip("/").rsplit("/", 1)[-1].startswith((".", "_"))]
    return _cached_runs(fs, entries, cache or RunCache())


def _cached_runs(fs, entries: list[Mapping[str, Any]], cache: RunCache) -> list[DiagnosisRun]:
    """The readable runs of these folder entries, through the cache (which forgets the rest)."""
    runs = [run for run in (cache.get(fs, entry) for entry in entries) if run is not None]
    cache.forget_except({entry["name"].rstrip("/") for entry in entries})
    return runs


# -- from runs to samples ------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]
Samples = dict[str, dict[Labels, float]]


def _key(row: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(row["cluster"]), str(row["group_id"]), str(row["topic"]))


def latest_by_key(runs: Iterable[DiagnosisRun]) -> dict[tuple[str, str, str], DiagnosisRun]:
    """For each (cluster, group, topic), the newest run that covered it (ties: the later folder name).

    Runs with threshold overrides are left out: an incident run with
    {"warning_lag": 1} must not page anyone through an alert rule.
    """
    latest: dict[tuple[str, str, str], DiagnosisRun] = {}
    for run in runs:
        if run.threshold_overrides:
            continue
        for row in [*run.findings, *run.partitions]:
            k = _key(row)
            held = latest.get(k)
            if held is None or (run.ran_at, run.key) > (held.ran_at, held.key):
                latest[k] = run
    return latest


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _owner(row: Mapping[str, Any], findings: list[dict[str, Any]]) -> tuple[str, str, str]:
    """(member_host, consumer_id, client_id) of a partition: from its status row when the
    job put them there, else from a finding whose evidence names this partition's owner."""
    if any(row.get(k) is not None for k in ("host", "member_id", "client_id")):
        return _text(row.get("host")), _text(row.get("member_id")), _text(row.get("client_id"))
    for finding in findings:
        evidence = finding.get("evidence") or {}
        if evidence.get("partition") == row["partition"] and any(
            evidence.get(k) is not None for k in ("owner_host", "owner_member_id", "owner_client_id")
        ):
            return (_text(evidence.get("owner_host")), _text(evidence.get("owner_member_id")),
                    _text(evidence.get("owner_client_id")))
    return "", "", ""


def _forecast(findings: list[dict[str, Any]], key: str) -> list[tuple[str, float | None]]:
    """(state, seconds) of each finding's evidence[key] (catch_up, data_loss); none in runs before issue 10."""
    out = []
    for finding in findings:
        value = (finding.get("evidence") or {}).get(key)
        if isinstance(value, Mapping) and isinstance(value.get("state"), str):
            seconds = _number(value.get("seconds"))
            out.append((value["state"], seconds if seconds is None or math.isfinite(seconds) else None))
    return out


def catch_up_seconds(findings: list[dict[str, Any]]) -> float | None:
    """+Inf for never and for a lag holding steady (it does not clear at current rates either), 0
    once caught up (no real lag left), the forecast while clearing; None when unknown. Findings
    of one group and topic share the forecast; the slowest one wins."""
    values = []
    for state, seconds in _forecast(findings, "catch_up"):
        if state in ("never", "steady"):
            values.append(math.inf)
        elif state == "caught_up":
            values.append(0.0)
        elif state == "clearing" and seconds is not None:
            values.append(max(0.0, seconds))
    return max(values, default=None)


def data_loss_seconds(findings: list[dict[str, Any]]) -> float | None:
    """0 when retention already deleted unread records, the forecast when at risk; None for
    safe or unknown (an alert reads presence). The soonest one wins."""
    values = []
    for state, seconds in _forecast(findings, "data_loss"):
        if state == "already":
            values.append(0.0)
        elif state == "at_risk" and seconds is not None:
            values.append(max(0.0, seconds))
    return min(values, default=None)


def not_collected(runs: Iterable[DiagnosisRun], latest: Mapping[tuple[str, str, str], DiagnosisRun],
                  sweeps: Mapping[str, float] | None = None) -> set[tuple[str, str, str]]:
    """The (cluster, group, topic) keys the newest sweep of their cluster did not collect: that
    sweep is newer than the run holding the key's verdict (which is the newest run naming it).
    `sweeps`: more sweep times per cluster (the run index's, for runs not read here)."""
    newest: dict[str, float] = dict(sweeps or {})
    for run in runs:
        for cluster in run.sweep_clusters:
            newest[cluster] = max(newest.get(cluster, run.ran_at), run.ran_at)
    return {k for k, run in latest.items() if k[0] in newest and newest[k[0]] > run.ran_at}


def collected_until(findings: Iterable[Mapping[str, Any]], run: DiagnosisRun) -> float:
    """Unix time of a key's last data in its run: the findings' data end, else window end, else the run's time."""
    ends = [_parse_time((f.get("evidence") or {}).get("data_end") or f.get("window_end")) for f in findings]
    ends = [e for e in ends if e is not None]
    return max(ends) if ends else run.ran_at


def collect_samples(runs: Iterable[DiagnosisRun], sweeps: Mapping[str, float] | None = None) -> Samples:
    """Every sample to expose, by family name; pure (no I/O, no clock).

    A key the newest sweep of its cluster did not collect (``not_collected``)
    keeps only `lagdoctor_not_collected_since_timestamp_seconds`: its last
    verdict is not current, and no alert rule may keep firing on it.
    """
    runs = list(runs)
    samples: Samples = {f.name: {} for f in FAMILIES}

    def put(name: str, value: float | None, **labels: str) -> None:
        if value is None:
            return
        names = FAMILY_LABELS[name]
        samples[name].setdefault(tuple((n, labels[n]) for n in names), value)

    group_lags: dict[tuple[str, str], list[float]] = {}
    group_time_lags: dict[tuple[str, str], list[float]] = {}
    group_status: dict[tuple[str, str], int] = {}
    group_severity: dict[tuple[str, str], int] = {}
    latest_offsets: dict[tuple[str, str, str], tuple[float, float]] = {}
    latest = latest_by_key(runs)
    stale = not_collected(runs, latest, sweeps)
    # each run's rows grouped by key once: a scan per key was 2 billion comparisons a
    # scrape at 10,000 groups x 20 partitions
    by_run: dict[int, tuple[dict, dict]] = {}
    for run in {id(r): r for r in latest.values()}.values():
        findings_of: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        rows_of: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for f in run.findings:
            findings_of.setdefault(_key(f), []).append(f)
        for r in run.partitions:
            rows_of.setdefault(_key(r), []).append(r)
        by_run[id(run)] = (findings_of, rows_of)

    for (cluster, group, topic), run in sorted(latest.items()):
        findings_of, rows_of = by_run[id(run)]
        findings = findings_of.get((cluster, group, topic), [])
        rows = rows_of.get((cluster, group, topic), [])
        if (cluster, group, topic) in stale:
            worst = max((SEVERITY_CODES.get(str(f.get("severity")), 0) for f in findings), default=0)
            put("lagdoctor_not_collected_since_timestamp_seconds", collected_until(findings, run),
                cluster_name=cluster, group=group, topic=topic,
                last_severity={v: k for k, v in SEVERITY_CODES.items()}[worst])
            continue
        topic_lag = None
        for row in rows:
            partition = str(row["partition"])
            host, consumer, client = _owner(row, findings)
            where = dict(cluster_name=cluster, group=group, topic=topic, partition=partition,
                         member_host=host, consumer_id=consumer, client_id=client)
            lag, time_lag = _number(row.get("lag")), _number(row.get("time_lag_seconds"))
            # too few snapshots: no status yet (0, unknown), never OK
            status = 0 if row.get("collecting_history") is True else STATUS_CODES.get(str(row.get("status")), 0)
            put("kafka_consumergroup_group_lag", lag, **where)
            put("kafka_consumergroup_group_lag_seconds", time_lag, **where)
            put("lagdoctor_partition_status", float(status), **where)
            group_status[(cluster, group)] = max(group_status.get((cluster, group), 0), status)
            if lag is not None:
                group_lags.setdefault((cluster, group), []).append(lag)
                topic_lag = (topic_lag or 0.0) + lag
            if time_lag is not None:
                group_time_lags.setdefault((cluster, group), []).append(time_lag)
            offset = _number(row.get("log_end_offset"))
            held = latest_offsets.get((cluster, topic, partition))
            if offset is not None and (held is None or run.ran_at > held[0]):
                latest_offsets[(cluster, topic, partition)] = (run.ran_at, offset)
        put("kafka_consumergroup_group_topic_sum_lag", topic_lag, cluster_name=cluster, group=group, topic=topic)
        put("lagdoctor_lag_catch_up_seconds", catch_up_seconds(findings), cluster_name=cluster, group=group,
            topic=topic)
        put("lagdoctor_data_loss_seconds", data_loss_seconds(findings), cluster_name=cluster, group=group,
            topic=topic)
        for finding in findings:
            severity = str(finding.get("severity"))
            if finding.get("diagnosis") == COLLECTING_HISTORY:
                put("lagdoctor_collecting_history", _parse_time((finding.get("evidence") or {}).get("decides_at")),
                    cluster_name=cluster, group=group, topic=topic)
                continue  # no verdict: no severity, no finding
            if severity in SEVERITY_CODES:
                group_severity[(cluster, group)] = max(
                    group_severity.get((cluster, group), 0), SEVERITY_CODES[severity])
            if finding.get("diagnosis") != "healthy":
                put("lagdoctor_finding", 1.0, cluster_name=cluster, group=group, topic=topic,
                    diagnosis=_text(finding.get("diagnosis")), severity=severity,
                    pattern=_text(finding.get("pattern")))

    for (cluster, group), lags in group_lags.items():
        put("kafka_consumergroup_group_max_lag", max(lags), cluster_name=cluster, group=group)
        put("kafka_consumergroup_group_sum_lag", sum(lags), cluster_name=cluster, group=group)
    for (cluster, group), lags in group_time_lags.items():
        put("kafka_consumergroup_group_max_lag_seconds", max(lags), cluster_name=cluster, group=group)
    for (cluster, group), status in group_status.items():
        put("lagdoctor_group_status", float(status), cluster_name=cluster, group=group)
    for (cluster, group), severity in group_severity.items():
        put("lagdoctor_group_severity", float(severity), cluster_name=cluster, group=group)
    for (cluster, topic, partition), (_, offset) in latest_offsets.items():
        put("kafka_partition_latest_offset", offset, cluster_name=cluster, topic=topic, partition=partition)

    last_run: dict[str, float] = {}
    for run in runs:
        if run.threshold_overrides:
            continue  # staleness is about the configured diagnosis, not an experiment
        for row in [*run.findings, *run.partitions]:
            cluster = str(row["cluster"])
            last_run[cluster] = max(last_run.get(cluster, 0.0), run.ran_at)
    for cluster, ran_at in last_run.items():
        put("lagdoctor_last_diagnosis_timestamp_seconds", ran_at, cluster_name=cluster)
    return samples


# -- the text exposition format -------------------------------------------------------

def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    return repr(value)


def _sort_key(labels: Labels) -> tuple:
    # partitions sort as numbers, everything else as text
    return tuple((0, int(v), "") if n == "partition" and v.isdigit() else (1, 0, v) for n, v in labels)


def render_exposition(samples: Samples) -> str:
    """Prometheus text format 0.0.4: families in FAMILIES order, series sorted by labels."""
    lines: list[str] = []
    for family in FAMILIES:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels in sorted(samples.get(family.name, {}), key=_sort_key):
            value = samples[family.name][labels]
            body = ",".join(f'{n}="{escape_label_value(v)}"' for n, v in labels)
            lines.append(f"{family.name}{{{body}}} {format_value(value)}" if body
                         else f"{family.name} {format_value(value)}")
    return "\n".join(lines) + "\n"


def render_metrics(findings_root: str, cache: RunCache | None = None) -> str:
    """The /metrics body for the findings under `findings_root` (a path or URI). On an
    object store, a rotated key or token is picked up without a restart: the connection
    is read again every few minutes, and at once when the store refuses the old one."""
    from lagdoctor.objectstore import configure_for, retry_on_stale_credentials

    def render() -> str:
        configure_for(findings_root)
        return render_exposition(collect_samples(*read_indexed(findings_root, cache)))

    return retry_on_stale_credentials(render)()


# -- serving -----------------------------------------------------------------------------

def make_server(host: str, port: int, findings_root: str):
    """A ThreadingHTTPServer answering /metrics (read fresh on each scrape) and / (a pointer)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    cache, cache_lock = RunCache(), threading.Lock()

    class MetricsHandler(BaseHTTPRequestHandler):
        server_version = "lagdoctor-metrics"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    with cache_lock:
                        text = render_metrics(findings_root, cache)
                    body, status, ctype = text.encode(), 200, CONTENT_TYPE
                except Exception as exc:  # a scrape must answer, and say why it failed
                    log.exception("metrics: rendering failed")
                    body, status = f"lagdoctor: cannot read findings: {exc}\n".encode(), 500
                    ctype = "text/plain; charset=utf-8"
            elif path == "/":
                body, status, ctype = (
                    b"lagdoctor metrics exporter: Prometheus metrics at /metrics\n", 200,
                    "text/plain; charset=utf-8",
                )
            else:
                body, status, ctype = b"not found: try /metrics\n", 404, "text/plain; charset=utf-8"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.info("metrics: %s - %s", self.address_string(), format % args)

    server = ThreadingHTTPServer((host, port), MetricsHandler)
    server.daemon_threads = True
    return server


def default_findings_root(data_root: str | None) -> str:
    from lagdoctor.settings import Settings, join

    # Settings(...) reads the object store's connection for an s3:// root
    return Settings(data_root=data_root).findings_root if data_root else Settings.from_env().findings_root


def local_root_missing(findings_root: str) -> bool:
    """True when `findings_root` is a local path that does not exist (yet)."""
    return "://" not in findings_root and not os.path.isdir(findings_root)
