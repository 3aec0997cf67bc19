"""Bounded readers (issue 9): the lag page and the exporter read the run index's
candidate runs, not every run folder, and answer exactly as a full read does.

A history of run folders is written the way the DAGs leave them (sweeps every
5 minutes, scoped incident runs, runs with threshold overrides, a bare
`lagdoctor diagnose` folder without run.json, a half-written and a corrupt
one). Folder names are hashes, so nothing here depends on names sorting by
time. Each check compares the indexed answer with the full read of the same
folders, and counts the files the readers open.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lagdoctor import runindex
from lagdoctor.metrics import collect_samples, read_all_runs, render_exposition, render_metrics
from lagdoctor.settings import Settings
from lagdoctor.web import data
from lagdoctor.web.app import create_app
from lagdoctor.web.auth import dag_run_reader

SWEEP, INCIDENT = "kafka_lag_health_sweep", "kafka_lag_incident"
T0 = datetime(2026, 11, 14, tzinfo=timezone.utc)


def _finding(cluster, group, topic, severity, lag, at):
    diagnosis = {"ok": "healthy", "warning": "slow_consumer", "critical": "stalled_consumer"}[severity]
    return {"cluster": cluster, "group_id": group, "topic": topic, "partitions": [] if severity == "ok" else [0],
            "diagnosis": diagnosis, "pattern": "flat" if severity == "ok" else "steady_climb", "severity": severity,
            "summary": f"{diagnosis} in {group} (lag {lag})", "evidence": {"lag": lag},
            "window_start": (at - timedelta(minutes=30)).isoformat(), "window_end": at.isoformat()}


def _status(cluster, group, topic, partition, lag):
    return {"cluster": cluster, "group_id": group, "topic": topic, "partition": partition,
            "status": "OK" if lag < 1000 else "WARN", "lag": lag, "time_lag_seconds": lag / 50,
            "consume_rate": 50.0, "produce_rate": 50.0 + lag / 600, "log_end_offset": 10_000 + lag}


def write_run(root: Path, name: str, keys, at: datetime, rng: random.Random, *, dag=SWEEP, overrides=None,
              run_json=True) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    findings, rows = [], []
    for cluster, group, topic in keys:
        lag = rng.choice([0, 5, 40, 2_500, 90_000])
        findings.append(_finding(cluster, group, topic, "ok" if lag < 1000 else rng.choice(["warning", "critical"]),
                                 lag, at))
        rows += [_status(cluster, group, topic, p, lag // (p + 1)) for p in range(2)]
    (folder / "findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    (folder / "partition_status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "plans.json").write_text("[]")
    if run_json:
        (folder / "run.json").write_text(json.dumps({
            "dag_id": dag, "run_id": f"run-{name}", "kind": "incident" if dag == INCIDENT else "sweep",
            "planned_at": at.isoformat(), "group_pattern": None, "topic": None,
            "threshold_overrides": overrides or {}}))
    stamp = at.timestamp()
    for path in (*folder.iterdir(), folder):
        os.utime(path, (stamp, stamp))
    return folder


def _name(i: int, dag: str) -> str:
    return f"{dag}__{hashlib.sha1(str(i).encode()).hexdigest()[:12]}"  # names do not sort by time


def seed_history(root: Path, n: int, *, vanishing: bool = True, block: int = 100, seed: int = 7) -> list[str]:
    """n runs 5 minutes apart, oldest first; returns the folder names in that order.

    Steady groups are in every sweep; with `vanishing`, group gone-k is in the
    sweeps of the k-th `block` of runs only (seen only in older runs later),
    and 'late' from the middle on. The last few runs are the special ones.
    """
    rng = random.Random(seed)
    steady = [("prod", f"steady-{g}", f"topic-{g % 3}") for g in range(5)] + [("staging", "search", "docs")]
    names = []
    for i in range(n):
        at = T0 + timedelta(minutes=5 * i)
        keys = list(steady)
        if vanishing:
            keys.append(("prod", f"gone-{i // block}", "topic-0"))
            if i >= n // 2:
                keys.append(("prod", "late", "topic-1"))
        dag, overrides, run_json = SWEEP, None, True
        back = n - i
        if vanishing and i % 37 == 11 or back in (9, 6):
            dag, keys = INCIDENT, keys[:1]  # a scoped incident run on one group
            if i % 3 == 0 or back == 6:
                overrides = {"warning_lag": 1}
        if back == 4:
            run_json = False  # a bare `lagdoctor diagnose` output: dated by file times
        name = _name(i, dag)
        write_run(root, name, keys, at, rng, dag=dag, overrides=overrides, run_json=run_json)
        names.append(name)
    broken = root / names[-2] / "partition_status.jsonl"  # not valid JSON: both readers skip the run
    broken.write_text(broken.read_text()[:-20])
    half = root / "half-written"  # the job wrote findings, no status rows yet
    half.mkdir()
    (half / "findings.jsonl").write_text(json.dumps(_finding("prod", "steady-0", "topic-0", "critical", 7, at)) + "\n")
    return names


# -- the answers, indexed and full ---------------------------------------------------------

def page_indexed(root, **kw):
    states, runs = data.latest_states(str(root), **kw)
    return [(s.key, s.run.run_key, s.findings, s.status_rows) for s in states], [r.run_key for r in runs]


def page_full(root, **kw):
    states, runs = data.latest_states(str(root), runs=data.list_runs(str(root), limit=10**9), **kw)
    return [(s.key, s.run.run_key, s.findings, s.status_rows) for s in states], [r.run_key for r in runs]


def metrics_full(root) -> str:
    return render_exposition(collect_samples(read_all_runs(str(root))))


def assert_same_as_full_read(root, **kw):
    assert page_indexed(root, **kw) == page_full(root, **kw)
    assert render_metrics(str(root)) == metrics_full(root)


def client(data_root: Path, can_read=lambda dag_id: True) -> TestClient:
    app = create_app(lambda: Settings(data_root=str(data_root)))
    app.dependency_overrides[dag_run_reader] = lambda: can_read
    return TestClient(app)


def _page(c: TestClient) -> str:
    return re.sub(r"generated [0-9: -]+ UTC", "generated", c.get("/").text)


def _api(c: TestClient) -> dict:
    return {k: v for k, v in c.get("/api/findings").json().items() if k != "generated_at"}


@pytest.fixture
def new_process(monkeypatch):
    """Forget what this process holds (the index and parsed runs), as a fresh server would."""
    def forget():
        monkeypatch.setattr(runindex, "_MEMORY", {})
        monkeypatch.setattr(data, "_CACHE", {})
    forget()
    return forget


@pytest.fixture
def opened(monkeypatch):
    """Names of the files opened through fsspec's local filesystem (both readers use it)."""
    from fsspec.implementations.local import LocalFileSystem

    names: list[str] = []
    real = LocalFileSystem._open

    def counting(self, path, *args, **kwargs):
        names.append(str(path).rsplit("/", 1)[-1])
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "_open", counting)
    return names


# -- same answers -------------------------------------------------------------------------

def test_500_runs_page_api_and_exporter_equal_a_full_read(tmp_path, monkeypatch, new_process):
    root = tmp_path / "findings"
    names = seed_history(root, 500)
    assert_same_as_full_read(root)
    assert_same_as_full_read(root, can_read_dag=lambda d: d == INCIDENT)  # a user who may read one DAG only
    assert_same_as_full_read(root, cluster="prod", group="gone-2")

    # Groups seen only in older runs still show, each from its own newest run.
    states, _ = data.latest_states(str(root))
    shown = {s.group_id: s.run.run_key for s in states}
    assert shown["gone-0"] == names[99] and shown["gone-3"] == names[399]

    # The page and its JSON, through the app: the same bytes as from every folder.
    new_process()
    with client(tmp_path) as c:
        indexed = (_page(c), _api(c))
    monkeypatch.setattr(data, "candidate_runs", lambda root, index=None: data.list_runs(root, limit=10**9))
    with client(tmp_path) as c:
        assert (_page(c), _api(c)) == indexed
    assert "gone-4" in indexed[0] and "threshold overrides: warning_lag=1" in indexed[0]


def test_answers_follow_deleted_rewritten_and_new_runs(tmp_path, new_process):
    root = tmp_path / "findings"
    names = seed_history(root, 300)
    rng = random.Random(3)
    assert_same_as_full_read(root)
    # Retention removes the oldest runs; someone removes the newest sweep by hand:
    # its groups fall back to the sweep before it.
    for name in names[:120]:
        shutil.rmtree(root / name)
    newest_sweep = next(n for n in reversed(names) if n.startswith(SWEEP) and (root / n / "run.json").exists())
    shutil.rmtree(root / newest_sweep)
    assert_same_as_full_read(root)
    # A retried plan rewrites the newest run's run.json in place: a later time, then
    # threshold overrides (its groups fall back to the sweep before it).
    run_json = root / names[-3] / "run.json"
    meta = json.loads(run_json.read_text())
    run_json.write_text(json.dumps({**meta, "planned_at": (T0 + timedelta(days=3)).isoformat()}))
    assert_same_as_full_read(root)
    run_json.write_text(json.dumps({**meta, "threshold_overrides": {"warning_lag": 1}}))
    assert_same_as_full_read(root)
    # The bare folder gets its run.json; the half-written one its status rows; a new sweep lands.
    (root / names[-4] / "run.json").write_text(json.dumps({"dag_id": SWEEP, "planned_at": T0.isoformat()}))
    shutil.copy(root / names[-3] / "partition_status.jsonl", root / "half-written" / "partition_status.jsonl")
    write_run(root, "a-new-sweep", [("prod", "steady-1", "topic-1")], T0 + timedelta(days=4), rng)
    assert_same_as_full_read(root)
    # A fresh process reads the stored index and agrees too.
    new_process()
    assert_same_as_full_read(root)


# -- bounded work ---------------------------------------------------------------------------

def _costs(data_root: Path, run: str, opened: list[str], new_process) -> dict[str, list[str]]:
    """Files opened by one page view, one JSON call, one report and one scrape in a fresh
    process, once the index exists."""
    root = data_root / "findings"
    while runindex.refresh(str(root)).not_read:  # built earlier (by the writer, or earlier views)
        pass
    report = data_root / "reports" / run / "r.html"
    report.parent.mkdir(parents=True)
    report.write_text("<p>report</p>")
    costs = {}
    with client(data_root) as c:
        for what, call in (("page", lambda: c.get("/")), ("api", lambda: c.get("/api/findings")),
                           ("report", lambda: c.get(f"/reports/{run}/r.html")),
                           ("scrape", lambda: render_metrics(str(root)))):
            new_process()
            opened.clear()
            call()
            costs[what] = sorted(opened)
    return costs


def test_work_per_view_and_scrape_does_not_grow_with_stored_runs(tmp_path, opened, new_process):
    small, large = tmp_path / "small", tmp_path / "large"
    oldest_small = seed_history(small / "findings", 50, vanishing=False)[0]
    oldest_large = seed_history(large / "findings", 500, vanishing=False)[0]
    costs_small = _costs(small, oldest_small, opened, new_process)
    costs_large = _costs(large, oldest_large, opened, new_process)
    assert costs_large == costs_small
    # The index, then only the candidates: the newest sweep, the two incident runs, and the
    # two folders the index cannot date or parse (the corrupt one has its run.json read);
    # the half-written folder is incomplete: never a candidate, never opened.
    index = runindex.refresh(str(large / "findings"))
    candidates = index.candidates()
    assert len(candidates) == 5 and "half-written" not in candidates
    assert [name for name, _ in index.incomplete_runs()] == ["half-written"]
    assert costs_large["page"].count("_runindex.json") == 1
    assert costs_large["page"].count("findings.jsonl") == 5
    assert costs_large["page"].count("run.json") == 1
    assert costs_large["report"] == ["r.html", "run.json"]  # its own run's run.json: who may read it
    assert len(costs_large["scrape"]) <= 1 + 3 * len(candidates)


def test_a_warm_scrape_reads_nothing_that_did_not_change(tmp_path, opened, new_process):
    from lagdoctor.metrics import RunCache

    root = tmp_path / "findings"
    names = seed_history(root, 200, vanishing=False)
    cache = RunCache()
    render_metrics(str(root), cache)
    opened.clear()
    render_metrics(str(root), cache)
    assert opened == []
    write_run(root, "next-sweep", [("prod", "steady-0", "topic-0")], T0 + timedelta(days=2), random.Random(1))
    opened.clear()
    render_metrics(str(root), cache)
    # The new run only: folded into the index, then read for its samples; the index rewritten.
    assert sorted(n for n in opened if not n.startswith(".")) == [
        "findings.jsonl", "findings.jsonl", "partition_status.jsonl", "partition_status.jsonl", "run.json",
        "run.json"]
    assert [n for n in opened if n.startswith(".")][0].startswith("._runindex.json.")
    assert len(names) == 200


def test_the_writers_call_keeps_the_index_current(tmp_path, new_process):
    root = tmp_path / "findings"
    seed_history(root, 40, vanishing=False)
    runindex.refresh(str(root))
    folder = write_run(root, "written-now", [("prod", "steady-0", "topic-0")], T0 + timedelta(days=1),
                       random.Random(2))
    runindex.record_run(str(folder))
    stored = json.loads((root / runindex.INDEX_FILE).read_text())
    assert "written-now" in stored["runs"]
    new_process()
    assert_same_as_full_read(root)
    # A writer that cannot fold (the folder is gone) does not fail its task.
    runindex.record_run(str(root / "no-such-run"))


def test_without_an_index_the_newest_runs_are_read_first_and_the_page_says_what_is_not(
        tmp_path, monkeypatch, new_process):
    monkeypatch.setattr(runindex, "MAX_FOLD", 20)
    monkeypatch.setattr(runindex, "BACKFILL_RUNS", 15)
    root = tmp_path / "findings"
    names = seed_history(root, 80, block=30)
    with client(tmp_path) as c:
        html = c.get("/").text
        assert "61 older run folders not read yet" in html  # 81 folders, the newest 20 read
        assert c.get("/api/findings").json()["runs_not_read"] == 46  # then 15 more on each view
        states, _ = data.latest_states(str(root))
        assert "gone-0" not in {s.group_id for s in states}  # only in the oldest runs, not read yet
        for _ in range(3):
            c.get("/api/findings")
        assert "runs_not_read" not in c.get("/api/findings").json()
        assert "not read yet" not in c.get("/").text
    assert_same_as_full_read(root)
    assert {s.run.run_key for s in data.latest_states(str(root))[0] if s.group_id == "gone-0"} == {names[29]}


def test_a_read_only_findings_root_still_answers(tmp_path, monkeypatch, new_process):
    root = tmp_path / "findings"
    seed_history(root, 30)
    monkeypatch.setattr(runindex, "_save", lambda fs, base, index: False)
    assert_same_as_full_read(root)
    assert not (root / runindex.INDEX_FILE).exists()


def test_recording_a_run_a_scrape_already_folded_reads_no_older_run(tmp_path, opened, new_process):
    """The sweep's write_reports records its run after a scrape may have folded it: a
    group new in that run must not send the writer back through hundreds of older runs."""
    root = tmp_path / "findings"
    seed_history(root, 300, vanishing=False)
    folder = write_run(root, "with-a-new-group", [("prod", "steady-0", "topic-0"), ("prod", "brand-new", "t")],
                       T0 + timedelta(days=2), random.Random(3))
    runindex.refresh(str(root))  # a scrape between the plan and write_reports
    opened.clear()
    runindex.record_run(str(folder))
    assert [n for n in opened if n in ("run.json", "findings.jsonl")] == []
    # and a run rewritten in place (a retried plan) is re-read alone, not its predecessors
    (folder / "findings.jsonl").write_text((folder / "findings.jsonl").read_text() + "\n")
    opened.clear()
    runindex.record_run(str(folder))
    assert opened.count("run.json") <= 2 and opened.count("findings.jsonl") <= 2
    stored = json.loads((root / runindex.INDEX_FILE).read_text())
    assert "with-a-new-group" in stored["runs"]


# -- one rule for a complete run (issue 17) ---------------------------------------------------------

F = json.dumps(_finding("prod", "g", "t", "critical", 5_000, T0)) + "\n"
S = json.dumps(_status("prod", "g", "t", 0, 5_000)) + "\n"


def _marker(findings_bytes=len(F), status=True) -> str:
    outputs = {"findings.jsonl": {"rows": 1, "bytes": findings_bytes}}
    if status:
        outputs["partition_status.jsonl"] = {"rows": 1, "bytes": len(S)}
    return json.dumps({"outputs": outputs})


@pytest.mark.parametrize(("files", "complete", "reason"), [
    # written before the marker existed: both contract outputs whole -> history keeps answering
    ({"findings.jsonl": F, "partition_status.jsonl": S, "run.json": "{}"}, True, ""),
    ({"findings.jsonl": F}, False, "no _SUCCESS and no partition_status.jsonl"),
    ({"_WRITING": "{}", "findings.jsonl": F, "partition_status.jsonl": S}, False,
     "the diagnosis did not finish writing it: no _SUCCESS"),
    ({"_WRITING": "{}"}, False, "the diagnosis did not finish writing it: no _SUCCESS"),
    ({"_SUCCESS": _marker(), "findings.jsonl": F, "partition_status.jsonl": S}, True, ""),
    ({"_SUCCESS": _marker(), "findings.jsonl": F}, False,
     "_SUCCESS does not match the files: partition_status.jsonl missing"),
    ({"_SUCCESS": _marker(9), "findings.jsonl": F, "partition_status.jsonl": S}, False,
     f"_SUCCESS does not match the files: findings.jsonl is {len(F)} bytes, not 9"),
    ({"_SUCCESS": _marker(status=False), "findings.jsonl": F, "partition_status.jsonl": S}, False,
     "_SUCCESS does not match the files: partition_status.jsonl not named"),
    ({"_SUCCESS": "not json", "findings.jsonl": F, "partition_status.jsonl": S}, False, None),
    ({"plans.json": "[]"}, False, ""),  # no run folder at all: ignored, as before
])
def test_one_rule_says_which_run_folders_are_complete(tmp_path, new_process, files, complete, reason):
    root = tmp_path / "findings"
    folder = root / "the-run"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    fs, base = runindex.filesystem(str(folder))
    state = runindex.run_completeness(fs, base)
    assert state.complete is complete
    assert state.legacy is (complete and "_SUCCESS" not in files)
    if reason is None:
        assert state.reason.startswith("_SUCCESS unreadable (")
    else:
        assert state.reason == reason
    index = runindex.refresh(str(root))
    assert index.incomplete_runs() == ([("the-run", state.reason)] if state.reason else [])
    if complete or state.reason:  # (a folder that is no run stays a candidate each reader ignores, as before)
        assert ("the-run" in index.candidates()) is complete
    assert [r.run_key for r in data.list_runs(str(root))] == (["the-run"] if complete else [])
    assert_same_as_full_read(root)


def test_an_index_stored_before_the_rule_judges_its_half_written_folders_again(tmp_path, new_process):
    root = tmp_path / "findings"
    seed_history(root, 20, vanishing=False)
    runindex.refresh(str(root))
    stored = json.loads((root / runindex.INDEX_FILE).read_text())
    assert "half-written" in stored["provisional"] and "half-written" in stored["incomplete"]
    del stored["incomplete"]  # as the index of an older lagdoctor left it
    (root / runindex.INDEX_FILE).write_text(json.dumps(stored))
    new_process()
    assert [name for name, _ in runindex.refresh(str(root)).incomplete_runs()] == ["half-written"]
