"""Faults the diagnosis job must survive, run as a user runs it: spark-submit of
spark_jobs/diagnose_lag.py through lagdoctor.diagnosis.submit.

One store holds every fault at once, so two JVM starts cover them all:
a corrupt file and a schema-conflicting file (quarantined, the rest
diagnosed), a failed offset read at the window's end (never "healthy, ok"),
a log end offset going backwards (a warning naming the partition); the
second run, scoped with --groups, moves nothing more and writes only the
asked groups (on the warm server only: scoping is the job's own Python).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest

from tests.fixtures.spark import ENGINES, connect_job, read_jsonl, run_job

pytestmark = pytest.mark.spark

DAY = "cluster=prod/date=2026-11-21"


def stderr_lines(proc):
    # Java 17 prints one start-up notice ("Using incubator modules"); nothing else is expected
    return [ln for ln in proc.stderr.splitlines() if ln.strip() and "incubator modules" not in ln]


def group_table(group, topic, rows):
    """Contract-1 rows (plus read_error) for one group: rows are
    (seconds before the seeds' end, partition, log end, committed, read_error)."""
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema
    from lagdoctor.lab.sim import SEEDS_END

    schema = snapshot_arrow_schema(include_optional=True)
    if "read_error" not in schema.names:  # contract 1's optional column, listed or not yet
        schema = schema.append(pa.field("read_error", pa.string()))
    schema = pa.schema([f.with_nullable(True) for f in schema])  # failed reads leave offsets null
    out = []
    for back, partition, leo, committed, error in rows:
        lag = None if committed is None or leo is None else max(0, leo - committed)
        out.append({"snapshot_ts": SEEDS_END - timedelta(seconds=back), "cluster": "prod", "group_id": group,
                    "group_state": "STABLE", "topic": topic, "partition": partition, "log_start_offset": 0,
                    "log_end_offset": leo, "committed_offset": committed, "lag": lag, "member_id": "consumer-1-a",
                    "client_id": "consumer-1", "host": "10.0.0.9", "group_members": 1, "read_error": error})
    return pa.Table.from_pylist(out, schema=schema)


@pytest.fixture(scope="module", params=ENGINES)
def runner(request):
    """The job's runner for this module's pass: spark-submit, then a Spark Connect client;
    each pass has a store of its own (the first run moves the bad files aside)."""
    return run_job if request.param == "spark-submit" else connect_job(request.getfixturevalue("connect_server"))


@pytest.fixture(scope="module")
def faulty_store(tmp_path_factory, runner):
    """The seeds' incident plus every fault; the store root sits in a dot-folder, as `.demo/` does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lagdoctor.lab.sim import seeds_incident_table, write_seeds_incident

    root = tmp_path_factory.mktemp("faults") / ".lagdoctor" / "snapshots"
    write_seeds_incident(str(root))
    day = root / DAY
    steps = range(300, -1, -30)  # the seeds' 5 minutes, every 30 s
    # payments keeps up, but the last read of partition 1's committed offset failed
    failed = "committed offsets: KafkaError{code=_TIMED_OUT}"
    payments = [(b, p, 100_000 - 10 * b, None if (b == 0 and p == 1) else 100_000 - 10 * b - 50,
                 failed if (b == 0 and p == 1) else None) for b in steps for p in (0, 1)]
    pq.write_table(group_table("payments", "payments", payments), day / "payments.parquet")
    # audit-log's topic was deleted and recreated 2 minutes ago: log end 3,256 -> 40; the old commit stays
    recreated = [(b, 0, 3_000 + (300 - b) if b > 120 else 40 + (120 - b), 3_000 + (300 - b) if b > 120 else 3_180,
                  None) for b in steps]
    pq.write_table(group_table("audit-log", "audit", recreated), day / "audit.parquet")
    # the faults: half a file, and a writer that put committed_offset as text
    (day / "snapshot-corrupt.parquet").write_bytes(b"PAR1" + b"\0" * 64)
    seeds = seeds_incident_table(cluster="prod", group_id="orders-replay")
    typed = seeds.set_column(seeds.schema.get_field_index("committed_offset"), "committed_offset",
                             seeds["committed_offset"].cast(pa.string()))
    pq.write_table(typed, day / "snapshot-typed.parquet")
    return root


@pytest.fixture(scope="module")
def first_run(faulty_store, tmp_path_factory, runner):
    out = tmp_path_factory.mktemp("out-first")
    return runner(faulty_store, out, "--quarantine"), out


def test_bad_files_are_quarantined_and_the_rest_diagnosed(faulty_store, first_run):
    proc, out = first_run
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["_SUCCESS", "findings.jsonl", "partition_status.jsonl", "quarantined.jsonl"]

    corrupt, typed = str(faulty_store / DAY / "snapshot-corrupt.parquet"), str(faulty_store / DAY / "snapshot-typed.parquet")
    quarantined = read_jsonl(out / "quarantined.jsonl")
    assert [q["path"] for q in quarantined] == [corrupt, typed]
    assert quarantined[0]["reason"].startswith("not a readable Parquet file: ")
    assert quarantined[1]["reason"] == "column committed_offset is string where contract 1 has int64 (not a number)"
    for q, name in zip(quarantined, ("snapshot-corrupt.parquet", "snapshot-typed.parquet")):
        moved = faulty_store / "_quarantine" / DAY / name
        assert q["moved_to"] == str(moved) and moved.exists() and not os.path.exists(q["path"])
        reason = (moved.parent / f"{name}.reason.txt").read_text().splitlines()
        assert len(reason) == 1 and reason[0].startswith(q["reason"] + "; quarantined at ")
        assert reason[0].endswith(" by diagnose_lag")

    # the user sees each file named once, one line each, and nothing else
    lines = stderr_lines(proc)
    assert len(lines) == 2, proc.stderr
    for line, q in zip(lines, quarantined):
        assert line.startswith("diagnose_lag: WARNING: quarantined ") and q["path"] in line and q["reason"] in line

    # the good data is diagnosed as before; the quarantined file's group is not invented
    findings = read_jsonl(out / "findings.jsonl")
    assert {f["group_id"] for f in findings} == {"orders-processor", "payments", "audit-log"}
    seeds = [f for f in findings if f["group_id"] == "orders-processor"]
    assert [(f["diagnosis"], f["partitions"], f["evidence"]["data_complete"]) for f in seeds] == [
        ("partition_imbalance", [1], True)]


def test_a_failed_offset_read_is_never_healthy_ok(first_run):
    proc, out = first_run
    assert proc.returncode == 0, proc.stderr
    (payments,) = [f for f in read_jsonl(out / "findings.jsonl") if f["group_id"] == "payments"]
    assert (payments["diagnosis"], payments["severity"]) == ("healthy", "warning")
    ev = payments["evidence"]
    assert (ev["data_complete"], ev["read_error_count"], ev["read_errors"]) == (
        False, 1, ["partition 1: committed offsets: KafkaError{code=_TIMED_OUT}"])
    assert ev["lag_unknown_partitions"] == [1] and ev["lag"] == 100  # partition 1's last known 50, not 0
    assert payments["summary"].startswith("Incomplete data: 1 read failed (partition 1: committed offsets: ")
    status = {s["partition"]: s for s in read_jsonl(out / "partition_status.jsonl") if s["group_id"] == "payments"}
    assert (status[1]["lag"], status[1]["lag_unknown"]) == (50, True) and status[1]["read_error"] == "committed offsets: KafkaError{code=_TIMED_OUT}"
    assert (status[0]["lag"], status[0]["lag_unknown"]) == (50, False) and status[0]["read_error"] is None


def test_log_end_offset_going_backwards_is_a_warning(first_run):
    proc, out = first_run
    assert proc.returncode == 0, proc.stderr
    (audit,) = [f for f in read_jsonl(out / "findings.jsonl") if f["group_id"] == "audit-log"]
    assert audit["severity"] == "warning" and audit["evidence"]["offset_reset_partitions"] == [0]
    assert "log end offset went backwards on partition 0 (topic recreated or truncated?)" in audit["summary"]
    (status,) = [s for s in read_jsonl(out / "partition_status.jsonl") if s["group_id"] == "audit-log"]
    assert status["status"] == "REWIND"


def test_a_scoped_rerun_moves_nothing_more_and_writes_only_the_asked_groups(faulty_store, first_run, tmp_path,
                                                                           runner):
    if runner is run_job:
        pytest.skip("scoping is the job's own Python, the same on both engines: run on the warm server only")
    first, _ = first_run  # the store as the first run left it
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out-scoped"
    proc = runner(faulty_store, out, "--quarantine", "--groups", "orders-.*|payments")
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == [] and read_jsonl(out / "quarantined.jsonl") == []
    assert sorted(os.listdir(faulty_store / "_quarantine" / DAY)) == [
        "snapshot-corrupt.parquet", "snapshot-corrupt.parquet.reason.txt",
        "snapshot-typed.parquet", "snapshot-typed.parquet.reason.txt"]
    # an incident run writes verdicts only for the groups it was asked about (full match: not audit-log)
    assert {f["group_id"] for f in read_jsonl(out / "findings.jsonl")} == {"orders-processor", "payments"}
    assert {s["group_id"] for s in read_jsonl(out / "partition_status.jsonl")} == {"orders-processor", "payments"}


# A diagnosis killed with SIGKILL just after findings.jsonl appeared: the driver's own
# writer kills its process right after that file's rename, under a real spark-submit.
KILL_AFTER_FINDINGS = """\
import os, runpy, signal, sys

import lagdoctor.diagnosis.output as output

real_write_text = output.write_text


def write_text(out, name, text):
    path = real_write_text(out, name, text)
    if name == "findings.jsonl":
        os.kill(os.getpid(), signal.SIGKILL)
    return path


output.write_text = write_text
sys.argv[0] = {job!r}
runpy.run_path({job!r}, run_name="__main__")
"""


def test_a_diagnosis_killed_mid_write_leaves_the_last_complete_run_on_page_api_and_exporter(
        faulty_store, first_run, tmp_path, runner):
    import html
    import shutil

    from fastapi.testclient import TestClient

    from lagdoctor.diagnosis.submit import default_job_script
    from lagdoctor.metrics import render_metrics
    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader
    from tests.fixtures.web import api_severities, exported_severities, shown_severities

    proc, out = first_run
    assert proc.returncode == 0, proc.stderr
    findings_root = tmp_path / "lagdoctor" / "findings"
    previous = findings_root / "kafka_lag_health_sweep__scheduled__previous-0123456789"
    shutil.copytree(out, previous)  # the complete run before: its verdicts must stay
    (previous / "run.json").write_text(json.dumps({"dag_id": "kafka_lag_health_sweep", "run_id": "previous",
                                                   "planned_at": "2026-11-21T14:30:00+00:00"}))
    verdicts = api_severities({"findings": read_jsonl(previous / "findings.jsonl")})
    assert verdicts["orders-processor"] == "critical" and len(verdicts) == 3

    killed = findings_root / "kafka_lag_health_sweep__scheduled__killed-0123456789"
    wrapper = tmp_path / "diagnose_then_sigkill.py"
    wrapper.write_text(KILL_AFTER_FINDINGS.format(job=default_job_script()))
    # thresholds no lag reaches: this run's findings would call every group healthy, ok
    proc = runner(faulty_store, killed, "--warning-lag", "1000000000000", "--critical-lag", "10000000000000",
                   "--groups", "orders-.*", job_script=str(wrapper))
    assert proc.returncode != 0
    assert sorted(os.listdir(killed)) == ["_WRITING", "findings.jsonl"]
    assert [(f["group_id"], f["severity"]) for f in read_jsonl(killed / "findings.jsonl")] == [
        ("orders-processor", "ok")]

    app = create_app(lambda: Settings(data_root=str(tmp_path / "lagdoctor")))
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: True)
    with TestClient(app) as client:
        page = client.get("/").text
        body = client.get("/api/findings").json()
    shown, api = shown_severities(page), api_severities(body)
    exported = exported_severities(render_metrics(str(findings_root)))
    assert shown == api == exported == verdicts
    assert {f["run_key"] for f in body["findings"]} == {previous.name}
    note = f"1 incomplete run skipped: {killed} (the diagnosis did not finish writing it: no _SUCCESS)"
    assert body["incomplete_runs_text"] == note and note in html.unescape(page)
