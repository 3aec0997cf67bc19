"""A local data root declared shared (LAGDOCTOR_DATA_ROOT_SHARED=1): accepted beside a cluster
master or a distributed executor, and proved on every run, never trusted (issue 34)."""

from __future__ import annotations

import json
import os
import re

import pytest

from lagdoctor.mount import (MOUNT_FOLDER, MountNotSeen, check_worker_sees, executor_view, leave_run_marker,
                             unseen_line, write_marker)
from lagdoctor.objectstore import ObjectStoreError, check_deployable
from lagdoctor.settings import Settings


def test_a_bad_value_is_one_line_naming_the_setting():
    with pytest.raises(ValueError) as err:
        Settings.from_env({"LAGDOCTOR_DATA_ROOT": "/srv/lagdoctor", "LAGDOCTOR_DATA_ROOT_SHARED": "yes please"})
    assert str(err.value) == "LAGDOCTOR_DATA_ROOT_SHARED must be 1 or 0, not 'yes please'"
    assert Settings.from_env({"LAGDOCTOR_DATA_ROOT": "/srv/l", "LAGDOCTOR_DATA_ROOT_SHARED": "1"}).data_root_shared
    assert not Settings.from_env({"LAGDOCTOR_DATA_ROOT": "/srv/l"}).data_root_shared


@pytest.mark.parametrize("master, executor", [
    ("spark://10.0.0.5:7077", None),  # a standalone cluster's executors read the snapshots
    ("local[2]", "CeleryExecutor"),  # Celery workers on other hosts write them
    ("k8s://https://api:6443", "KubernetesExecutor"),
])
def test_without_the_declaration_the_refusal_names_both_ways_out(master, executor):
    with pytest.raises(ObjectStoreError) as err:
        check_deployable("/srv/lagdoctor", master=master, executor=executor)
    line = str(err.value)
    assert "whose hosts share no disk" in line and "LAGDOCTOR_DATA_ROOT=s3://<bucket>/lagdoctor" in line
    assert line.endswith("or, if it is mounted at that path on every host, LAGDOCTOR_DATA_ROOT_SHARED=1")
    check_deployable("/srv/lagdoctor", master=master, executor=executor, shared=True)  # declared: a check instead


def test_a_declared_shared_root_must_be_the_same_absolute_path_everywhere():
    with pytest.raises(ObjectStoreError, match="LAGDOCTOR_DATA_ROOT_SHARED=1 needs an absolute LAGDOCTOR_DATA_ROOT"):
        check_deployable("data/lagdoctor", master="spark://10.0.0.5:7077", shared=True)


def test_what_an_executor_sees(tmp_path):
    snapshots = tmp_path / "snapshots"
    (snapshots / "cluster=prod" / "date=2026-11-21").mkdir(parents=True)
    (snapshots / "cluster=prod" / "date=2026-11-21" / "a.parquet").write_bytes(b"PAR1")
    marker = write_marker(str(snapshots))
    assert os.path.dirname(marker.path) == str(snapshots / MOUNT_FOLDER)
    host, seen, files, error = executor_view(0, str(snapshots), marker.path, marker.token).split("\t")
    assert (seen, files, error) == ("1", "1", "")  # the marker itself is not a snapshot file
    _, seen, files, error = executor_view(0, str(tmp_path / "empty"), str(tmp_path / "empty" / "m"), "t").split("\t")
    assert (seen, files) == ("0", "0") and error.startswith("FileNotFoundError")


# (executor answers, files the driver lists, failure line or None): the proof's table.
SEEN = "exec-a\t1\t12\t"
CASES = [
    ([SEEN, SEEN], 12, None),  # 1. every task saw the token and the files
    ([SEEN, "exec-b\t1\t0\t"], 0, None),  # 2. an empty store is empty everywhere: nothing to tell apart
    ([SEEN, "exec-b\t0\t0\tFileNotFoundError: No such file or directory"], 12,
     "1 of 2 Spark executor host(s) on spark://m:7077 do not see /srv/l/snapshots: exec-b: no marker "
     "(FileNotFoundError: No such file or directory)"),  # 3. the mount is missing on one host
    ([SEEN, "exec-b\t1\t0\t"], 12, "exec-b: lists no snapshot file where the driver lists 12"),  # 4. half a mount
    ([SEEN, "exec-b\t0\t12\tanother token"], 12, "exec-b: no marker (another token)"),  # 5. another root there
    ([], 12, "no Spark task on spark://m:7077 reported whether it sees /srv/l/snapshots"),  # 6. nothing ran
]


@pytest.mark.parametrize("views, driver_files, says", CASES)
def test_the_proof_fails_in_one_line_naming_the_hosts_and_the_path(views, driver_files, says):
    line = unseen_line(views, path="/srv/l/snapshots", driver_files=driver_files, master="spark://m:7077")
    if says is None:
        assert line is None
    else:
        assert says in line and "\n" not in line


def shared(root, **extra):
    return Settings(data_root=str(root), data_root_shared=True, **extra)


def test_an_airflow_worker_that_does_not_see_the_runs_marker_says_so_in_one_line(tmp_path):
    root = tmp_path / "mounted"
    assert leave_run_marker(shared(root), "run-1", executor="CeleryExecutor")
    check_worker_sees(shared(root), "run-1", executor="CeleryExecutor")  # the mount: seen, writable

    # another worker where the mount is missing: the same path is an empty local folder
    other = tmp_path / "unmounted"
    other.mkdir()
    with pytest.raises(MountNotSeen) as err:
        check_worker_sees(shared(other), "run-1", executor="CeleryExecutor")
    line = str(err.value)
    assert f"does not see the data root {other}" in line and "run-1.marker is missing" in line and "\n" not in line


def test_an_airflow_worker_that_cannot_write_the_spool_says_so(tmp_path):
    root = tmp_path / "mounted"
    leave_run_marker(shared(root), "run-1", executor="CeleryExecutor")
    spool = tmp_path / "not-a-folder"
    spool.write_text("a file where the spool folder should be")
    with pytest.raises(MountNotSeen, match=f"cannot write to {re.escape(str(spool))} "):
        check_worker_sees(shared(root, spool_dir=str(spool)), "run-1", executor="CeleryExecutor")


def test_nothing_is_proved_or_written_without_the_declaration_or_on_one_machine(tmp_path):
    assert leave_run_marker(Settings(data_root=str(tmp_path / "a")), "r", executor="CeleryExecutor") is None
    assert leave_run_marker(shared(tmp_path / "b"), "r", executor="LocalExecutor") is None
    check_worker_sees(shared(tmp_path / "c"), "r", executor="LocalExecutor")
    assert not any(tmp_path.iterdir())


def test_an_old_runs_marker_is_removed_by_the_next_runs_first_task(tmp_path):
    import time

    old = leave_run_marker(shared(tmp_path), "run-old", executor="CeleryExecutor")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    new = leave_run_marker(shared(tmp_path), "run-new", executor="CeleryExecutor")
    assert os.listdir(os.path.dirname(new)) == ["run-new.marker"]


def test_the_declared_root_is_the_operators_word_for_the_spool_under_it(tmp_path):
    from lagdoctor.notify.spool import SpoolNotShared, check_shared

    check_shared(shared(tmp_path), executor="CeleryExecutor")
    with pytest.raises(SpoolNotShared):  # an object store root: the spool would be on the worker's disk
        check_shared(Settings(data_root="s3://bucket/l", data_root_shared=True), executor="CeleryExecutor")


# -- on a real standalone cluster -------------------------------------------------------------


@pytest.mark.spark
def test_an_executor_that_does_not_see_the_mount_fails_the_job_in_one_line(spark_standalone, tmp_path):
    """The worker (and its executors) run in a mount namespace where an empty tmpfs covers the data
    root: the same path, an empty folder, as on a host that forgot the mount."""
    from tests.fixtures.spark import QUICK_CONF, can_hide_a_folder

    from lagdoctor.diagnosis.submit import run_diagnosis_process
    from lagdoctor.lab.sim import write_seeds_incident
    from lagdoctor.stages.diagnose import diagnosis_failure_line

    if not can_hide_a_folder():
        pytest.skip("unshare -m with a tmpfs mount needs root here")
    root = tmp_path / "data"
    snapshots = root / "snapshots"
    write_seeds_incident(str(snapshots))
    cluster = spark_standalone(hide=root)

    done = run_diagnosis_process(str(snapshots), str(root / "findings" / "r1"), master=cluster.master_url,
                                 extra_args=["--check-mount"], conf=QUICK_CONF, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [l for l in done.stderr.splitlines() if l.startswith("diagnose_lag: error:")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert (f"1 of 1 Spark executor host(s) on {cluster.master_url} do not see {snapshots}: " in lines[0]
            and "no marker (FileNotFoundError" in lines[0]), lines[0]
    # what the DAG's diagnose task fails with
    _, said = diagnosis_failure_line(done.stderr + "\nError code is: 1")
    assert said.startswith("diagnosis: LAGDOCTOR_DATA_ROOT_SHARED=1, but 1 of 1 Spark executor host(s)")
    # never an empty or "healthy" verdict from an unseen root; the marker is gone
    assert not (root / "findings" / "r1" / "findings.jsonl").exists()
    assert not (snapshots / MOUNT_FOLDER).exists()


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.airflow
def test_the_incident_dag_diagnoses_on_a_standalone_cluster_with_a_declared_shared_root(
        spark_standalone, airflow_db, incident_dag, lagging_group, slack_connection, monkeypatch, kafka_bootstrap,
        tmp_path):
    from airflow.utils.state import DagRunState

    cluster = spark_standalone()
    port = int(cluster.master_url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": port}))
    root = tmp_path / "data"
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(root))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT_SHARED", "1")

    topic, group = lagging_group
    run = incident_dag.test(run_conf={
        "group_pattern": re.escape(group), "dry_run": True, "samples": 6, "interval_seconds": 2, "window_minutes": 30,
    })
    assert run.state == DagRunState.SUCCESS, cluster.logs()[-3000:]
    prep = run.get_task_instance("prepare_diagnosis").xcom_pull(task_ids="prepare_diagnosis")
    assert "--check-mount" in prep["args"]  # the job proved its executor saw the root before reading
    findings = [json.loads(l) for p in root.glob("findings/*/findings.jsonl") for l in p.read_text().splitlines()]
    assert any(f["group_id"] == group and f["diagnosis"] == "partition_imbalance" for f in findings), findings
    assert any(group in str(p.body) and "partition_imbalance" in json.dumps(p.body) for p in slack_connection.posts)
    assert not list(root.rglob(f"snapshots/**/{MOUNT_FOLDER}"))  # the marker is removed


from tests.test_incident_dag import lagging_group  # noqa: E402,F401 - the same live lagging group
