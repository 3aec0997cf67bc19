"""`make airflow`: Airflow standalone on the embedded default, with the DAGs, the
plugin (the lag page) and the demo's live incidents, until Ctrl-C.

Each start is clean: the embedded broker keeps nothing across restarts, so the
previous start's snapshots, findings, state and Airflow database (offsets of a
broker that no longer exists) are moved to `<workdir>/previous/` instead of
being mixed into the new window. The DAGs are created paused and unpaused once
Airflow is healthy (a run the scheduler starts before its API serves fails its
first task); the first sweep is the one the scheduler starts on unpause, or,
when it starts none within a few seconds, one triggered then; and every
incident the demo tells is played live, each consumer an OS process of its
own: a hot partition, a stalled consumer, a consumer process killed with
SIGKILL 15 s in, a member evicted and rejoining in a loop, a producer surge
once the first sweep has sampled the calm before it, and a healthy group.

Airflow runs in its own process group: stopping it signals the whole group,
since a TERM to the parent alone orphans its ~35 children (shared/STACK.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from lagdoctor.lab.demo import (CLUSTER, CRASHED_GROUP, kill_consumer, live_incidents, project_root, say,
                                start_workloads, stop_workloads, surge)

DAG_IDS = ("kafka_lag_health_sweep", "kafka_lag_incident")
CRASH_AFTER_S = 15.0  # invoices-mailer's only consumer process is killed
SURGE_AFTER_SWEEP_S = 120.0  # clicks' producers surge this long after the first sweep was triggered
FIRST_RUN_WAIT_S = 20.0  # how long the scheduler gets to start the sweep's run of its own after unpause


def sweep_runs(bindir: str, env: dict[str, str]) -> int | None:
    """Runs of the sweep DAG Airflow knows of; None when the CLI did not answer."""
    ok, out = airflow_cli(bindir, env, "dags", "list-runs", DAG_IDS[0], "--output", "json")
    if not ok:
        return None
    try:
        return len(json.loads(out[out.index("["):]))
    except ValueError:
        return None


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> bool:
    """The health endpoint answers 200 even when unhealthy: read its JSON body."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=3) as resp:
                body = json.load(resp)
            statuses = [body.get(k, {}).get("status") for k in ("metadatabase", "scheduler")]
            if all(s == "healthy" for s in statuses):
                return True
        except (OSError, ValueError):
            pass
        time.sleep(2)
    return False


def start_clean(workdir: Path) -> list[str]:
    """Move the previous start's lagdoctor data and Airflow database to workdir/previous;
    returns what was moved (relative to workdir)."""
    import shutil

    previous = workdir / "previous"
    moved = []
    for rel in ("lagdoctor", "airflow/airflow.db"):
        src = workdir / rel
        if not src.exists():
            continue
        dest = previous / rel
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(dest))
        moved.append(rel)
    return moved


def airflow_cli(bindir: str, env: dict[str, str], *args: str) -> tuple[bool, str]:
    """(ok, the last line of its output) of an `airflow` CLI call."""
    done = subprocess.run([str(Path(bindir) / "airflow"), *args], env=env, capture_output=True, text=True,
                          timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lagdoctor.lab.standalone", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(project_root() / ".demo"))
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--no-workloads", action="store_true", help="do not play the demo's live incidents")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    from lagdoctor.kafka.broker import EmbeddedBroker

    workdir = Path(args.workdir).resolve()
    airflow_home = workdir / "airflow"
    moved = start_clean(workdir)
    if moved:
        say(f"starting clean: the embedded broker keeps nothing across restarts, so the previous start's "
            f"{' and '.join(moved)} went to {workdir / 'previous'}")
    airflow_home.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(log_path=workdir / "broker.log").start()
    say(f"embedded broker at {broker.bootstrap}")
    incidents = [] if args.no_workloads else live_incidents(CRASH_AFTER_S)
    proc = None
    crash = None

    def on_term(*_):
        raise KeyboardInterrupt  # stop at once, also while waiting for health

    signal.signal(signal.SIGTERM, on_term)
    try:
        if incidents:
            say("starting the live incidents (topics, producers, one OS process per consumer):")
            start_workloads(broker.bootstrap, incidents)
        if incidents:
            # On the workloads' clock, not Airflow's: under load Airflow takes minutes to come up.
            crash = threading.Timer(CRASH_AFTER_S, lambda: say(
                f"  event: killed {CRASHED_GROUP}'s consumer process {kill_consumer(incidents, CRASHED_GROUP)} "
                "with SIGKILL"))
            crash.daemon = True
            crash.start()
        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root() / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",  # 32 workers by default: ~5 GB
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__PORT": str(args.port),
            # links in Slack and reports need Airflow's absolute address
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{args.port}",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap}}),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[*]"}),
            "LAGDOCTOR_DATA_ROOT": str(workdir / "lagdoctor"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        log_path = workdir / "airflow-standalone.log"
        say(f"starting Airflow standalone (log: {log_path}) ...")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([str(Path(bindir) / "airflow"), "standalone"], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{args.port}"
        if not wait_healthy(url, proc):
            say(f"Airflow did not become healthy; see {log_path}")
            return 1
        passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
        login = json.loads(passwords.read_text()) if passwords.exists() else {}
        say(f"Airflow is up: {url}")
        for user, password in login.items():
            say(f"  login: {user} / {password}")
        say(f"  lag page: {url}/lagdoctor/   incident form: {url}/dags/kafka_lag_incident (Trigger)")
        say(f"  cluster connection 'kafka_default' -> {broker.bootstrap} ({CLUSTER})")
        for dag_id in DAG_IDS:
            ok, last = airflow_cli(bindir, env, "dags", "unpause", dag_id)
            say(f"  {dag_id}: {'unpaused' if ok else 'could not unpause: ' + last}")
        swept_at = None
        if not args.no_workloads:
            # Unpaused, a schedule with catchup off starts its latest interval's run at once;
            # a second, triggered run would only queue behind it (max_active_runs=1).
            deadline = time.monotonic() + FIRST_RUN_WAIT_S
            while not sweep_runs(bindir, env) and time.monotonic() < deadline:
                time.sleep(2)
            swept_at = time.monotonic()
            if sweep_runs(bindir, env):
                say("  first sweep started by the scheduler; then every 5 minutes")
            else:
                ok, last = airflow_cli(bindir, env, "dags", "trigger", DAG_IDS[0])
                say(f"  first sweep {'triggered' if ok else 'not triggered: ' + last}; then every 5 minutes")
        say("press Ctrl-C to stop")
        surged = args.no_workloads
        while proc.poll() is None:
            if not surged and swept_at is not None and time.monotonic() - swept_at >= SURGE_AFTER_SWEEP_S:
                say(f"  event: {surge(incidents)}")
                surged = True
            time.sleep(1)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if crash is not None:
            crash.cancel()
        if proc is not None and proc.poll() is None:
            say("stopping Airflow (the whole process group) ...")
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        stop_workloads(incidents)
        broker.stop()
        say("stopped")


if __name__ == "__main__":
    sys.exit(main())
