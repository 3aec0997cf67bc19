"""`make demo`: the main job, end to end, on the embedded Apache Kafka broker.

1. Start the embedded broker (Apache Kafka in KRaft mode, one node).
2. Play six live incidents on real topics and groups, each consumer a
   process of its own: a hot partition owned by a slow consumer, a producer
   surge, a consumer stuck on one message, a consumer process killed with
   SIGKILL, a member evicted and rejoining in a loop (its batches take longer
   than max.poll.interval.ms), and a healthy group for contrast.
3. Sample offset snapshots while they run (the history a scheduled sweep
   would have accumulated): offsets, group state and the owner of each
   partition (member id, client id, host).
4. Run the real `kafka_lag_health_sweep` DAG through `airflow dags test`,
   with spark-submit on local[*] and Slack going to a local outbox. A
   loopback Kubernetes API (bearer token, kubeconfig in the work folder)
   serves a pod per consumer and a Deployment per group, so the sweep names
   the pod and workload behind each owner, as in a cluster.
5. Print the findings beside what was played, the owners they name, the
   Slack messages and the reports; stop everything, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

CLUSTER = "kafka_default"  # the sweep's default Kafka connection, and the store's cluster name
SWEEP_DAG = "kafka_lag_health_sweep"
NAMESPACE = "shop"  # where the demo's Deployments run, in its loopback Kubernetes API
# Every consumer process connects from this machine: its pods share the node's address, as pods on
# the host network do, and each one's client id (its pod's name) tells them apart.
POD_IP = "127.0.0.1"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Incident:
    """One live workload: a topic, its producer, its group's members, and a story."""

    topic: str
    group: str
    story: str
    expect: str  # the diagnosis the story should get
    watch: str  # what in the snapshots shows it
    partitions: int
    produce_rate: float
    # ThrottledConsumer options of each member; every member is an OS process
    members: tuple[dict[str, Any], ...] = ({},)
    producer: Any = None
    consumers: list[Any] = field(default_factory=list)


# Evicted every batch: 6 s of work per batch, 4 s allowed between polls.
LOOP_MEMBER = {"batch_processing_s": 6.0,
               "config": {"session.timeout.ms": 3000, "max.poll.interval.ms": 4000}}
CRASHED_GROUP = "invoices-mailer"
SURGE_GROUP, SURGE_RATE = "clicks-aggregator", 150.0


def live_incidents(crash_after_s: float = 15.0) -> list[Incident]:
    return [
        Incident("orders", "orders-processor",
                 "hot partition: the owner of partition 1 processes 8 msg/s while 40 arrive",
                 "partition_imbalance", "partition 1's lag climbs while partitions 0 and 2 keep up",
                 3, 40, ({"max_rate": {1: 8}},)),
        Incident("clicks", SURGE_GROUP,
                 f"producer surge: 20 msg/s per partition, which the consumer keeps up with (it caps at 60), "
                 f"jumps to {SURGE_RATE:g} once the history shows it keeping up",
                 "producer_surge", "log end offsets' rate against committed offsets' rate, before and after",
                 2, 20, ({"max_rate": {0: 60, 1: 60}},)),
        Incident("payments", "payments-ledger",
                 "stalled consumer: alive, but stuck on the message at offset 120 of partition 0",
                 "stalled_consumer", "partition 0's committed offset stops at 120; its member stays in the group",
                 2, 15, ({"stuck_at": {0: 120}},)),
        Incident("invoices", CRASHED_GROUP,
                 f"crashed consumer: its only member's process is killed (SIGKILL) after {crash_after_s:g} s; "
                 "records keep arriving",
                 "crashed_consumer", "group state STABLE -> EMPTY once its 6 s session times out; lag grows",
                 2, 25),
        Incident("inventory", "inventory-sync",
                 "rebalance loop: member 2 takes 6 s per batch with max.poll.interval.ms 4 s, so it is "
                 "evicted and rejoins under a new member id, again and again",
                 "rebalance_loop", "owner member ids and group state changing from sample to sample",
                 2, 20, ({}, LOOP_MEMBER)),
        Incident("audit-log", "audit-archiver", "healthy: keeps up on every partition",
                 "healthy", "lag stays within a second of production", 2, 30),
    ]


def pod_name(group: str, member: int) -> str:
    """The pod of the group's Deployment that runs its `member`th consumer: the ReplicaSet's name
    and a suffix, the same every run."""
    from lagdoctor.lab.kube_api import replica_set_name

    return f"{replica_set_name(NAMESPACE, group)}-{zlib.crc32(f'{group}/{member}'.encode()) % 16**5:05x}"


def start_workloads(bootstrap: str, incidents: list[Incident], *, assigned_within_s: float = 60.0) -> None:
    """Topics, producers and one consumer process per member; returns once every member has partitions."""
    from lagdoctor.lab.workload import ConsumerProcess, SteadyProducer, create_topic

    for inc in incidents:
        create_topic(bootstrap, inc.topic, inc.partitions)
        inc.producer = SteadyProducer(bootstrap, inc.topic, list(range(inc.partitions)), inc.produce_rate).start()
        # client.id from the hostname, as a pod's consumer often sets it: its pod's name
        inc.consumers = [ConsumerProcess(bootstrap, inc.group, inc.topic, client_id=pod_name(inc.group, i),
                                         **options).start()
                         for i, options in enumerate(inc.members, 1)]
        say(f"  {inc.group:<17} on {inc.topic:<9} {inc.story}")
        say(f"  {'':<17}    {'':<9} measured: {inc.watch}; expected: {inc.expect}")
    say("waiting for every consumer process to join its group ...")
    deadline = time.monotonic() + assigned_within_s
    for inc in incidents:
        for member in inc.consumers:
            if not member.assigned.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{member.client_id} was not assigned partitions within {assigned_within_s:g} s")


def stop_workloads(incidents: list[Incident]) -> None:
    for inc in incidents:
        for member in inc.consumers:
            member.stop()
        if inc.producer is not None:
            inc.producer.stop()


def workload_shortfalls(incidents: list[Incident]) -> dict[str, str]:
    """{group: "machine too slow: clicks reached 11 of 150 msg/s per partition"} for each workload
    whose producer fell short of its design (see lagdoctor.lab.rates)."""
    from lagdoctor.lab.rates import rate_shortfall

    out = {}
    for inc in incidents:
        if inc.producer is not None and (line := rate_shortfall(inc.topic, inc.producer.segments())):
            out[inc.group] = line
    return out


def report_shortfalls(incidents: list[Incident], data_root: str, already: dict[str, str]) -> dict[str, str]:
    """Check the workloads' rates; print each new shortfall and keep the lag page's copy current."""
    from lagdoctor.lab.rates import write_shortfalls

    found = workload_shortfalls(incidents)
    for group, line in found.items():
        if already.get(group) != line:
            say(f"  {line}: {group}'s incident was not played as designed")
    if found != already:
        write_shortfalls(data_root, found)
    return found


def kill_consumer(incidents: list[Incident], group: str) -> str:
    """SIGKILL the group's consumer processes, as a crash; says which."""
    inc = next(i for i in incidents if i.group == group)
    killed = [f"{m.client_id} (pid {m.pid})" for m in inc.consumers if m.alive()]
    for member in inc.consumers:
        member.kill()
    return ", ".join(killed) or "nobody (already dead)"


def surge(incidents: list[Incident]) -> str:
    next(i for i in incidents if i.group == SURGE_GROUP).producer.rate = SURGE_RATE
    return f"{SURGE_GROUP}'s producer surged to {SURGE_RATE:g} msg/s per partition"


# -- the pods behind the consumers: a loopback Kubernetes API -------------------------------------

def write_kubeconfig(path: Path, server: str, token: str) -> Path:
    """A kubeconfig naming `server` with `token`, readable by its owner only (the token is inside,
    never in an argument, an environment value or a log line)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = "lagdoctor-demo"
    config = {"apiVersion": "v1", "kind": "Config", "current-context": name,
              "clusters": [{"name": name, "cluster": {"server": server}}],
              "users": [{"name": name, "user": {"token": token}}],
              "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, 0o600)  # a file left by an earlier run keeps its mode through O_CREAT
        json.dump(config, fh)
    return path


DEPLOYED_BEFORE = timedelta(days=1)


class DemoKubernetes:
    """The demo's cluster as the sweep sees it: a Deployment per incident group in namespace shop,
    a pod per consumer process, and an HPA on the surge's Deployment (which scaling by hand would
    fight). The Deployments were rolled out a day before (DEPLOYED_BEFORE): none of the demo's
    incidents is a rollout's, so no message may name one as a suspect."""

    def __init__(self, workdir: Path) -> None:
        self.kubeconfig = workdir / "kubernetes" / "kubeconfig"
        self.api = None
        self._serving = contextlib.ExitStack()

    def start(self, incidents: list[Incident], rolled_out_at: datetime) -> "DemoKubernetes":
        from lagdoctor.lab.kube_api import LoopbackKubernetes

        api = LoopbackKubernetes(token=secrets.token_urlsafe(24))  # any local user can reach a loopback port
        for inc in incidents:
            api.add_deployment(NAMESPACE, inc.group, replicas=len(inc.members), rolled_out_at=rolled_out_at,
                               pods={pod_name(inc.group, i): POD_IP for i in range(1, len(inc.members) + 1)})
            if inc.group == SURGE_GROUP:
                api.add_autoscaler(NAMESPACE, f"{inc.group}-cpu", inc.group, min_replicas=1, max_replicas=4)
        self.api = self._serving.enter_context(api.serve())
        write_kubeconfig(self.kubeconfig, api.url, api.token)
        return self

    def stop(self) -> None:
        self._serving.close()
        self.api = None


# -- the warm Spark engine (lagdoctor.connectserver) shared by the demo, `make airflow` and the topology --

WARM_UP_TIMEOUT_S = 600.0


def start_engine(workdir: Path, master: str = "local[*]", conf: dict[str, str] | None = None):
    """A Spark Connect server started (not yet waited for): it comes up while other parts do."""
    from lagdoctor.connectserver import ConnectServer

    return ConnectServer(workdir / "connect-server", master=master, conf=conf).start()


def warm_engine(server, workdir: Path) -> float:
    """Wait for the server, then diagnose a small simulated store once, so the first sweep finds
    its JIT and code cache warm (a first run on a cold server costs several warm ones). Seconds."""
    from lagdoctor.connectserver import ConnectServerError
    from lagdoctor.diagnosis.submit import run_connect_process
    from lagdoctor.lab.sim import write_scenarios

    started = time.monotonic()
    server.wait_ready()
    store, out = workdir / "warm-up" / "snapshots", workdir / "warm-up" / "findings"
    shutil.rmtree(workdir / "warm-up", ignore_errors=True)
    write_scenarios(str(store), seed=7, n_groups_per_scenario=1)
    proc = run_connect_process(str(store), str(out), remote=server.client_url, timeout=WARM_UP_TIMEOUT_S)
    shutil.rmtree(workdir / "warm-up", ignore_errors=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise ConnectServerError(f"warming the Spark Connect server failed ({proc.returncode}): "
                                 f"{lines[-1] if lines else 'no output'}")
    return time.monotonic() - started


def latest_complete_findings(findings_root: str) -> tuple[Path | None, list[dict[str, Any]], str]:
    """The newest complete run's folder (None when there is none), its findings, and a line naming the
    incomplete runs skipped ("" for none): the readers' one completeness rule, so a
    diagnosis killed mid-write is never shown as the result."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.web.data import incomplete_text, list_runs

    skipped: list = []
    runs = list_runs(findings_root, skipped=skipped)
    if not runs:
        return None, [], incomplete_text(skipped)
    run_dir = Path(runs[0].path)
    text = (run_dir / FINDINGS_FILE).read_text()
    return run_dir, [json.loads(line) for line in text.splitlines() if line.strip()], incomplete_text(skipped)


class Demo:
    def __init__(self, workdir: Path, sample_seconds: float, interval_s: float, surge_after_s: float,
                 crash_after_s: float) -> None:
        self.workdir = workdir
        self.data_root = workdir / "lagdoctor"
        self.airflow_home = workdir / "airflow"
        self.sample_seconds = sample_seconds
        self.interval_s = interval_s
        self.surge_after_s = surge_after_s
        self.crash_after_s = crash_after_s
        self.broker = None
        self.incidents: list[Incident] = []
        self.shortfalls: dict[str, str] = {}
        self.airflow_proc: subprocess.Popen | None = None
        self.engine = None  # lagdoctor.connectserver.ConnectServer once started
        self.kubernetes: DemoKubernetes | None = None
        # the warm-up's outcome (seconds, or why it failed) and whether the sweep has chosen its
        # engine: only the sweep's side stops the engine, and only before the sweep starts
        self._warm_lock = threading.Lock()
        self._warm_outcome: float | str | None = None
        self._engine_chosen = False

    # -- lifecycle ----------------------------------------------------------

    def run(self) -> int:
        from lagdoctor.kafka.broker import EmbeddedBroker

        if self.data_root.exists():
            shutil.rmtree(self.data_root)  # each demo tells one fresh story
        self.data_root.mkdir(parents=True)
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        say("starting the embedded broker (Apache Kafka, KRaft, one node; a fresh cluster each time) ...")
        self.broker = EmbeddedBroker(log_path=self.workdir / "broker.log").start()
        say(f"broker ready at {self.broker.bootstrap}")
        try:
            self.engine = start_engine(self.workdir)
            say(f"starting the warm Spark engine: a Spark Connect server on {self.engine.url}, warmed on a small "
                "simulated store while the history is sampled")
            warming = threading.Thread(target=self._warm, args=(self.engine,), daemon=True)
            warming.start()
            say("starting the live incidents (topics, producers, one OS process per consumer):")
            self.incidents = live_incidents(self.crash_after_s)
            self.kubernetes = DemoKubernetes(self.workdir).start(
                self.incidents, datetime.now(timezone.utc) - DEPLOYED_BEFORE)
            say(f"serving a loopback Kubernetes API on {self.kubernetes.api.url}: a Deployment per group in "
                f"namespace {NAMESPACE}, a pod per consumer (kubeconfig {self.kubernetes.kubeconfig})")
            start_workloads(self.broker.bootstrap, self.incidents)
            self.sample_history()
            warming.join(WARM_UP_TIMEOUT_S)
            self._choose_engine()
            self.shortfalls = report_shortfalls(self.incidents, str(self.data_root), self.shortfalls)
            code = self.run_sweep()
            # the surge ran during the sweep's own samples: measured again before the workloads stop
            self.shortfalls = report_shortfalls(self.incidents, str(self.data_root), self.shortfalls)
            if code != 0:
                say(f"the sweep DAG failed (exit {code}); its log is above")
                return code
        finally:
            self.stop()
        return self.show_results()

    def _warm(self, engine) -> None:
        """Warm the engine and record how it went; never stops it (the sweep may be its client)."""
        try:
            outcome: float | str = warm_engine(engine, self.workdir)
        except Exception as exc:  # noqa: BLE001 - a timeout too: the sweep's choice says it
            outcome = " ".join(str(exc).split()) or type(exc).__name__
        with self._warm_lock:
            self._warm_outcome = outcome
            if isinstance(outcome, float) and not self._engine_chosen:
                say(f"  Spark Connect server warm ({outcome:.0f} s after its start)")

    def _choose_engine(self) -> None:
        """Before the sweep starts: the engine if it is warm, else spark-submit, the engine stopped now."""
        with self._warm_lock:
            self._engine_chosen = True
            outcome = self._warm_outcome
        if self.engine is None or isinstance(outcome, float):
            return
        reason = outcome or f"the Spark Connect server was not warm after {WARM_UP_TIMEOUT_S:.0f} s"
        say(f"  {reason}: this demo's diagnosis goes through spark-submit instead")
        engine, self.engine = self.engine, None
        engine.stop()

    def stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
        if self.airflow_proc and self.airflow_proc.poll() is None:
            os.killpg(self.airflow_proc.pid, signal.SIGTERM)
            try:
                self.airflow_proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.airflow_proc.pid, signal.SIGKILL)
        stop_workloads(self.incidents)
        if self.kubernetes is not None:
            self.kubernetes.stop()
            self.kubernetes = None
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    # -- history ------------------------------------------------------------

    def sample_history(self) -> None:
        from lagdoctor.kafka.clients import admin_client
        from lagdoctor.kafka.collector import collect_snapshot
        from lagdoctor.store import write_snapshot

        admin = admin_client(self.broker.bootstrap)
        root = str(self.data_root / "snapshots")
        started = time.monotonic()
        events: list[tuple[float, Callable[[], str]]] = [
            (self.crash_after_s, lambda: f"killed {CRASHED_GROUP}'s consumer process "
                                         f"{kill_consumer(self.incidents, CRASHED_GROUP)} with SIGKILL"),
            (self.surge_after_s, lambda: surge(self.incidents)),
        ]
        owners_before: dict[str, frozenset] = {}
        samples = 0
        say(f"sampling every {self.interval_s:g} s for {self.sample_seconds:g} s: committed and log end offsets, "
            "group state, each partition's owner (member id, client id, host)")
        while (elapsed := time.monotonic() - started) < self.sample_seconds:
            for event in [e for e in events if elapsed >= e[0]]:
                say(f"  event: {event[1]()}")
                events.remove(event)
            now = datetime.now(timezone.utc)
            table = collect_snapshot(admin, CLUSTER, None, now, bootstrap=self.broker.bootstrap)
            write_snapshot(table, root, CLUSTER, now)
            samples += 1
            say(f"  sample {samples}: " + sample_line(table.to_pylist(), owners_before))
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - started - elapsed)))
        for event in events:  # due at the end: the sweep's samples see them
            say(f"  event: {event[1]()} (after the last sample: the sweep's own samples see it)")

    # -- the DAG --------------------------------------------------------------

    def airflow_env(self) -> dict[str, str]:
        from lagdoctor.connectserver import connection_json

        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root() / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": self.broker.bootstrap}}),
            # the warm engine when it came up, else a spark-submit per run (the fallback)
            "AIRFLOW_CONN_SPARK_DEFAULT": connection_json(self.engine.url, self.engine.token) if self.engine is not None
            else json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "LAGDOCTOR_DATA_ROOT": str(self.data_root),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        if self.kubernetes is not None:
            env["KUBECONFIG"] = str(self.kubernetes.kubeconfig)
            # the demo's pods are in its loopback API, not in a cluster the demo itself may run in
            env.pop("KUBERNETES_SERVICE_HOST", None)
            env.pop("KUBERNETES_SERVICE_PORT", None)
        return env

    def run_sweep(self) -> int:
        airflow = str(Path(sys.executable).parent / "airflow")
        env = self.airflow_env()
        say("preparing Airflow's metadata database (SQLite) ...")
        migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True)
        if migrate.returncode != 0:
            print(migrate.stderr[-3000:], file=sys.stderr)
            return migrate.returncode
        # The demo has a minute of live history at tens of msg/s; a stall is only
        # called after 2 minutes, a lag under a minute of production reads as a
        # flat pattern, and a rise under 2.5 minutes may be a burst (rule case 36),
        # by default, so the demo lowers those three thresholds, openly.
        conf = {"samples": 2, "interval_seconds": 5, "window_minutes": 25,
                "thresholds": {"stall_min_seconds": 40, "pattern_min_seconds": 10, "surge_min_seconds": 5}}
        engine = f"on the Spark Connect server {self.engine.url}" if self.engine is not None else "spark-submit local[*]"
        say(f"running the {SWEEP_DAG} DAG (airflow dags test, diagnosis {engine}) ...")
        say("  (with stall_min_seconds=40 instead of 120, pattern_min_seconds=10 instead of 60 and "
            "surge_min_seconds=5 instead of 150: "
            "the demo has only a minute of live history)")
        started = time.monotonic()
        self.airflow_proc = subprocess.Popen(
            [airflow, "dags", "test", SWEEP_DAG, "-c", json.dumps(conf)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        log_path = self.workdir / "sweep.log"
        with open(log_path, "w") as log:
            for line in self.airflow_proc.stdout:
                log.write(line)
                if "[DAG TEST] end task" in line or "Marking run" in line:
                    task = line.split("task_id=")[-1].split()[0] if "task_id=" in line else line.strip()[-80:]
                    say(f"  done: {task}")
        code = self.airflow_proc.wait()
        say(f"the sweep finished in {time.monotonic() - started:.0f} s (log: {log_path})")
        if code != 0:
            print("".join(log_path.read_text().splitlines(True)[-40:]), file=sys.stderr)
        return code

    # -- what the on-call engineer sees -------------------------------------------

    def show_results(self) -> int:
        from lagdoctor.settings import Settings

        settings = Settings(data_root=str(self.data_root))
        run_dir, findings, skipped = latest_complete_findings(settings.findings_root)
        if skipped:
            say(skipped)
        if run_dir is None:
            say("no complete run of findings was written")
            return 1
        print()
        print(render_findings_table(findings))
        checks = played_against_found(self.incidents, findings, self.shortfalls)
        print("\nPlayed against found:")
        print("\n".join(line for line, _ in checks))
        outbox = Path(settings.data_root) / "outbox" / "slack.jsonl"
        if outbox.exists():
            messages = [json.loads(l) for l in outbox.read_text().splitlines() if l.strip()]
            print(f"\nSlack messages ({len(messages)}, no Slack token set: written to {outbox}):\n")
            for m in messages:
                indent = "    ↳ " if m.get("thread_ts") else "  • "
                print(f"{indent}{html.unescape(m['text'])}")  # Slack text is mrkdwn-escaped
                for line in evidence_lines(m) + workload_lines_of(m):  # the owners, and the pod behind them
                    print(f"      {line}")
        reports = sorted(Path(settings.reports_root).rglob("*.html")) if Path(settings.reports_root).exists() else []
        print()
        for report in reports:
            say(f"report: {report}")
        say(f"findings: {run_dir / 'findings.jsonl'}")
        say(f"snapshots: {settings.snapshots_root}")
        problems = {f["group_id"] for f in findings if f["diagnosis"] != "healthy"}
        matched = sum(ok for _, ok in checks)
        say(f"done: {len(problems)} group(s) with a problem, named with their evidence above; "
            f"{matched} of {len(checks)} incidents diagnosed as played")
        if self.shortfalls:
            # A verdict on traffic that never came is no verdict: say so last, where it is read.
            say(f"{len(self.shortfalls)} incident(s) NOT played as designed, so their findings prove nothing: "
                + "; ".join(f"{g} ({line})" for g, line in sorted(self.shortfalls.items())))
        return 0


def played_against_found(incidents: list[Incident], findings: list[dict[str, Any]],
                         shortfalls: dict[str, str] | None = None) -> list[tuple[str, bool]]:
    """One line per incident: what was played, what the sweep found for its group, and whether they agree.
    An incident whose workload fell short (`shortfalls`, by group) was not played: never "ok"."""
    found: dict[str, set[str]] = {}
    for f in findings:
        found.setdefault(f["group_id"], set()).add(f["diagnosis"])
    out = []
    for inc in incidents:
        got = sorted(found.get(inc.group, set()))
        short = (shortfalls or {}).get(inc.group)
        ok = inc.expect in got and not short
        mark = "SHORT" if short else "ok   " if ok else "MISS "
        out.append((f"  {mark} {inc.group:<17} {'meant ' if short else 'played'} {inc.expect:<19} "
                    f"found {', '.join(got) or 'nothing'}" + (f" (not tested: {short})" if short else ""), ok))
    return out


def evidence_lines(message: dict[str, Any]) -> list[str]:
    """The 'Worst partitions' table of an incident message (partition, lag, consumer id, host, client id)."""
    for block in message.get("blocks") or []:
        text = (block.get("text") or {}).get("text", "") if isinstance(block.get("text"), dict) else ""
        if text.startswith("*Worst partitions*") and "```" in text:
            return html.unescape(text.split("```")[1]).strip("\n").splitlines()
    return []


def workload_lines_of(message: dict[str, Any]) -> list[str]:
    """The message's line naming the owner's pod and workload (or why it is unknown), as plain text."""
    lines = []
    for block in message.get("blocks") or []:
        text = (block.get("text") or {}).get("text", "") if isinstance(block.get("text"), dict) else ""
        if re.match(r":\w+: \*(Runs in|Pod and workload unknown):\*", text):
            lines.append(html.unescape(re.sub(r"^:\w+: \*([^*]+)\*", r"\1", text)))
    return lines


def sample_line(rows: list[dict[str, Any]], owners_before: dict[str, frozenset]) -> str:
    """Each group's total lag, with its state when not STABLE and a mark when its
    owners' member ids changed since the last sample (updates `owners_before`)."""
    lag: dict[str, int] = {}
    state: dict[str, str] = {}
    owners: dict[str, set] = {}
    for r in rows:
        g = r["group_id"]
        lag[g] = lag.get(g, 0) + (r["lag"] or 0)
        state[g] = r["group_state"]
        owners.setdefault(g, set()).update([r["member_id"]] if r["member_id"] else [])
    parts = []
    for g in sorted(lag):
        notes = [state[g]] if state[g] != "STABLE" else []
        now = frozenset(owners[g])
        if g in owners_before and now and owners_before[g] != now:
            notes.append("owners changed")
        owners_before[g] = now if now else owners_before.get(g, now)
        parts.append(f"{g} {lag[g]:,}" + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(parts)


def render_findings_table(findings: list[dict[str, Any]]) -> str:
    order = {"critical": 0, "warning": 1, "ok": 2}
    rows = sorted(findings, key=lambda f: (order.get(f["severity"], 3), f["group_id"], f["diagnosis"]))
    header = ("SEVERITY", "DIAGNOSIS", "PATTERN", "GROUP", "TOPIC", "PARTITIONS", "SUMMARY")
    cells = [
        (f["severity"], f["diagnosis"], f["pattern"], f["group_id"], f["topic"],
         ",".join(map(str, f["partitions"])) or "-", f["summary"])
        for f in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header[:-1])]
    lines = [" ".join(h.ljust(w) for h, w in zip(header[:-1], widths)) + " " + header[-1]]
    lines += [" ".join(c.ljust(w) for c, w in zip(row[:-1], widths)) + " " + row[-1] for row in cells]
    return "\n".join(lines)


def project_root() -> Path:
    """The checkout holding dags/ and spark_jobs/ (this module is plugins/lagdoctor/lab/demo.py)."""
    return Path(__file__).resolve().parents[3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lagdoctor.lab.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(project_root() / ".demo"))
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--interval-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    demo = Demo(workdir, args.sample_seconds, args.interval_seconds,
                # The surge waits for the last sample: the history before it must show the
                # consumer keeping up (the first third of the sweep's window, however long
                # the sweep takes to start), as a surge between two sweeps would.
                surge_after_s=args.sample_seconds, crash_after_s=args.sample_seconds / 4)

    def interrupted(signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        return demo.run()
    except KeyboardInterrupt:
        demo.stop()
        say("interrupted: the broker, the workloads and Airflow have been stopped")
        return 130


if __name__ == "__main__":
    sys.exit(main())
