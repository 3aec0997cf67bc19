"""The diagnosis job end to end (contract 2), once through spark-submit (a JVM start per
run, about 20-40 s on two cores) and once as a Spark Connect client of a warm server:
the same arguments must give the same outputs on both. Tests of what the job decides from
its input, the same Python on either engine, run on the warm server only (ONE_ENGINE)."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fixtures.spark import read_jsonl

pytestmark = pytest.mark.spark

# The window, the scope and the carry chain are decided by the job's own Python, the same on both engines.
ONE_ENGINE = pytest.mark.parametrize("job_runner", ["connect"], indirect=True)


def test_job_writes_findings_and_status_for_every_group(tmp_path, job_runner):
    from lagdoctor.contracts import DIAGNOSES, FINDING_FIELDS, PARTITION_STATUS_FIELDS, PARTITION_STATUSES, PATTERNS
    from lagdoctor.lab.sim import write_scenarios, write_seeds_incident

    store = tmp_path / "snapshots"
    labels = write_scenarios(str(store), seed=11, n_groups_per_scenario=1)
    write_seeds_incident(str(store))
    out = tmp_path / "out"
    proc = job_runner(store, out)
    assert proc.returncode == 0, proc.stderr
    # no temp files left, no _WRITING; nothing quarantined; _SUCCESS names each output's rows and bytes
    assert sorted(os.listdir(out)) == ["_SUCCESS", "findings.jsonl", "partition_status.jsonl", "quarantined.jsonl"]
    assert (out / "quarantined.jsonl").read_text() == ""
    marker = json.loads((out / "_SUCCESS").read_text())
    assert marker["outputs"] == {name: {"rows": len((out / name).read_text().splitlines()),
                                        "bytes": (out / name).stat().st_size}
                                 for name in ("findings.jsonl", "partition_status.jsonl", "quarantined.jsonl")}
    assert marker["outputs"]["findings.jsonl"]["rows"] > 0

    findings = read_jsonl(out / "findings.jsonl")
    for f in findings:
        assert set(FINDING_FIELDS) <= set(f)
        assert f["diagnosis"] in DIAGNOSES and f["pattern"] in PATTERNS
        assert f["severity"] in ("ok", "warning", "critical") and f["summary"] and "\n" not in f["summary"]
        assert f["window_end"].endswith("Z") and f["window_start"] < f["window_end"]
        # issue 18: every finding says whether it is provisional; a decided one names no candidates
        assert f["provisional"] in (True, False)
        if f["provisional"]:
            assert f["deciding_between"][0] == f["diagnosis"] and len(f["deciding_between"]) == 2
            assert f["decided_by"] > f["window_end"][:19] and f["samples_needed"] >= 1 and f["undecided_because"]
        else:
            assert f["deciding_between"] == [] and f.get("decided_by") is None
    by_group = {}
    for f in findings:
        by_group.setdefault(f["group_id"], set()).add(f["diagnosis"])
    # every group gets a finding; a healthy one gets exactly one
    assert set(by_group) == {lab["group_id"] for lab in labels} | {"orders-processor"}
    assert all(d == {"healthy"} or "healthy" not in d for d in by_group.values())
    for lab in labels:
        assert by_group[lab["group_id"]] == set(lab["diagnoses"]), lab["scenario"]
    seeds = [f for f in findings if f["group_id"] == "orders-processor"]
    assert [(f["diagnosis"], f["partitions"]) for f in seeds] == [("partition_imbalance", [1])]
    assert "consumer-2-def456 on 10.0.1.15" in seeds[0]["summary"]

    status = read_jsonl(out / "partition_status.jsonl")
    assert all(set(PARTITION_STATUS_FIELDS) <= set(s) and s["status"] in PARTITION_STATUSES for s in status)
    assert len(status) == sum(lab["partition_count"] for lab in labels) + 3
    crashed = [s for s in status if s["group_id"].startswith("crashed_consumer-")]
    assert crashed and all(s["status"] in ("STOP", "ERR") for s in crashed)  # nobody commits
    # The describe-shaped Slack table reads offsets and owners from these rows.
    seed_rows = {s["partition"]: s for s in status if s["group_id"] == "orders-processor"}
    assert {p: (r["committed_offset"], r["log_end_offset"], r["lag"], r["member_id"], r["host"])
            for p, r in seed_rows.items()} == {
        0: (8_412_901, 8_901_234, 488_333, "consumer-1-abc123", "10.0.1.14"),
        1: (8_100_442, 12_543_210, 4_442_768, "consumer-2-def456", "10.0.1.15"),
        2: (9_023_011, 9_187_443, 164_432, "consumer-3-ghi789", "10.0.1.16"),
    }


# Every bad input is judged by the job's own Python (file footers, paths, arguments), the same on both
# engines; what spark-submit adds is a JVM whose logs must not reach stderr. Two cases show that there.
ON_SPARK_SUBMIT_TOO = {"corrupt", "mixed-no-flag"}


def test_bad_input_exits_non_zero_with_one_line(tmp_path, job_runner, request):
    import pyarrow.parquet as pq

    from lagdoctor.lab.sim import seeds_incident_table

    no_column = tmp_path / "no_column"
    no_column.mkdir()
    pq.write_table(seeds_incident_table().drop_columns(["group_state"]), no_column / "a.parquet")
    # a corrupt file given as the input itself (not a store to quarantine in): named, not moved
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + b"\0" * 64)
    empty = tmp_path / "empty"
    empty.mkdir()
    # a store whose every file is unreadable is the user's input gone wrong, not one poison file:
    # it fails, even when asked to quarantine, and nothing is moved
    all_bad = tmp_path / "all_bad" / "cluster=prod" / "date=2026-11-21"
    all_bad.mkdir(parents=True)
    (all_bad / "only.parquet").write_bytes(b"PAR1" + b"\0" * 64)
    # without --quarantine a bad file in a good store fails the job and stays where it is
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(seeds_incident_table(), mixed / "good.parquet")
    (mixed / "bad.parquet").write_bytes(b"PAR1" + b"\0" * 64)
    cases = {
        "missing": (tmp_path / "does-not-exist", "does not exist", []),
        "no_column": (no_column, "group_state", []),
        "corrupt": (corrupt, str(corrupt), []),
        "all-bad": (tmp_path / "all_bad", "could be read", ["--quarantine"]),
        "mixed-no-flag": (mixed, "bad.parquet", []),
        "bad-regex": (empty, "invalid --groups regex", ["--groups", "(a+"]),
        "empty": (empty, None, []),
    }
    if request.node.callspec.params["job_runner"] == "spark-submit":
        cases = {name: case for name, case in cases.items() if name in ON_SPARK_SUBMIT_TOO}
    with ThreadPoolExecutor(4) as pool:  # JVMs side by side: the slow part is their start
        futures = {name: pool.submit(job_runner, path, tmp_path / f"out-{name}", *extra)
                   for name, (path, _, extra) in cases.items()}
        results: dict[str, subprocess.CompletedProcess] = {name: f.result() for name, f in futures.items()}

    for name, (_, needle, _) in cases.items():
        proc = results[name]
        if needle is None:  # empty input is not an error: empty outputs
            assert proc.returncode == 0, proc.stderr
            out = tmp_path / f"out-{name}"
            assert (out / "findings.jsonl").read_text() == "" == (out / "partition_status.jsonl").read_text()
            assert (out / "quarantined.jsonl").read_text() == ""
            continue
        assert proc.returncode != 0, name
        # Java 17 prints one start-up notice ("Using incubator modules"); besides it, one line
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "incubator modules" not in ln]
        assert len(lines) == 1 and lines[0].startswith("diagnose_lag: error:") and needle in lines[0], (
            name, proc.stderr)
        assert not (tmp_path / f"out-{name}" / "findings.jsonl").exists()
    assert corrupt.exists()  # nothing moved
    assert (all_bad / "only.parquet").exists() and (mixed / "bad.parquet").exists()
    assert not (tmp_path / "all_bad" / "_quarantine").exists() and not (mixed / "_quarantine").exists()
    if "bad-regex" in results:
        assert results["bad-regex"].returncode == 2  # before the JVM starts


@ONE_ENGINE
def test_clusters_and_a_window_without_as_of_read_only_what_they_name(tmp_path, job_runner):
    from datetime import datetime, timedelta

    import pyarrow.compute as pc

    from lagdoctor.lab.sim import SEEDS_END, seeds_incident_table
    from lagdoctor.store import write_snapshot

    store = tmp_path / "snapshots"
    table = seeds_incident_table()
    for ts in sorted(set(table.column("snapshot_ts").to_pylist())):
        write_snapshot(table.filter(pc.equal(table["snapshot_ts"], ts)), str(store), "prod", ts)
    # unreadable files the runs must never open (neither run quarantines: one would fail the job)
    old = store / "cluster=prod" / f"date={SEEDS_END:%Y-%m-%d}" / "hour=09" / "snapshot-old.parquet"
    other = store / "cluster=dr" / f"date={SEEDS_END:%Y-%m-%d}" / f"hour={SEEDS_END:%H}" / "snapshot-dr.parquet"
    for bad in (old, other):
        bad.parent.mkdir(parents=True)
        bad.write_bytes(b"PAR1" + b"\0" * 64)
    cases = {
        "prod": ["--clusters", "prod", "--window-minutes", "10"],
        "unknown": ["--clusters", "nowhere"],
        # a scope with no rows in the footers' window: empty outputs, no error
        "scoped-out": ["--clusters", "prod", "--groups", "nobody-.*", "--window-minutes", "10"],
    }
    with ThreadPoolExecutor(3) as pool:
        futures = {name: pool.submit(job_runner, store, tmp_path / f"out-{name}", *extra) for name, extra in cases.items()}
        results = {name: f.result() for name, f in futures.items()}

    def stderr_lines(proc):
        return [ln for ln in proc.stderr.splitlines() if ln.strip() and "incubator modules" not in ln]

    prod = results["prod"]
    assert prod.returncode == 0, prod.stderr
    assert stderr_lines(prod) == []
    findings = read_jsonl(tmp_path / "out-prod" / "findings.jsonl")
    assert [(f["cluster"], f["diagnosis"], f["partitions"]) for f in findings] == [("prod", "partition_imbalance", [1])]
    # the window's end is the latest snapshot, found in the footers
    window = [datetime.fromisoformat(findings[0][k].replace("Z", "+00:00")) for k in ("window_start", "window_end")]
    assert window == [SEEDS_END - timedelta(minutes=10), SEEDS_END]

    unknown = results["unknown"]
    assert unknown.returncode == 0, unknown.stderr
    assert stderr_lines(unknown) == [f"diagnose_lag: WARNING: no snapshots for cluster(s) nowhere under {store}"]
    out = tmp_path / "out-unknown"
    assert (out / "findings.jsonl").read_text() == "" == (out / "partition_status.jsonl").read_text()
    assert old.exists() and other.exists() and not (store / "_quarantine").exists()

    scoped_out = results["scoped-out"]
    assert scoped_out.returncode == 0, scoped_out.stderr
    out = tmp_path / "out-scoped-out"
    assert (out / "findings.jsonl").read_text() == "" == (out / "partition_status.jsonl").read_text()


def _surge_store(path):
    """Two partitions at 20 msg/s, consumed as they arrive; at minute 10 producers jump to 100 msg/s and the
    consumers top out at 30. A snapshot a minute for an hour."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema
    from lagdoctor.lab.sim import write_table

    t0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    rows = []
    for k in range(61):
        t, after = 60 * k, max(0, 60 * (k - 10))
        for p in range(2):
            leo, committed = 20 * (t - after) + 100 * after, 20 * (t - after) + 30 * after
            rows.append({"snapshot_ts": t0 + timedelta(seconds=t), "cluster": "c", "group_id": "clicks",
                         "group_state": "STABLE", "topic": "t", "partition": p, "log_start_offset": 0,
                         "log_end_offset": leo, "committed_offset": committed, "lag": leo - committed,
                         "member_id": "consumer-1-aaa", "client_id": "consumer-1", "host": "10.0.0.1",
                         "group_members": 1})
    write_table(pa.Table.from_pylist(rows, schema=snapshot_arrow_schema()), str(path), "c")


@ONE_ENGINE
def test_a_surge_that_outlasts_the_window_is_still_a_surge_on_the_next_run(tmp_path, job_runner):
    """Rule case 27 end to end: the run that saw the surge begin says producer_surge; a later run whose window
    holds only the surge reads the earlier run's findings (--carry-from) and says producer_surge too, where on
    its window alone (or with findings it cannot read: one warning line) it says slow_consumer."""
    store = tmp_path / "snapshots"
    _surge_store(store)
    first, later, unread = tmp_path / "first", tmp_path / "later", tmp_path / "unread"
    window = ["--window-minutes", "20"]
    with ThreadPoolExecutor(2) as pool:
        seen = pool.submit(job_runner, store, first, "--as-of", "2026-11-21T12:25:00Z", *window)
        alone = pool.submit(job_runner, store, unread, "--as-of", "2026-11-21T13:00:00Z", *window,
                            "--carry-from", str(tmp_path / "nowhere"))
        seen, alone = seen.result(), alone.result()
    assert seen.returncode == 0, seen.stderr
    assert [f["diagnosis"] for f in read_jsonl(first / "findings.jsonl")] == ["producer_surge"]
    assert alone.returncode == 0, alone.stderr
    ours = [line for line in alone.stderr.splitlines() if line.startswith("diagnose_lag:")]
    assert len(ours) == 1 and ours[0].startswith("diagnose_lag: WARNING: nothing carried from")
    assert [f["diagnosis"] for f in read_jsonl(unread / "findings.jsonl")] == ["slow_consumer"]

    carried = job_runner(store, later, "--as-of", "2026-11-21T12:40:00Z", *window, "--carry-from", str(first))
    assert carried.returncode == 0, carried.stderr
    (f,) = read_jsonl(later / "findings.jsonl")
    assert (f["diagnosis"], f["evidence"]["baseline_source"]) == ("producer_surge", "previous run")


def test_a_nan_or_infinite_value_is_written_as_null_and_every_other_line_unchanged():
    # the writer encodes as is and cleans a record only when the encoder refuses a value
    from lagdoctor.diagnosis.output import to_json_line

    plain = {"group_id": "g", "evidence": {"lag": 5, "rates": (1.5, 2)}, "partitions": [0, 1]}
    assert to_json_line(plain) == '{"group_id":"g","evidence":{"lag":5,"rates":[1.5,2]},"partitions":[0,1]}'
    odd = {"group_id": "é", "evidence": {"surge_ratio": float("nan"), "rates": [float("inf"), -float("inf"), 1.0]}}
    assert json.loads(to_json_line(odd)) == {"group_id": "é", "evidence": {"surge_ratio": None,
                                                                          "rates": [None, None, 1.0]}}
    assert "é" in to_json_line(odd)  # not escaped
