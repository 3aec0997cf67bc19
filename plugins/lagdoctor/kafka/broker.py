"""The embedded broker: Apache Kafka in KRaft mode, fetched on first use.

The broker's jars come from Maven Central through `mvn
dependency:copy-dependencies` over a generated pom, into the user's cache
folder (``$LAGDOCTOR_CACHE`` or ``$XDG_CACHE_HOME/lagdoctor``), once per
pinned version. Each node is one JVM running `kafka.Kafka` as a combined
broker and controller, its storage formatted in a temporary folder that is
removed on stop: a fresh start is a fresh cluster, as a demo wants.

``EmbeddedBroker(brokers=3)`` starts a three-node quorum on loopback ports
for fault tests; single nodes can be killed and restarted with their data.
``sasl_users`` puts a SASL/PLAIN listener with ACLs in front of the clients
(the controller and the inter-broker listener stay on plain loopback ports).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
KAFKA_VERSION = "4.4.0"
# Kafka 4 logs through log4j2; its slf4j 1.7 API needs this bridge or it goes silent.
LOG4J_VERSION = "2.25.5"
ADMIN_USER = "admin"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>lagdoctor</groupId><artifactId>embedded-kafka</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class BrokerError(RuntimeError):
    """The embedded broker could not be fetched or started."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cache_root() -> Path:
    explicit = os.environ.get("LAGDOCTOR_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lagdoctor"


def kafka_libs(version: str = KAFKA_VERSION, *, quiet: bool = False) -> Path:
    """The folder of the broker's jars, fetched with Maven on first use.

    A lock file keeps two processes (a demo and a test run) from fetching at
    once; the folder appears whole or not at all (fetched beside, renamed).
    """
    target = cache_root() / f"kafka-{version}" / "libs"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                f"Apache Kafka {version} is fetched with Maven on first use, and no `mvn` is on PATH "
                "(apt-get install maven)")
        if not quiet:
            print(f"==> fetching Apache Kafka {version} from Maven Central into {target} (once, about 45 MB)",
                  flush=True)
        work = Path(tempfile.mkdtemp(prefix="fetch-", dir=target.parent))
        try:
            (work / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
            started = time.monotonic()
            done = subprocess.run(
                [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                 f"-DoutputDirectory={work / 'libs'}", "-DincludeScope=runtime"],
                capture_output=True, text=True, timeout=900,
            )
            if done.returncode != 0:
                tail = " ".join((done.stdout + done.stderr).split())[-300:]
                raise BrokerError(f"could not fetch Apache Kafka {version} with Maven: {tail}")
            (work / "libs" / ".complete").write_text(f"{time.monotonic() - started:.1f}s\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(work / "libs", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise BrokerError("the embedded Kafka broker needs a Java 17+ runtime (apt-get install openjdk-17-jre-headless)")
    return java


def _die_with_parent() -> None:
    """In the child before exec: a SIGTERM when the process that started the node dies,
    so a killed test run or demo leaves no broker JVM behind (Linux only)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def new_cluster_id() -> str:
    # kafka-storage's argument parser takes an id starting with "-" for an option (as Kafka's own Uuid avoids).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def plain_jaas(users: dict[str, str]) -> str:
    """A PlainLoginModule line: the broker logs in as admin and knows every user."""
    entries = " ".join(f'user_{name}="{secret}"' for name, secret in users.items())
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'username="{ADMIN_USER}" password="{users[ADMIN_USER]}" {entries};')


def wait_until_ready(bootstrap: str, timeout_s: float = 30.0, *, brokers: int = 1,
                     config: dict | None = None) -> None:
    """Block until `brokers` nodes answer a Metadata request (not just a TCP accept)."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **(config or {})})
    last_error: object = None
    while time.monotonic() < deadline:
        try:
            seen = len(admin.list_topics(timeout=2).brokers)
            if seen >= brokers:
                return
            last_error = f"{seen} of {brokers} brokers registered"
        except Exception as exc:  # KafkaException while the listener comes up
            last_error = exc
        time.sleep(0.2)
    raise BrokerError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last_error}")


def wait_for_group_coordinator(config: dict, timeout_s: float) -> None:
    """Block until a committed-offset fetch succeeds: the first one creates
    __consumer_offsets, and until its partitions load every group call fails with
    NOT_COORDINATOR (librdkafka then gives up on an assign()ed consumer's committed
    offsets for good). A consumer asks: librdkafka 2.16's admin OffsetFetch crashed the
    process (SIGSEGV) when sent while the coordinator was being created."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({**config, "group.id": "lagdoctor-broker-ready", "log_level": 0})
    deadline = time.monotonic() + timeout_s
    last_error: object = None
    try:
        while time.monotonic() < deadline:
            try:
                consumer.committed([TopicPartition("lagdoctor-broker-ready", 0)], timeout=5)
                return
            except KafkaException as exc:  # COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR while loading
                last_error = exc
                time.sleep(0.2)
    finally:
        consumer.close()
    raise BrokerError(f"the group coordinator did not come up within {timeout_s:.0f}s: {last_error}")


def wait_for_group_listing(config: dict, timeout_s: float) -> None:
    """Block until every node lists its groups without an error (a node's coordinator
    answers COORDINATOR_LOAD_IN_PROGRESS while it loads them after a restart)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**config, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    errors: list = []
    while time.monotonic() < deadline:
        try:
            errors = list(admin.list_consumer_groups(request_timeout=5).result().errors or [])
            if not errors:
                return
        except Exception as exc:
            errors = [exc]
        time.sleep(0.2)
    raise BrokerError(f"groups were not listed without errors within {timeout_s:.0f}s: {errors[:1]}")


@dataclass
class BrokerNode:
    node_id: int
    port: int
    controller_port: int
    internal_port: int | None
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen | None = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class EmbeddedBroker:
    """Apache Kafka nodes on loopback ports; use as a context manager.

    Each JVM gets its own session so stop() can signal its whole group.
    """

    def __init__(self, port: int | None = None, *, brokers: int = 1, log_path: Path | None = None,
                 sasl_users: dict[str, str] | None = None, heap: str | None = None,
                 overrides: dict[str, str] | None = None) -> None:
        if brokers < 1:
            raise BrokerError(f"--brokers must be at least 1, got {brokers}")
        if sasl_users is not None and ADMIN_USER not in sasl_users:
            raise BrokerError(f"sasl_users must include {ADMIN_USER!r}, the broker's own login")
        self.brokers = brokers
        self.log_path = Path(log_path) if log_path else None
        self.sasl_users = sasl_users
        self.heap = heap or os.environ.get("LAGDOCTOR_BROKER_HEAP", "1g")
        self.overrides = dict(overrides or {})
        self._root: Path | None = None
        self.cluster_id = new_cluster_id()
        ports = [port] if port else []
        while len(ports) < brokers:
            ports.append((port + len(ports)) if port else free_port())
        self.nodes = [
            BrokerNode(node_id=i + 1, port=p, controller_port=free_port(),
                       internal_port=free_port() if sasl_users else None,
                       data_dir=Path(), log_path=Path())
            for i, p in enumerate(ports)
        ]

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{n.port}" for n in self.nodes)

    def client_config(self, user: str = ADMIN_USER) -> dict[str, str]:
        """librdkafka settings to reach the nodes (SASL settings when the listener has them)."""
        conf = {"bootstrap.servers": self.bootstrap}
        if self.sasl_users:
            conf.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                         "sasl.username": user, "sasl.password": self.sasl_users[user]})
        return conf

    # -- configuration -------------------------------------------------------

    def _properties(self, node: BrokerNode) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self.nodes)
        replicas = str(min(3, self.brokers))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(node.data_dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": replicas,
            # Few coordinator partitions: each one is loaded at start and on failover.
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # Tests and demos use short session timeouts so a killed consumer leaves in seconds.
            "group.min.session.timeout.ms": "1000",
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.share.min.session.timeout.ms": "1000",
            "group.share.min.heartbeat.interval.ms": "500",
            "group.streams.min.session.timeout.ms": "1000",
            "group.streams.min.heartbeat.interval.ms": "500",
            "log.retention.check.interval.ms": "5000",
        }
        if self.sasl_users:
            jaas = plain_jaas(self.sasl_users)
            props.update({
                "listeners": (f"SASL_PLAINTEXT://{LOOPBACK}:{node.port},"
                              f"INTERNAL://{LOOPBACK}:{node.internal_port},"
                              f"CONTROLLER://{LOOPBACK}:{node.controller_port}"),
                "advertised.listeners": (f"SASL_PLAINTEXT://{LOOPBACK}:{node.port},"
                                         f"INTERNAL://{LOOPBACK}:{node.internal_port}"),
                "listener.security.protocol.map":
                    "SASL_PLAINTEXT:SASL_PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "INTERNAL",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # The loopback-only internal and controller listeners authenticate nobody.
                "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
                "allow.everyone.if.no.acl.found": "false",
            })
        else:
            props.update({
                "listeners": f"PLAINTEXT://{LOOPBACK}:{node.port},CONTROLLER://{LOOPBACK}:{node.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{node.port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
            })
        props.update(self.overrides)
        return props

    def _write_config(self, node: BrokerNode) -> Path:
        path = node.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self._properties(node).items()))
        (node.data_dir / "log4j2.properties").write_text(
            _LOG4J2.format(path=node.log_path, level=os.environ.get("LAGDOCTOR_BROKER_LOG_LEVEL", "INFO")))
        return path

    def _java(self, libs: Path, main: list[str], node: BrokerNode, heap: str) -> list[str]:
        return [java_binary(), f"-Xmx{heap}", "-Xms64m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={node.data_dir / 'log4j2.properties'}",
                "-cp", f"{libs}/*", *main]

    # -- lifecycle -----------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> "EmbeddedBroker":
        libs = kafka_libs()
        self._root = Path(tempfile.mkdtemp(prefix="lagdoctor-kafka-"))
        try:
            for node in self.nodes:
                node.data_dir = self._root / f"node-{node.node_id}"
                node.data_dir.mkdir()
                node.log_path = self._node_log(node)
                config = self._write_config(node)
                formatted = subprocess.run(
                    self._java(libs, ["kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                                      "-c", str(config)], node, "256m"),
                    capture_output=True, text=True, timeout=120)
                if formatted.returncode != 0:
                    raise BrokerError("could not format the broker's storage: "
                                      + " ".join((formatted.stdout + formatted.stderr).split())[-300:])
            started = time.monotonic()
            for node in self.nodes:
                self._spawn(libs, node)
            for node in self.nodes:
                self._wait_listening(node, started + timeout_s)
            wait_until_ready(self.bootstrap, max(1.0, started + timeout_s - time.monotonic()),
                             brokers=self.brokers, config=self.client_config())
            wait_for_group_coordinator(self.client_config(), max(1.0, started + timeout_s - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        log.info("embedded Apache Kafka %s ready at %s in %.1fs", KAFKA_VERSION, self.bootstrap,
                 time.monotonic() - started)
        return self

    def _node_log(self, node: BrokerNode) -> Path:
        if self.log_path is None:
            return node.data_dir / "server.log"
        if self.brokers == 1:
            return self.log_path
        return self.log_path.with_name(f"{self.log_path.stem}-{node.node_id}{self.log_path.suffix}")

    def _spawn(self, libs: Path, node: BrokerNode) -> None:
        # stdout carries only the JVM's own complaints (the log goes to node.log_path).
        out = open(node.data_dir / "stdout.log", "ab")
        try:
            node.proc = subprocess.Popen(
                self._java(libs, ["kafka.Kafka", str(node.data_dir / "server.properties")], node, self.heap),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        finally:
            out.close()

    def _wait_listening(self, node: BrokerNode, deadline: float) -> None:
        while time.monotonic() < deadline:
            if node.proc is None or node.proc.poll() is not None:
                tail = ""
                with contextlib.suppress(OSError):
                    tail = " ".join((node.data_dir / "stdout.log").read_text()[-400:].split())
                raise BrokerError(f"Kafka node {node.node_id} exited with code "
                                  f"{node.proc.returncode if node.proc else '?'} before listening on "
                                  f"{LOOPBACK}:{node.port}: {tail or 'see ' + str(node.log_path)}")
            try:
                with socket.create_connection((LOOPBACK, node.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise BrokerError(f"Kafka node {node.node_id} did not listen on {LOOPBACK}:{node.port} in time")

    def running(self) -> bool:
        return all(n.running() for n in self.nodes)

    def node(self, node_id: int) -> BrokerNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise BrokerError(f"no node {node_id} (nodes: {[n.node_id for n in self.nodes]})")

    def kill_node(self, node_id: int, *, hard: bool = True) -> None:
        """Stop one node (SIGKILL by default, as a crashed machine); its data stays for a restart."""
        self._stop_proc(self.node(node_id), signal.SIGKILL if hard else signal.SIGTERM)

    def start_node(self, node_id: int, timeout_s: float = 90.0) -> None:
        node = self.node(node_id)
        if node.running():
            return
        self._spawn(kafka_libs(), node)
        deadline = time.monotonic() + timeout_s
        self._wait_listening(node, deadline)
        # Back when it serves again: a restarted node's group coordinator loads its
        # groups first (ListGroups answers COORDINATOR_LOAD_IN_PROGRESS meanwhile).
        running = sum(1 for n in self.nodes if n.running())
        wait_until_ready(self.bootstrap, max(1.0, deadline - time.monotonic()), brokers=running,
                         config=self.client_config())
        wait_for_group_coordinator(self.client_config(), max(1.0, deadline - time.monotonic()))
        wait_for_group_listing(self.client_config(), max(1.0, deadline - time.monotonic()))

    def restart_node(self, node_id: int, timeout_s: float = 90.0) -> None:
        self.kill_node(node_id, hard=False)
        self.start_node(node_id, timeout_s)

    def _stop_proc(self, node: BrokerNode, sig: int, timeout_s: float = 30.0) -> None:
        proc, node.proc = node.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        for node in self.nodes:
            if node.proc is not None:
                return node.proc.wait()
        return 0

    def stop(self, timeout_s: float = 30.0) -> None:
        # Brokers first, then the remaining controllers: all are combined nodes, so TERM all at once.
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.proc.pid, signal.SIGTERM)
        for node in self.nodes:
            self._stop_proc(node, signal.SIGTERM, timeout_s)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m lagdoctor.kafka.broker [--quiet-if-present]`: fetch only (the Makefile's install step)."""
    import sys

    present = (cache_root() / f"kafka-{KAFKA_VERSION}" / "libs" / ".complete").exists()
    libs = kafka_libs()
    if present and "--quiet-if-present" in sys.argv[1:]:
        return
    size = sum(p.stat().st_size for p in libs.glob("*.jar"))
    print(f"Apache Kafka {KAFKA_VERSION}: {len(list(libs.glob('*.jar')))} jars, {size / 2**20:.0f} MiB in {libs}")


if __name__ == "__main__":
    main()
