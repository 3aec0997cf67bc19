"""The noise lab's reading of a played run (bench/noise_lab.py): what it counts is what Slack heard."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0  # the workloads' start


@pytest.fixture(scope="module")
def lab():
    spec = importlib.util.spec_from_file_location("noise_lab", ROOT / "bench" / "noise_lab.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["noise_lab"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("noise_lab", None)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def post(t: float, text: str, thread: float | None = None) -> dict:
    return {"channel": "#lag", "ts": f"{t:.6f}", "thread_ts": None if thread is None else f"{thread:.6f}",
            "text": text, "blocks": []}


def finding(t: float, group: str, diagnosis: str, snapshots: int, **extra) -> dict:
    return {"cluster": "kafka_default", "group_id": group, "topic": "t", "partitions": [], "diagnosis": diagnosis,
            "severity": "ok" if diagnosis in ("healthy", "collecting_history") else "critical", "summary": "",
            "window_start": iso(t - 1800), "window_end": iso(t),
            "evidence": {"snapshots": snapshots, **extra.pop("evidence", {})}, **extra}


def played(tmp_path: Path, posts: list[dict], runs: list[list[dict]], actions=()) -> Path:
    work = tmp_path / "now"
    data = work / "lagdoctor"
    (data / "outbox").mkdir(parents=True)
    (data / "outbox" / "slack.jsonl").write_text("".join(json.dumps(p) + "\n" for p in posts))
    for n, rows in enumerate(runs):
        run = data / "findings" / f"run-{n:02d}"
        run.mkdir(parents=True)
        (run / "findings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "_SUCCESS").write_text("{}")
    if actions:
        (data / "state").mkdir()
        with sqlite3.connect(data / "state" / "lagdoctor.db") as conn:
            conn.execute("CREATE TABLE action_log (ts TEXT, action TEXT, group_id TEXT, status TEXT, dry_run BOOLEAN)")
            conn.executemany("INSERT INTO action_log VALUES (?, ?, ?, ?, ?)", actions)
    events = {"workloads": T0, "crash": T0 + 15, "up": T0 + 200, "surge": T0 + 340, "mended": T0 + 2000,
              "end": T0 + 3800}
    incidents = [{"group": "orders-processor", "expect": "partition_imbalance"},
                 {"group": "invoices-mailer", "expect": "crashed_consumer"},
                 {"group": "audit-archiver", "expect": "healthy"}]
    (work / "lab.json").write_text(json.dumps({"side": "now", "commit": "abc1234", "events": events,
                                               "error": None, "incidents": incidents}))
    return work


def test_messages_repeats_first_right_minute_and_the_healthy_half(lab, tmp_path):
    root = T0 + 260
    posts = [
        post(T0 + 230, "Deciding between crashed consumer and healthy for invoices-mailer"),
        post(root, ":red_circle: Partition imbalance in orders-processor on orders: partition 1"),
        post(root + 60, "total lag 4 -> 73", thread=root),
        post(root + 120, "total lag 73 -> 4", thread=root),  # the same thing said again
        post(root + 180, "Severity rose: critical", thread=root),
        post(T0 + 400, "CRITICAL: crashed_consumer for group invoices-mailer on invoices"),
        post(T0 + 100, "lagdoctor is watching 3 groups: orders-processor, invoices-mailer, audit-archiver"),
        post(T0 + 2100, "orders-processor recovered", thread=root),
        post(T0 + 2200, "total lag 9 -> 2", thread=root),
    ]
    out = lab.analyse(played(tmp_path, posts, []))
    orders, invoices, other = (out["table"][g] for g in ("orders-processor", "invoices-mailer", "(other)"))
    assert (orders["top_level"], orders["replies"], orders["repeats"]) == (1, 3, 1)
    assert orders["first_right_min"] == pytest.approx(260 / 60, abs=0.05)
    # a provisional "deciding between" names no cause yet: the right message is the decided one
    assert invoices["top_level"] == 2 and invoices["first_right_min"] == pytest.approx((400 - 15) / 60, abs=0.05)
    assert (orders["healthy_recoveries"], orders["healthy_other"]) == (1, 1)
    assert other["top_level"] == 1  # the watching notice belongs to no incident
    text = lab.render([out])
    assert "orders-processor (partition_imbalance)" in text and "1 / 3" in text


def test_verdicts_on_short_history_false_healthy_and_false_alarms(lab, tmp_path):
    runs = [
        [finding(T0 + 30, "orders-processor", "healthy", 1),  # one snapshot: a verdict it cannot give
         finding(T0 + 30, "invoices-mailer", "collecting_history", 1),  # said as what it is: not counted
         finding(T0 + 30, "audit-archiver", "slow_consumer", 2)],  # short, and an alarm on the healthy group
        [finding(T0 + 300, "orders-processor", "healthy", 5),  # the incident has lasted: false healthy
         finding(T0 + 300, "invoices-mailer", "crashed_consumer", 2, provisional=True),
         finding(T0 + 300, "audit-archiver", "healthy", 5)],
        [finding(T0 + 2500, "orders-processor", "healthy", 30)],  # after the mend: right
    ]
    table = lab.analyse(played(tmp_path, [], runs))["table"]
    assert table["orders-processor"]["short_history"] == 1 and table["orders-processor"]["false_healthy"] == 1
    assert table["invoices-mailer"]["short_history"] == 0 and table["invoices-mailer"]["false_healthy"] == 0
    assert table["audit-archiver"]["false_alarms"] == 1 and table["audit-archiver"]["short_history"] == 1


def test_findings_after_its_own_real_action_count_unless_they_say_so(lab, tmp_path):
    acted = T0 + 600
    runs = [[finding(acted + 120, "orders-processor", "partition_imbalance", 10)],
            [finding(acted + 180, "orders-processor", "partition_imbalance", 10,
                     evidence={"own_actions": [{"action": "add_partitions"}]})],
            [finding(acted - 60, "orders-processor", "partition_imbalance", 10)]]  # before it: not its doing
    actions = [(iso(acted), "add_partitions", "orders-processor", "executed", 0),
               (iso(acted), "add_partitions", "orders-processor", "dry_run", 1)]
    out = lab.analyse(played(tmp_path, [], runs, actions))
    assert out["actions_run"] == 1
    row = out["table"]["orders-processor"]
    assert (row["unattributed"], row["own_actions"]) == (1, 2)


def test_analyse_refuses_a_folder_that_is_not_a_played_run(lab, tmp_path, capsys):
    with pytest.raises(SystemExit):
        lab.main(["--analyse", str(tmp_path)])
    assert "no lab.json in" in capsys.readouterr().err
