"""`make airflow` starts from a clean state: the previous start's history (offsets of a
memory-only broker that no longer exists) and Airflow database are moved aside, not mixed in."""

from __future__ import annotations

import signal

from lagdoctor.lab.standalone import component_commands, is_healthy, open_dags, start_clean, wait_healthy


def test_a_start_moves_the_previous_history_and_database_aside(tmp_path):
    work = tmp_path / ".demo"
    (work / "lagdoctor" / "snapshots").mkdir(parents=True)
    (work / "lagdoctor" / "snapshots" / "old.parquet").write_text("old offsets")
    (work / "airflow").mkdir()
    (work / "airflow" / "airflow.db").write_text("paused DAGs")
    (work / "airflow" / "simple_auth_manager_passwords.json.generated").write_text("{}")

    assert start_clean(work) == ["lagdoctor", "airflow/airflow.db"]
    assert not (work / "lagdoctor").exists() and not (work / "airflow" / "airflow.db").exists()
    assert (work / "previous" / "lagdoctor" / "snapshots" / "old.parquet").read_text() == "old offsets"
    assert (work / "previous" / "airflow" / "airflow.db").read_text() == "paused DAGs"
    # the login survives: the same password as last time
    assert (work / "airflow" / "simple_auth_manager_passwords.json.generated").exists()

    # the next start keeps one previous copy, the newest
    (work / "lagdoctor").mkdir()
    (work / "lagdoctor" / "new.txt").write_text("second start")
    assert start_clean(work) == ["lagdoctor"]
    assert (work / "previous" / "lagdoctor" / "new.txt").exists()
    assert not (work / "previous" / "lagdoctor" / "snapshots").exists()
    assert (work / "previous" / "airflow" / "airflow.db").exists()  # not moved again: nothing to move


def test_a_first_start_moves_nothing(tmp_path):
    assert start_clean(tmp_path / ".demo") == []


class FakeProcess:
    """A component process as wait_healthy sees it: alive (poll() is None) or exited with a code."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


HEALTHY = {k: {"status": "healthy"} for k in ("metadatabase", "scheduler", "dag_processor", "triggerer")}


def components() -> dict:
    return {name: FakeProcess() for name in ("scheduler", "dag processor", "triggerer", "API server")}


def test_a_slow_airflow_is_waited_for_with_what_is_missing_said_not_given_up_on():
    """341 s on a loaded machine: far past the old fixed 180 s, every process alive the whole time."""
    clock, said = FakeClock(), []

    def read(url):
        if clock.now < 300:
            return None  # the API server is not answering yet
        if clock.now < 341:
            return {**HEALTHY, "scheduler": {"status": "unhealthy"}}
        return HEALTHY

    failed = wait_healthy("http://127.0.0.1:8080", components(), read=read, report=said.append,
                          clock=clock, sleep=clock.sleep, progress_every_s=15)
    assert failed is None
    assert clock.now >= 341
    assert "  waiting for the API server on 127.0.0.1:8080 (scheduler running, dag processor running, " \
           "triggerer running) 16 s" in said
    waited = [int(line.split()[-2]) for line in said if line.startswith("  waiting for the API server")]
    assert max(waited) > 180 and len(waited) >= 180 // 16  # still waiting, and saying so, past the old limit
    assert any(line.startswith("  waiting for the scheduler to report healthy (API server up on 127.0.0.1:8080, "
                               "dag processor up, triggerer up)") for line in said)


def test_a_component_that_dies_fails_the_wait_at_once_with_its_exit_code_and_last_line(tmp_path):
    clock, said = FakeClock(), []
    procs = components()
    procs["scheduler"] = FakeProcess(1)
    log = tmp_path / "airflow-scheduler.log"
    log.write_text("starting\nsqlite3.OperationalError: database is locked\n\n")
    failed = wait_healthy("http://127.0.0.1:8080", procs, {"scheduler": log}, read=lambda url: None,
                          report=said.append, clock=clock, sleep=clock.sleep)
    assert failed == f"the scheduler exited with code 1: sqlite3.OperationalError: database is locked (log: {log})"
    assert clock.now == 0 and said == []


def test_the_dags_are_unpaused_only_after_airflow_reports_healthy():
    """A run the scheduler starts before the API serves fails its first task: unpausing waits for health,
    the DAG processor's included (a DAG not yet parsed cannot be unpaused)."""
    clock, events = FakeClock(), []

    def read(url):
        health = (None if clock.now < 20 else {**HEALTHY, "dag_processor": {"status": None}} if clock.now < 40
                  else HEALTHY)
        events.append(("health", is_healthy(health)))
        return health

    def cli(bindir, env, *args):
        events.append(("cli", args))
        return True, ""

    assert wait_healthy("http://127.0.0.1:8080", components(), read=read, report=lambda _: None,
                        clock=clock, sleep=clock.sleep) is None
    assert open_dags("bin", {}, cli=cli, report=lambda _: None, sleep=clock.sleep) == []
    first_unpause = events.index(("cli", ("dags", "unpause", "kafka_lag_health_sweep")))
    assert events[first_unpause - 1] == ("health", True)
    assert ("health", True) not in events[:first_unpause - 1]
    assert events[first_unpause + 1] == ("cli", ("dags", "unpause", "kafka_lag_incident"))


def test_a_dag_not_yet_written_is_retried_and_one_never_found_is_said(capsys):
    answers = iter([(False, "Dag kafka_lag_health_sweep not found"), (True, "")]
                   + [(False, "Dag kafka_lag_incident not found")] * 5)
    said = []
    left = open_dags("bin", {}, cli=lambda *a: next(answers), report=said.append, sleep=lambda s: None)
    assert left == ["kafka_lag_incident"]
    assert said == ["  kafka_lag_health_sweep: unpaused",
                    "  kafka_lag_incident: could not unpause: Dag kafka_lag_incident not found"]


def test_every_airflow_server_listens_on_loopback_only():
    """The API server is told 127.0.0.1; the scheduler's and triggerer's log servers bind every interface
    (Airflow has no setting for their address), so they are not started."""
    commands = component_commands("/venv/bin", 8080)
    assert commands["API server"][-4:] == ["--host", "127.0.0.1", "--port", "8080"]
    assert "--skip-serve-logs" in commands["scheduler"] and "--skip-serve-logs" in commands["triggerer"]
    assert set(commands) == {"scheduler", "dag processor", "triggerer", "API server"}


# `make airflow` in a process of its own: Airflow's four components stand-in processes in one
# group (the last holds its stop until released), the broker and the Spark engine stand-ins
# that leave a file when stopped.
STAND_IN_MAKE_AIRFLOW = r"""
import sys
import types
from pathlib import Path

import lagdoctor.kafka.broker
from lagdoctor.lab import standalone

work, holds = Path(sys.argv[1]), sys.argv[2]


def stopped(what):
    return lambda: (work / f"{what}-stopped").touch()


broker = types.SimpleNamespace(bootstrap="127.0.0.1:1", stop=stopped("broker"))
lagdoctor.kafka.broker.EmbeddedBroker = lambda **_: types.SimpleNamespace(start=lambda: broker)
engine = types.SimpleNamespace(url="sc://localhost:1", token="t", log=work / "engine.log", alive=lambda: True,
                               stop=stopped("engine"))
standalone.start_engine = lambda workdir: engine
standalone.warm_engine = lambda server, workdir: 1.0
standalone.airflow_cli = lambda *args, **kwargs: (True, "")
standalone.component_commands = lambda bindir, port: {
    "scheduler": ["sleep", "600"], "dag processor": ["sleep", "600"], "triggerer": ["sleep", "600"],
    "API server": ["sh", "-c", holds.format(work)]}


def healthy(url, procs, logs=None):
    (work / "groups").write_text(str(next(iter(procs.values())).pid))
    return None


standalone.wait_healthy = healthy
standalone.open_dags = lambda bindir, env: []
sys.exit(standalone.main(["--workdir", str(work / "demo"), "--port", "1", "--no-workloads"]))
"""


def test_a_second_ctrl_c_while_make_airflow_stops_does_not_cut_the_stop_short(tmp_path):
    from tests.fixtures.signals import HOLDS_ITS_STOP, groups_left, read_until, reap, start_stand_in, wait_for_file

    proc = start_stand_in(tmp_path, STAND_IN_MAKE_AIRFLOW, HOLDS_ITS_STOP)
    try:
        proc.send_signal(signal.SIGINT)
        wait_for_file(tmp_path / "term-received", proc)  # Airflow is being stopped, held by one component
        said = ""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # an impatient user, one at a time
            proc.send_signal(sig)
            said += read_until(proc, f"{sig.name}: already stopping", 1)  # handled (or died of it)
        (tmp_path / "release").touch()
        proc.wait(120)
        output = said + proc.stdout.read()
        assert groups_left(tmp_path) == [], output
        assert (tmp_path / "engine-stopped").exists() and (tmp_path / "broker-stopped").exists(), output
        assert proc.returncode == 0, output
    finally:
        reap(tmp_path, proc)


def test_a_closed_terminal_stops_make_airflow_as_ctrl_c_does(tmp_path):
    from tests.fixtures.signals import HOLDS_ITS_STOP, groups_left, hang_up, reap, start_stand_in

    proc = start_stand_in(tmp_path, STAND_IN_MAKE_AIRFLOW, HOLDS_ITS_STOP)
    try:
        hang_up(tmp_path, proc)
        assert groups_left(tmp_path) == []
        assert (tmp_path / "engine-stopped").exists() and (tmp_path / "broker-stopped").exists()
        assert proc.returncode == 0
    finally:
        reap(tmp_path, proc)
