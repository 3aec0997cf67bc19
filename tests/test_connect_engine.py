"""The warm Spark engine (issue 20): a Spark Connect server, and the diagnosis as its client.

The job's own suite (test_diagnosis_job.py, test_faults_diagnosis.py) runs once per
engine; here: the server's lifecycle, a whole sweep on Connect whose diagnosis,
run again through spark-submit on the same prepared input, writes the same
findings, and what a user meets when the server is gone or out of reach.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from lagdoctor.connectserver import ConnectServer, ConnectServerError, connection_json, free_port, trivial_query
from lagdoctor.diagnosis.submit import plan_connect, run_connect_process

pytestmark = pytest.mark.spark
DAGS = Path(__file__).resolve().parents[1] / "dags"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_server_answers_a_new_client_drops_its_secrets_file_once_up_and_stops_with_its_jvm(tmp_path):
    from pyspark.sql import SparkSession

    secret = "probe-secret-0b7e"
    # a setting a session can read back stands in for the store's keys: proof the JVM read the file
    server = ConnectServer(tmp_path / "secret", master="local[1]",
                           secret_conf={"spark.sql.shuffle.partitions": "7", "spark.lagdoctor.probe.secret": secret})
    mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    with server:
        assert server.url == f"sc://localhost:{server.port}"
        assert trivial_query(server.client_url) > 0
        pgid = server.pid
        assert group_alive(pgid)
        spark = SparkSession.builder.remote(server.client_url).create()
        try:
            assert spark.conf.get("spark.sql.shuffle.partitions") == "7"
        finally:
            spark.stop()
            if mode is None:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        assert not _files_holding(tmp_path, secret)  # removed once the server was up
    assert not _files_holding(tmp_path, secret)
    deadline = time.monotonic() + 30  # killed processes leave the group once reaped
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(pgid)  # the JVM and anything it started: gone
    assert server.proc.poll() is not None


def _files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_server_that_cannot_bind_says_why_in_one_line(tmp_path, connect_server):
    clash = ConnectServer(tmp_path / "clash", port=connect_server.port, master="local[1]")
    with pytest.raises(ConnectServerError) as info:
        with clash:
            pass
    message = str(info.value)
    assert "\n" not in message and "before it was ready" in message and str(clash.log) in message
    assert not clash.alive()
    assert trivial_query(connect_server.client_url) > 0  # the server already there is untouched


def test_the_server_is_locked_a_client_without_its_token_is_refused(connect_server):
    """Any local user can reach a loopback port: without the server's token, no query runs
    (no file read as the server's user, no use of the store's keys it holds)."""
    from pyspark.errors.exceptions.connect import SparkConnectGrpcException

    with pytest.raises(SparkConnectGrpcException, match="UNAUTHENTICATED"):
        trivial_query(connect_server.url)
    with pytest.raises(SparkConnectGrpcException, match="Invalid authentication token"):
        trivial_query(f"{connect_server.url}/;token=guessed")
    for secret in (connect_server.token,):  # never on the server's argv, where `ps` shows it
        assert secret not in " ".join(server_argv(connect_server.pid))
    assert trivial_query(connect_server.client_url) > 0


def server_argv(pid: int) -> list[str]:
    """The argv of every process in `pid`'s group (the JVM spark-submit starts among them)."""
    argv = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getpgid(int(proc.name)) == pid:
                    argv += (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except (OSError, ProcessLookupError):
                pass
    assert argv, "no process of the server's group found"
    return argv


def test_the_job_says_in_one_line_when_no_server_answers(tmp_path):
    from lagdoctor.lab.sim import write_seeds_incident

    store = tmp_path / "snapshots"
    write_seeds_incident(str(store))
    port = free_port()  # nothing listens there
    proc = run_connect_process(str(store), str(tmp_path / "out"), remote=f"sc://127.0.0.1:{port}/;token=s3cr3t-t0ken",
                               timeout=120)
    assert proc.returncode == 1  # worth a retry: not bad input
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    # a loopback address with a token is dialled as localhost: pyspark's only host for a token without TLS
    assert lines[0].startswith(f"diagnose_lag: error: cannot start a Spark session on sc://localhost:{port}:")
    assert "s3cr3t-t0ken" not in proc.stderr + proc.stdout  # the URL's token is never printed
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_a_remote_server_with_a_local_data_root_is_refused(monkeypatch, tmp_path):
    from lagdoctor.diagnosis.submit import connect_master
    from lagdoctor.objectstore import ObjectStoreError, check_deployable

    assert connect_master("sc://127.0.0.1:15002/") == "local"
    assert connect_master("sc://spark-connect.prod:15002/;token=x") == "sc://spark-connect.prod:15002/"
    with pytest.raises(ObjectStoreError, match="LAGDOCTOR_DATA_ROOT is a local path"):
        check_deployable(str(tmp_path), master=connect_master("sc://spark-connect.prod:15002/;token=x"))
    check_deployable(str(tmp_path), master=connect_master("sc://localhost:15002/"))  # one host: fine


def test_a_server_on_another_host_without_tls_is_refused_in_one_line(tmp_path):
    """The session's settings hold the store's keys: they never cross a network in clear text."""
    from lagdoctor.diagnosis.submit import client_remote

    prep = {"python": "/venv/bin/python", "application": "/app/diagnose_lag.py", "py_files": "/app/lagdoctor.zip",
            "args": ["--snapshots", "s3://lake/snapshots", "--output", "s3://lake/findings/run1"]}
    with pytest.raises(ValueError) as info:
        plan_connect(prep, remote="sc://spark-connect.prod:15002/", session_conf_dir=tmp_path,
                     operator_conf={"spark.hadoop.fs.s3a.secret.key": "hunter2"})
    assert str(info.value) == (
        "the Spark Connect server sc://spark-connect.prod:15002 is not on this host and its connection has no "
        "TLS: the store's keys would cross the network in clear text; set use_ssl true (and its token as the "
        "password) in the spark_connect connection")
    assert list(tmp_path.iterdir()) == []  # no secret written for a run that will not go
    # TLS asked for, or a token (pyspark sends one only over TLS to another host): it goes
    assert client_remote("sc://spark-connect.prod:15002/;use_ssl=true") == "sc://spark-connect.prod:15002/;use_ssl=true"
    assert client_remote("sc://spark-connect.prod:15002/;token=t") == "sc://spark-connect.prod:15002/;token=t"
    # this host: plain is fine; a token to a loopback address is dialled as localhost
    assert client_remote("sc://127.0.0.1:15002") == "sc://127.0.0.1:15002"
    assert client_remote("sc://127.0.0.1:15002/;token=t") == "sc://localhost:15002/;token=t"


def test_session_settings_go_to_a_private_file_not_the_command_line(tmp_path):
    prep = {"python": "/venv/bin/python", "application": "/app/diagnose_lag.py", "py_files": "/app/lagdoctor.zip",
            "args": ["--snapshots", str(tmp_path / "s"), "--output", str(tmp_path / "o")]}
    environ = {"LAGDOCTOR_SPARK_CONF": json.dumps({"spark.hadoop.fs.s3a.secret.key": "hunter2",
                                                   "spark.sql.shuffle.partitions": "8"}), "PATH": "/usr/bin"}
    plan = plan_connect(prep, remote="sc://127.0.0.1:15002/", environ=environ, session_conf_dir=tmp_path,
                        operator_conf={"spark.sql.shuffle.partitions": "6"})
    assert plan.command == ["/venv/bin/python", "/app/diagnose_lag.py", *prep["args"]]
    assert "hunter2" not in " ".join(plan.command) and "hunter2" not in json.dumps(
        {k: v for k, v in plan.env.items() if k != "LAGDOCTOR_SPARK_CONF"})
    conf_file = Path(plan.env["LAGDOCTOR_SPARK_SESSION_CONF"])
    assert oct(conf_file.stat().st_mode & 0o777) == "0o600"
    assert json.loads(conf_file.read_text()) == {"spark.hadoop.fs.s3a.secret.key": "hunter2",
                                                 "spark.sql.shuffle.partitions": "6"}  # the operator's wins
    assert plan.env["SPARK_REMOTE"] == "sc://127.0.0.1:15002/"
    assert plan.env["PYTHONPATH"].split(os.pathsep)[0] == "/app/lagdoctor.zip"


@pytest.mark.broker
@pytest.mark.airflow
def test_a_sweep_on_connect_and_its_diagnosis_on_spark_submit_give_the_same_findings(
        airflow_db, kafka_bootstrap, crashed_group, slack_connection, connect_server, tmp_path, monkeypatch):
    """One sweep run, its diagnosis on the warm server (the spark_default connection of type
    spark_connect); then the same prepared diagnosis through spark-submit (type spark):
    the same findings and statuses, byte for byte."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    from lagdoctor.contracts import SWEEP_DAG_ID
    from lagdoctor.pipeline import DiagnoseLagOperator

    topic, group = crashed_group
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}))
    monkeypatch.delenv("LAGDOCTOR_SWEEP_CLUSTERS", raising=False)
    monkeypatch.delenv("LAGDOCTOR_STATE_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connection_json(connect_server.url, connect_server.token))
    data = tmp_path / "data"
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(data))
    bag = DagBag(dag_folder=str(DAGS / f"{SWEEP_DAG_ID}.py"))
    assert bag.import_errors == {}
    run = bag.dags[SWEEP_DAG_ID].test(run_conf={"group_pattern": re.escape(group), "topic": topic, "samples": 2,
                                                "interval_seconds": 1, "window_minutes": 30, "dry_run": True})
    assert run.state == DagRunState.SUCCESS
    tis = {ti.task_id: ti for ti in run.get_task_instances() if ti.task_id != "snapshot"}
    assert tis["diagnose"].state == TaskInstanceState.SUCCESS
    prep = tis["prepare_diagnosis"].xcom_pull(task_ids="prepare_diagnosis")
    on_connect = Path(prep["output"])
    connect_findings = [json.loads(line) for line in (on_connect / "findings.jsonl").read_text().splitlines()]
    assert [f["diagnosis"] for f in connect_findings if f["group_id"] == group] == ["crashed_consumer"]

    # the same prepared input through spark-submit, into a folder of its own
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    on_submit = tmp_path / "on-spark-submit"
    args = list(prep["args"])
    args[args.index("--output") + 1] = str(on_submit)

    class PreparedTI:
        def xcom_pull(self, task_ids):
            return {**prep, "args": args, "output": str(on_submit)}

    DiagnoseLagOperator(task_id="diagnose_again", prepare_task_id="prepare_diagnosis").execute({"ti": PreparedTI()})
    for name in ("findings.jsonl", "partition_status.jsonl", "quarantined.jsonl"):
        assert (on_submit / name).read_text() == (on_connect / name).read_text(), name
    assert (on_submit / "findings.jsonl").read_text()


def test_sigterm_interrupts_the_clients_queries_and_exits(tmp_path, connect_server):
    """Airflow killing the task: the client asks the server to stop its queries, then exits
    (a server would otherwise run them on for a client that is gone)."""
    import subprocess
    import sys

    script = tmp_path / "client.py"
    script.write_text(
        "import sys\n"
        "from lagdoctor.diagnosis.session import start_spark\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from diagnose_lag import stop_on_term\n"
        "spark = start_spark('sleepy')\n"
        "stop_on_term(spark)\n"
        "print('started', flush=True)\n"
        "spark.range(10**12).selectExpr('sum(id % 7)').collect()\n")
    from lagdoctor.diagnosis.submit import connect_client_env, default_job_script

    env = connect_client_env(connect_server.client_url)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1] / "plugins"),
                                                    env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, str(script), str(Path(default_job_script()).parent)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(3)  # the query is running on the server
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(60)
    assert code == 128 + signal.SIGTERM, proc.stderr.read()
    assert time.monotonic() - started < 30
    assert trivial_query(connect_server.client_url) < 30  # the server is free again, not summing 10^12 rows


def test_the_cli_diagnoses_as_a_client_of_a_server(tmp_path, connect_server, capsys):
    from lagdoctor.cli import main
    from lagdoctor.lab.sim import write_seeds_incident

    store = tmp_path / "snapshots"
    write_seeds_incident(str(store))
    out = tmp_path / "out"
    token_file = tmp_path / "token"
    token_file.write_text(connect_server.token + "\n")
    assert main(["diagnose", "--remote", connect_server.url, "--token-file", str(token_file),
                 "--snapshots", str(store), "--output", str(out)]) == 0
    findings = [json.loads(line) for line in (out / "findings.jsonl").read_text().splitlines()]
    assert [(f["group_id"], f["diagnosis"], f["partitions"]) for f in findings] == [
        ("orders-processor", "partition_imbalance", [1])]
    assert main(["diagnose", "--remote", connect_server.url, "--master", "local[2]", "--snapshots", str(store),
                 "--output", str(tmp_path / "o2")]) == 1
    assert "--remote and --master exclude each other" in capsys.readouterr().err
    # a token on the command line is refused before anything runs: `ps` shows every argv
    assert main(["diagnose", "--remote", f"{connect_server.url}/;token={connect_server.token}",
                 "--snapshots", str(store), "--output", str(tmp_path / "o3")]) == 1
    err = capsys.readouterr().err
    assert "use --token-file or $SPARK_CONNECT_AUTHENTICATE_TOKEN" in err and connect_server.token not in err
    assert not (tmp_path / "o3").exists()


def _prepared(tmp_path) -> dict:
    """What prepare_diagnosis hands the diagnose task: the seeds incident's store, an output folder."""
    import sys

    from lagdoctor.diagnosis.submit import build_package_zip, default_job_script, job_arguments
    from lagdoctor.lab.sim import write_seeds_incident

    store, out = tmp_path / "snapshots", tmp_path / "findings" / "run-1"
    write_seeds_incident(str(store))
    return {"application": default_job_script(), "py_files": build_package_zip(tmp_path / "zip"),
            "args": job_arguments(str(store), str(out), quarantine=True), "output": str(out),
            "python": sys.executable}


def test_a_diagnosis_that_times_out_stops_its_client_and_its_run_is_never_read(
        tmp_path, connect_server, monkeypatch):
    """Airflow's execution_timeout raises in the task while its Connect client runs: the client
    is stopped before the task ends (Airflow's on_kill comes too late to find it), nothing it
    might have written is read as a run, and the next try writes a run that is."""
    import subprocess

    from airflow.sdk.exceptions import AirflowTaskTimeout

    from lagdoctor.pipeline import DiagnoseLagOperator
    from lagdoctor.runindex import filesystem, run_completeness

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", connection_json(connect_server.url, connect_server.token))
    monkeypatch.setenv("LAGDOCTOR_DATA_ROOT", str(tmp_path))
    prep = _prepared(tmp_path)

    class PreparedTI:
        def xcom_pull(self, task_ids):
            return prep

    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_then_time_out(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        signal.setitimer(signal.ITIMER_REAL, 1.5)  # as Airflow's timeout does: SIGALRM in the task
        return proc

    def on_alarm(*_):
        raise AirflowTaskTimeout("Timeout, PID: 4242")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    monkeypatch.setattr(subprocess, "Popen", popen_then_time_out)
    operator = DiagnoseLagOperator(task_id="diagnose", prepare_task_id="prepare_diagnosis")
    try:
        with pytest.raises(AirflowTaskTimeout):
            operator.execute({"ti": PreparedTI()})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        monkeypatch.setattr(subprocess, "Popen", real_popen)
    (client,) = started
    assert client.poll() is not None and not group_alive(client.pid)  # stopped, not orphaned
    operator.on_kill()  # what Airflow calls next: nothing left to stop, nothing raised
    assert not run_completeness(*filesystem(prep["output"])).complete
    assert trivial_query(connect_server.client_url) < 30  # the server is free

    operator.execute({"ti": PreparedTI()})  # the next try
    assert run_completeness(*filesystem(prep["output"])).complete
    findings = [json.loads(line) for line in (Path(prep["output"]) / "findings.jsonl").read_text().splitlines()]
    assert [(f["group_id"], f["diagnosis"]) for f in findings] == [("orders-processor", "partition_imbalance")]


def test_a_client_whose_task_is_killed_outright_stops_too(tmp_path, connect_server):
    """SIGKILL to the task's process runs no Python: the client, told its parent's pid, gets a
    SIGTERM from the kernel when that process dies, and writes nothing."""
    import subprocess
    import sys

    from lagdoctor.diagnosis.submit import connect_client_env
    from lagdoctor.runindex import filesystem, run_completeness

    prep = _prepared(tmp_path)
    env = connect_client_env(connect_server.client_url, py_files=prep["py_files"])
    task = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys, time\n"
         "env = dict(os.environ, LAGDOCTOR_PARENT_PID=str(os.getpid()))\n"
         "p = subprocess.Popen(sys.argv[1:], env=env, start_new_session=True)\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(600)\n",
         prep["python"], prep["application"], *prep["args"]],
        env=env, stdout=subprocess.PIPE, text=True)
    client_pid = int(task.stdout.readline())
    task.kill()
    task.wait(10)
    deadline = time.monotonic() + 60
    while group_alive(client_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(client_pid)
    assert not run_completeness(*filesystem(prep["output"])).complete


def test_connect_server_command_keeps_its_token_in_private_files_not_the_terminal(tmp_path):
    """`lagdoctor connect-server`: the token in DIR/token and the connection in
    DIR/spark_default.json, both 0600; the terminal says where, never the token; a restart
    reuses the token, so the connection a user exported stays valid."""
    import subprocess
    import sys

    from lagdoctor.connectserver import read_or_create_token

    workdir = tmp_path / "engine"
    cli = Path(sys.executable).parent / "lagdoctor"
    proc = subprocess.Popen([str(cli), "connect-server", "--port", str(free_port()), "--master", "local[1]",
                             "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        said = []
        for line in proc.stdout:
            said.append(line)
            if "AIRFLOW_CONN_SPARK_DEFAULT" in line:
                break
        token = (workdir / "token").read_text().strip()
        conn = json.loads((workdir / "spark_default.json").read_text())
        assert token and conn["password"] == token and conn["host"] == "localhost"
        assert oct((workdir / "token").stat().st_mode & 0o777) == oct((workdir / "spark_default.json").stat().st_mode
                                                                       & 0o777) == "0o600"
        assert token not in "".join(said)
        assert f'export AIRFLOW_CONN_SPARK_DEFAULT="$(cat {workdir / "spark_default.json"})"' in "".join(said)
        url = f"sc://localhost:{conn['port']}"
        assert trivial_query(f"{url}/;token={token}") > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert read_or_create_token(workdir / "token") == token  # the next start's
