"""Reader cost over a week of stored runs: the lag page, the report route and one
Prometheus scrape, with the run index (lagdoctor.runindex).

Builds N run folders (default 2,016: a week of 5-minute sweeps) of G groups
each (findings.jsonl, partition_status.jsonl, plans.json, run.json, as the
sweep leaves them) in a temporary folder, then times:

  - the index's first use (no index yet: the newest MAX_FOLD folders read),
    then the writer's call for one new run (``record_run``);
  - the lag page's data (``latest_states``) and the whole page (GET /), in a
    fresh process (index file present, nothing parsed yet) and warm;
  - the report route (GET /reports/<run>/<file>);
  - one scrape (``render_metrics``), cold (new process, new RunCache) and warm.

    python bench/readers_bench.py [--runs 2016] [--groups 200] [--partitions 2] [--full]

``--full`` also times the full read of every folder (the readers before the
index), which takes minutes at the default size. No snapshots are written, so
the page draws no charts: the figures are the cost of finding and reading runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

SWEEP = "kafka_lag_health_sweep"
T0 = datetime(2026, 11, 14, tzinfo=timezone.utc)


def build(root: Path, runs: int, groups: int, partitions: int, first: int = 0) -> list[str]:
    """Run folders oldest first (the `first`-th sweep on); returns their names. Lags vary by run."""
    from lagdoctor.stages.common import run_key

    names = []
    for i in range(first, first + runs):
        at = T0 + timedelta(minutes=5 * i)
        run_id = f"scheduled__{at.isoformat()}"
        name = run_key(run_id, SWEEP)
        folder = root / name
        folder.mkdir(parents=True)
        findings, rows = [], []
        for g in range(groups):
            lag = (i * 7919 + g * 104729) % 50_000
            severity = "ok" if lag < 20_000 else "warning" if lag < 40_000 else "critical"
            diagnosis = "healthy" if severity == "ok" else "slow_consumer"
            key = {"cluster": "prod", "group_id": f"group-{g:04d}", "topic": f"topic-{g % 50:02d}"}
            findings.append(json.dumps({
                **key, "partitions": [] if severity == "ok" else [0], "diagnosis": diagnosis,
                "pattern": "flat" if severity == "ok" else "steady_climb", "severity": severity,
                "summary": f"{diagnosis}: lag {lag}", "evidence": {"lag": lag, "data_complete": True},
                "window_start": (at - timedelta(minutes=30)).isoformat(), "window_end": at.isoformat()}))
            rows += [json.dumps({**key, "partition": p, "status": "OK" if severity == "ok" else "WARN",
                                 "lag": lag // partitions, "time_lag_seconds": lag / 500.0,
                                 "consume_rate": 500.0, "produce_rate": 510.0, "log_end_offset": 10_000_000 + i})
                     for p in range(partitions)]
        (folder / "findings.jsonl").write_text("\n".join(findings) + "\n")
        (folder / "partition_status.jsonl").write_text("\n".join(rows) + "\n")
        (folder / "plans.json").write_text("[]")
        (folder / "run.json").write_text(json.dumps({
            "dag_id": SWEEP, "run_id": run_id, "kind": "sweep", "planned_at": (at + timedelta(seconds=40)).isoformat(),
            "group_pattern": None, "topic": None, "threshold_overrides": {}}))
        stamp = at.timestamp()
        os.utime(folder, (stamp, stamp))
        names.append(name)
    return names


def timed(label: str, fn, results: list[tuple[str, float]]):
    start = time.perf_counter()
    value = fn()
    results.append((label, time.perf_counter() - start))
    return value


def fresh_process() -> None:
    """Forget the index and parsed runs this process holds, as a new server would."""
    from lagdoctor import runindex
    from lagdoctor.web import data

    runindex._MEMORY.clear()
    data._CACHE.clear()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2016)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--full", action="store_true", help="also time a full read of every folder")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    from fastapi.testclient import TestClient

    from lagdoctor import runindex
    from lagdoctor.metrics import RunCache, collect_samples, read_all_runs, render_metrics
    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader
    from lagdoctor.web.data import latest_states, list_runs

    data_root = Path(tempfile.mkdtemp(prefix="lagdoctor-readers-bench-"))
    root = data_root / "findings"
    results: list[tuple[str, float]] = []
    try:
        names = timed(f"build {args.runs} runs x {args.groups} groups", lambda: build(
            root, args.runs, args.groups, args.partitions), results)
        size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
        report_run = names[-1]
        report = data_root / "reports" / report_run / "group-0001__topic-01__slow_consumer-0123456789.html"
        report.parent.mkdir(parents=True)
        report.write_text("<!doctype html><p>report</p>")

        fresh_process()
        index = timed("index, first use (no index file yet)", lambda: runindex.refresh(str(root)), results)
        not_read_first = index.not_read
        while runindex.refresh(str(root)).not_read:
            pass  # later views read the rest, a few each
        names += build(root, 1, args.groups, args.partitions, first=args.runs)  # the next sweep
        timed("writer's record_run(the next sweep)", lambda: runindex.record_run(str(root / names[-1])), results)

        # Imports and template compilation once, over another root: "new process" below
        # means nothing parsed yet, not nothing imported.
        warm_root = data_root / "warm-up"
        build(warm_root / "findings", 1, 2, 1)
        warm_app = create_app(lambda: Settings(data_root=str(warm_root)))
        warm_app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: True)
        with TestClient(warm_app) as client:
            client.get("/")
        render_metrics(str(warm_root / "findings"))

        app = create_app(lambda: Settings(data_root=str(data_root)))
        app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: True)
        with TestClient(app) as client:
            fresh_process()
            states, _ = timed("page data (latest_states), new process", lambda: latest_states(str(root)), results)
            timed("page data (latest_states), warm", lambda: latest_states(str(root)), results)
            fresh_process()
            timed("GET / (whole page), new process", lambda: client.get("/"), results)
            timed("GET / (whole page), warm", lambda: client.get("/"), results)
            url = f"/reports/{report_run}/{report.name}"
            assert client.get(url).status_code == 200
            timed("GET report route", lambda: client.get(url), results)

        fresh_process()
        cache = RunCache()
        cold = timed("scrape, new process (cold)", lambda: render_metrics(str(root), cache), results)
        warm = timed("scrape, warm (same RunCache)", lambda: render_metrics(str(root), cache), results)
        assert cold == warm
        if args.full:
            timed("full read: page data over every folder",
                  lambda: latest_states(str(root), runs=list_runs(str(root), limit=10**9)), results)
            timed("full read: scrape over every folder", lambda: collect_samples(read_all_runs(str(root))), results)

        index = runindex.refresh(str(root))
        print(f"{len(names)} run folders, {args.groups} groups x {args.partitions} partitions each, "
              f"{size / 1e6:.0f} MB; index file {(root / runindex.INDEX_FILE).stat().st_size / 1e3:.0f} kB; "
              f"{len(index.candidates())} candidate run(s); first use left {not_read_first} folder(s) to read later; "
              f"{len(states)} group/topic pairs shown")
        width = max(len(label) for label, _ in results)
        for label, seconds in results:
            print(f"  {label:<{width}}  {seconds * 1000:9.1f} ms")
    finally:
        shutil.rmtree(data_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
