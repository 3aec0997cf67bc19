"""`make airflow`: Airflow standalone on the embedded default, with the DAGs, the
plugin (the lag page) and the demo's data, until Ctrl-C.

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
import time
import urllib.request
from pathlib import Path

from lagdoctor.demo import CLUSTER, live_incidents, project_root, say


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lagdoctor.standalone", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(project_root() / ".demo"))
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--no-workloads", action="store_true", help="do not play the demo's live incidents")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    from lagdoctor.broker import EmbeddedBroker
    from lagdoctor.workload import SteadyProducer, ThrottledConsumer, create_topic

    workdir = Path(args.workdir).resolve()
    airflow_home = workdir / "airflow"
    airflow_home.mkdir(parents=True, exist_ok=True)
    broker = EmbeddedBroker(log_path=workdir / "broker.log").start()
    say(f"embedded broker at {broker.bootstrap}")
    running = []
    proc = None

    def on_term(*_):
        raise KeyboardInterrupt  # stop at once, also while waiting for health

    signal.signal(signal.SIGTERM, on_term)
    try:
        if not args.no_workloads:
            for inc in live_incidents():
                create_topic(broker.bootstrap, inc.topic, inc.partitions)
                running.append(SteadyProducer(broker.bootstrap, inc.topic, list(range(inc.partitions)),
                                              inc.produce_rate).start())
                running.append(ThrottledConsumer(broker.bootstrap, inc.group, inc.topic,
                                                 client_id=f"{inc.group}-1", **inc.consumer_options).start())
            say("playing the demo's live incidents so scheduled sweeps have something to find")
        bindir = str(Path(sys.executable).parent)
        env = {
            **os.environ,
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(project_root() / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(project_root() / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__PARALLELISM": "4",  # 32 workers by default: ~5 GB
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__API__PORT": str(args.port),
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
        say("press Ctrl-C to stop")
        while proc.poll() is None:
            time.sleep(1)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if proc is not None and proc.poll() is None:
            say("stopping Airflow (the whole process group) ...")
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for part in running:
            part.stop()
        broker.stop()
        say("stopped")


if __name__ == "__main__":
    sys.exit(main())
