"""The `lagdoctor` command as a user runs it (contract 4)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lagdoctor.kafka.clients import admin_client as _real_admin_client
from lagdoctor.store import list_snapshot_files, read_snapshots
from lagdoctor.lab.workload import commit_offsets, create_topic, produce_counts

LAGDOCTOR = str(Path(sys.executable).parent / "lagdoctor")


def run(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [LAGDOCTOR, *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def kafka_jvms(pid: int) -> list[int]:
    """The broker JVMs (kafka.Kafka) the process `pid` started, still running."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(c) for c in children if is_kafka_jvm(int(c))]


def is_kafka_jvm(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone
        return False


@pytest.mark.broker
def test_broker_prints_ready_and_stops_cleanly_on_sigterm():
    proc = subprocess.Popen([LAGDOCTOR, "broker"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jvms: list[int] = []
    try:
        line = proc.stdout.readline().strip()
        m = re.fullmatch(r"ready bootstrap=127\.0\.0\.1:(\d+)", line)
        assert m, f"unexpected first line {line!r}"
        port = int(m.group(1))
        from confluent_kafka.admin import AdminClient

        assert AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10).brokers
        jvms = kafka_jvms(proc.pid)
        assert len(jvms) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    # No broker JVM is left behind.
    assert [p for p in jvms if is_kafka_jvm(p)] == []


@pytest.mark.broker
def test_broker_with_three_nodes_lists_them_all_and_leaves_no_jvm_on_sigterm():
    proc = subprocess.Popen([LAGDOCTOR, "broker", "--brokers", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    jvms: list[int] = []
    try:
        line = proc.stdout.readline().strip()
        m = re.fullmatch(r"ready bootstrap=(127\.0\.0\.1:\d+),(127\.0\.0\.1:\d+),(127\.0\.0\.1:\d+)", line)
        assert m, f"unexpected first line {line!r}: {proc.stderr.read() if proc.poll() is not None else ''}"
        addresses = sorted(m.groups())
        assert len(set(addresses)) == 3
        from confluent_kafka.admin import AdminClient

        # Any one address is enough to find all three nodes.
        brokers = AdminClient({"bootstrap.servers": m.group(2)}).list_topics(timeout=10).brokers
        assert sorted(f"{b.host}:{b.port}" for b in brokers.values()) == addresses
        assert sorted(brokers) == [1, 2, 3]
        jvms = kafka_jvms(proc.pid)
        assert len(jvms) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert [p for p in jvms if is_kafka_jvm(p)] == [], "broker JVMs left running after SIGTERM"
    for address in addresses:
        host, port = address.split(":")
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=2).close()


def test_broker_port_with_several_nodes_gives_consecutive_ports():
    from lagdoctor.cli import build_parser
    from lagdoctor.kafka.broker import EmbeddedBroker

    args = build_parser().parse_args(["broker", "--brokers", "3", "--port", "39092"])
    broker = EmbeddedBroker(args.port, brokers=args.brokers)  # not started
    assert broker.bootstrap == "127.0.0.1:39092,127.0.0.1:39093,127.0.0.1:39094"


def test_broker_refuses_zero_nodes_in_one_line():
    result = run("broker", "--brokers", "0", timeout=30)
    assert result.returncode != 0
    assert result.stderr.strip() == "lagdoctor: error: --brokers must be at least 1, not 0"


def test_unreachable_cluster_fails_fast_with_one_line_and_no_file(tmp_path):
    out = tmp_path / "store"
    started = time.monotonic()
    result = run("snapshot", "--bootstrap-servers", "127.0.0.1:1", "--cluster", "prod",
                 "--output", str(out), timeout=30)
    assert time.monotonic() - started < 30
    assert result.returncode != 0
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "127.0.0.1:1" in result.stderr
    assert not out.exists() or list_snapshot_files(str(out)) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--groups", "orders-["], "invalid --groups regex"),  # a typo in the regex, caught before connecting
        # RE2 (linear time) has no lookaround: said plainly, and RE2's own log line stays off stderr.
        (["--groups", "(?!legacy-).*"], "invalid --groups regex '(?!legacy-).*': invalid perl operator: (?!"),
        (["--groups", "a" * 1001], "1001 characters, at most 1000"),
        (["--samples", "0"], "--samples must be at least 1"),
    ],
)
def test_bad_arguments_get_one_clear_line(tmp_path, args, message):
    result = run("snapshot", "--bootstrap-servers", "127.0.0.1:1", "--cluster", "prod",
                 "--output", str(tmp_path), *args)
    assert result.returncode != 0
    assert message in result.stderr and result.stderr.strip().count("\n") == 0


def test_missing_bootstrap_names_the_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    result = subprocess.run([LAGDOCTOR, "describe", "--group", "g"], capture_output=True, text=True,
                            timeout=30, env=env)
    assert result.returncode != 0 and "KAFKA_BOOTSTRAP_SERVERS" in result.stderr


@pytest.mark.broker
def test_snapshot_samples_write_one_file_each(kafka_bootstrap, unique, tmp_path):
    topic, group = unique("cli"), unique("cli-group")
    create_topic(kafka_bootstrap, topic, 2)
    produce_counts(kafka_bootstrap, topic, {0: 6, 1: 2})
    commit_offsets(kafka_bootstrap, group, topic, {0: 1, 1: 2})
    out = tmp_path / "store"
    result = run("snapshot", "--bootstrap-servers", kafka_bootstrap, "--cluster", "prod",
                 "--output", str(out), "--groups", re.escape(group),
                 "--samples", "3", "--interval-seconds", "0.2")
    assert result.returncode == 0, result.stderr
    assert len(list_snapshot_files(str(out))) == 3
    table = read_snapshots(str(out))
    assert table.num_rows == 6
    assert sorted(set(table.column("lag").to_pylist())) == [0, 5]
    assert len(set(table.column("snapshot_ts").to_pylist())) == 3


@pytest.mark.broker
def test_snapshot_reads_the_committed_record_unless_told_not_to(kafka_bootstrap, unique, tmp_path):
    topic, group = unique("cli"), unique("cli-group")
    create_topic(kafka_bootstrap, topic, 1)
    produce_counts(kafka_bootstrap, topic, {0: 6})
    commit_offsets(kafka_bootstrap, group, topic, {0: 1})
    common = ("snapshot", "--bootstrap-servers", kafka_bootstrap, "--cluster", "prod", "--groups", re.escape(group))
    assert run(*common, "--output", str(tmp_path / "on")).returncode == 0
    assert run(*common, "--output", str(tmp_path / "off"), "--record-partitions", "0").returncode == 0
    on, off = read_snapshots(str(tmp_path / "on")).to_pylist(), read_snapshots(str(tmp_path / "off")).to_pylist()
    assert on[0]["committed_record_offset"] == 1 and on[0]["committed_record_ts"] is not None
    assert off[0]["committed_record_offset"] is None and off[0]["committed_record_ts"] is None

    bad = run(*common, "--output", str(tmp_path / "bad"), env={"LAGDOCTOR_RECORD_PARTITIONS": "three"})
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].endswith(
        "LAGDOCTOR_RECORD_PARTITIONS must be a number, not 'three'")
    assert not (tmp_path / "bad").exists()  # nothing half-written


@pytest.mark.broker
def test_describe_prints_the_kafka_consumer_groups_table(kafka_bootstrap, unique):
    topic, group = unique("desc"), unique("desc-group")
    create_topic(kafka_bootstrap, topic, 3)
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 20, 2: 5})
    commit_offsets(kafka_bootstrap, group, topic, {0: 10, 1: 5})
    result = run("describe", "--bootstrap-servers", kafka_bootstrap, "--group", group)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET",
                                "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    body = [line.split() for line in lines[1:]]
    assert body == [
        [group, topic, "0", "10", "10", "0", "-", "-", "-"],
        [group, topic, "1", "5", "20", "15", "-", "-", "-"],
        [group, topic, "2", "-", "5", "-", "-", "-", "-"],  # no commit: "-" as Kafka prints it
    ]
    assert f"Consumer group '{group}' has no active members." in result.stderr


@pytest.mark.broker
def test_describe_unknown_group_is_an_error(kafka_bootstrap):
    result = run("describe", "--bootstrap-servers", kafka_bootstrap, "--group", "never-seen-group")
    assert result.returncode != 0
    assert "never-seen-group" in result.stderr and result.stderr.strip().count("\n") == 0


@pytest.mark.spark
def test_diagnose_missing_path_fails_with_the_path_named(tmp_path):
    result = run("diagnose", "--snapshots", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"),
                 "--master", "local[1]", timeout=120)
    assert result.returncode != 0
    assert "nowhere" in result.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "out" / "findings.jsonl").exists()


@pytest.mark.spark
def test_diagnose_runs_the_job_on_the_seeds_incident(tmp_path):
    import json

    from lagdoctor.lab.sim import write_seeds_incident

    write_seeds_incident(str(tmp_path / "snapshots"))
    result = run("diagnose", "--snapshots", str(tmp_path / "snapshots"), "--output", str(tmp_path / "out"),
                 "--master", "local[2]", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    findings = [json.loads(l) for l in (tmp_path / "out" / "findings.jsonl").read_text().splitlines()]
    assert [(f["diagnosis"], f["partitions"]) for f in findings] == [("partition_imbalance", [1])]
    assert "consumer-2-def456 on 10.0.1.15" in findings[0]["summary"]


@pytest.mark.broker
def test_sasl_handshake_failure_says_cannot_authenticate_in_one_line(kafka_bootstrap, embedded_only, tmp_path):
    # The embedded broker's plain listener cannot satisfy a SASL client: the handshake fails.
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      "sasl.username=lagdoctor\nsasl.password=hunter2-not-to-be-printed\n")
    started = time.monotonic()
    result = run("snapshot", "--bootstrap-servers", kafka_bootstrap, "--cluster", "prod", "--command-config",
                 str(config), "--output", str(tmp_path / "store"), timeout=60)
    assert time.monotonic() - started < 30
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[:2000]  # not ~200 of librdkafka's %3|FAIL| lines
    assert lines[0].startswith(f"lagdoctor: error: cannot authenticate to Kafka at {kafka_bootstrap}: ")
    assert "SASL" in lines[0] and "hunter2" not in result.stderr
    assert list_snapshot_files(str(tmp_path / "store")) == []


def _describe_in_process(monkeypatch, capsys, bootstrap, group, **failures):
    """`lagdoctor describe` run in this process, its AdminClient failing as `failures` say."""
    import lagdoctor.kafka.clients as kafka_clients
    from lagdoctor.cli import main
    from tests.fixtures.failing_admin import FailingAdmin

    monkeypatch.setattr(kafka_clients, "admin_client",
                        lambda *a, **k: FailingAdmin(_real_admin_client(*a, **k), **failures))
    code = main(["describe", "--bootstrap-servers", bootstrap, "--group", group])
    out, err = capsys.readouterr()
    return code, [line.split() for line in out.splitlines()[1:]], err.strip().splitlines()


@pytest.mark.broker
def test_describe_shows_unknown_as_dash_and_names_the_failed_read(kafka_bootstrap, unique, monkeypatch, capsys):
    topic, group = unique("desc-fault"), unique("desc-fault-group")
    create_topic(kafka_bootstrap, topic, 2)
    produce_counts(kafka_bootstrap, topic, {0: 10, 1: 20})
    commit_offsets(kafka_bootstrap, group, topic, {0: 4, 1: 5})

    # The committed offsets cannot be read; the group is EMPTY, so its topics are unknown too.
    code, body, err = _describe_in_process(monkeypatch, capsys, kafka_bootstrap, group, offset_fetch={group})
    assert code == 1
    assert body == [[group, "-", "-", "-", "-", "-", "-", "-", "-"]]  # unknown, never 0
    assert err == [f"lagdoctor: error: group '{group}' at {kafka_bootstrap}: could not read committed offsets: "
                   "Broker: Coordinator load in progress (COORDINATOR_LOAD_IN_PROGRESS); "
                   "unknown values are shown as -"]

    # One partition's log end offset cannot be read: its LOG-END-OFFSET and LAG are unknown.
    code, body, err = _describe_in_process(monkeypatch, capsys, kafka_bootstrap, group, end_offsets={(topic, 1)})
    assert code == 1
    assert body == [[group, topic, "0", "4", "10", "6", "-", "-", "-"],
                    [group, topic, "1", "5", "-", "-", "-", "-", "-"]]
    assert len(err) == 1 and "could not read log end offset: Local: Timed out" in err[0]


def test_compact_folds_closed_hours_under_the_data_root_and_prints_one_line(tmp_path):
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema
    from lagdoctor.store import write_snapshot

    snapshots = tmp_path / "data" / "snapshots"
    start = datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc)  # long closed, whatever today is
    for cluster in ("prod", "dr"):
        for k in range(3):
            ts = start + timedelta(minutes=5 * k)
            row = dict(snapshot_ts=ts, cluster=cluster, group_id="g", group_state="STABLE", topic="t", partition=0,
                       log_start_offset=0, log_end_offset=10, committed_offset=10 - k, lag=k, member_id="m",
                       client_id="c", host="h", group_members=1)
            write_snapshot(pa.Table.from_pylist([row], schema=snapshot_arrow_schema()), str(snapshots), cluster, ts)
    before = sorted(read_snapshots(str(snapshots)).to_pylist(), key=lambda r: (r["cluster"], r["snapshot_ts"]))
    result = run("compact", "--data-root", str(tmp_path / "data"), "--cluster", "prod")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"compacted 1 hour(s): 3 files folded, 3 rows; 0 covered files removed under {snapshots}"]
    files = list_snapshot_files(str(snapshots))
    assert sum("/compacted-" in f for f in files) == 1 and sum("cluster=dr" in f for f in files) == 3
    after = sorted(read_snapshots(str(snapshots)).to_pylist(), key=lambda r: (r["cluster"], r["snapshot_ts"]))
    assert after == before
    # the data root from the environment, as the other commands take it
    again = run("compact", env={"LAGDOCTOR_DATA_ROOT": str(tmp_path / "data")})
    assert again.returncode == 0 and again.stdout.startswith("compacted 1 hour(s): 3 files folded"), again.stderr


def test_the_installed_command_keeps_its_exit_codes_and_output_while_leaving_without_teardown(tmp_path):
    """The script exits through os._exit (Arrow's thread pools aborted one `compact` in 30 at interpreter
    teardown, exit -6, after its work): what it printed still arrives, and each outcome keeps its code."""
    assert run("--help").returncode == 0 and "compact" in run("--help").stdout
    usage = run("compact", "--no-such-option")
    assert usage.returncode == 2 and "unrecognized arguments: --no-such-option" in usage.stderr, usage
    empty = run("compact", "--data-root", str(tmp_path / "none"))
    assert empty.returncode == 0 and empty.stdout.startswith("compacted 0 hour(s)"), empty
    bad = run("compact", "--data-root", "nosuch://bucket/x")
    assert (bad.returncode, bad.stderr) == (1, "lagdoctor: error: Protocol not known: nosuch\n"), bad
