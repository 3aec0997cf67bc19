"""`make airflow` starts from a clean state: the previous start's history (offsets of a
memory-only broker that no longer exists) and Airflow database are moved aside, not mixed in."""

from __future__ import annotations

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
