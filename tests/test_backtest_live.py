"""Issue 33's first "done when": on the snapshots of a live run, the backtest's verdict per sweep
equals what the real sweeps decided for the same windows, and it would have said what they said.

The run is the demo's incidents on the test broker (a hot partition, a producer surge, a consumer
killed mid-run, a healthy group), swept by the sweep DAG's own stages one after another: samples
into the store, the diagnosis as a Spark Connect client (as DiagnoseLagOperator runs it), carrying
from the run before, the plan, and the post to the local outbox. Then `run_backtest(as_swept=True)`
replays those sweeps from the store and their run folders alone.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from lagdoctor import runindex
from lagdoctor.contracts import SWEEP_DAG_ID
from lagdoctor.notify.formatting import parse_iso
from lagdoctor.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.spark]

SWEEPS = 6
WINDOW_MINUTES = 1.0  # short, so the windows slide: each sees about three sweeps' samples
SAMPLES, SAMPLE_INTERVAL_S = 3, 3.0
SPOKEN = ("posted", "replied", "recovered")  # decisions that send a message


def verdicts(findings: list[dict]) -> dict[tuple, list]:
    out: dict[tuple, list] = {}
    for f in findings:
        out.setdefault((f["cluster"], f["group_id"], f["topic"]), []).append(
            [f["diagnosis"], f["severity"], bool(f.get("provisional"))])
    return {k: sorted(v) for k, v in out.items()}


def replayed_verdicts(timeline: list[dict], ends: list[datetime]) -> dict[datetime, dict[tuple, list]]:
    """Each sweep's verdict per key from the backtest's timeline (each change held until the next)."""
    changes: dict[tuple, list[tuple[datetime, list]]] = {}
    for row in timeline:
        verdict = sorted([v["diagnosis"], v["severity"], bool(v["provisional"])] for v in row["verdict"])
        changes.setdefault((row["cluster"], row["group_id"], row["topic"]), []).append(
            (parse_iso(row["sweep_end"]), verdict))
    out: dict[datetime, dict[tuple, list]] = {end: {} for end in ends}
    for key, rows in changes.items():
        rows.sort(key=lambda r: r[0])
        for end in ends:
            held = [v for at, v in rows if at <= end]
            if held:
                out[end][key] = held[-1]
    return out


def one_sweep(n: int, settings: Settings, server, prefix: str) -> tuple[datetime, dict]:
    """The sweep DAG's stages for one scheduled run: (its window's end, what it decided to say)."""
    from lagdoctor.diagnosis.submit import connect_client_env
    from lagdoctor.stages.collect import take_snapshots
    from lagdoctor.stages.diagnose import prepare_diagnosis, read_findings
    from lagdoctor.stages.notify import post_findings
    from lagdoctor.stages.plan import plan_findings

    run_id = f"scheduled__live-{n:02d}"
    take_snapshots("kafka_default", run_id, group_pattern=f"{prefix}.*", samples=SAMPLES,
                   interval_s=SAMPLE_INTERVAL_S, settings=settings, dag_id=SWEEP_DAG_ID)
    prep = prepare_diagnosis("kafka_default", run_id, window_minutes=WINDOW_MINUTES, dag_id=SWEEP_DAG_ID,
                             settings=settings)
    job = subprocess.run([prep["python"], prep["application"], *prep["args"]], capture_output=True, text=True,
                         env=connect_client_env(server.client_url, py_files=prep["py_files"]), timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    summary = plan_findings(prep["output"], dag_id=SWEEP_DAG_ID, run_id=run_id, kind="sweep",
                            clusters=prep["clusters"])
    said = post_findings(summary["plans"], run_id, settings=settings)
    (window_end,) = {parse_iso(f["window_end"]) for f in read_findings(prep["output"])}
    return window_end, said


def test_the_backtest_of_a_live_run_says_what_its_sweeps_decided_sweep_by_sweep(
        kafka_bootstrap, unique, connect_server, tmp_path, monkeypatch):
    from lagdoctor.backtest import replay_notifications, run_backtest
    from lagdoctor.lab.demo import (CRASHED_GROUP, SURGE_GROUP, SURGE_RATE, kill_consumer, live_incidents,
                                    start_workloads, stop_workloads)

    settings = Settings(data_root=str(tmp_path / "data"))
    for name in ("SLACK_BOT_TOKEN", "AIRFLOW_CONN_SLACK_API_DEFAULT", "LAGDOCTOR_STATE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", settings.data_root)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setattr(runindex, "_MEMORY", {})

    prefix = unique("live")
    wanted = {"orders-processor", SURGE_GROUP, CRASHED_GROUP, "audit-archiver"}
    incidents = [dataclasses.replace(i, topic=f"{prefix}-{i.topic}", group=f"{prefix}-{i.group}")
                 for i in live_incidents() if i.group in wanted]
    crashed, surging = f"{prefix}-{CRASHED_GROUP}", f"{prefix}-{SURGE_GROUP}"
    real: dict[datetime, dict] = {}
    start_workloads(kafka_bootstrap, incidents)
    try:
        for n in range(SWEEPS):
            if n == 1:
                kill_consumer(incidents, crashed)
            if n == 2:
                next(i for i in incidents if i.group == surging).producer.rate = SURGE_RATE
            end, said = one_sweep(n, settings, connect_server, prefix)
            real[end] = said
            time.sleep(2)
    finally:
        stop_workloads(incidents)

    ends = sorted(real)
    runs = sorted(p for p in Path(settings.findings_root).iterdir() if p.is_dir())
    swept = {}
    for run in runs:
        found = [json.loads(line) for line in (run / "findings.jsonl").read_text().splitlines() if line.strip()]
        swept[parse_iso(found[0]["window_end"])] = verdicts(found)
    assert sorted(swept) == ends

    output, report = run_backtest(start=ends[0], end=ends[-1], window_minutes=None, as_swept=True,
                                  store=settings.snapshots_root, output=str(tmp_path / "backtest"),
                                  master="local[2]", settings=settings)
    assert report["sweeps"] == SWEEPS and report["window_minutes"] == WINDOW_MINUTES
    assert report["text"].splitlines()[0].endswith(f"{SWEEPS} sweeps (as they ran), 1-minute window")
    timeline = [json.loads(line) for line in Path(output, "current.timeline.jsonl").read_text().splitlines()]
    replayed = replayed_verdicts(timeline, ends)
    for end in ends:
        assert replayed[end] == swept[end], f"the sweep ending {end.isoformat()} decided otherwise"
    problems = {v[0] for found in swept.values() for vs in found.values() for v in vs} - {
        "healthy", "collecting_history"}
    assert "crashed_consumer" in problems, f"the live run showed no crash to compare: {problems}"

    # what would have been said, sweep by sweep, is what the sweeps said
    findings = [json.loads(line) for line in Path(output, "current.findings.jsonl").read_text().splitlines()]
    decisions, _, _ = replay_notifications(findings)
    for end in ends:
        would = {}
        for d in decisions:
            if parse_iso(d["sweep_end"]) == end and d["decision"] in SPOKEN:
                would[d["decision"]] = would.get(d["decision"], 0) + 1
        said = {k: v for k, v in real[end].items() if k in SPOKEN}
        assert would == said, f"the sweep ending {end.isoformat()} said {said}, the backtest {would}"
    assert sum(sum(v for k, v in s.items() if k in SPOKEN) for s in real.values()) > 0
