"""Task-level behaviour that needs no broker or Spark: retention, branching, scopes."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone

from lagdoctor import orchestration
from lagdoctor.settings import Settings


def _age(path, days: float) -> None:
    t = time.time() - days * 86400
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t))


def test_retention_prunes_old_findings_and_reports_but_keeps_recent_ones(tmp_path):
    settings = Settings(data_root=str(tmp_path))
    old_run = tmp_path / "findings" / "scheduled__old"
    new_run = tmp_path / "findings" / "scheduled__new"
    old_report = tmp_path / "reports" / "scheduled__old"
    for d in (old_run, new_run, old_report):
        d.mkdir(parents=True)
        (d / "findings.jsonl").write_text("{}\n")
    _age(old_run, 10)
    _age(old_report, 10)
    removed = orchestration.prune_history(keep_days=7, settings=settings)
    assert removed == 2
    assert not old_run.exists() and not old_report.exists() and new_run.exists()


def test_run_key_is_path_safe_and_stable():
    key = orchestration.run_key("scheduled__2026-11-21T03:15:00+00:00")
    assert key == orchestration.run_key("scheduled__2026-11-21T03:15:00+00:00")
    assert "/" not in key and ":" not in key and "+" not in key


def test_branches_are_one_group_per_wanted_action():
    summary = {"actions": {"restart_consumers": 2, "recommend_consumer_config": 1, "not_an_action": 1}}
    assert orchestration.choose_branches(summary) == [
        "remediate_recommend_consumer_config.run", "remediate_restart_consumers.gate",
    ]
    assert orchestration.choose_branches({"actions": {}}) == []


def test_incident_scope_names_what_was_looked_at():
    assert orchestration.incident_scope({"cluster": "prod", "group_pattern": "orders-.*", "topic": ""}) == \
        "prod / orders-.*"
    assert orchestration.incident_scope({"cluster": "prod", "group_pattern": "", "topic": "clicks"}) == \
        "prod / .* / clicks"


def test_threshold_overrides_are_checked_before_spark_starts():
    import pytest

    assert orchestration.check_thresholds({"warning_lag": "5000"}) == {"warning_lag": "5000"}
    with pytest.raises(ValueError, match="unknown threshold.*warn_lag"):
        orchestration.check_thresholds({"warn_lag": 5000})
    with pytest.raises(ValueError, match="bad threshold value"):
        orchestration.check_thresholds({"warning_lag": "lots"})
