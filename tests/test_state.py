"""lagdoctor's state database: where it lives, leases, and check-then-act under races.

Every test that touches the database runs twice, against SQLite and against a
real PostgreSQL server (tests/fixtures/postgres.py).
"""

from __future__ import annotations

import multiprocessing
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from lagdoctor.settings import Settings
from lagdoctor.state import STATE_URL_ENV, StateConfigError, StateDB, leases, state_url

NOW = datetime(2026, 11, 23, 3, 14, tzinfo=timezone.utc)


def test_default_is_sqlite_under_the_data_root(tmp_path):
    url = state_url(Settings(data_root=str(tmp_path)), environ={})
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "state" / "lagdoctor.db")


def test_a_remote_data_root_without_a_state_database_is_refused_in_one_line():
    with pytest.raises(StateConfigError) as err:
        state_url(Settings(data_root="s3a://bucket/lagdoctor"), environ={})
    message = str(err.value)
    assert "\n" not in message
    assert "s3a://" in message and "lagdoctor_state" in message


def test_the_lagdoctor_state_connection_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_LAGDOCTOR_STATE",
                       '{"conn_type": "postgres", "host": "db.internal", "port": 5432, "login": "ld",'
                       ' "password": "s3cr3t-pw", "schema": "lagdoctor"}')
    url = state_url(Settings(data_root=str(tmp_path)), environ={})
    assert (url.drivername, url.host, url.port, url.database, url.username) == (
        "postgresql+psycopg", "db.internal", 5432, "lagdoctor", "ld")


def test_an_unreachable_database_fails_in_one_line_without_its_password():
    url = "postgresql+psycopg://ld:s3cr3t-pw@127.0.0.1:9/lagdoctor?connect_timeout=2"
    with pytest.raises(StateConfigError) as err:
        StateDB.from_url(url)
    assert "s3cr3t-pw" not in str(err.value)
    assert "127.0.0.1:9" in str(err.value) and "\n" not in str(err.value)


def test_state_url_env_wins(tmp_path):
    url = state_url(Settings(data_root="s3a://bucket/x"), environ={STATE_URL_ENV: f"sqlite:///{tmp_path}/s.db"})
    assert url.database == f"{tmp_path}/s.db"


def test_a_lease_is_exclusive_until_it_expires_or_is_released(state_url):
    db = StateDB.from_url(state_url)
    ttl = timedelta(minutes=10)
    assert db.acquire_lease("prod/orders/restart", "run-a", ttl, now=NOW)
    assert not db.acquire_lease("prod/orders/restart", "run-b", ttl, now=NOW + timedelta(minutes=5))
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=5)) == "run-a"
    # the holder renews; another key is independent
    assert db.acquire_lease("prod/orders/restart", "run-a", ttl, now=NOW + timedelta(minutes=6))
    assert db.acquire_lease("prod/payments/restart", "run-b", ttl, now=NOW)
    # expired: taken over
    assert db.acquire_lease("prod/orders/restart", "run-b", ttl, now=NOW + timedelta(minutes=17))
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) == "run-b"
    # only the holder releases
    db.release_lease("prod/orders/restart", "run-a")
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) == "run-b"
    db.release_lease("prod/orders/restart", "run-b")
    assert db.lease_holder("prod/orders/restart", now=NOW + timedelta(minutes=17)) is None


def test_a_failed_transaction_leaves_nothing_behind(state_url):
    db = StateDB.from_url(state_url)
    with pytest.raises(RuntimeError):
        with db.transaction() as conn:
            db.acquire_lease("k", "run-a", timedelta(minutes=1), now=NOW, conn=conn)
            raise RuntimeError("crash between the check and the act")
    with db.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(leases)).scalar() == 0


def _race(url: str, holder: str, start, results) -> None:
    from lagdoctor.state import StateDB

    db = StateDB.from_url(url)
    start.wait()
    results.put((holder, db.acquire_lease("prod/orders/restart_consumers", holder, timedelta(minutes=10))))


def test_two_processes_racing_for_one_lease_exactly_one_wins(state_url):
    # No warm-up: the racers also race to create the database and its tables.
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(state_url, f"run-{i}", start, results)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = dict(results.get(timeout=5) for _ in procs)
    assert sum(outcomes.values()) == 1, outcomes
    winner = next(h for h, won in outcomes.items() if won)
    assert StateDB.from_url(state_url).lease_holder("prod/orders/restart_consumers") == winner
