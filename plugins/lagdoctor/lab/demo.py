"""`make demo`: the main job, end to end, on the embedded broker.

1. Start the embedded Kafka-compatible broker (Tansu).
2. Play live incidents on real topics and groups: a hot partition owned by a
   slow consumer, a producer surge, a consumer stuck on one message, a crashed
   consumer, and a healthy group for contrast.
3. Sample offset snapshots while they run (the history a scheduled sweep
   would have accumulated).
4. Replay from the simulator what Tansu cannot reproduce live: a rebalance
   loop (its group coordinator does not report members or churn them).
5. Run the real `kafka_lag_health_sweep` DAG through `airflow dags test`,
   with spark-submit on local[*] and Slack going to a local outbox.
6. Print the findings, the Slack messages and the reports; stop everything,
   also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

CLUSTER = "kafka_default"  # the sweep's default Kafka connection, and the store's cluster name
SWEEP_DAG = "kafka_lag_health_sweep"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Incident:
    """One live workload: a topic, its producer, its group's consumer, and a story."""

    topic: str
    group: str
    story: str
    partitions: int
    produce_rate: float
    consumer_options: dict[str, Any] = field(default_factory=dict)
    producer: Any = None
    consumer: Any = None


def live_incidents() -> list[Incident]:
    return [
        Incident("orders", "orders-processor",
                 "hot partition: the owner of partition 1 processes 8 msg/s while 40 arrive",
                 3, 40, {"max_rate": {1: 8}}),
        Incident("clicks", "clicks-aggregator",
                 "producer surge: 20 msg/s per partition jumps to 150 halfway; consumers cap at 60",
                 2, 20, {"max_rate": {0: 60, 1: 60}}),
        Incident("payments", "payments-ledger",
                 "stalled consumer: alive, but stuck on the message at offset 120 of partition 0",
                 2, 15, {"stuck_at": {0: 120}}),
        Incident("invoices", "invoices-mailer",
                 "crashed consumer: the only member dies after 15 s; records keep arriving",
                 2, 25, {}),
        Incident("audit-log", "audit-archiver", "healthy: keeps up on every partition", 2, 30, {}),
    ]


def replay_rebalance_loop(snapshots_root: str, now: datetime) -> None:
    """Write the 20 minutes before `now` of a simulated rebalance loop (group
    inventory-sync): Tansu's coordinator cannot reproduce member churn live."""
    import numpy as np

    from lagdoctor.lab.sim import simulate_group
    from lagdoctor.store import write_snapshot

    window = 1200.0  # a loop needs room: at least 3 rebalances in the window
    start = now - timedelta(seconds=window)
    table, _ = simulate_group(np.random.default_rng(7), "rebalance_loop_staircase", cluster=CLUSTER,
                              group_id="inventory-sync", topic="inventory", start=start, window_seconds=window)
    write_snapshot(table, snapshots_root, CLUSTER, start, key="simulated-rebalance-loop")


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
        self.airflow_proc: subprocess.Popen | None = None

    # -- lifecycle ----------------------------------------------------------

    def run(self) -> int:
        from lagdoctor.kafka.broker import EmbeddedBroker

        if self.data_root.exists():
            shutil.rmtree(self.data_root)  # each demo tells one fresh story
        self.data_root.mkdir(parents=True)
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        say("starting the embedded Kafka-compatible broker (Tansu, in memory) ...")
        self.broker = EmbeddedBroker(log_path=self.workdir / "broker.log").start()
        say(f"broker ready at {self.broker.bootstrap}")
        try:
            self.start_incidents()
            self.sample_history()
            self.replay_rebalance_loop()
            code = self.run_sweep()
            if code != 0:
                say(f"the sweep DAG failed (exit {code}); its log is above")
                return code
        finally:
            self.stop()
        return self.show_results()

    def stop(self) -> None:
        if self.airflow_proc and self.airflow_proc.poll() is None:
            os.killpg(self.airflow_proc.pid, signal.SIGTERM)
            try:
                self.airflow_proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.airflow_proc.pid, signal.SIGKILL)
        for incident in self.incidents:
            for part in (incident.consumer, incident.producer):
                if part is not None:
                    part.stop()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None

    # -- workloads ----------------------------------------------------------

    def start_incidents(self) -> None:
        from lagdoctor.lab.workload import SteadyProducer, ThrottledConsumer, create_topic

        bootstrap = self.broker.bootstrap
        self.incidents = live_incidents()
        for inc in self.incidents:
            create_topic(bootstrap, inc.topic, inc.partitions)
            inc.producer = SteadyProducer(bootstrap, inc.topic, list(range(inc.partitions)), inc.produce_rate).start()
            inc.consumer = ThrottledConsumer(bootstrap, inc.group, inc.topic, client_id=f"{inc.group}-1",
                                             **inc.consumer_options).start()
            say(f"  {inc.group:<18} on {inc.topic:<9} {inc.story}")
        say("waiting for the consumers to join their groups ...")
        for inc in self.incidents:
            if not inc.consumer.assigned.wait(60):
                raise RuntimeError(f"consumer of {inc.group} was not assigned partitions within 60 s")

    def sample_history(self) -> None:
        from lagdoctor.kafka.collector import collect_snapshot
        from lagdoctor.kafka.clients import admin_client
        from lagdoctor.store import write_snapshot

        admin = admin_client(self.broker.bootstrap)
        root = str(self.data_root / "snapshots")
        started = time.monotonic()
        events: list[tuple[float, str, Callable[[], None]]] = [
            (self.crash_after_s, "invoices-mailer's consumer crashed", self._crash),
            (self.surge_after_s, "clicks producers surged to 150 msg/s per partition", self._surge),
        ]
        samples = 0
        say(f"sampling offsets every {self.interval_s:g} s for {self.sample_seconds:g} s ...")
        while (elapsed := time.monotonic() - started) < self.sample_seconds:
            for when, what, act in list(events):
                if elapsed >= when:
                    act()
                    say(f"  event: {what}")
                    events.remove((when, what, act))
            now = datetime.now(timezone.utc)
            table = collect_snapshot(admin, CLUSTER, None, now, bootstrap=self.broker.bootstrap)
            write_snapshot(table, root, CLUSTER, now)
            samples += 1
            lag = {}
            for r in table.to_pylist():
                lag[r["group_id"]] = lag.get(r["group_id"], 0) + (r["lag"] or 0)
            say(f"  sample {samples}: total lag " + ", ".join(f"{g} {v:,}" for g, v in sorted(lag.items())))
            time.sleep(max(0.0, self.interval_s - (time.monotonic() - started - elapsed)))

    def _crash(self) -> None:
        inc = next(i for i in self.incidents if i.group == "invoices-mailer")
        inc.consumer.stop()
        inc.consumer = None

    def _surge(self) -> None:
        next(i for i in self.incidents if i.group == "clicks-aggregator").producer.rate = 150

    def replay_rebalance_loop(self) -> None:
        replay_rebalance_loop(str(self.data_root / "snapshots"), datetime.now(timezone.utc))
        say("replayed a rebalance loop for group inventory-sync from the simulator "
            "(Tansu's coordinator cannot reproduce member churn live)")

    # -- the DAG --------------------------------------------------------------

    def airflow_env(self) -> dict[str, str]:
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
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "LAGDOCTOR_DATA_ROOT": str(self.data_root),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
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
        # called after 2 minutes, and a lag under a minute of production reads as a
        # flat pattern, by default, so the demo lowers those two thresholds, openly.
        conf = {"samples": 2, "interval_seconds": 5, "window_minutes": 25,
                "thresholds": {"stall_min_seconds": 40, "pattern_min_seconds": 10}}
        say(f"running the {SWEEP_DAG} DAG (airflow dags test, spark-submit local[*]) ...")
        say("  (with stall_min_seconds=40 instead of 120 and pattern_min_seconds=10 instead of 60: "
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
        runs = sorted(Path(settings.findings_root).glob("*/run.json"), key=lambda p: p.stat().st_mtime)
        if not runs:
            say("no findings were written")
            return 1
        run_dir = runs[-1].parent
        findings = [json.loads(l) for l in (run_dir / "findings.jsonl").read_text().splitlines() if l.strip()]
        print()
        print(render_findings_table(findings))
        outbox = Path(settings.data_root) / "outbox" / "slack.jsonl"
        if outbox.exists():
            messages = [json.loads(l) for l in outbox.read_text().splitlines() if l.strip()]
            print(f"\nSlack messages ({len(messages)}, no Slack token set: written to {outbox}):\n")
            for m in messages:
                indent = "    ↳ " if m.get("thread_ts") else "  • "
                print(f"{indent}{html.unescape(m['text'])}")  # Slack text is mrkdwn-escaped
        reports = sorted(Path(settings.reports_root).rglob("*.html")) if Path(settings.reports_root).exists() else []
        print()
        for report in reports:
            say(f"report: {report}")
        say(f"findings: {run_dir / 'findings.jsonl'}")
        say(f"snapshots: {settings.snapshots_root}")
        problems = {f["group_id"] for f in findings if f["diagnosis"] != "healthy"}
        say(f"done: {len(problems)} group(s) with a problem, named with their evidence above")
        return 0


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
                surge_after_s=args.sample_seconds / 2, crash_after_s=args.sample_seconds / 4)

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
