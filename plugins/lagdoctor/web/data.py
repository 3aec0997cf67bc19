"""Read what the diagnosis runs wrote, and the offset history behind it.

Read-only, but for the run index (lagdoctor.runindex keeps
``<findings_root>/_runindex.json`` up to date when it can write it). A run is
one folder under ``findings_root`` (contract 2's findings.jsonl and
partition_status.jsonl, plus plans.json and run.json written by
``stages.plan.plan_findings``); only a complete one is read
(lagdoctor.runindex.run_completeness: the job's _SUCCESS marker, written last),
and the page says which incomplete ones it skipped. The page shows, per (cluster, group, topic),
the findings of the latest run that looked at it, among every run folder kept
(retention bounds them): latest by run.json's ``planned_at``, else by the
findings file's modification time. A run with threshold overrides (run.json
``threshold_overrides``) counts only where no run without them looked. Only
the index's candidate runs are read, which gives the same answer as reading
every folder; folders the index has not read yet are counted on the page.

Series for the charts come from the snapshot store (contract 1), limited to
the finding's window. Time lag per partition follows the diagnosis job's
rules at each snapshot (``PartitionHistory.time_lag_points``): exact from the
record at the committed offset, else interpolated on the log end offsets,
else "at least" the time since the window's first snapshot; so the chart's
last point is the table's value.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Collection, Iterable, Mapping

from lagdoctor.settings import join

SHORTFALLS_FILE = "lab/workload_shortfalls.json"

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
PLANS_FILE = "plans.json"
MAX_RUNS = 500  # list_runs' default; the page reads the run index's candidates instead
SEVERITY_RANK = {"critical": 2, "warning": 1, "ok": 0}

Key = tuple[str, str, str]  # (cluster, group_id, topic)


@dataclass(frozen=True)
class Run:
    run_key: str
    path: str
    dag_id: str | None
    run_id: str | None
    planned_at: datetime
    group_pattern: str | None = None
    topic: str | None = None
    kind: str | None = None  # "sweep" or "incident" (run.json); None for older runs
    threshold_overrides: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    swept: frozenset[str] = field(default_factory=frozenset, compare=False)  # runindex.sweep_clusters

    @property
    def has_overrides(self) -> bool:
        """Run with its own thresholds: an experiment, never the current verdict over a plain run's."""
        return bool(self.threshold_overrides)

    @property
    def overrides_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in sorted(self.threshold_overrides.items()))

    def as_dict(self) -> dict[str, Any]:
        return {"run_key": self.run_key, "dag_id": self.dag_id, "run_id": self.run_id,
                "planned_at": self.planned_at.isoformat(), "group_pattern": self.group_pattern,
                "topic": self.topic, "kind": self.kind, "threshold_overrides": dict(self.threshold_overrides)}


def _overrides(meta: Mapping[str, Any]) -> dict[str, Any]:
    value = meta.get("threshold_overrides")
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass
class RunData:
    """One run folder's files, parsed."""

    run: Run
    findings: list[dict[str, Any]]
    status_rows: list[dict[str, Any]]
    plans: dict[tuple[Key, str], dict[str, Any]] = field(default_factory=dict)  # (key, diagnosis) -> plan


@dataclass
class GroupState:
    """The latest run's view of one (cluster, group, topic)."""

    key: Key
    run: Run
    findings: list[dict[str, Any]]  # worst first
    status_rows: list[dict[str, Any]]  # by partition
    plans: dict[str, dict[str, Any]]  # diagnosis -> runbook plan
    # Set when the newest sweep of the cluster (at last_sweep_at) did not collect this key: the
    # verdict is its last, from data ending then (see ``collected_until``).
    not_collected_since: datetime | None = None
    last_sweep_at: datetime | None = None

    @property
    def stale(self) -> bool:
        return self.not_collected_since is not None

    @property
    def cluster(self) -> str:
        return self.key[0]

    @property
    def group_id(self) -> str:
        return self.key[1]

    @property
    def topic(self) -> str:
        return self.key[2]

    @property
    def severity(self) -> str:
        return max((f.get("severity", "ok") for f in self.findings), key=lambda s: SEVERITY_RANK.get(s, 0),
                   default="ok")

    @property
    def window(self) -> tuple[datetime | None, datetime | None]:
        starts = [parse_ts(f.get("window_start")) for f in self.findings]
        ends = [parse_ts(f.get("window_end")) for f in self.findings]
        starts = [s for s in starts if s]
        ends = [e for e in ends if e]
        return (min(starts) if starts else None, max(ends) if ends else None)


def collected_until(state: GroupState) -> datetime:
    """The time of a key's last data: the findings' data end (evidence), else window end, else the run's time."""
    ends = [parse_ts((f.get("evidence") or {}).get("data_end") or f.get("window_end")) for f in state.findings]
    ends = [e for e in ends if e is not None]
    return max(ends) if ends else state.run.planned_at


def finding_key(f: Mapping[str, Any]) -> Key:
    return (str(f.get("cluster", "")), str(f.get("group_id", "")), str(f.get("topic", "")))


def parse_ts(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if not value:
        return None
    try:
        ts = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


# ------------------------------------------------------------------ run folders

def _fs(root: str):
    import fsspec

    fs, path = fsspec.core.url_to_fs(root)
    return fs, path.rstrip("/") or "/"


def _read_json_lines(fs, path: str) -> list[dict[str, Any]]:
    if not fs.exists(path):
        return []
    with fs.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _mtime(info: Mapping[str, Any]) -> datetime:
    value = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(float(value), tz=timezone.utc)


def _run_of_meta(findings_root: str, name: str, meta: Mapping[str, Any], info: Mapping[str, Any] | None = None) -> Run:
    planned = parse_ts(meta.get("planned_at")) or _mtime(info or {})
    return Run(run_key=name, path=join(findings_root, name), dag_id=meta.get("dag_id"), run_id=meta.get("run_id"),
               planned_at=planned, group_pattern=meta.get("group_pattern"), topic=meta.get("topic"),
               kind=meta.get("kind"), threshold_overrides=_overrides(meta), swept=_swept(meta))


def _swept(meta: Mapping[str, Any]) -> frozenset[str]:
    from lagdoctor.runindex import sweep_clusters

    return frozenset(sweep_clusters(meta))


def _run_of_folder(fs, findings_root: str, path: str, name: str, skipped: list | None = None) -> Run | None:
    """The Run of one folder under the root; None unless it is a complete run
    (lagdoctor.runindex.run_completeness); an incomplete one is added to ``skipped``."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.runindex import run_completeness

    state = run_completeness(fs, path)
    if not state.complete:
        if state.reason and skipped is not None:
            skipped.append(IncompleteRun(name, join(findings_root, name), state.reason))
        return None  # a run still being written, killed while writing, or not a run folder
    try:
        info = fs.info(f"{path}/{FINDINGS_FILE}")
    except FileNotFoundError:
        return None  # removed since
    meta: dict[str, Any] = {}
    if fs.exists(f"{path}/{RUN_FILE}"):
        try:
            with fs.open(f"{path}/{RUN_FILE}", "rt") as fh:
                meta = json.load(fh) or {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s/%s: %s", path, RUN_FILE, exc)
    return _run_of_meta(findings_root, name, meta if isinstance(meta, Mapping) else {}, info)


def list_runs(findings_root: str, limit: int = MAX_RUNS, skipped: list | None = None) -> list[Run]:
    """Every complete run folder, newest first: a full read (the page reads
    ``candidate_runs``; this is what the index is checked against). Incomplete
    ones go to ``skipped`` (IncompleteRun) when given."""
    fs, base = _fs(findings_root)
    if not fs.exists(base):
        return []
    runs = []
    for entry in fs.ls(base, detail=True):
        if entry.get("type") != "directory":
            continue
        path = entry["name"].rstrip("/")
        name = path.rsplit("/", 1)[-1]
        if name.startswith((".", "_")):
            continue
        run = _run_of_folder(fs, findings_root, path, name, skipped)
        if run is not None:
            runs.append(run)
    runs.sort(key=lambda r: (r.planned_at, r.run_key), reverse=True)
    return runs[:limit]


@dataclass(frozen=True)
class IncompleteRun:
    """A run folder skipped because it is not complete: said on the page and in the API."""

    run_key: str
    path: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"run_key": self.run_key, "path": self.path, "reason": self.reason}


def incomplete_runs(findings_root: str, index, can_read_dag=lambda dag_id: True) -> list[IncompleteRun]:
    """The incomplete run folders the index skipped, those the caller may see (see RunIndex.incomplete_runs)."""
    return [IncompleteRun(name, join(findings_root, name), reason)
            for name, reason in index.incomplete_runs(can_read_dag)]


def incomplete_text(skipped: list[IncompleteRun]) -> str:
    """One line for the page: "1 incomplete run skipped: <path> (<why>)"; "" for none."""
    if not skipped:
        return ""
    shown = "; ".join(f"{r.path} ({r.reason})" for r in skipped[:3])
    more = f"; and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return f"{len(skipped)} incomplete run{'s' if len(skipped) != 1 else ''} skipped: {shown}{more}"


def current_index(findings_root: str):
    """The run index of ``findings_root``, brought up to date (lagdoctor.runindex)."""
    from lagdoctor.runindex import refresh

    return refresh(findings_root)


def candidate_runs(findings_root: str, index=None) -> list[Run]:
    """The runs that can hold a current verdict (lagdoctor.runindex), newest first:
    the same answer as every run folder, from a few of them."""
    index = index if index is not None else current_index(findings_root)
    fs, base = _fs(findings_root)
    runs = []
    for name in index.candidates():
        meta = index.meta(name)
        run = (_run_of_meta(findings_root, name, meta) if meta is not None
               else _run_of_folder(fs, findings_root, f"{base}/{name}", name))
        if run is not None:
            runs.append(run)
    runs.sort(key=lambda r: (r.planned_at, r.run_key), reverse=True)
    return runs


# Parsed run folders, keyed by their files' identity: a finished run's files
# never change, so the page does not re-parse hundreds of folders per request.
_CACHE: dict[tuple[str, Any], RunData] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_MAX = 2 * MAX_RUNS


def read_run(run: Run) -> RunData:
    """One run folder's files, parsed; ValueError (one line) when it is not complete (a
    retried diagnosis rewriting a run the index folded earlier: runindex.run_completeness)."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.runindex import SUCCESS_FILE, WRITING_FILE, run_completeness

    fs, _ = _fs(run.path)
    fs.invalidate_cache(run.path)
    try:
        listed = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e for e in fs.ls(run.path, detail=True)}
    except FileNotFoundError:
        raise ValueError(f"run folder {run.path} is gone") from None
    stamp = tuple(
        (n, listed[n].get("size"), str(listed[n].get("mtime") or listed[n].get("LastModified") or ""))
        for n in (FINDINGS_FILE, PARTITION_STATUS_FILE, PLANS_FILE, RUN_FILE, SUCCESS_FILE, WRITING_FILE)
        if n in listed
    )
    cache_key = (run.path, stamp)
    with _CACHE_LOCK:
        cached = _CACHE.get(cache_key)
    if cached is not None:
        return RunData(run, cached.findings, cached.status_rows, cached.plans)
    state = run_completeness(fs, run.path, {n: e.get("size") for n, e in listed.items()})
    if not state.complete:
        raise ValueError(f"run folder {run.path} is incomplete: {state.reason or 'no diagnosis output'}")
    findings = _read_json_lines(fs, f"{run.path}/{FINDINGS_FILE}")
    status_rows = _read_json_lines(fs, f"{run.path}/{PARTITION_STATUS_FILE}")
    plans: dict[tuple[Key, str], dict[str, Any]] = {}
    workloads: dict[tuple[Key, str], dict[str, Any]] = {}
    if fs.exists(f"{run.path}/{PLANS_FILE}"):
        try:
            with fs.open(f"{run.path}/{PLANS_FILE}", "rt") as fh:
                for item in json.load(fh):
                    f = item.get("finding") or {}
                    planned = (finding_key(f), str(f.get("diagnosis")))
                    plans[planned] = {**(item.get("plan") or {}), "report_url": f.get("report_url")}
                    ev = f.get("evidence")
                    workload = ev.get("workload") if isinstance(ev, Mapping) else None
                    if isinstance(workload, Mapping):
                        workloads[planned] = dict(workload)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s/%s: %s", run.path, PLANS_FILE, exc)
    # What the plan step added travels with the finding: the report link (stamped on plans.json's
    # findings by lagdoctor.web.report) and the owner's pod and workload (lagdoctor.workloads).
    findings = [_with_plan_fields(f, plans, workloads) for f in findings]
    data = RunData(run, findings, status_rows, plans)
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[cache_key] = data
    return data


def _with_plan_fields(f: dict[str, Any], plans: Mapping[tuple[Key, str], Mapping[str, Any]],
                      workloads: Mapping[tuple[Key, str], Mapping[str, Any]]) -> dict[str, Any]:
    planned = (finding_key(f), str(f.get("diagnosis")))
    out = {**f, "report_url": plans.get(planned, {}).get("report_url")}
    if planned in workloads and isinstance(f.get("evidence"), Mapping):
        out["evidence"] = {**f["evidence"], "workload": workloads[planned]}
    return out


def states_of_run(data: RunData, keys: Collection[Key] | None = None) -> list[GroupState]:
    """Each (cluster, group, topic) of one run, or of those in `keys`, its findings worst first."""
    from lagdoctor.notify.evidence import with_partition_status

    # each file grouped by key once: matching every key against every row took
    # 100M comparisons (157 s) at 10,000 groups x 20 partitions
    status_by_key: dict[Key, list[dict[str, Any]]] = {}
    for row in data.status_rows:
        status_by_key.setdefault(finding_key(row), []).append(row)
    findings_by_key: dict[Key, list[dict[str, Any]]] = {}
    for f in data.findings:
        key = finding_key(f)
        if keys is None or key in keys:
            findings_by_key.setdefault(key, []).append(f)
    plans_by_key: dict[Key, dict[str, dict[str, Any]]] = {}
    for (k, d), p in data.plans.items():
        plans_by_key.setdefault(k, {})[d] = p
    states = []
    for key, key_findings in findings_by_key.items():
        rows = sorted(status_by_key.get(key, []), key=lambda r: r.get("partition", 0))
        findings = [with_partition_status(f, rows) for f in key_findings]
        findings.sort(key=lambda f: (-SEVERITY_RANK.get(f.get("severity", "ok"), 0), str(f.get("diagnosis"))))
        states.append(GroupState(key, data.run, findings, rows, plans_by_key.get(key, {})))
    return states


def latest_states(
    findings_root: str,
    *,
    cluster: str | None = None,
    group: str | None = None,
    can_read_dag=lambda dag_id: True,
    index=None,
    runs: Iterable[Run] | None = None,
) -> tuple[list[GroupState], list[Run]]:
    """The latest readable run's findings per (cluster, group, topic), worst first,
    and the runs shown (those findings' runs, and every readable run with threshold overrides).

    A run with threshold overrides never replaces a plain run's verdict (an
    incident run with {"warning_lag": 1} must not turn the page red until the
    next sweep): it shows a group only when no plain run looked at that group,
    and is listed, labelled, either way.

    ``can_read_dag(dag_id)`` decides which runs the caller may see; a run the
    caller cannot read is skipped as if it did not exist (an older readable run
    of the same group then shows, which is what the Airflow UI would show too).

    A key the newest readable sweep of its cluster did not collect gets
    ``not_collected_since`` (lagdoctor.runindex.sweep_clusters says which runs
    are sweeps of which clusters): its verdict is shown as its last, not as current.

    Reads the candidate runs of the run index (``index``, default: refreshed
    now), or ``runs`` when given (``list_runs``: every folder). A run whose
    files cannot be parsed is skipped and logged, as the exporter does.
    """
    states: dict[Key, GroupState] = {}
    experiments: dict[Key, GroupState] = {}
    override_runs: dict[str, Run] = {}
    if runs is None:
        index = index if index is not None else current_index(findings_root)
        runs = candidate_runs(findings_root, index)
        sweeps = index.last_sweeps(can_read_dag)  # also sweeps that named no group: no candidates
    else:
        runs = list(runs)
        sweeps = {}
    for run in runs:
        if can_read_dag(run.dag_id):
            for name in run.swept:
                sweeps[name] = max(sweeps.get(name, run.planned_at), run.planned_at)
    for run in runs:
        if not can_read_dag(run.dag_id):
            continue
        held = experiments if run.has_overrides else states
        try:
            data = read_run(run)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable run %s: %s", run.path, exc)
            continue
        # a group's view builds that group's state only, not every group's of the run
        wanted = None if not (cluster or group) else {
            k for k in map(finding_key, data.findings) if (not cluster or k[0] == cluster) and (not group or k[1] == group)}
        for state in states_of_run(data, wanted):
            if run.has_overrides:
                override_runs[run.run_key] = run
            held.setdefault(state.key, state)
    for key, state in experiments.items():
        states.setdefault(key, state)
    for state in states.values():
        swept = sweeps.get(state.cluster)
        if swept is not None and swept > state.run.planned_at:
            state.not_collected_since, state.last_sweep_at = collected_until(state), swept
    ordered = sorted(states.values(), key=lambda s: (s.cluster, -SEVERITY_RANK.get(s.severity, 0), s.group_id, s.topic))
    runs = {**override_runs, **{s.run.run_key: s.run for s in ordered}}
    return ordered, sorted(runs.values(), key=lambda r: r.planned_at, reverse=True)


def run_of(path: str) -> Run:
    """The Run of one folder, whether or not it is under a findings root;
    ValueError (one line) when the folder is not a complete run (runindex.run_completeness)."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.runindex import run_completeness

    fs, base = _fs(path)
    state = run_completeness(fs, base)
    if not state.complete:
        raise ValueError(f"run folder {path} is incomplete: {state.reason or 'no diagnosis output'}")
    meta: dict[str, Any] = {}
    if fs.exists(f"{base}/{RUN_FILE}"):
        with fs.open(f"{base}/{RUN_FILE}", "rt") as fh:
            meta = json.load(fh) or {}
    planned = parse_ts(meta.get("planned_at")) or _mtime(fs.info(f"{base}/{FINDINGS_FILE}"))
    return Run(run_key=base.rstrip("/").rsplit("/", 1)[-1], path=path.rstrip("/"), dag_id=meta.get("dag_id"),
               run_id=meta.get("run_id"), planned_at=planned, group_pattern=meta.get("group_pattern"),
               topic=meta.get("topic"), kind=meta.get("kind"), threshold_overrides=_overrides(meta),
               swept=_swept(meta))


def find_run(findings_root: str, run_key: str) -> Run | None:
    """The run folder named ``run_key`` (a plain name, no path), or None: one folder read, not a listing."""
    if not run_key or "/" in run_key or run_key.startswith((".", "_")):
        return None
    fs, base = _fs(findings_root)
    return _run_of_folder(fs, findings_root, f"{base}/{run_key}", run_key)


# ------------------------------------------------------------------ offset history

@dataclass
class PartitionHistory:
    partition: int
    ts: list[datetime] = field(default_factory=list)
    log_end: list[int] = field(default_factory=list)
    committed: list[int | None] = field(default_factory=list)
    lag: list[int | None] = field(default_factory=list)
    committed_record_ts: list[datetime | None] = field(default_factory=list)
    committed_record_error: list[str | None] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)  # the newest row (owner, offsets)

    def time_lag(self) -> list[float | None]:
        """Seconds behind real time at each snapshot (see ``time_lag_points``)."""
        return [seconds for seconds, _ in self.time_lag_points()]

    def time_lag_points(self) -> list[tuple[float | None, str | None]]:
        """(seconds, source) at each snapshot, by the diagnosis job's rules
        (lagdoctor.diagnosis.timelag) over the snapshots up to that one: so the last
        point is the value the table shows, from the same source.

        record: the record at the committed offset was read then (exact); caught_up:
        no lag, or only transaction markers after the commit; interpolated: when the
        log end passed the committed offset, between two snapshots; lower_bound: the
        committed offset is older than the first snapshot (after the last fall of the
        log end, as the job counts): "at least" the time since then, never an
        extrapolation (a rate-based guess can exceed the topic's age); None: unknown.
        """
        from lagdoctor.contracts import NOTHING_TO_READ

        out: list[tuple[float | None, str | None]] = []
        first = 0  # the job drops the rows before the log end's last fall (a reset)
        for j, (t, c, end) in enumerate(zip(self.ts, self.committed, self.log_end)):
            if j and end < self.log_end[j - 1]:
                first = j
            crt = self.committed_record_ts[j] if j < len(self.committed_record_ts) else None
            error = self.committed_record_error[j] if j < len(self.committed_record_error) else None
            lag = self.lag[j] if j < len(self.lag) and self.lag[j] is not None else (
                None if c is None else end - c)
            if c is None:
                out.append((None, None))
            elif (lag is not None and lag <= 0) or (error or "").startswith(NOTHING_TO_READ):
                out.append((0.0, "caught_up"))
            elif crt is not None:
                out.append((max(0.0, (t - crt).total_seconds()), "record"))
            elif self.log_end[first] <= c < end:
                # log ends from `first` on never fall: one pair of snapshots brackets c
                i = bisect.bisect_right(self.log_end, c, first, j + 1) - 1
                span = self.log_end[i + 1] - self.log_end[i]
                passed = self.ts[i] + (self.ts[i + 1] - self.ts[i]) * ((c - self.log_end[i]) / span)
                out.append((max(0.0, (t - passed).total_seconds()), "interpolated"))
            elif c < self.log_end[first]:
                out.append(((t - self.ts[first]).total_seconds(), "lower_bound"))
            else:
                out.append((None, None))
        return out


@dataclass
class GroupHistory:
    key: Key
    partitions: dict[int, PartitionHistory] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.partitions

    def latest_rows(self) -> list[dict[str, Any]]:
        return [self.partitions[p].last for p in sorted(self.partitions)]

    def rates(self) -> tuple[list[datetime], list[float | None], list[float | None]]:
        """(times, produce msg/s, consume msg/s) between consecutive snapshots, topic-wide.

        A rate is missing (None) where offsets went backwards (a reset or a
        rewind) or a partition has no committed offset.
        """
        by_ts: dict[datetime, dict[int, tuple[int, int | None]]] = {}
        for p, h in self.partitions.items():
            for t, e, c in zip(h.ts, h.log_end, h.committed):
                by_ts.setdefault(t, {})[p] = (e, c)
        n = len(self.partitions)
        times = sorted(t for t, rows in by_ts.items() if len(rows) == n)  # complete snapshots only
        out_t, produce, consume = [], [], []
        for a, b in zip(times, times[1:]):
            dt = (b - a).total_seconds()
            if dt <= 0:
                continue
            # Per partition, so one partition's rewind is not hidden by another's progress.
            d_end = [by_ts[b][p][0] - by_ts[a][p][0] for p in by_ts[b]]
            commits = [(by_ts[a][p][1], by_ts[b][p][1]) for p in by_ts[b]]
            out_t.append(b)
            produce.append(sum(d_end) / dt if min(d_end) >= 0 else None)
            if any(ca is None or cb is None or cb < ca for ca, cb in commits):
                consume.append(None)
            else:
                consume.append(sum(cb - ca for ca, cb in commits) / dt)
        return out_t, produce, consume


_HISTORY_COLUMNS = ("snapshot_ts", "cluster", "group_id", "topic", "partition", "log_end_offset",
                    "committed_offset", "lag", "member_id", "client_id", "host", "group_members", "group_state",
                    "committed_record_ts", "committed_record_error")


def _cluster_files(snapshots_root: str, cluster: str, start: datetime | None, end: datetime | None,
                   listings: dict[str, list[str]] | None = None) -> list[str]:
    """The cluster's snapshot files on the days of [start, end]. `listings` (cluster -> all its
    files) keeps one listing per cluster for a caller that reads many windows (the reports)."""
    from lagdoctor.store import list_snapshot_files, snapshot_dir

    if listings is not None and cluster in listings:
        files = listings[cluster]
    else:
        cluster_dir = snapshot_dir(snapshots_root, cluster, datetime.now(timezone.utc)).rsplit("/", 1)[0]
        files = list_snapshot_files(cluster_dir)
        if listings is not None:
            listings[cluster] = files
    if not files:
        return []

    def in_range(path: str) -> bool:
        day = next((p[5:] for p in path.split("/") if p.startswith("date=")), None)
        if day is None:
            return True
        return (start is None or day >= f"{start:%Y-%m-%d}") and (end is None or day <= f"{end:%Y-%m-%d}")

    return [f for f in files if in_range(f)]


def read_history(
    snapshots_root: str,
    keys: Iterable[Key],
    start: datetime | None,
    end: datetime | None,
    *,
    listings: dict[str, list[str]] | None = None,
) -> dict[Key, GroupHistory]:
    """Offset history of each (cluster, group, topic) between start and end (inclusive).
    `listings`: see `_cluster_files` (a cache the caller shares across calls)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    wanted = set(keys)
    out: dict[Key, GroupHistory] = {k: GroupHistory(k) for k in wanted}
    fs, _ = _fs(snapshots_root)
    for cluster in sorted({k[0] for k in wanted}):
        files = _cluster_files(snapshots_root, cluster, start, end, listings)
        if not files:
            continue
        try:
            dataset = ds.dataset(files, filesystem=fs, format="parquet")
            cols = [c for c in _HISTORY_COLUMNS if c in dataset.schema.names]
            ts_type = pa.timestamp("us", tz="UTC")
            expr = (ds.field("cluster") == cluster) & ds.field("group_id").isin(sorted({k[1] for k in wanted if k[0] == cluster}))
            if start is not None:
                expr &= ds.field("snapshot_ts") >= pa.scalar(start, ts_type)
            if end is not None:
                expr &= ds.field("snapshot_ts") <= pa.scalar(end, ts_type)
            rows = dataset.to_table(columns=cols, filter=expr).sort_by([("snapshot_ts", "ascending")]).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            log.warning("cannot read snapshot history of cluster %s: %s", cluster, exc)
            continue
        for row in rows:
            key = (row["cluster"], row["group_id"], row["topic"])
            if key not in out or row["log_end_offset"] is None:
                continue  # a failed read (read_error) is a gap in the chart, never a zero
            p = int(row["partition"])
            h = out[key].partitions.get(p)
            if h is None:
                h = out[key].partitions[p] = PartitionHistory(p)
            ts = parse_ts(row["snapshot_ts"])
            h.ts.append(ts)
            h.log_end.append(int(row["log_end_offset"]))
            h.committed.append(row["committed_offset"])
            lag = row["lag"]
            if lag is None and row["committed_offset"] is not None and not row.get("read_error"):
                lag = max(0, row["log_end_offset"] - row["committed_offset"])
            h.lag.append(lag)
            h.committed_record_ts.append(parse_ts(row.get("committed_record_ts")))
            h.committed_record_error.append(row.get("committed_record_error"))
            h.last = row
    return out


def read_shortfalls(data_root: str) -> dict[str, str]:
    """The demo's workloads that fell short of their design (lagdoctor.lab.rates), {group: line};
    {} when no demo wrote one (a real deployment) or it cannot be read."""
    import fsspec

    try:
        with fsspec.open(join(data_root, SHORTFALLS_FILE), "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("workload shortfalls at %s not read: %s", join(data_root, SHORTFALLS_FILE), exc)
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
