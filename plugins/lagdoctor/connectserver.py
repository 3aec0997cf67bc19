"""A warm Spark engine: the Spark Connect server the diagnosis runs on as a client.

Starting a JVM and a Spark session costs most of a small diagnosis, paid again
by every `spark-submit`. A Connect server starts once and stays up; each
diagnosis is then a Python client (`SPARK_REMOTE=sc://host:port`) that sends
plans, and the server's JIT-compiled code and code-generation cache stay warm
between runs.

    server = ConnectServer(workdir, master="local[2]")
    with server:                      # started, ready, stopped (with its JVM) on exit
        server.url                    # sc://localhost:PORT: the `spark_connect` connection's host and port
        server.token                  # its password: a client without it is refused
        trivial_query(server.client_url)  # seconds of a new session's count of 1,000 rows

`lagdoctor connect-server` runs one in the foreground. `make airflow`, the demo
and the topology start one and point the `spark_default` connection at it
(conn_type `spark_connect`); production points that connection at its own
(a Connect server on a cluster's master, or Databricks). pyspark 4.3 ships the
server (jars/spark-connect_2.13-4.3.0.jar); lagdoctor runs it as a plugin of a
small driver of its own (connect_driver.py: sessions share one class loader, so
a warm run reuses the classes the last one compiled), in its own process group
so stopping it never leaves its JVM behind.

The server is locked: it starts with a random token (Spark's
`spark.connect.authenticate.token`, given in its environment, never its argv),
and a client must send it (`sc://localhost:PORT/;token=...`, the connection's
password). Without it any local user could run queries, read what the server's
user can read and use the store's keys it holds. `localhost`, not 127.0.0.1:
pyspark sends a token over plain TCP only to `localhost` (gRPC local
credentials); to any other host it uses TLS.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

# The Connect service as a plugin of lagdoctor's own driver (connect_driver.py), not the
# SparkConnectServer class: that one gives every session a class loader of its own, and so
# every warm run a cold code-generation cache.
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
READY_LINE = "Spark Connect server started"
HOST = "127.0.0.1"  # where the server binds
CLIENT_HOST = "localhost"  # what clients dial: pyspark's only host for a token without TLS
TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # read by Spark's server and by pyspark's client
DEFAULT_PORT = 15002  # Spark Connect's own default
STOP_GRACE_S = 20.0
READY_TIMEOUT_S = 300.0  # a loaded 2-core machine starts it in well under a minute

# Settings for a long-lived server: no UI port by default, and a code-generation cache
# large enough to hold every class one diagnosis compiles (the default keeps 100: the
# next run would compile them all again).
SERVER_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.codegen.cache.maxEntries": "2000",
    "spark.sql.session.timeZone": "UTC",
    # static here: a client reads it to decide whether to record a call site for every
    # Column it builds (0.5 s of a sweep's client CPU); sessions cannot change it
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # each run's local checkpoints are freed when the JVM collects their RDDs; Spark forces
    # a collection every 30 min by default, which at one run a minute holds 30 runs' rows
    "spark.cleaner.periodicGC.interval": "5min",
}


class ConnectServerError(RuntimeError):
    """The server did not start or died; one line naming why."""


def spark_submit_binary() -> str:
    """pyspark's own bin/spark-submit: it finds its SPARK_HOME beside it."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_command(*, port: int, host: str = HOST, master: str = "local[*]", conf: Mapping[str, str] | None = None,
                   driver_memory: str | None = None, properties_file: str | None = None) -> list[str]:
    """The spark-submit argv of a Connect server on host:port (secrets go in `properties_file`)."""
    merged = {**SERVER_CONF, **dict(conf or {}),
              "spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)}
    plugins = [p for p in (merged.pop("spark.plugins", ""), CONNECT_PLUGIN) if p]
    merged["spark.plugins"] = ",".join(dict.fromkeys(",".join(plugins).split(",")))
    cmd = [spark_submit_binary()]
    if properties_file:
        cmd += ["--extra-properties-file", properties_file]
    cmd += ["--name", "lagdoctor-connect-server", "--master", master]
    if driver_memory:
        cmd += ["--driver-memory", driver_memory]
    for key, value in merged.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd + [str(Path(__file__).with_name("connect_driver.py"))]


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """This interpreter's bin first on PATH and as the Python workers' interpreter."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", HOST)
    return env


def stop_process_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, grace_s: float = STOP_GRACE_S) -> None:
    """Signal a process's whole group (a TERM to a parent alone orphans its children), then KILL what is left."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left, children included
    except ProcessLookupError:
        pass
    try:
        proc.wait(30)  # a KILL always lands; a loaded machine may take a while to reap it
    except subprocess.TimeoutExpired:
        pass


def last_log_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class ConnectServer:
    """One Spark Connect server on loopback, in its own process group, logging to `workdir`."""

    def __init__(self, workdir: str | Path, *, port: int | None = None, host: str = HOST, master: str = "local[*]",
                 conf: Mapping[str, str] | None = None, driver_memory: str | None = None,
                 secret_conf: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 token: str | None = None) -> None:
        self.workdir = Path(workdir)
        self.host, self.port = host, port or free_port()
        self.master, self.conf, self.driver_memory = master, dict(conf or {}), driver_memory
        self.secret_conf = dict(secret_conf or {})
        self.token = token or new_token()
        self.env = server_env(env)
        self.env[TOKEN_ENV] = self.token
        self.log = self.workdir / "connect-server.log"
        self.proc: subprocess.Popen | None = None
        self.secrets_dir: Path | None = None  # the store's keys for spark-submit; gone once the JVM is up

    @property
    def url(self) -> str:
        """sc://localhost:PORT: where clients dial it; no secret (safe in a log line)."""
        return f"sc://{CLIENT_HOST if self.host == HOST else self.host}:{self.port}"

    @property
    def client_url(self) -> str:
        """The URL a client connects with: its token included (a secret: never log it)."""
        return client_url(self.url, self.token)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> ConnectServer:
        import tempfile

        self.workdir.mkdir(parents=True, exist_ok=True)
        props = None
        if self.secret_conf:
            from lagdoctor.objectstore import write_properties_file

            # a fresh 0700 folder of its own: the workdir may be shared; 0600 file, never on the argv
            self.secrets_dir = Path(tempfile.mkdtemp(prefix=".secrets-", dir=self.workdir))
            props = write_properties_file(self.secret_conf, self.secrets_dir)
        cmd = server_command(port=self.port, host=self.host, master=self.master, conf=self.conf,
                             driver_memory=self.driver_memory, properties_file=props)
        try:
            with open(self.log, "ab") as log:
                # its own working directory: relative paths a client sends must not resolve here silently
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=self.env, cwd=self.workdir, start_new_session=True)
        except BaseException:
            self.remove_secrets()
            raise
        return self

    def remove_secrets(self) -> None:
        """The properties file's folder removed: spark-submit reads the file before the JVM
        starts Spark, so it is not needed once the server is ready (nor after a stop)."""
        import shutil

        if self.secrets_dir is not None:
            shutil.rmtree(self.secrets_dir, ignore_errors=True)
            self.secrets_dir = None

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, progress: Callable[[str], None] | None = None) -> None:
        """Until the server says it started and its port answers; ConnectServerError if it dies or times out."""
        start = time.monotonic()
        said = start
        while True:
            if not self.alive():
                code = self.proc.poll() if self.proc else None
                raise ConnectServerError(f"the Spark Connect server exited ({code}) before it was ready: "
                                         f"{last_log_line(self.log)} (log: {self.log})")
            if self._said_ready() and port_open(self.host, self.port):
                self.remove_secrets()
                return
            now = time.monotonic()
            if now - start > timeout_s:
                self.stop()
                raise ConnectServerError(f"the Spark Connect server on {self.url} was not ready after "
                                         f"{timeout_s:.0f} s: {last_log_line(self.log)} (log: {self.log})")
            if progress and now - said >= 15:
                progress(f"waiting for the Spark Connect server on {self.url} ({now - start:.0f} s)")
                said = now
            time.sleep(0.25)

    def _said_ready(self) -> bool:
        try:
            with open(self.log, "rb") as fh:
                return READY_LINE.encode() in fh.read()
        except OSError:
            return False

    def stop(self) -> None:
        try:
            stop_process_group(self.proc)
        finally:
            self.remove_secrets()

    def __enter__(self) -> ConnectServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def new_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


def client_url(url: str, token: str | None) -> str:
    """sc://host:port/;token=... (the provider's form); `url` unchanged without a token."""
    from urllib.parse import quote

    base = url.split(";", 1)[0].rstrip("/")
    return f"{base}/;token={quote(token, safe='')}" if token else url


def read_or_create_token(path: str | Path) -> str:
    """The token kept in `path` (0600), created on first use: a restarted server keeps the token
    its clients' connection holds."""
    path = Path(path)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    token = new_token()
    replace_private_file(path, token + "\n")
    return token


def replace_private_file(path: Path, text: str) -> None:
    """`path` replaced whole by `text`, mode 0600 from its first byte: written to a new file of
    a unique name (never through a link planted there), then renamed over `path`."""
    import secrets

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def connection_json(url: str, token: str | None = None) -> str:
    """The `spark_default` connection (AIRFLOW_CONN_SPARK_DEFAULT) for a server at sc://host:port,
    its token as the connection's password (the provider puts it in the client's URL)."""
    import json
    from urllib.parse import urlparse

    parsed = urlparse(url.split(";", 1)[0])
    conn: dict[str, object] = {"conn_type": "spark_connect", "host": parsed.hostname, "port": parsed.port}
    if token:
        conn["password"] = token
    return json.dumps(conn)


def trivial_query(url: str) -> float:
    """Seconds for a new client session to count 1,000 rows on the server, and stop:
    the Connect baseline the benchmarks print beside their figures."""
    from pyspark.sql import SparkSession

    mode = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
    start = time.perf_counter()
    # create(), not getOrCreate(): the latter refuses while a classic session runs in this process
    spark = SparkSession.builder.remote(url).create()
    try:
        if spark.range(1000).count() != 1000:
            raise ConnectServerError(f"the Spark Connect server on {url} counted wrong")
    finally:
        spark.stop()
        # pyspark marks the whole process (and its children) as Connect-only: undo it, or a
        # spark-submit started from here afterwards would look for a remote URL
        if mode is None:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """`lagdoctor connect-server`: one server in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(prog="lagdoctor connect-server", description=main.__doc__)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--driver-memory", default=None)
    parser.add_argument("--workdir", default=".connect-server")
    parser.add_argument("--token-file", default=None,
                        help="the server's token, kept 0600 and reused at the next start "
                             "(default: WORKDIR/token; created when missing)")
    args = parser.parse_args(argv)
    token_file = Path(args.token_file or Path(args.workdir) / "token")
    conn_file = Path(args.workdir) / "spark_default.json"
    try:
        token = read_or_create_token(token_file)
    except OSError as exc:
        print(f"cannot read or create the token file {token_file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    server = ConnectServer(args.workdir, port=args.port, master=args.master, driver_memory=args.driver_memory,
                           token=token)
    stopping = False

    def on_signal(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    try:
        server.wait_ready(progress=print)
        print(f"Spark Connect server on {server.url} (master {args.master}); log {server.log}; Ctrl-C stops it",
              flush=True)
        replace_private_file(conn_file, connection_json(server.url, token) + "\n")  # it holds the token
        print(f"  its connection, token included: export AIRFLOW_CONN_SPARK_DEFAULT=\"$(cat {conn_file})\"",
              flush=True)
        while not stopping and server.alive():
            time.sleep(0.5)
        if not stopping:
            print(f"the Spark Connect server exited ({server.proc.poll()}): {last_log_line(server.log)}",
                  file=sys.stderr)
            return 1
        return 0
    except ConnectServerError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
