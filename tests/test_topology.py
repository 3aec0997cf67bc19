"""The one-machine cluster (`lagdoctor topology`), each part a real server, and the
DAGs running on it unchanged: scheduled sweeps on two Celery workers with no shared
disk, an incident approved through the REST API, the lag page read with a token,
and a worker killed mid-run.

One topology for the module (its start time is printed); the tests run in order
and build on each other's runs, as an operator's day would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.k8s import FakeKubernetes
from tests.fixtures.loopback import serve_loopback
from tests.fixtures.signals import (HOLDS_ITS_STOP, groups_left, hang_up, live_in_group, read_until, reap,
                                    start_stand_in, wait_for_file)
from tests.fixtures.slack import SLACK_TEST_TOKEN, FakeSlack
from tests.fixtures.slack import _handler as slack_handler

pytestmark = [pytest.mark.topology, pytest.mark.timeout(900)]

SWEEP = "kafka_lag_health_sweep"
INCIDENT = "kafka_lag_incident"
APPROVAL_TASK = "remediate_restart_consumers.approve"
TOPIC, GROUP = "topology-mail", "topology-mailer"

# The s3:// data root through one Airflow AWS connection is issue 19's item 2 (branch i19-s3).
S3_ROOT_MISSING = importlib.util.find_spec("lagdoctor.objectstore") is None
needs_s3_root = pytest.mark.xfail(
    S3_ROOT_MISSING, strict=False,
    reason="the s3:// data root (lagdoctor.objectstore: an Airflow AWS connection feeding s3fs and Spark's s3a, "
           "hadoop-aws jars) is not on this branch: the sweep's tasks cannot write or read s3://lagdoctor/lagdoctor")


def _missing_servers() -> list[str]:
    import shutil
    import sys

    from lagdoctor.lab.postgres import pg_bin

    missing = [name for name, ok in (("redis-server", shutil.which("redis-server")), ("PostgreSQL", pg_bin()),
                                     ("weed", (Path(sys.executable).parent / "weed").exists()),
                                     ("java", shutil.which("java")))
               if not ok]
    return missing


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The topology, a loopback Slack, a loopback Kubernetes API, and a crashed consumer group."""
    missing = _missing_servers()
    if missing:
        pytest.skip(f"the cluster topology needs {', '.join(missing)} (make test installs them)")
    from lagdoctor.lab.topology import Topology
    from lagdoctor.lab.workload import SteadyProducer, commit_offsets, create_topic, produce_counts

    slack, k8s = FakeSlack(), FakeKubernetes()
    k8s.add_deployment("mail", "mailer", replicas=2)
    with serve_loopback(slack_handler(slack)) as slack_base, k8s.serve():
        slack.url = slack_base + "/api/"
        remediation = {"require_approval": ["restart_consumers"],
                       "deployments": {GROUP: {"namespace": "mail", "name": "mailer"}},
                       "kubernetes": {"host": k8s.url}}
        topology = Topology(tmp_path_factory.mktemp("topology"), slack_url=slack.url, slack_token=SLACK_TEST_TOKEN,
                            extra_env={"LAGDOCTOR_SWEEP_SCHEDULE": "* * * * *",
                                       # a killed worker's task is failed (then retried) after 30 s, not 60
                                       "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                                       "LAGDOCTOR_REMEDIATION_CONFIG": json.dumps(remediation)})
        addresses = topology.start()
        print(f"\ntopology started in {topology.started_s:.0f} s\n{topology.table()}", flush=True)
        producer = None
        try:
            # A group with no live consumer while records keep arriving: its runbook restarts consumers.
            bootstrap = addresses.kafka_bootstrap
            create_topic(bootstrap, TOPIC, 2)
            produce_counts(bootstrap, TOPIC, {0: 50, 1: 50})
            commit_offsets(bootstrap, GROUP, TOPIC, {0: 40, 1: 40})
            producer = SteadyProducer(bootstrap, TOPIC, [0, 1], rate_per_partition=20).start()
            yield {"topology": topology, "a": addresses, "slack": slack, "k8s": k8s, "runs": {}}
        finally:
            if producer is not None:
                producer.stop()
            topology.stop()


# -- REST helpers -----------------------------------------------------------------

def rest(world, method: str, path: str, body: dict | None = None, token: str | None = "auto") -> tuple[int, object]:
    """(status, JSON body) of an Airflow REST call with a token from POST /auth/token."""
    if token == "auto":
        if "token" not in world:
            world["token"] = world["topology"].token()
        token = world["token"]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(world["a"].airflow_url + path, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def runs_of(world, dag_id: str) -> list[dict]:
    status, body = rest(world, "GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=run_after")
    assert status == 200, body
    return body["dag_runs"]


def task_instances(world, dag_id: str, run_id: str) -> list[dict]:
    from urllib.parse import quote

    status, body = rest(world, "GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances?limit=100")
    assert status == 200, body
    return body["task_instances"]


def wait_for(what: str, check, timeout_s: float, world=None, every_s: float = 3.0):
    """Poll `check` until it returns something truthy; fail naming `what` (and a dead part)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if world is not None:
            dead = world["topology"].check()
            assert dead is None, f"while waiting for {what}: {dead}"
        value = check()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def state_rows(world, table: str) -> list[dict]:
    import psycopg
    from psycopg.rows import dict_row

    url = world["a"].state_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return list(conn.execute(f"SELECT * FROM {table}"))  # noqa: S608 - a table name of ours


# -- phase 1: every part answers ---------------------------------------------------

def test_every_part_answers_on_loopback(world):
    import boto3
    import psycopg
    import redis
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError
    from confluent_kafka.admin import AdminClient

    from lagdoctor.lab.topology import s3_client

    a, topology = world["a"], world["topology"]
    names = [p.name for p in topology.parts]
    assert names == ["PostgreSQL", "Redis", "SeaweedFS S3", "Spark master", "Spark worker-1", "Spark worker-2",
                     "Spark Connect", "Kafka broker", "Airflow API server", "Airflow scheduler", "Airflow DAG processor",
                     "Celery worker w1", "Celery worker w2"]
    # each its own process group (one can be killed alone)
    groups = {os.getpgid(p.pid) for p in topology.parts}
    assert len(groups) == len(names)
    for db in ("airflow", "lagdoctor_state"):
        url = a.postgres_admin_url.replace("postgresql+psycopg://", "postgresql://").rsplit("/", 1)[0] + "/" + db
        with psycopg.connect(url, connect_timeout=5) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert redis.Redis.from_url(a.redis_url).ping() is True
    # S3: a signed list of the bucket answers; an unsigned one is refused
    assert s3_client(a.s3_endpoint, a.s3_key, a.s3_secret).list_objects_v2(Bucket=a.bucket)["ResponseMetadata"][
        "HTTPStatusCode"] == 200
    anonymous = boto3.client("s3", endpoint_url=a.s3_endpoint, region_name="us-east-1",
                             config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}))
    with pytest.raises(ClientError):
        anonymous.list_objects_v2(Bucket=a.bucket)
    assert os.stat(a.workdir / "s3" / "s3.json").st_mode & 0o777 == 0o600
    with urllib.request.urlopen(f"{a.spark_ui}/json/", timeout=10) as resp:
        master = json.load(resp)
    assert master["status"] == "ALIVE" and master["url"] == a.spark_master
    assert [w["state"] for w in master["workers"]] == ["ALIVE", "ALIVE"]
    assert [w["cores"] for w in master["workers"]] == [1, 1]
    # the warm engine: a Connect server answering a new client, its executors on one of the two cores
    from lagdoctor.connectserver import client_url, trivial_query

    assert trivial_query(client_url(a.spark_connect, a.spark_connect_token)) > 0
    with pytest.raises(Exception, match="UNAUTHENTICATED"):  # locked: a client without its token is refused
        trivial_query(a.spark_connect)
    (engine,) = [app for app in master["activeapps"] if app["name"] == "lagdoctor-connect-server"]
    assert engine["cores"] == 1
    assert len(AdminClient({"bootstrap.servers": a.kafka_bootstrap}).list_topics(timeout=10).brokers) == 1
    with urllib.request.urlopen(f"{a.airflow_url}/api/v2/monitor/health", timeout=10) as resp:
        health = json.load(resp)
    assert {k: health[k]["status"] for k in ("metadatabase", "scheduler", "dag_processor")} == {
        "metadatabase": "healthy", "scheduler": "healthy", "dag_processor": "healthy"}
    # every listening socket of the parts is on loopback
    assert a.airflow_url.startswith("http://127.0.0.1:") and a.s3_endpoint.startswith("http://127.0.0.1:")


def test_postgres_redis_and_spark_refuse_a_client_without_their_password(world):
    """Every local user can reach a loopback port: each server asks for its secret."""
    import socket

    import psycopg

    a = world["a"]
    host, port = a.postgres_admin_url.rsplit("@", 1)[1].split("/")[0].split(":")
    for password, refusal in ((None, "no password supplied"),
                              ("guess", 'password authentication failed for user "postgres"')):
        with pytest.raises(psycopg.OperationalError, match=refusal):
            psycopg.connect(host=host, port=port, user="postgres", dbname="airflow", password=password,
                            connect_timeout=5, passfile=str(a.workdir / "no-pgpass"))  # no ~/.pgpass
    host, port = a.redis_url.rsplit("@", 1)[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"PING\r\n")
        assert conn.recv(200).startswith(b"-NOAUTH Authentication required")
    # the secret files: the owner's alone
    for path in (a.workdir / "postgres-password", a.workdir / "redis" / "redis.conf",
                 a.spark_conf_dir / "spark-defaults.conf"):
        assert os.stat(path).st_mode & 0o777 == 0o600, path
    conf = (a.spark_conf_dir / "spark-defaults.conf").read_text().splitlines()
    assert "spark.authenticate true" in conf and f"spark.authenticate.secret {a.spark_secret}" in conf
    assert a.spark_secret and a.postgres_password and a.redis_password
    assert a.postgres_password not in repr(a) and a.redis_password not in repr(a) and a.spark_secret not in repr(a)


def test_two_celery_workers_are_registered_with_homes_of_their_own(world):
    from lagdoctor.lab.topology import celery_workers

    a = world["a"]
    names = celery_workers(a.redis_url)
    assert [n.split("@")[0] for n in names] == ["w1", "w2"]
    homes = {a.workdir / "airflow-w1", a.workdir / "airflow-w2", a.workdir / "airflow"}
    assert all(h.is_dir() for h in homes)
    # the Airflow side's settings: Celery, the S3 data root, the state connection, the warm engine
    # as spark_default, and spark:// in client mode as the spark-submit fallback
    env = a.airflow_env
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["LAGDOCTOR_DATA_ROOT"] == f"s3://{a.bucket}/lagdoctor"
    engine = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert engine["conn_type"] == "spark_connect" and f"sc://{engine['host']}:{engine['port']}" == a.spark_connect
    assert engine["password"] == a.spark_connect_token
    spark = json.loads(env["AIRFLOW_CONN_SPARK_SUBMIT"])
    assert f"{spark['host']}:{spark['port']}" == a.spark_master and spark["extra"]["deploy-mode"] == "client"
    assert json.loads(env["AIRFLOW_CONN_LAGDOCTOR_STATE"])["schema"] == "lagdoctor_state"


def test_the_rest_api_refuses_a_call_without_a_token(world):
    status, _ = rest(world, "GET", f"/api/v2/dags/{SWEEP}", token=None)
    assert status == 401
    for dag_id in (SWEEP, INCIDENT):  # the DAG processor may still be writing them
        body = wait_for(f"{dag_id} in Airflow", lambda: (lambda r: r[1] if r[0] == 200 else None)(
            rest(world, "GET", f"/api/v2/dags/{dag_id}")), 120, world)
        assert body["is_paused"] is True  # created paused


# -- phase 2: the DAGs on the cluster ---------------------------------------------

def _finished(run: dict) -> bool:
    return run["state"] in ("success", "failed")


def test_two_scheduled_sweeps_run_their_tasks_on_both_workers(world):
    status, body = rest(world, "PATCH", f"/api/v2/dags/{SWEEP}", {"is_paused": False})
    assert status == 200 and body["is_paused"] is False, body

    def ran(run: dict) -> bool:
        # a scheduled run that started after the next one was due skips every task (issue 20):
        # on two loaded cores some do; the two counted here are runs that did the work
        return any(ti["task_id"] == "validate_params" and ti["state"] == "success"
                   for ti in task_instances(world, SWEEP, run["dag_run_id"]))

    def two_scheduled_done():
        runs = [r for r in runs_of(world, SWEEP) if r["run_type"] == "scheduled"]
        done = [r for r in runs if _finished(r) and ran(r)]
        return done[:2] if len(done) >= 2 else None

    runs = wait_for("two scheduled sweeps to run and finish (schedule: every minute)", two_scheduled_done, 600,
                    world)
    # the second run may start while the test reads: pause so later tests see a quiet scheduler
    rest(world, "PATCH", f"/api/v2/dags/{SWEEP}", {"is_paused": True})
    world["runs"]["sweeps"] = runs
    hosts = {ti["hostname"] for r in runs for ti in task_instances(world, SWEEP, r["dag_run_id"])
             if ti["hostname"]}
    assert hosts == {"w1", "w2"}, f"task instances ran on {hosts}"


@needs_s3_root
def test_the_sweeps_found_the_crashed_group_posted_it_and_kept_state_in_postgres(world):
    runs = world["runs"].get("sweeps")
    assert runs, "no sweeps ran (see the previous test)"
    assert [r["state"] for r in runs] == ["success", "success"], [
        (r["dag_run_id"], {ti["task_id"]: ti["state"] for ti in task_instances(world, SWEEP, r["dag_run_id"])})
        for r in runs]
    from lagdoctor.lab.topology import s3_client

    a = world["a"]
    keys = [o["Key"] for page in s3_client(a.s3_endpoint, a.s3_key, a.s3_secret).get_paginator(
        "list_objects_v2").paginate(Bucket=a.bucket, Prefix="lagdoctor/") for o in page.get("Contents", [])]
    assert any(k.startswith("lagdoctor/snapshots/") and k.endswith(".parquet") for k in keys)
    assert any(k.startswith("lagdoctor/findings/") and k.endswith("findings.jsonl") for k in keys)
    posted = json.dumps(world["slack"].messages)
    assert GROUP in posted and "crashed" in posted.lower()
    assert any(GROUP in json.dumps(row, default=str) for row in state_rows(world, "incident_threads"))
    assert state_rows(world, "slack_messages"), "no Slack message was recorded in the PostgreSQL state"


CLUSTER_EXAMPLE = "<!-- run by tests/test_topology.py: the cluster example -->"
CLUSTER_EXAMPLE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "deploying.md"


def cluster_example() -> str:
    """The deploying page's cluster example: the bash block after its marker."""
    text = CLUSTER_EXAMPLE_PAGE.read_text()
    after = text[text.index(CLUSTER_EXAMPLE):]
    return after[after.index("```bash\n") + len("```bash\n"):after.index("\n```", after.index("```bash"))]


@needs_s3_root
def test_the_deploying_pages_cluster_example_runs_as_written(world):
    """Its placeholders (the store's address and keys, the master) become this topology's;
    the rest runs as printed, on the snapshots the sweeps wrote."""
    import subprocess
    import sys

    from lagdoctor.lab.topology import s3_client

    a = world["a"]
    script = cluster_example()
    for placeholder, value in {"http://s3.internal:9000": a.s3_endpoint, "<access key>": a.s3_key,
                               "<secret key>": a.s3_secret,
                               "/etc/spark/conf": str(a.spark_conf_dir),
                               "spark://spark-master:7077": a.spark_master}.items():
        assert placeholder in script, f"the deploying page's cluster example lost its {placeholder}"
        script = script.replace(placeholder, value)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert a.s3_secret not in done.stdout + done.stderr and a.spark_secret not in done.stdout + done.stderr
    keys = [o["Key"] for page in s3_client(a.s3_endpoint, a.s3_key, a.s3_secret).get_paginator(
        "list_objects_v2").paginate(Bucket=a.bucket, Prefix="lagdoctor/findings/readme-example/")
        for o in page.get("Contents", [])]
    assert "lagdoctor/findings/readme-example/findings.jsonl" in keys, keys
    findings = s3_client(a.s3_endpoint, a.s3_key, a.s3_secret).get_object(
        Bucket=a.bucket, Key="lagdoctor/findings/readme-example/findings.jsonl")["Body"].read().decode()
    assert GROUP in findings


@needs_s3_root
def test_an_incident_run_asks_for_approval_answered_through_the_rest_api(world):
    import re
    from urllib.parse import quote

    status, body = rest(world, "PATCH", f"/api/v2/dags/{INCIDENT}", {"is_paused": False})
    assert status == 200, body
    status, run = rest(world, "POST", f"/api/v2/dags/{INCIDENT}/dagRuns", {
        "logical_date": None,
        "conf": {"group_pattern": re.escape(GROUP), "samples": 3, "interval_seconds": 1, "window_minutes": 30,
                 "dry_run": False}})
    assert status == 200, run
    run_id = run["dag_run_id"]
    world["runs"]["incident"] = run_id
    path = f"/api/v2/dags/{INCIDENT}/dagRuns/{quote(run_id, safe='')}"

    def waiting_form():
        _, state = rest(world, "GET", path)
        assert state["state"] != "failed", f"the incident run failed before asking: {_states(world, run_id)}"
        status, detail = rest(world, "GET", f"{path}/taskInstances/{APPROVAL_TASK}/-1/hitlDetails")
        return detail if status == 200 else None

    detail = wait_for("the incident run's approval form", waiting_form, 400, world)
    option = f"Approve 1: {GROUP} on kafka_default / {TOPIC}"
    assert detail["options"] == [option, "Reject all"]
    status, answer = rest(world, "PATCH", f"{path}/taskInstances/{APPROVAL_TASK}/-1/hitlDetails",
                          {"chosen_options": [option], "params_input": {}})
    assert status == 200, answer

    def finished():
        _, state = rest(world, "GET", path)
        return state if _finished(state) else None

    assert wait_for("the approved incident run to finish", finished, 300, world)["state"] == "success", \
        _states(world, run_id)
    patches = [r for r in world["k8s"].requests if r.method == "PATCH"]
    assert len(patches) == 1 and "restartedAt" in json.dumps(patches[0].body)
    # The sweeps' dry runs of the same action are logged too; the incident's is the only real one.
    actions = [r for r in state_rows(world, "action_log") if r.get("action") == "restart_consumers"
               and not r["dry_run"]]
    assert [r["status"] for r in actions] == ["started", "executed"], actions
    assert "admin" in json.dumps([r for r in actions], default=str)  # who approved, through the REST API


def _states(world, run_id: str) -> dict[str, str]:
    return {ti["task_id"]: ti["state"] for ti in task_instances(world, INCIDENT, run_id)}


@needs_s3_root
def test_the_lag_page_answers_a_token_and_refuses_without(world):
    status, body = rest(world, "GET", "/lagdoctor/api/findings", token=None)
    assert status == 401
    status, body = rest(world, "GET", "/lagdoctor/api/findings")
    assert status == 200, body
    assert GROUP in {f["group_id"] for f in body["findings"]}


@needs_s3_root
def test_a_worker_killed_mid_task_and_the_task_recovers_on_the_other(world):
    import re

    topology = world["topology"]
    rest(world, "PATCH", f"/api/v2/dags/{INCIDENT}", {"is_paused": False})
    # a long snapshot task (10 samples 3 s apart) so it is surely running when its worker dies
    status, run = rest(world, "POST", f"/api/v2/dags/{INCIDENT}/dagRuns", {
        "logical_date": None,
        "conf": {"group_pattern": re.escape(GROUP), "samples": 10, "interval_seconds": 3, "window_minutes": 30}})
    assert status == 200, run
    run_id = run["dag_run_id"]

    def snapshot(state: str | None = None):
        for ti in task_instances(world, INCIDENT, run_id):
            # a try that failed for good ends the wait at once (no retry left to recover on)
            assert not (ti["task_id"] == "snapshot" and ti["state"] == "failed"), _states(world, run_id)
            if ti["task_id"] == "snapshot" and ti["hostname"] and (state is None or ti["state"] == state):
                return ti
        return None

    ti = wait_for("the incident run's snapshot task to run", lambda: snapshot("running"), 300, world, every_s=1)
    victim = ti["hostname"]
    survivor = ({"w1", "w2"} - {victim}).pop()
    part = topology.part(f"Celery worker {victim}")
    os.killpg(part.pid, signal.SIGKILL)  # the worker, its task supervisor and the task: all at once
    part.proc.wait(10)
    topology.parts.remove(part)  # dead on purpose: not a failure of the topology

    # the scheduler finds the task without a heartbeat, fails that try, and the retry runs on the survivor
    done = wait_for("the snapshot task to succeed on the other worker", lambda: snapshot("success"), 420, world)
    assert done["try_number"] >= 2 and done["hostname"] == survivor
    world["runs"]["recovered"] = run_id


def test_no_secret_is_on_any_argv_or_in_any_log_of_the_topology(world):
    """Every process of every part's group (JVMs, executors, Celery workers, their tasks): an argv is
    readable by every local user. And every log the parts wrote."""
    a, topology = world["a"], world["topology"]
    env = a.airflow_env
    found = {"PostgreSQL's password": a.postgres_password, "Redis's password": a.redis_password,
             "the Spark cluster's secret": a.spark_secret, "the Connect server's token": a.spark_connect_token,
             "the S3 secret key": a.s3_secret, "Airflow's admin password": a.airflow_password,
             "Airflow's fernet key": env["AIRFLOW__CORE__FERNET_KEY"],
             "Airflow's JWT secret": env["AIRFLOW__API_AUTH__JWT_SECRET"]}
    assert all(found.values())
    groups = {p.pid for p in topology.parts if p.exit_code() is None}
    argvs = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) in groups:
                argvs[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace")
        except (OSError, ValueError):
            continue  # gone meanwhile
    assert len(argvs) > len(groups)  # the parts' children too (Spark executors, Celery's pool, ...)
    assert any("CoarseGrainedExecutorBackend" in argv for argv in argvs.values())  # a Spark executor was read
    leaks = [f"{what} on the argv of pid {pid}: {argv[:120]}" for pid, argv in argvs.items()
             for what, secret in found.items() if secret in argv]
    assert leaks == []
    logs = [p for p in a.workdir.rglob("*") if p.is_file() and (p.suffix == ".log" or p.name in ("stderr", "stdout"))]
    assert len(logs) > len(topology.parts)
    leaks = [f"{what} in {path}" for path in logs for what, secret in found.items()
             if secret in path.read_text(errors="replace")]
    assert leaks == []


def test_nothing_was_written_to_a_local_data_folder(world):
    """No lagdoctor data folder on any Airflow home (the data root is s3://); a local spool
    appears only while the state database is unreachable, which it never was."""
    a = world["a"]
    homes = [a.workdir / "airflow", a.workdir / "airflow-w1", a.workdir / "airflow-w2"]
    written = [str(p) for home in homes for p in home.rglob("*")
               if "lagdoctor" in p.relative_to(home).parts[:1] or p.suffix in (".parquet", ".jsonl")]
    assert written == []


# -- the topology's own behaviour, on stand-in processes -----------------------------

def test_a_part_that_dies_while_waited_for_fails_the_start_naming_it_and_its_last_line(tmp_path):
    from lagdoctor.lab.topology import Topology, TopologyError

    said = []
    topology = Topology(tmp_path, report=said.append)
    part = topology._spawn("Redis", ["sh", "-c", "echo 'Address already in use'; exit 3"], "127.0.0.1:1",
                           tmp_path / "redis.log")
    with pytest.raises(TopologyError) as exc:
        topology._wait("Redis on 127.0.0.1:1", lambda: False, [part], timeout_s=30)
    assert "Redis exited with code 3" in str(exc.value)
    assert "Address already in use" in str(exc.value) and str(tmp_path / "redis.log") in str(exc.value)
    topology.stop()


def test_a_slow_part_is_waited_for_saying_what_is_missing(tmp_path, monkeypatch):
    from lagdoctor.lab import topology as topo

    monkeypatch.setattr(topo, "PROGRESS_EVERY_S", 0.0)
    said = []
    topology = topo.Topology(tmp_path, report=said.append)
    part = topology._spawn("Spark master", ["sleep", "30"], "spark://127.0.0.1:1", tmp_path / "m.log")
    answers = iter(["1 of 2 workers ALIVE", "1 of 2 workers ALIVE", True])
    topology._wait("the Spark master to show 2 ALIVE workers", lambda: next(answers), [part])
    assert any("waiting for the Spark master to show 2 ALIVE workers (1 of 2 workers ALIVE)" in s for s in said)
    topology.stop()
    assert part.proc.poll() is not None


def test_check_names_a_dead_part_and_stop_ends_every_group_in_reverse_order(tmp_path, monkeypatch):
    import lagdoctor.lab.topology as topo

    topology = topo.Topology(tmp_path, report=lambda _: None)
    stopped = []
    first = topology._spawn("PostgreSQL", ["sleep", "60"], "-", tmp_path / "pg.log")
    topology.parts.append(topo.Part("Kafka broker", "-", tmp_path / "k.log", stopper=lambda: stopped.append("Kafka")))
    # a part whose child ignores TERM: the group is KILLed after the grace
    last = topology._spawn("Celery worker w1", ["sh", "-c", "trap '' TERM; sleep 60 & wait"], "-", tmp_path / "w.log")
    assert topology.check() is None
    os.killpg(first.pid, signal.SIGKILL)
    first.proc.wait(5)
    assert topology.check().startswith("PostgreSQL exited with code -9")
    real = topo.stop_process_group

    def recorded(proc, sig=signal.SIGTERM, grace_s=topo.STOP_GRACE_S):
        stopped.append(proc.pid)
        real(proc, sig, 1.0)

    monkeypatch.setattr(topo, "stop_process_group", recorded)
    topology.stop()
    assert stopped == [last.pid, "Kafka", first.pid]
    assert live_in_group(last.pid) == []
    assert topology.parts == []


# `lagdoctor topology` in a process of its own, its parts stand-in process groups: the first
# stopped (the last started) says when it gets its TERM and holds the stop until released.
STAND_IN_TOPOLOGY = r"""
import sys
from pathlib import Path
from lagdoctor.lab import topology

work = Path(sys.argv[1])
HOLDS = sys.argv[2]


class StandIns(topology.Topology):
    def start(self):
        for i in range(3):
            self._spawn(f"part {i}", ["sleep", "600"], "-", work / f"part{i}.log")
        self._spawn("holds its stop", ["sh", "-c", HOLDS.format(work)], "-", work / "holds.log")
        (work / "groups").write_text(" ".join(str(p.pid) for p in self.parts))
        self.started_s = 0.0
        self.addresses = topology.TopologyAddresses(
            workdir=work, postgres_admin_url="-", airflow_db_url="-", state_url="-", redis_url="-",
            s3_endpoint="-", bucket="-", s3_key="-", s3_secret="-")
        return self.addresses


topology.Topology = StandIns
sys.exit(topology.run(work / "topology"))
"""


def test_a_second_ctrl_c_while_the_topology_stops_does_not_cut_the_stop_short(tmp_path):
    proc = start_stand_in(tmp_path, STAND_IN_TOPOLOGY, HOLDS_ITS_STOP)
    try:
        proc.send_signal(signal.SIGINT)
        wait_for_file(tmp_path / "term-received", proc)  # the stop is under way, held by a part
        said = ""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # an impatient user, one at a time
            proc.send_signal(sig)
            said += read_until(proc, f"{sig.name}: already stopping", 1)  # handled (or died of it)
        (tmp_path / "release").touch()
        proc.wait(120)
        output = said + proc.stdout.read()
        assert groups_left(tmp_path) == [], output
        assert output.count("already stopping") == 3 and output.rstrip().endswith("stopped"), output
        assert proc.returncode == 0, output
    finally:
        reap(tmp_path, proc)


def test_a_closed_terminal_stops_every_part_as_ctrl_c_does(tmp_path):
    proc = start_stand_in(tmp_path, STAND_IN_TOPOLOGY, HOLDS_ITS_STOP)
    try:
        hang_up(tmp_path, proc)
        assert groups_left(tmp_path) == []
        assert proc.returncode == 0
    finally:
        reap(tmp_path, proc)
