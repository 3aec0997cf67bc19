"""`make airflow` starts from a clean state: the previous start's history (offsets of a
memory-only broker that no longer exists) and Airflow database are moved aside, not mixed in."""

from __future__ import annotations

from lagdoctor.lab.standalone import start_clean


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
