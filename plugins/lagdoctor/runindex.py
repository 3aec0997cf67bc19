"""Which run folders can hold the current verdict of a (cluster, group, topic):
the index the lag page and the metrics exporter read instead of every run folder.

A sweep every 5 minutes leaves about 2,000 run folders a week under
``findings_root``. Both readers show, per (cluster, group, topic), what the
newest run that looked at it says (lagdoctor.web.data, lagdoctor.metrics).
Finding that by reading every folder costs more with every week of history;
this index keeps, in ``<findings_root>/_runindex.json`` (rewritten atomically):

  - per (cluster, group, topic, dag_id), the newest run without threshold
    overrides whose findings name it, and the newest whose partition status
    names it ("pointers"; per DAG because the page hides runs of DAGs the
    caller may not read, and then shows the newest readable one);
  - each folded run's run.json and its files' sizes and times.

A reader then reads only the candidate runs: the runs the pointers name, every
run with threshold overrides (the page lists them all; they are manual and
rare), and every provisional folder, one the index cannot date or parse (no
run.json yet, a bare ``lagdoctor diagnose`` output, a file missing or not
valid JSON). Each reader judges those by its own rules, as before. So for the
same folders a reader's result over the candidates equals its result over
every folder, at the cost of one listing of the root plus a few small reads.

Each refresh (one per page view or scrape, under a lock) lists the root, folds
in new folders (normally just the newest run), compares the files of the
newest RECHECK_RUNS runs and of provisional folders with what it folded (a
retried plan rewrites run.json in place), and forgets folders that are gone.
When a forgotten or changed run was a key's newest, older runs of the same DAG
are read, newest first, until the key is found again (retention removes the
oldest runs first, so usually there is none left to read).

The writer keeps the index current with ``record_run(run_dir)`` once run.json
exists; without it readers fold new folders themselves. With no index yet, or
more than MAX_FOLD new folders at once, the newest MAX_FOLD (by folder time,
else by name) are read; the rest are read BACKFILL_RUNS per refresh, newest
first, and until then ``not_read`` counts them (the page says so).

Only complete run folders are read (``run_completeness``, the one rule every
reader uses: this index, the lag page and its API, the group view's timeline,
the reports and the exporter). A folder the job is writing, or one it was
killed while writing, is never folded and never a candidate; ``incomplete``
names it with why, and the page and API say "N incomplete run(s) skipped".

Known limit: two writers rewriting the index at the same moment can lose one
update; a lost new folder is folded by the next refresh, a lost re-fold (a plan
retried in place) only if the run is still among the newest RECHECK_RUNS.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

log = logging.getLogger(__name__)

INDEX_FILE = "_runindex.json"
VERSION = 1
RUN_FILE = "run.json"  # written by stages.plan.plan_findings
FINDINGS_FILE = "findings.jsonl"  # contract 2 (lagdoctor.contracts)
PARTITION_STATUS_FILE = "partition_status.jsonl"
SUCCESS_FILE = "_SUCCESS"  # the job's completion marker, written last (lagdoctor.diagnosis.output)
WRITING_FILE = "_WRITING"  # written before the job's first output, removed after _SUCCESS
FAILED_FILE = "_FAILED"  # written by the diagnose task when its try failed (DiagnoseLagOperator)
QUARANTINED_FILE = "quarantined.jsonl"
CONTRACT_OUTPUTS = (FINDINGS_FILE, PARTITION_STATUS_FILE)
# Every file the completeness rule or a fold looks at: a change to any of them re-reads the folder.
WATCHED = (FINDINGS_FILE, PARTITION_STATUS_FILE, RUN_FILE, SUCCESS_FILE, WRITING_FILE, QUARANTINED_FILE,
           FAILED_FILE)
MAX_FOLD = 500  # run folders read in one refresh, at most (first use, or a key's older runs)
BACKFILL_RUNS = 25  # folders left unread by a first use, read per later refresh
RECHECK_RUNS = 6  # newest runs compared on each refresh: a plan retry lands within minutes

Key = tuple[str, str, str]  # (cluster, group_id, topic)
Slot = tuple[str, str, str, Any]  # (cluster, group_id, topic, dag_id)
IN_FINDINGS, IN_STATUS = 0, 1


def filesystem(root: str):
    """(fsspec filesystem, path) of a local path or URI; s3a:// (Spark's name) is read as s3://."""
    import fsspec

    url = "s3://" + root[len("s3a://"):] if root.startswith("s3a://") else root
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/") or "/"


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


def has_overrides(meta: Mapping[str, Any]) -> bool:
    value = meta.get("threshold_overrides")
    return isinstance(value, Mapping) and bool(value)


def clusters_read(meta: Mapping[str, Any]) -> set[str]:
    """The clusters a run's diagnosis read (run.json `clusters`; one whose snapshot failed is in
    `clusters_unread` instead). Empty for a run.json without them (before issue 17): it cannot say."""
    unread = {str(c) for c in meta.get("clusters_unread") or [] if isinstance(c, str)}
    return {str(c) for c in meta.get("clusters") or [] if isinstance(c, str)} - unread


def sweep_clusters(meta: Mapping[str, Any]) -> set[str]:
    """The clusters a sweep run looked at (run.json `clusters` read, `clusters_unread` not):
    a group of one of them that the run does not name was not collected. Empty for any other
    run: an incident run or one with threshold overrides looks at a few groups only, and a run
    without these fields (before issue 17, or a bare `lagdoctor diagnose`) cannot say."""
    if meta.get("kind") != "sweep" or has_overrides(meta):
        return set()
    named = [*(meta.get("clusters") or []), *(meta.get("clusters_unread") or [])]
    return {str(c) for c in named if isinstance(c, str)}


def last_sweeps(metas: Iterable[Mapping[str, Any]]) -> dict[str, datetime]:
    """Per cluster, planned_at of the newest sweep that looked at it (see ``sweep_clusters``)."""
    out: dict[str, datetime] = {}
    for meta in metas:
        at = parse_time(meta.get("planned_at")) if isinstance(meta, Mapping) else None
        if at is None:
            continue
        for cluster in sweep_clusters(meta):
            if cluster not in out or out[cluster] < at:
                out[cluster] = at
    return out


SWEEP_DAG_ID = "kafka_lag_health_sweep"  # contract 5
CADENCE_WINDOW_SECONDS = 3600


def _is_sweep(meta: Mapping[str, Any]) -> bool:
    return (meta.get("kind") == "sweep" or meta.get("dag_id") == SWEEP_DAG_ID) and not has_overrides(meta)


def sweep_cadence(metas: Iterable[Mapping[str, Any]], now: datetime, *,
                  within_seconds: float = CADENCE_WINDOW_SECONDS) -> dict[str, Any] | None:
    """How often sweeps really ran over the last ``within_seconds`` before ``now``, from each folded
    sweep's planned_at: a sweep that skipped (it started when the next was due) writes no folder, so
    its gap shows. None without a sweep in that time."""
    times = sorted(t for t in (parse_time(m.get("planned_at")) for m in metas if isinstance(m, Mapping) and _is_sweep(m))
                   if t is not None and 0 <= (now - t).total_seconds() <= within_seconds)
    if not times:
        return None
    gaps = sorted((b - a).total_seconds() for a, b in zip(times, times[1:]))
    return {"runs": len(times), "within_seconds": within_seconds,
            "median_gap_seconds": gaps[len(gaps) // 2] if gaps else None,
            "longest_gap_seconds": gaps[-1] if gaps else None,
            "since_last_seconds": (now - times[-1]).total_seconds()}


def schedule_every_seconds(schedule: str) -> float | None:
    """The interval of a cron schedule that fires every N minutes (`* * * * *`, `*/5 * * * *`), else None."""
    fields = str(schedule).split()
    if len(fields) != 5 or any(f != "*" for f in fields[1:]):
        return None
    if fields[0] == "*":
        return 60.0
    step = fields[0].removeprefix("*/")
    return 60.0 * int(step) if fields[0].startswith("*/") and step.isdigit() and int(step) > 0 else None


def _span(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def cadence_text(cadence: Mapping[str, Any] | None, *, scheduled_every_seconds: float | None = 60.0) -> str:
    """One line for the page: how often sweeps ran, against the schedule when it is a fixed interval."""
    if not cadence:
        return "No sweep ran in the last hour."
    hour = cadence["within_seconds"] / 3600
    span = "hour" if hour == 1 else f"{hour:g} hours"
    if cadence["median_gap_seconds"] is None:
        return f"1 sweep in the last {span}, {_span(cadence['since_last_seconds'])} ago."
    line = (f"Sweeps ran every {_span(cadence['median_gap_seconds'])} (median) over the last {span}: "
            f"{cadence['runs']} run(s)")
    if scheduled_every_seconds:
        expected = int(cadence["within_seconds"] // scheduled_every_seconds)
        line += f" of the {expected} scheduled (every {_span(scheduled_every_seconds)})"
    return line + f", longest gap {_span(cadence['longest_gap_seconds'])}."


def _stamp(info: Mapping[str, Any]) -> str:
    return str(info.get("mtime") or info.get("LastModified") or info.get("created") or "")


def _seconds(info: Mapping[str, Any]) -> float:
    """A listing entry's modification time in Unix seconds; 0 when the store has none (object-store prefixes)."""
    value = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
    if isinstance(value, datetime):
        return value.timestamp()
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _name(entry: Mapping[str, Any]) -> str:
    return str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Completeness:
    """Whether a run folder may be read: ``complete``, else ``reason`` (one line) when it
    is a run folder that is not complete; neither for a folder that is no run at all."""

    complete: bool
    reason: str = ""
    legacy: bool = False  # complete by the rule for folders written before the marker existed


def folder_sizes(fs, path: str) -> dict[str, Any] | None:
    """{file name: size} of a folder's files (one listing); None when the folder is gone."""
    try:
        fs.invalidate_cache(path)
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return {_name(e): e.get("size") for e in entries if e.get("type") != "directory"}


def run_completeness(fs, path: str, sizes: Mapping[str, Any] | None = None) -> Completeness:
    """The one rule for "may this run folder be read" (every reader calls it).

    ``sizes``: {file name: size} of the folder's files when the caller listed it
    already (it must name every file of WATCHED that is there), else one listing.

    - ``_FAILED`` there: incomplete, whatever else is (the diagnose task failed; a job it
      could not stop may still have finished writing, for a run nobody will post).
    - ``_SUCCESS`` there: complete when it parses and every output it names is
      there with the bytes it names (a retried job removes it before rewriting).
    - else ``_WRITING`` there: incomplete (the job is writing, or was killed).
    - else a folder written before the marker existed: complete when both
      outputs of contract 2 are there (each was written whole, by rename), so
      older history keeps answering; incomplete when findings.jsonl is there
      alone (a job killed between the two).
    - a folder with none of these is no run folder (ignored, as before).
    """
    if sizes is None:
        sizes = folder_sizes(fs, path)
        if sizes is None:
            return Completeness(False)
    if FAILED_FILE in sizes:
        return Completeness(False, _failed_reason(fs, path))
    if SUCCESS_FILE in sizes:
        try:
            with fs.open(f"{path}/{SUCCESS_FILE}", "rt", encoding="utf-8") as fh:
                outputs = json.load(fh)["outputs"]
            problems = [f"{name} not named" for name in CONTRACT_OUTPUTS if name not in outputs]
            for name, stats in outputs.items():
                if name not in sizes:
                    problems.append(f"{name} missing")
                elif isinstance(sizes[name], int) and isinstance(stats.get("bytes"), int) and \
                        sizes[name] != stats["bytes"]:
                    problems.append(f"{name} is {sizes[name]} bytes, not {stats['bytes']}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return Completeness(False, f"{SUCCESS_FILE} unreadable ({' '.join(str(exc).split())[:120]})")
        if problems:
            return Completeness(False, f"{SUCCESS_FILE} does not match the files: {', '.join(problems)}")
        return Completeness(True)
    if WRITING_FILE in sizes:
        return Completeness(False, f"the diagnosis did not finish writing it: no {SUCCESS_FILE}")
    if FINDINGS_FILE not in sizes:
        return Completeness(False)
    if PARTITION_STATUS_FILE not in sizes:
        return Completeness(False, f"no {SUCCESS_FILE} and no {PARTITION_STATUS_FILE}")
    return Completeness(True, legacy=True)


def _failed_reason(fs, path: str) -> str:
    try:
        with fs.open(f"{path}/{FAILED_FILE}", "rt", encoding="utf-8") as fh:
            reason = " ".join(fh.read().split())[:300]
    except OSError:
        reason = ""
    return reason or "the diagnose task failed"


def mark_failed(run_dir: str, reason: str) -> None:
    """The diagnose task's try failed: its folder, when the job began one, is never read as a
    run (run_completeness). Best effort: a store that cannot take the marker leaves the job's
    own markers to decide."""
    try:
        fs, path = filesystem(run_dir)
        if not fs.isdir(path):  # the job wrote nothing: nothing to keep from readers
            return
        with fs.open(f"{path}/{FAILED_FILE}", "wt", encoding="utf-8") as fh:
            fh.write(" ".join(reason.split())[:300] + "\n")
    except Exception as exc:  # noqa: BLE001 - the task's own failure is what the user must see
        log.warning("could not mark %s as failed: %s", run_dir, " ".join(str(exc).split()))


def clear_failed(run_dir: str) -> None:
    """A new try of the diagnose task: the last try's failure marker goes."""
    fs, path = filesystem(run_dir)
    try:
        fs.rm_file(f"{path}/{FAILED_FILE}")
    except FileNotFoundError:
        pass


def folder_signature(fs, path: str) -> list[list[Any]] | None:
    """Sizes and times of a folder's run files (one listing); None when the folder is gone."""
    try:
        fs.invalidate_cache(path)  # object stores cache listings; a run folder changes under us
        entries = fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return sorted([_name(e), e.get("size"), _stamp(e)] for e in entries if _name(e) in WATCHED)


@dataclass
class FoldedRun:
    meta: dict[str, Any]
    at: datetime
    in_findings: set[Key]
    in_status: set[Key]


def _keys(fs, path: str) -> set[Key]:
    with fs.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return {(str(r["cluster"]), str(r["group_id"]), str(r["topic"])) for r in rows}


def read_folder(fs, path: str, signature: list[list[Any]]) -> FoldedRun | None:
    """A complete (``run_completeness``), readable run folder's run.json and keys; None for a provisional one."""
    sizes = {s[0]: s[1] for s in signature}
    if RUN_FILE not in sizes or not run_completeness(fs, path, sizes).complete:
        return None
    try:
        with fs.open(f"{path}/{RUN_FILE}", "rt", encoding="utf-8") as fh:
            meta = json.load(fh)
        at = parse_time(meta.get("planned_at")) if isinstance(meta, dict) else None
        if at is None:
            return None  # each reader dates it by file times, its own way
        return FoldedRun(meta, at, _keys(fs, f"{path}/{FINDINGS_FILE}"), _keys(fs, f"{path}/{PARTITION_STATUS_FILE}"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # the metrics reader skips such a folder, the page shows what it can: theirs to judge


@dataclass
class RunIndex:
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_key -> {"meta", "sig"}
    latest: dict[Slot, list[str | None]] = field(default_factory=dict)  # -> [in findings, in status]
    provisional: dict[str, list[list[Any]]] = field(default_factory=dict)  # run_key -> signature
    skipped: dict[str, float] = field(default_factory=dict)  # run_key -> folder time (0 unknown): not read yet
    # Provisional folders that are incomplete (run_completeness): run_key -> {"reason", "dag_id"}.
    incomplete: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Not stored: the last listing (name -> entry) and each run's (planned_at, run_key) order.
    folders: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    order: dict[str, tuple[datetime, str]] = field(default_factory=dict, compare=False)

    # -- what readers use ---------------------------------------------------------

    def candidates(self) -> list[str]:
        """Run folders a reader must read to get the same answer as from every folder."""
        names = {r for pointers in self.latest.values() for r in pointers if r}
        names.update(r for r, rec in self.runs.items() if has_overrides(rec["meta"]))
        names.update(self.provisional)
        return sorted(n for n in names if n in self.folders and n not in self.incomplete)

    def incomplete_runs(self, can_read_dag=lambda dag_id: True) -> list[tuple[str, str]]:
        """(run_key, why) of each incomplete run folder the caller may see (by its run.json's
        dag_id; none: whoever may read every DAG), by name."""
        return sorted((name, str(rec.get("reason") or "")) for name, rec in self.incomplete.items()
                      if name in self.folders and can_read_dag(rec.get("dag_id")))

    def meta(self, run_key: str) -> dict[str, Any] | None:
        """run.json of a folded run (None for a provisional folder)."""
        rec = self.runs.get(run_key)
        return rec["meta"] if rec is not None else None

    def last_sweeps(self, can_read_dag=lambda dag_id: True) -> dict[str, datetime]:
        """Per cluster, the newest folded sweep that looked at it (``last_sweeps``), among every
        folded run, not only the candidates: a sweep that named no group of a cluster (its
        groups gone, or the cluster unreadable) is no key's pointer, yet it says they were not collected."""
        return last_sweeps(rec["meta"] for rec in self.runs.values()
                           if isinstance(rec.get("meta"), Mapping) and can_read_dag(rec["meta"].get("dag_id")))

    def sweep_cadence(self, now: datetime, can_read_dag=lambda dag_id: True) -> dict[str, Any] | None:
        """``sweep_cadence`` over every folded run the caller may read."""
        return sweep_cadence((rec["meta"] for rec in self.runs.values()
                              if isinstance(rec.get("meta"), Mapping) and can_read_dag(rec["meta"].get("dag_id"))), now)

    @property
    def not_read(self) -> int:
        """Run folders present but not read yet (see the module docstring)."""
        return len(self.skipped)

    # -- folding --------------------------------------------------------------------

    def add(self, run_key: str, run: FoldedRun, signature: list[list[Any]]) -> None:
        self.runs[run_key] = {"meta": run.meta, "sig": signature}
        self.order[run_key] = (run.at, run_key)
        self.provisional.pop(run_key, None)
        self.skipped.pop(run_key, None)
        self.incomplete.pop(run_key, None)
        if has_overrides(run.meta):
            return
        dag = run.meta.get("dag_id")
        for where, keys in ((IN_FINDINGS, run.in_findings), (IN_STATUS, run.in_status)):
            for key in keys:
                pointers = self.latest.setdefault((*key, dag), [None, None])
                held = pointers[where]
                if held is None or self.order[held] < self.order[run_key]:
                    pointers[where] = run_key

    def remove(self, run_key: str) -> list[tuple[Slot, int, Any, tuple[datetime, str]]]:
        """Forget a run; the pointers it held: (slot, where, dag_id, its order), to look below."""
        rec = self.runs.pop(run_key, None)
        bound = self.order.pop(run_key, None)
        if rec is None or bound is None:
            return []
        lost = []
        for slot, pointers in list(self.latest.items()):
            for where in (IN_FINDINGS, IN_STATUS):
                if pointers[where] == run_key:
                    pointers[where] = None
                    lost.append((slot, where, slot[3], bound))
            if pointers == [None, None]:
                del self.latest[slot]
        return lost

    def find_again(self, fs, base: str, lost, budget: int) -> int:
        """Point each lost slot at the newest older run of its DAG that names the key;
        reads those runs newest first. Returns how many folders were read."""
        if not lost:
            return 0
        wanted: dict[tuple[Slot, int], tuple[datetime, str]] = {}
        for slot, where, _dag, bound in lost:
            wanted[(slot, where)] = max(bound, wanted.get((slot, where), bound))
        dags = {slot[3] for slot, _ in wanted}
        top = max(wanted.values())
        older = sorted((o for r, o in self.order.items()
                        if o < top and not has_overrides(self.runs[r]["meta"])
                        and self.runs[r]["meta"].get("dag_id") in dags), reverse=True)
        reads = 0
        for at, run_key in older:
            if not wanted:
                break
            dag = self.runs[run_key]["meta"].get("dag_id")
            if not any(slot[3] == dag and (at, run_key) < bound for (slot, _), bound in wanted.items()):
                continue
            if reads >= budget:
                log.warning("run index: stopped after reading %d older runs; %d group/topic pointers dropped",
                            reads, len(wanted))
                break
            run = read_folder(fs, f"{base}/{run_key}", self.runs[run_key]["sig"])
            reads += 1
            if run is None:
                continue
            for (slot, where), bound in list(wanted.items()):
                keys = run.in_findings if where == IN_FINDINGS else run.in_status
                if slot[3] == dag and (at, run_key) < bound and slot[:3] in keys:
                    pointers = self.latest.setdefault(slot, [None, None])
                    if pointers[where] is None or self.order[pointers[where]] < (at, run_key):
                        pointers[where] = run_key
                    del wanted[(slot, where)]
        return reads

    # -- storage --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "runs": self.runs,
                "latest": [[*slot, *pointers] for slot, pointers in self.latest.items()],
                "provisional": self.provisional, "skipped": self.skipped, "incomplete": self.incomplete}

    @classmethod
    def from_json(cls, data: Any) -> "RunIndex":
        if not isinstance(data, dict) or data.get("version") != VERSION:
            return cls()
        index = cls(runs=dict(data.get("runs") or {}), provisional=dict(data.get("provisional") or {}),
                     skipped=dict(data.get("skipped") or {}), incomplete=dict(data.get("incomplete") or {}))
        if "incomplete" not in data:
            index.provisional = {}  # stored before the completeness rule: read them again to judge them
        for run_key, rec in list(index.runs.items()):
            at = parse_time((rec.get("meta") or {}).get("planned_at")) if isinstance(rec, dict) else None
            if at is None:
                del index.runs[run_key]  # not what this module writes: read it again
                continue
            index.order[run_key] = (at, run_key)
        for row in data.get("latest") or []:
            c, g, t, dag, in_findings, in_status = row
            pointers = [r if r in index.runs else None for r in (in_findings, in_status)]
            if pointers != [None, None]:
                index.latest[(c, g, t, dag)] = pointers
        return index


# One index per findings root per process, with the stored file's signature it
# was loaded from or saved as: a page view or scrape parses the file only when
# another process rewrote it.
_MEMORY: dict[str, tuple[Any, RunIndex]] = {}
_LOCK = threading.Lock()
_MEMORY_MAX = 16


def _file_sig(fs, path: str) -> Any:
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return None
    return (info.get("size"), _stamp(info))


def _load(fs, path: str) -> RunIndex:
    try:
        with fs.open(path, "rt", encoding="utf-8") as fh:
            return RunIndex.from_json(json.load(fh))
    except FileNotFoundError:
        return RunIndex()
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("run index %s unreadable (%s); rebuilding it", path, exc)
        return RunIndex()


def planned_times(findings_root: str) -> dict[str, datetime]:
    """run key -> planned_at of each run the stored index folded (one read, no refresh; {}
    without an index): what retention dates a folder by when its name does not say."""
    fs, base = filesystem(findings_root)
    index = _load(fs, f"{base}/{INDEX_FILE}")
    return {key: at for key in index.runs if (at := parse_time((index.meta(key) or {}).get("planned_at")))}


def _save(fs, base: str, index: RunIndex) -> bool:
    """Atomic rewrite (hidden temporary name, then rename); False where the root is read-only."""
    tmp = f"{base}/.{INDEX_FILE}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with fs.open(tmp, "wt", encoding="utf-8") as fh:
            json.dump(index.to_json(), fh, separators=(",", ":"))
        fs.mv(tmp, f"{base}/{INDEX_FILE}")
        return True
    except OSError as exc:
        log.debug("run index not saved under %s: %s", base, exc)
        try:
            if fs.exists(tmp):
                fs.rm(tmp)
        except OSError:
            pass
        return False


def refresh(findings_root: str, *, force: Iterable[str] = ()) -> RunIndex:
    """The index of `findings_root`, brought up to date with its folders (see the module docstring).

    `force` names run folders to read again whatever their files' times say
    (the writer's own run). Never writes anything but the index file, and
    works without being able to write that.
    """
    fs, base = filesystem(findings_root)
    with _LOCK:
        if not fs.exists(base):
            return RunIndex()
        path = f"{base}/{INDEX_FILE}"
        stored = _file_sig(fs, path)
        held = _MEMORY.get(base)
        index = held[1] if held is not None and held[0] == stored else _load(fs, path)
        if _update(fs, base, index, set(force)):
            if _save(fs, base, index):
                stored = _file_sig(fs, path)
        if len(_MEMORY) >= _MEMORY_MAX and base not in _MEMORY:
            _MEMORY.clear()
        _MEMORY[base] = (stored, index)
        return index


def _update(fs, base: str, index: RunIndex, force: set[str]) -> bool:
    """Fold the listing into `index`; True when anything stored changed."""
    fs.invalidate_cache(base)
    index.folders = {
        _name(e): e for e in fs.ls(base, detail=True)
        if e.get("type") == "directory" and not _name(e).startswith((".", "_"))
    }
    listed = set(index.folders)
    changed = False
    gone = [r for r in (*index.runs, *index.provisional, *index.skipped) if r not in listed]
    newest = sorted(index.order.values(), reverse=True)[:RECHECK_RUNS]
    recheck = {r for _, r in newest} | (force & set(index.runs))
    signatures: dict[str, list[list[Any]] | None] = {}
    stale = []
    for run_key in sorted(recheck & listed):
        signatures[run_key] = folder_signature(fs, f"{base}/{run_key}")
        # `force` (the writer's record_run) rechecks a run even when it is not among the
        # newest; unchanged files mean a reader folded it already: nothing to redo.
        if signatures[run_key] != index.runs[run_key]["sig"]:
            stale.append(run_key)
    lost = []
    for run_key in gone:
        lost += index.remove(run_key)
        index.provisional.pop(run_key, None)
        index.skipped.pop(run_key, None)
        index.incomplete.pop(run_key, None)
    for run_key in stale:
        lost += index.remove(run_key)
    changed |= bool(gone or stale)
    # A rewritten run that still names a key points at it again once re-read below:
    # no walk back through older runs for those (a new group would read up to MAX_FOLD).
    for run_key in stale:
        run = read_folder(fs, f"{base}/{run_key}", signatures[run_key] or [])
        if run is not None and not has_overrides(run.meta) and run.meta.get("dag_id"):
            renamed = {(k, IN_FINDINGS) for k in run.in_findings} | {(k, IN_STATUS) for k in run.in_status}
            lost = [item for item in lost
                    if not (item[0][3] == run.meta.get("dag_id") and (item[0][:3], item[1]) in renamed)]
    index.find_again(fs, base, lost, MAX_FOLD)

    # Folders to read now: the stale runs, provisional folders whose files moved, new folders.
    to_read = list(stale)
    for run_key, sig in list(index.provisional.items()):
        now_sig = folder_signature(fs, f"{base}/{run_key}")
        if now_sig != sig:
            signatures[run_key] = now_sig
            to_read.append(run_key)
    new = [r for r in listed if r not in index.runs and r not in index.provisional and r not in index.skipped
           and r not in stale]
    room = max(0, MAX_FOLD - len(to_read))
    if len(new) > room:
        new.sort(key=lambda r: (_seconds(index.folders[r]), r), reverse=True)
        for run_key in new[room:]:
            index.skipped[run_key] = _seconds(index.folders[run_key])
        new = new[:room]
        changed = True
    elif index.skipped:
        # Older folders a first use left unread: a few per refresh, newest first.
        new += sorted(index.skipped, key=lambda r: (index.skipped[r], r), reverse=True)[:BACKFILL_RUNS]
    to_read += new
    for run_key in to_read:
        sig = signatures.get(run_key) if run_key in signatures else folder_signature(fs, f"{base}/{run_key}")
        index.skipped.pop(run_key, None)
        changed = True
        if sig is None:
            index.provisional.pop(run_key, None)
            index.incomplete.pop(run_key, None)
            continue  # removed meanwhile
        run = read_folder(fs, f"{base}/{run_key}", sig)
        if run is None:
            index.provisional[run_key] = sig
            _judge(fs, f"{base}/{run_key}", run_key, sig, index)
        else:
            index.add(run_key, run, sig)
    return changed


def _judge(fs, path: str, run_key: str, signature: list[list[Any]], index: RunIndex) -> None:
    """Record whether a provisional folder is an incomplete run (and whose, by its run.json if any)."""
    state = run_completeness(fs, path, {s[0]: s[1] for s in signature})
    if not state.reason:
        index.incomplete.pop(run_key, None)
        return
    dag_id = None
    if any(s[0] == RUN_FILE for s in signature):
        try:
            with fs.open(f"{path}/{RUN_FILE}", "rt", encoding="utf-8") as fh:
                meta = json.load(fh)
            dag_id = meta.get("dag_id") if isinstance(meta, dict) else None
        except (OSError, ValueError):
            pass
    index.incomplete[run_key] = {"reason": state.reason, "dag_id": dag_id}
    log.info("run index: %s skipped: incomplete (%s)", path, state.reason)


def record_run(run_dir: str) -> None:
    """The writer's call, once run.json is written: fold this run into its root's index now.

    Never raises: the index is an aid to readers, which fold the run
    themselves when this fails.
    """
    try:
        root, _, name = run_dir.rstrip("/").rpartition("/")
        refresh(root, force=[name])
    except Exception as exc:  # noqa: BLE001 - never hold back the run that calls this
        log.warning("run index: could not record %s: %s", run_dir, " ".join(str(exc).split()))
