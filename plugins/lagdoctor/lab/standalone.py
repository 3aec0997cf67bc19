"""`make airflow`: Airflow (scheduler, DAG processor, triggerer, API server) on the
embedded broker, with the DAGs, the plugin (the lag page) and the demo's live
incidents, until Ctrl-C.

It waits for Airflow as long as its processes live, saying what it waits for
(a loaded machine took 341 s), and stops with the reason when one dies. Every
server listens on 127.0.0.1 only.

Each start is clean: the embedded broker keeps nothing across restarts, so the
previous start's snapshots, findings, state and Airflow database (offsets of a
broker that no longer exists) are moved to `<workdir>/previous/` instead of
being mixed into the new window. The DAGs are created paused and unpaused once
Airflow is healthy, its DAG processor included (a run the scheduler starts before its API serves fails its
first task); the first sweep is the one the scheduler starts on unpause, or,
when it starts none within a few seconds, one triggered then; and every
incident the demo tells is played live, each consumer an OS process of its
own: a hot partition, a stalled consumer, a consumer process killed with
SIGKILL 15 s in, a member evicted and rejoining in a loop, a producer surge
once the first sweep has sampled the calm before it, and a healthy group.

Airflow's processes share one process group of their own: stopping it signals
the whole group, since a TERM to a parent alone orphans its children
(shared/STACK.md).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lagdoctor.connectserver import connection_json
from lagdoctor.lab.demo import (CLUSTER, CRASHED_GROUP, kill_consumer, live_incidents, project_root,
                                report_shortfalls, say, start_engine, start_workloads, stop_workloads, surge,
                                warm_engine)
from lagdoctor.lab.stopping import (let_go_of_a_closed_terminal, line_by_line, raise_on_stop_signals, restore,
                                    stop_shielded, tell)

DAG_IDS = ("kafka_lag_health_sweep", "kafka_lag_incident")
CRASH_AFTER_S = 15.0  # invoices-mailer's only consumer process is killed
SURGE_AFTER_SWEEP_S = 120.0  # clicks' producers surge this long after the first sweep was triggered
RATE_CHECK_EVERY_S = 30.0  # how often the workloads' achieved rates are compared with their design
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


# Airflow's four components, each started as `airflow <command>` (what `airflow standalone`
# runs, with flags it cannot pass): the log servers of the scheduler and triggerer bind every
# interface with no setting to change it, so they are skipped (task logs are read from
# AIRFLOW_HOME/logs on this machine) and the API server is told to listen on loopback.
HOST = "127.0.0.1"
PROGRESS_EVERY_S = 15.0
HEALTH_KEYS = {"scheduler": "scheduler", "dag processor": "dag_processor", "triggerer": "triggerer"}


def component_commands(bindir: str, port: int) -> dict[str, list[str]]:
    airflow = str(Path(bindir) / "airflow")
    return {
        "scheduler": [airflow, "scheduler", "--skip-serve-logs"],
        "dag processor": [airflow, "dag-processor"],
        "triggerer": [airflow, "triggerer", "--skip-serve-logs"],
        "API server": [airflow, "api-server", "--host", HOST, "--port", str(port)],
    }


def read_health(url: str) -> dict | None:
    """The health endpoint's JSON body (it answers 200 even when unhealthy); None while nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=3) as resp:
            body = json.load(resp)
        return body if isinstance(body, dict) else None
    except (OSError, ValueError):
        return None


def waiting_line(address: str, health: dict | None, alive: list[str], elapsed_s: float) -> str:
    """What `make airflow` is waiting for: the API server, then the heartbeats it reports."""
    if health is None:
        others = ", ".join(f"{name} running" for name in alive if name != "API server")
        return f"waiting for the API server on {address} ({others}) {elapsed_s:.0f} s"
    status = {name: (health.get(key) or {}).get("status") for name, key in HEALTH_KEYS.items()}
    up = [name for name, st in status.items() if st == "healthy"]
    pending = [name for name, st in status.items() if st != "healthy"]
    if (health.get("metadatabase") or {}).get("status") != "healthy":
        pending.insert(0, "metadata database")
    return (f"waiting for the {' and the '.join(pending)} to report healthy "
            f"(API server up on {address}{''.join(', ' + n + ' up' for n in up)}) {elapsed_s:.0f} s")


def is_healthy(health: dict | None) -> bool:
    # The DAG processor too: the DAGs must be in the database before they can be unpaused.
    return health is not None and all((health.get(key) or {}).get("status") == "healthy"
                                      for key in ("metadatabase", "scheduler", "dag_processor"))


def wait_healthy(url: str, procs: dict[str, Any], logs: dict[str, Path] | None = None, *,
                 read: Callable[[str], dict | None] = read_health, report: Callable[[str], None] = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 progress_every_s: float = PROGRESS_EVERY_S) -> str | None:
    """Wait as long as every component process lives: a loaded machine took 341 s.
    Says what it waits for every `progress_every_s`; returns None once healthy,
    else the reason (which process died, its exit code and last log line)."""
    report = report or say
    address = url.split("://", 1)[-1]
    started = clock()
    next_report = started + progress_every_s
    while True:
        for name, proc in procs.items():
            code = proc.poll()
            if code is not None:
                return f"the {name} exited with code {code}" + last_log_line((logs or {}).get(name))
        health = read(url)
        if is_healthy(health):
            return None
        now = clock()
        if now >= next_report:
            report("  " + waiting_line(address, health, list(procs), now - started))
            next_report = now + progress_every_s
        sleep(2)


def last_log_line(path: Path | None) -> str:
    if path is None or not path.exists():
        return ""
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return (f": {lines[-1][:300]}" if lines else "") + f" (log: {path})"


def open_dags(bindir: str, env: dict[str, str], dag_ids: tuple[str, ...] = DAG_IDS, *,
              cli: Callable[..., tuple[bool, str]] = None, report: Callable[[str], None] = None,
              attempts: int = 5, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Unpause the DAGs (call only once Airflow is healthy: a run started before the API
    serves fails its first task); returns those left paused. A DAG the processor has not
    written yet is retried a few times."""
    cli = cli or airflow_cli
    report = report or say
    left = []
    for dag_id in dag_ids:
        for attempt in range(attempts):
            ok, last = cli(bindir, env, "dags", "unpause", dag_id)
            if ok:
                break
            sleep(3)
        report(f"  {dag_id}: {'unpaused' if ok else 'could not unpause: ' + last}")
        if not ok:
            left.append(dag_id)
    return left


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


def stop_group(procs: dict[str, subprocess.Popen]) -> None:
    """TERM the components' process group (a TERM to a parent alone orphans its children), KILL after 30 s."""
    pgid = next(iter(procs.values())).pid  # the first started the group: its pid is the group's id
    tell(say, "stopping Airflow (the whole process group) ...")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    for proc in procs.values():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    try:
        os.killpg(pgid, signal.SIGKILL)  # whatever is left, children included
    except ProcessLookupError:
        pass


def airflow_cli(bindir: str, env: dict[str, str], *args: str, timeout_s: float | None = 120) -> tuple[bool, str]:
    """(ok, the last line of its output) of an `airflow` CLI call."""
    done = subprocess.run([str(Path(bindir) / "airflow"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode == 0, lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lagdoctor.lab.standalone", description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(project_root() / ".demo"))
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--no-workloads", action="store_true", help="do not play the demo's live incidents")
    args = parser.parse_args(argv)
    line_by_line()
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
    procs: dict[str, subprocess.Popen] = {}
    crash = None
    # the warm Spark engine: up and warmed while Airflow starts; every sweep's diagnosis is its client
    engine = start_engine(workdir)
    say(f"starting the warm Spark engine: a Spark Connect server on {engine.url} (log: {engine.log})")
    warmed: dict[str, Any] = {}

    def warm() -> None:
        try:
            warmed["seconds"] = warm_engine(engine, workdir)
        except Exception as exc:  # noqa: BLE001 (said, and the main loop stops on it)
            warmed["error"] = " ".join(str(exc).split())
            return
        # a closed terminal is no engine failure
        tell(say, f"  Spark Connect server warm ({warmed['seconds']:.0f} s after its start)")

    threading.Thread(target=warm, daemon=True).start()

    # Ctrl-C, TERM and HUP (the terminal closed) stop at once, also while waiting for health;
    # once stopping, more of them are ignored until everything is stopped
    previous = raise_on_stop_signals(say)
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
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(args.port),
            # links in Slack and reports need Airflow's absolute address
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{args.port}",
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap}}),
            "AIRFLOW_CONN_SPARK_DEFAULT": connection_json(engine.url, engine.token),
            "LAGDOCTOR_DATA_ROOT": str(workdir / "lagdoctor"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        url = f"http://{HOST}:{args.port}"
        say("preparing Airflow's metadata database (SQLite) ...")
        ok, last = airflow_cli(bindir, env, "db", "migrate", timeout_s=None)
        if not ok:
            say(f"Airflow's database could not be prepared: {last}")
            return 1
        logs = {name: workdir / f"airflow-{name.replace(' ', '-').lower()}.log" for name in component_commands(bindir, 0)}
        say(f"starting Airflow: scheduler, dag processor, triggerer, API server on {HOST}:{args.port} "
            f"(logs: {workdir}/airflow-*.log) ...")
        for name, command in component_commands(bindir, args.port).items():
            with open(logs[name], "ab") as log:
                # One process group of their own for all four (Ctrl-C reaches us, not them; we stop
                # them): the first's pid names it. A group in another session cannot be joined.
                group = next(iter(procs.values())).pid if procs else 0
                procs[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               process_group=group)
        failed = wait_healthy(url, procs, logs)
        if failed:
            say(f"Airflow did not come up: {failed}")
            return 1
        passwords = airflow_home / "simple_auth_manager_passwords.json.generated"
        login = json.loads(passwords.read_text()) if passwords.exists() else {}
        say(f"Airflow is up: {url}")
        for user, password in login.items():
            say(f"  login: {user} / {password}")
        say(f"  lag page: {url}/lagdoctor/   incident form: {url}/dags/kafka_lag_incident (Trigger)")
        say(f"  cluster connection 'kafka_default' -> {broker.bootstrap} ({CLUSTER})")
        open_dags(bindir, env)
        swept_at = None
        if not args.no_workloads:
            # Unpaused, a schedule with catchup off starts its latest interval's run at once;
            # a second, triggered run would only queue behind it (max_active_runs=1).
            deadline = time.monotonic() + FIRST_RUN_WAIT_S
            while not sweep_runs(bindir, env) and time.monotonic() < deadline:
                time.sleep(2)
            swept_at = time.monotonic()
            if sweep_runs(bindir, env):
                say("  first sweep started by the scheduler; then one scheduled every minute (a run that starts late skips; "
                    "the lag page says how often they really ran)")
            else:
                ok, last = airflow_cli(bindir, env, "dags", "trigger", DAG_IDS[0])
                say(f"  first sweep {'triggered' if ok else 'not triggered: ' + last}; then one scheduled every minute "
                    "(a run that starts late skips; the lag page says how often they really ran)")
        say("press Ctrl-C to stop")
        surged = args.no_workloads
        shortfalls: dict[str, str] = {}
        checked_at = time.monotonic()
        while all(p.poll() is None for p in procs.values()):
            if "error" in warmed or not engine.alive():
                say(f"the Spark engine failed: {warmed.get('error') or 'the server exited' + last_log_line(engine.log)}")
                return 1
            if not surged and swept_at is not None and time.monotonic() - swept_at >= SURGE_AFTER_SWEEP_S:
                say(f"  event: {surge(incidents)}")
                surged = True
            if incidents and time.monotonic() - checked_at >= RATE_CHECK_EVERY_S:
                # printed, and on the lag page: a verdict on traffic that never came is no verdict
                shortfalls = report_shortfalls(incidents, env["LAGDOCTOR_DATA_ROOT"], shortfalls)
                checked_at = time.monotonic()
            time.sleep(1)
        say(f"Airflow stopped: {next(n for n, p in procs.items() if p.poll() is not None)} exited")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        with stop_shielded(say):
            if crash is not None:
                crash.cancel()
            steps = [("Airflow", lambda: stop_group(procs))] if procs else []
            steps += [("the workloads", lambda: stop_workloads(incidents)), ("the Spark engine", engine.stop),
                      ("the broker", broker.stop)]
            for what, stop in steps:
                try:
                    stop()
                except Exception as exc:  # noqa: BLE001 - said; the rest still stops
                    tell(say, f"stopping {what} failed: {type(exc).__name__}: {exc}")
            tell(say, "stopped")
            let_go_of_a_closed_terminal()
        restore(previous)


if __name__ == "__main__":
    sys.exit(main())
