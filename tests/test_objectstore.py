"""The data root on an S3-compatible store (SeaweedFS `weed mini`, a real server):
one AWS connection feeds fsspec and Spark's S3A; the store's operations and the
diagnosis job work on s3://; secrets stay off argv and out of error lines."""

from __future__ import annotations

import json
import os
from pathlib import Path
import stat
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tests.fixtures.objectstore import CONN_ID
from tests.fixtures.spark import run_job

H3 = datetime(2026, 11, 21, 3, 0, tzinfo=timezone.utc)


def snapshot(ts, lags=(5, 7), cluster="prod"):
    from lagdoctor.contracts import snapshot_arrow_schema

    rows = [dict(snapshot_ts=ts, cluster=cluster, group_id="g", group_state="STABLE", topic="t", partition=p,
                 log_start_offset=0, log_end_offset=100, committed_offset=100 - lag, lag=lag, member_id="m",
                 client_id="c", host="h", group_members=1) for p, lag in enumerate(lags)]
    return pa.Table.from_pylist(rows, schema=snapshot_arrow_schema())


def bucket_keys(s3_store, root):
    """Keys under an s3:// root, read with a filesystem of the test's own."""
    fs = s3_store.filesystem()
    base = root[len("s3://"):]
    return sorted(p[len(base) + 1:] for p in fs.find(base))


def test_one_connection_feeds_fsspec_and_spark_conf(s3_connection):
    from lagdoctor.objectstore import access_from_spark_conf, spark_conf
    from lagdoctor.settings import Settings

    settings = Settings(data_root=s3_connection.root("conf"))  # reads AIRFLOW_CONN_LAGDOCTOR_S3
    import fsspec.config

    assert fsspec.config.conf["s3"]["endpoint_url"] == s3_connection.endpoint
    from lagdoctor.objectstore import configure_for

    access = configure_for(settings.data_root)
    assert s3_connection.secret not in repr(access) and s3_connection.secret not in str(access)
    conf = spark_conf(access)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == s3_connection.endpoint
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    # the driver rebuilds the same access from the session's conf: one source
    assert access_from_spark_conf(conf) == access.__class__(**{**access.__dict__, "conn_id": None})


def test_store_operations_on_s3(s3_connection, tmp_path, monkeypatch):
    from lagdoctor import store
    from lagdoctor.diagnosis.snapshots import inspect_store, quarantine_file
    from lagdoctor.stages.housekeeping import compact_history, prune_history
    from lagdoctor.settings import Settings

    monkeypatch.chdir(tmp_path)
    settings = Settings(data_root=s3_connection.root("ops"))
    root = settings.snapshots_root
    for k in range(3):
        ts = H3 + timedelta(minutes=5 * k)
        assert store.write_snapshot(snapshot(ts, lags=(k, 10 + k)), root, "prod", ts, key=f"run-{k}")
    # a retried task with the same key writes nothing
    assert store.write_snapshot(snapshot(H3), root, "prod", H3 + timedelta(seconds=9), key="run-0") is None
    old_day = H3 - timedelta(days=30)
    store.write_snapshot(snapshot(old_day), root, "prod", old_day)
    assert len(store.list_snapshot_files(root)) == 4
    before = sorted(store.read_snapshots(root).to_pylist(), key=lambda r: (r["snapshot_ts"], r["partition"]))

    done = compact_history(settings, now=H3 + timedelta(hours=6))
    # (a stale s3fs listing cache saw no hour here: lagdoctor turns it off)
    assert done["hours"] == 1 and done["files_folded"] == 3
    hour = "snapshots/cluster=prod/date=2026-11-21/hour=03/"
    assert [k for k in bucket_keys(s3_connection, settings.data_root)
            if k.startswith(hour) and k.rsplit("/", 1)[1].startswith("compacted-")]
    after = sorted(store.read_snapshots(root).to_pylist(), key=lambda r: (r["snapshot_ts"], r["partition"]))
    assert after == before  # nothing read twice while the originals wait out their grace

    # retention drops the 30-day-old date folder on the store
    prune_history(keep_days=14, settings=settings, now=H3 + timedelta(hours=6))
    keys = bucket_keys(s3_connection, settings.data_root)
    assert not any(f"date={old_day:%Y-%m-%d}" in k for k in keys) and any("date=2026-11-21" in k for k in keys)

    # a file that cannot be read is moved to _quarantine/ on the store, a reason beside it
    fs = s3_connection.filesystem()
    bad = f"{root[len('s3://'):]}/cluster=prod/date=2026-11-21/hour=04/snapshot-bad.parquet"
    fs.pipe(bad, b"not parquet")
    inspection = inspect_store(root)
    assert [b.file.uri.rsplit("/", 1)[1] for b in inspection.bad] == ["snapshot-bad.parquet"]
    moved = quarantine_file(inspection, inspection.bad[0], H3)
    assert moved["moved_to"].startswith(root + "/_quarantine/") and not fs.exists(bad)
    assert fs.exists(moved["moved_to"][len("s3://"):] + ".reason.txt")
    assert os.listdir(tmp_path) == []  # nothing on the local disk


def test_retention_on_s3_removes_old_run_folders_listing_each_hour_once(s3_connection, monkeypatch):
    import s3fs

    from lagdoctor.settings import Settings
    from lagdoctor.stages.common import run_key
    from lagdoctor.stages.housekeeping import prune_history

    settings = Settings(data_root=s3_connection.root("retention"))
    fs = s3_connection.filesystem()
    uploaded = datetime.now(timezone.utc)  # S3 dates each file at its upload: now
    now = uploaded + timedelta(days=10)  # so "now" is 10 days later, and the files are old
    hour = uploaded.replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
    old = [run_key(f"scheduled__{(h + timedelta(minutes=m)).isoformat()}", "kafka_lag_health_sweep")
           for h in (hour, hour - timedelta(hours=1)) for m in range(0, 60, 5)]  # two whole hours of runs
    young = run_key(f"scheduled__{(now - timedelta(hours=1)).replace(microsecond=0).isoformat()}",
                    "kafka_lag_health_sweep")
    base = settings.findings_root[len("s3://"):]
    fs.pipe({f"{base}/{name}/{leaf}": b"{}\n" for name in [*old, young]
             for leaf in ("findings.jsonl", "partition_status.jsonl")})
    lists = []
    real_call = s3fs.S3FileSystem._call_s3

    async def call_s3(self, method, *args, **kwargs):
        if method == "list_objects_v2":
            lists.append(kwargs.get("Prefix"))
        return await real_call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", call_s3)
    assert prune_history(settings=settings, now=now) == len(old)
    left = {k.split("/")[1] for k in bucket_keys(s3_connection, settings.data_root) if k.startswith("findings/")}
    assert left == {young}  # the old runs went, files and all; the young one stayed whole
    # deciding lists each hour of old runs once (two requests), not each of the 24
    # folders; removing a folder lists it, as fs.rm does
    run_lists = [p for p in lists if p and "kafka_lag_health_sweep__scheduled__" in p]
    assert len(run_lists) == 2 + len(old), run_lists


def test_a_scheme_fsspec_cannot_open_is_one_line_not_a_blind_spark_read(monkeypatch):
    import importlib

    from lagdoctor.diagnosis.snapshots import SnapshotInputError, inspect_store

    # a machine without s3fs: Spark could read s3a:// through hadoop-aws, but nothing here can list it
    registry = importlib.import_module("fsspec.registry")
    for protocol in ("s3", "s3a"):
        monkeypatch.setitem(registry.known_implementations, protocol,
                            {"class": "s3fs_not_installed.S3FileSystem", "err": "Install s3fs to access S3"})
        monkeypatch.delitem(registry._registry, protocol, raising=False)
    with pytest.raises(SnapshotInputError) as err:
        inspect_store("s3a://lake/lagdoctor/snapshots")
    assert "no fsspec filesystem for s3://" in str(err.value) and "\n" not in str(err.value)


def test_secrets_go_to_a_private_properties_file_not_the_argv(s3_connection, tmp_path):
    from lagdoctor.diagnosis.submit import build_spark_submit_command

    root = s3_connection.root("argv")
    cmd = build_spark_submit_command(f"{root}/snapshots", f"{root}/findings/r1", master="local[2]",
                                     secrets_dir=tmp_path / "secrets", work_dir=tmp_path / "work",
                                     conf={"spark.driver.extraJavaOptions": "-Duser.option=1"})
    argv = " ".join(cmd)
    assert s3_connection.secret not in argv
    props = cmd[cmd.index("--extra-properties-file") + 1]
    assert stat.S_IMODE(os.stat(props).st_mode) == 0o600
    assert f"spark.hadoop.fs.s3a.secret.key={s3_connection.secret}" in open(props).read().splitlines()
    # hadoop-aws on the class path; the user's java options are appended to lagdoctor's, not replaced
    assert "hadoop-aws-3.5.0.jar" in argv and "bundle-2.35.4.jar" in argv
    java = cmd[cmd.index("--driver-java-options") + 1]
    assert "-Dlog4j2.configurationFile=" in java and java.endswith("-Duser.option=1")


def _write_properties(conf, directory):
    from lagdoctor.objectstore import write_properties_file

    return write_properties_file(conf, directory)


def _write_session_conf(conf, directory):
    from lagdoctor.diagnosis.submit import write_session_conf

    return write_session_conf(conf, directory)


# The two files that hold the store's keys, under the fixed names they had before issue 30.
SECRET_WRITERS = [pytest.param(_write_properties, "spark-secrets.conf", id="properties"),
                  pytest.param(_write_session_conf, "spark-session-conf.json", id="session-conf")]


@pytest.mark.parametrize("write, old_name", SECRET_WRITERS)
def test_a_link_planted_at_the_secrets_file_name_is_not_followed(tmp_path, write, old_name):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    elsewhere = tmp_path / "victim.txt"
    elsewhere.write_text("someone else's file\n")
    (private / old_name).symlink_to(elsewhere)

    path = write({"spark.hadoop.fs.s3a.secret.key": "s3cr3t"}, private)
    assert elsewhere.read_text() == "someone else's file\n"  # neither overwritten nor read by Spark
    assert not os.path.islink(path) and stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    assert "s3cr3t" in open(path).read()


@pytest.mark.parametrize("write, old_name", SECRET_WRITERS)
def test_each_call_writes_a_file_of_its_own(tmp_path, write, old_name):
    first = write({"spark.hadoop.fs.s3a.secret.key": "first"}, tmp_path)
    second = write({"spark.hadoop.fs.s3a.secret.key": "second"}, tmp_path)
    assert first != second  # two runs sharing a folder never read each other's keys
    assert "first" in open(first).read() and "second" in open(second).read()


@pytest.mark.parametrize("write, old_name", SECRET_WRITERS)
def test_secrets_are_refused_a_folder_others_can_enter(tmp_path, write, old_name):
    from lagdoctor.objectstore import ObjectStoreError

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    with pytest.raises(ObjectStoreError) as err:
        write({"spark.hadoop.fs.s3a.secret.key": "s3cr3t"}, shared)
    assert str(err.value) == (f"secrets are written only to a private folder (this user's, mode 0700, not a "
                              f"link): {shared} is not one")
    assert os.listdir(shared) == []


def test_the_connection_is_read_again_after_five_minutes_and_fsspec_builds_a_new_filesystem(monkeypatch):
    import fsspec

    from lagdoctor.objectstore import CREDENTIALS_TTL_S, configure_for, forget_configured

    def connection(key):
        return json.dumps({"conn_type": "aws", "login": key, "password": f"secret-of-{key}",
                           "extra": {"endpoint_url": "http://127.0.0.1:9"}})

    monkeypatch.setenv("AIRFLOW_CONN_LAGDOCTOR_TTL", connection("old-key"))
    monkeypatch.setenv("LAGDOCTOR_AWS_CONN_ID", "lagdoctor_ttl")
    forget_configured()
    try:
        assert configure_for("s3://lake/lagdoctor", now=1000.0).key == "old-key"
        old_fs = fsspec.core.url_to_fs("s3://lake/lagdoctor")[0]
        monkeypatch.setenv("AIRFLOW_CONN_LAGDOCTOR_TTL", connection("new-key"))  # rotated
        assert configure_for("s3://lake/lagdoctor", now=1000.0 + CREDENTIALS_TTL_S - 1).key == "old-key"
        assert configure_for("s3://lake/lagdoctor", now=1000.0 + CREDENTIALS_TTL_S).key == "new-key"
        fs = fsspec.core.url_to_fs("s3://lake/lagdoctor")[0]
        assert fs is not old_fs and (fs.key, fs.secret) == ("new-key", "secret-of-new-key")
    finally:
        forget_configured()


def _one_run_on_the_store(s3_store, tmp_path, findings_root: str, group: str) -> None:
    """A complete run folder holding one warning finding for `group`, put with the store's main key."""
    from tests.fixtures.web import write_run

    finding = {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": [0],
               "diagnosis": "slow_consumer", "pattern": "linear_growth", "severity": "warning",
               "summary": f"slow_consumer in {group}", "evidence": {"lag": 500},
               "window_start": "2026-11-21T02:40:00Z", "window_end": "2026-11-21T03:00:00Z"}
    row = {"cluster": "prod", "group_id": group, "topic": "orders", "partition": 0, "status": "LAGGING",
           "lag": 500, "time_lag_seconds": 60.0, "consume_rate": 1.0, "produce_rate": 2.0,
           "time_lag_lower_bound": False}
    folder = write_run(tmp_path / "findings", "run-1", [finding], [row], dag_id="kafka_lag_health_sweep",
                       run_id="scheduled__1", planned_at=H3)
    s3_store.filesystem().put(str(folder.parent) + "/", findings_root[len("s3://"):], recursive=True)


def test_a_rotated_key_reaches_the_page_and_the_exporter_without_a_restart(
        s3_store, s3_rotating_connection, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient

    from lagdoctor.metrics import render_metrics
    from lagdoctor.settings import Settings
    from lagdoctor.web.app import create_app
    from lagdoctor.web.auth import dag_run_reader

    root = s3_store.root("rotate")
    settings = Settings(data_root=root)  # reads the connection: the rotating identity's first key
    _one_run_on_the_store(s3_store, tmp_path, settings.findings_root, "billing")
    app = create_app(lambda: Settings(data_root=root))
    app.dependency_overrides[dag_run_reader] = lambda: (lambda dag_id: True)
    page = TestClient(app)

    def page_groups():
        answer = page.get("/api/findings")
        assert answer.status_code == 200, answer.text
        return [f["group_id"] for f in answer.json()["findings"]]

    assert page_groups() == ["billing"]
    assert 'group="billing"' in render_metrics(settings.findings_root)

    def rotate():
        key, secret = f"rotated-{os.urandom(4).hex()}", f"secret-{os.urandom(16).hex()}"
        s3_store.rotate_key(key, secret)  # the old key is refused from now on
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_store.connection_json(secret=secret, key=key))

    rotate()  # within the five minutes: the store's refusal is what makes the page read the connection again
    assert page_groups() == ["billing"]
    rotate()
    assert 'group="billing"' in render_metrics(settings.findings_root)


def _jvm_threads(pgid: int) -> int:
    """Threads of the Java processes in a process group (the Connect server's JVM)."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) == pgid and b"java" in (proc / "cmdline").read_bytes():
                total += int(next(line.split()[1] for line in (proc / "status").read_text().splitlines()
                                  if line.startswith("Threads:")))
        except (OSError, ProcessLookupError, StopIteration):
            pass
    return total


@pytest.mark.spark
def test_a_connect_server_reads_with_the_sessions_keys_and_does_not_grow_a_client_per_session(
        s3_store, s3_rotating_connection, monkeypatch, tmp_path):
    """A server started without S3 keys reads with the ones the operator's session sends, and
    keeps one S3A filesystem for them: with Hadoop's cache off each session left an S3 client
    and its threads behind (32 threads a session here), a dead server within hours of one-minute
    sweeps. A rotated key reaches the server at its restart."""
    from pyspark.sql import SparkSession

    from lagdoctor.connectserver import ConnectServer
    from lagdoctor.diagnosis.submit import plan_connect
    from lagdoctor.objectstore import forget_configured, s3a_impl_conf
    from lagdoctor.s3jars import classpath_conf, hadoop_aws_jars

    root = s3_store.root("connect-sessions")
    s3_store.filesystem().pipe(f"{root[len('s3://'):]}/rows.json", b'{"a": 1}\n{"a": 2}\n')
    prep = {"python": "python", "application": "diagnose_lag.py", "py_files": "lagdoctor.zip",
            "args": ["--snapshots", f"{root}/snapshots", "--output", f"{root}/findings/r1"]}
    mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")

    def rows_read_by_a_new_session(server) -> int:
        forget_configured()  # the connection as it is now
        session_conf = plan_connect(prep, remote=server.client_url).session_conf  # what the operator sends
        spark = SparkSession.builder.remote(server.client_url).create()
        try:
            for key, value in session_conf.items():
                spark.conf.set(key, value)
            return spark.read.json(f"{root.replace('s3://', 's3a://')}/rows.json").count()
        finally:
            spark.stop()
            if mode is None:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)

    conf = {**classpath_conf(hadoop_aws_jars()), **s3a_impl_conf()}
    with ConnectServer(tmp_path / "server", master="local[1]", conf=conf) as server:
        for _ in range(10):  # the server's own pools fill up over its first sessions
            assert rows_read_by_a_new_session(server) == 2
        settled = _jvm_threads(server.pid)
        for _ in range(10):
            assert rows_read_by_a_new_session(server) == 2
        # 10 sessions more: +40 to +80 threads here as pools settle; +320, every 10, with the cache off
        assert _jvm_threads(server.pid) - settled < 160
        key, secret = f"rotated-{os.urandom(4).hex()}", f"secret-{os.urandom(16).hex()}"
        s3_store.rotate_key(key, secret)  # the server's key is refused from now on
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_store.connection_json(secret=secret, key=key))
    with ConnectServer(tmp_path / "server", master="local[1]", conf=conf) as restarted:
        assert rows_read_by_a_new_session(restarted) == 2


@pytest.mark.spark
def test_diagnosis_job_reads_and_writes_the_object_store(s3_connection, tmp_path):
    from lagdoctor.lab.sim import write_seeds_incident
    from lagdoctor.metrics import render_metrics
    from lagdoctor.runindex import refresh
    from lagdoctor.settings import Settings
    from lagdoctor.stages.plan import plan_findings
    from lagdoctor.web.data import list_runs
    from lagdoctor.web.report import write_incident_report

    settings = Settings(data_root=s3_connection.root("job"))
    local = tmp_path / "snapshots"
    write_seeds_incident(str(local))
    fs = s3_connection.filesystem()
    snapshots = settings.snapshots_root
    fs.put(str(local) + "/", snapshots[len("s3://"):], recursive=True)
    bad = f"{snapshots[len('s3://'):]}/cluster=prod/date=2026-11-21/broken.parquet"
    fs.pipe(bad, b"PAR1 not really")
    output = f"{settings.findings_root}/run-s3"

    proc = run_job(snapshots, output.replace("s3://", "s3a://"), "--quarantine")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = output[len("s3://"):]
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(out)) == [
        "_SUCCESS", "findings.jsonl", "partition_status.jsonl", "quarantined.jsonl"]
    findings = [json.loads(line) for line in fs.cat(f"{out}/findings.jsonl").decode().splitlines()]
    seeds = [f for f in findings if f["group_id"] == "orders-processor"]
    assert [(f["diagnosis"], f["partitions"]) for f in seeds] == [("partition_imbalance", [1])]
    quarantined = [json.loads(line) for line in fs.cat(f"{out}/quarantined.jsonl").decode().splitlines()]
    assert [q["path"].rsplit("/", 1)[1] for q in quarantined] == ["broken.parquet"] and not fs.exists(bad)

    # planning, reports, the run index, the lag page's run list and the exporter: all on the store
    summary = plan_findings(output, dag_id="lagdoctor_sweep", run_id="scheduled__1", now=H3 + timedelta(hours=1))
    assert summary["problems"] >= 1 and summary["quarantined"] == 1
    reports = write_incident_report(output, settings=settings, base_url="", now=H3 + timedelta(hours=1))
    assert reports and all(r.startswith(settings.reports_root + "/run-s3/") and fs.exists(r[len("s3://"):])
                           for r in reports)
    assert "run-s3" in refresh(settings.findings_root).runs
    assert [r.run_key for r in list_runs(settings.findings_root)] == ["run-s3"]
    assert 'group="orders-processor"' in render_metrics(settings.findings_root)


@pytest.mark.spark
def test_a_wrong_secret_is_one_line_without_the_secret(s3_connection, monkeypatch, tmp_path):
    from lagdoctor import store
    from lagdoctor.objectstore import forget_configured
    from lagdoctor.settings import Settings

    wrong = "wrong-secret-5d1c9"
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", s3_connection.connection_json(secret=wrong))
    forget_configured()
    settings = Settings(data_root=s3_connection.root("wrong"))
    with pytest.raises(store.StoreError) as err:
        store.write_snapshot(snapshot(H3), settings.snapshots_root, "prod", H3)
    message = str(err.value)
    assert "\n" not in message and wrong not in message and s3_connection.secret not in message

    proc = run_job(settings.snapshots_root, f"{settings.findings_root}/r")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("diagnose_lag: error:") and wrong not in proc.stderr


def _throttled_store(proxy, tmp_path, name):
    """The seeds' incident, a second group's file (the one S3 will throttle) and a corrupt file,
    on the store; returns (settings, the throttled file's s3:// path, bucket keys)."""
    import pyarrow.parquet as pq

    from lagdoctor.lab.sim import seeds_incident_table, write_seeds_incident
    from lagdoctor.settings import Settings

    settings = Settings(data_root=proxy.store.root(name))  # fsspec now goes through the proxy
    local = tmp_path / "snapshots"
    write_seeds_incident(str(local))
    day = local / "cluster=prod" / "date=2026-11-21"
    pq.write_table(seeds_incident_table(group_id="orders-replay"), day / "replay.parquet")
    (day / "broken.parquet").write_bytes(b"PAR1 not really")
    fs = proxy.store.filesystem()  # straight to the store, not through the proxy
    fs.put(str(local) + "/", settings.snapshots_root[len("s3://"):], recursive=True)
    throttled = f"{settings.snapshots_root}/cluster=prod/date=2026-11-21/replay.parquet"
    proxy.slow_down.add("/" + throttled[len("s3://"):])
    return settings, throttled, bucket_keys(proxy.store, settings.data_root)


def test_a_throttled_footer_read_moves_nothing_and_the_next_run_reads_the_file(s3_slowdown_proxy, tmp_path):
    from lagdoctor.diagnosis.snapshots import StoreReadError, inspect_store, read_snapshot_store

    settings, throttled, keys = _throttled_store(s3_slowdown_proxy, tmp_path, "slowdown")
    with pytest.raises(StoreReadError) as err:
        read_snapshot_store(None, settings.snapshots_root, H3, quarantine=True)  # fails before Spark reads
    assert str(err.value) == (f"cannot read snapshot file {throttled}: OSError: [Errno 16] Please reduce your "
                              "request rate. (SlowDown) (the store failed, not the file: nothing was moved)")
    assert s3_slowdown_proxy.refused  # the 503 was S3's answer, not a stand-in
    assert bucket_keys(s3_slowdown_proxy.store, settings.data_root) == keys  # not even broken.parquet moved

    s3_slowdown_proxy.slow_down.clear()  # the throttling has passed
    inspection = inspect_store(settings.snapshots_root)
    assert throttled in [f.uri for files in inspection.groups.values() for f in files]
    assert [b.file.uri.rsplit("/", 1)[1] for b in inspection.bad] == ["broken.parquet"]


@pytest.mark.spark
def test_a_throttled_job_exits_1_in_one_line_and_the_next_run_diagnoses_the_file(s3_slowdown_proxy, tmp_path):
    settings, throttled, keys = _throttled_store(s3_slowdown_proxy, tmp_path, "slowjob")
    fs = s3_slowdown_proxy.store.filesystem()
    output = f"{settings.findings_root}/run-throttled"

    proc = run_job(settings.snapshots_root, output, "--quarantine")
    assert proc.returncode == 1, proc.stderr[-3000:]  # worth a retry, not bad input (3)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"diagnose_lag: error: cannot read snapshot file {throttled}: OSError: [Errno 16] Please reduce your "
        "request rate. (SlowDown) (the store failed, not the file: nothing was moved)")
    assert "WARNING: quarantined" not in proc.stderr
    assert bucket_keys(s3_slowdown_proxy.store, settings.data_root) == keys  # nothing moved, no output

    s3_slowdown_proxy.slow_down.clear()
    output = f"{settings.findings_root}/run-after"
    proc = run_job(settings.snapshots_root, output, "--quarantine")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = output[len("s3://"):]
    quarantined = [json.loads(line) for line in fs.cat(f"{out}/quarantined.jsonl").decode().splitlines()]
    assert [q["path"].rsplit("/", 1)[1] for q in quarantined] == ["broken.parquet"] and fs.exists(throttled[5:])
    findings = [json.loads(line) for line in fs.cat(f"{out}/findings.jsonl").decode().splitlines()]
    assert {f["group_id"] for f in findings} == {"orders-processor", "orders-replay"}


def _prep(tmp_path, data_root):
    return {"application": str(tmp_path / "diagnose_lag.py"), "py_files": str(tmp_path / "lagdoctor-x.zip"),
            "args": ["--snapshots", f"{data_root}/snapshots/cluster=prod", "--output", f"{data_root}/findings/r1"],
            "python": "/venv/bin/python", "spark_submit": "/venv/bin/spark-submit", "path": "/venv/bin",
            "log_config": str(tmp_path / "log4j2.properties"), "input_bytes": None}


def test_cluster_submission_takes_the_connection_and_forces_no_python(s3_connection, monkeypatch, tmp_path):
    from lagdoctor.pipeline import DiagnoseLagOperator

    data_root = s3_connection.root("submit")
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", data_root)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077,
        "extra": {"spark-binary": "spark3-submit", "conf": {"spark.executor.memory": "3g",
                                                            "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"}}}))
    monkeypatch.setenv("LAGDOCTOR_SPARK_CONF", json.dumps({"spark.executor.memory": "4g",
                                                           "spark.driver.extraJavaOptions": "-Dfrom.setting=1"}))
    op = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis",
                             conf={"spark.executor.cores": "2"})
    hook = op.prepared_hook(_prep(tmp_path, data_root), str(tmp_path))
    cmd = hook._build_spark_submit_command(op.application)
    argv = " ".join(cmd)
    assert cmd[0] == "spark3-submit"  # the connection's binary, not this venv's
    conf = dict(a.split("=", 1) for a in cmd[1:] if "=" in a and a.startswith("spark."))
    assert "spark.pyspark.python" not in conf and not (hook._env_vars or {}).get("PYSPARK_PYTHON")
    assert "PATH" not in (hook._env_vars or {})
    assert conf["spark.executor.memory"] == "4g" and conf["spark.executor.cores"] == "2"  # the user's win
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.driver.extraJavaOptions"].startswith("-Dlog4j2.configurationFile=")
    assert conf["spark.driver.extraJavaOptions"].endswith("-Dfrom.setting=1")
    assert conf["spark.hadoop.fs.s3a.endpoint"] == s3_connection.endpoint
    assert s3_connection.secret not in argv and "--extra-properties-file" in cmd


def test_cluster_mode_ships_the_job_through_the_store(s3_connection, monkeypatch, tmp_path):
    from lagdoctor.pipeline import DiagnoseLagOperator

    data_root = s3_connection.root("upload")
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", data_root)
    monkeypatch.setenv("LAGDOCTOR_HADOOP_AWS", "provided")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({
        "conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}}))
    prep = _prep(tmp_path, data_root)
    (tmp_path / "diagnose_lag.py").write_text("print('job')\n")
    (tmp_path / "lagdoctor-x.zip").write_bytes(b"PK zip")
    op = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis")
    cmd = op.prepared_hook(prep, str(tmp_path))._build_spark_submit_command(op.application)
    assert cmd[-5:] == [op.application, *prep["args"]]  # the job gets its arguments
    py_files = cmd[cmd.index("--py-files") + 1]
    assert op.application.startswith(data_root.replace("s3://", "s3a://") + "/_spark/")
    assert py_files.startswith(data_root.replace("s3://", "s3a://") + "/_spark/")
    props = cmd[cmd.index("--extra-properties-file") + 1]
    assert not [a for a in cmd if str(tmp_path) in a and a != props]  # no worker path
    assert s3_connection.filesystem().cat(py_files[len("s3a://"):]) == b"PK zip"
    assert not any(a.startswith("spark.driver.extraJavaOptions=") for a in cmd)  # no worker-local log4j path
    assert not any("hadoop-aws" in a for a in cmd)  # provided: baked into the image

    # or from a folder the cluster can read (the image's, HDFS): fixed names there
    monkeypatch.setenv("LAGDOCTOR_SPARK_APP_URI", "local:///opt/lagdoctor")
    cmd = op.prepared_hook(prep, str(tmp_path))._build_spark_submit_command(op.application)
    assert op.application == "local:///opt/lagdoctor/diagnose_lag.py"
    assert cmd[cmd.index("--py-files") + 1] == "local:///opt/lagdoctor/lagdoctor.zip"


@pytest.mark.parametrize("spark_host, executor, says", [
    ("spark://10.0.0.5", None, "Spark runs on spark://10.0.0.5"),
    ("local[2]", "CeleryExecutor", "Airflow runs tasks with the CeleryExecutor"),
])
def test_a_local_data_root_with_a_remote_master_or_distributed_workers_is_refused(
        monkeypatch, tmp_path, spark_host, executor, says):
    from airflow.sdk.exceptions import AirflowFailException

    from lagdoctor.pipeline import DiagnoseLagOperator

    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path / "data"))
    conn = {"conn_type": "spark", "host": spark_host} | ({"port": 7077} if "://" in spark_host else {})
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conn))
    if executor:
        monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    op = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis")
    with pytest.raises(AirflowFailException) as err:
        op.prepared_hook(_prep(tmp_path, str(tmp_path / "data")), str(tmp_path))
    line = str(err.value)
    assert says in line and "set LAGDOCTOR_DATA_ROOT=s3://" in line and "\n" not in line
    assert line.endswith("or, if it is mounted at that path on every host, LAGDOCTOR_DATA_ROOT_SHARED=1")

    # declared shared: submitted (the job proves the executors see it: tests/test_shared_root.py)
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT_SHARED", "1")
    op.prepared_hook(_prep(tmp_path, str(tmp_path / "data")), str(tmp_path))
