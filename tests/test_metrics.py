"""`lagdoctor metrics`: the Prometheus exposition of the latest findings, its
HTTP server, and the example alert rules in docs/prometheus/.

Findings folders are written the way a diagnosis run leaves them
(findings.jsonl, partition_status.jsonl, run.json), with rows shaped like the
job's real output.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.metrics import FAMILIES, FAMILY_LABELS, METRIC_NAMES, RunCache, render_metrics

ROOT = Path(__file__).resolve().parent.parent
ALERT_RULES = ROOT / "docs" / "prometheus" / "lagdoctor-alerts.yml"
T0 = datetime(2026, 11, 21, 5, 44, 4, tzinfo=timezone.utc)


# -- seeding findings folders ------------------------------------------------------

def finding(group, diagnosis="healthy", severity="ok", *, topic="orders", cluster="local",
            pattern="flat", evidence=None, partitions=()):
    return {
        "cluster": cluster, "group_id": group, "topic": topic, "partitions": list(partitions),
        "diagnosis": diagnosis, "pattern": pattern, "severity": severity,
        "summary": f"{diagnosis} in {group}",
        "evidence": {"lag": 0, "partition": None, "owner_member_id": None, "owner_client_id": None,
                     "owner_host": None, **(evidence or {})},
        "window_start": "2026-11-21T05:43:54.726928Z", "window_end": "2026-11-21T05:44:04.942791Z",
    }


def status_row(group, partition, status="OK", lag=0, time_lag=0.0, *, topic="orders", cluster="local", **extra):
    return {"cluster": cluster, "group_id": group, "topic": topic, "partition": partition,
            "status": status, "lag": lag, "time_lag_seconds": time_lag, "consume_rate": 38.372,
            "produce_rate": 39.155, "time_lag_lower_bound": False, **extra}


def write_run(findings_root: Path, key: str, findings, rows, *, planned_at: datetime | None = None,
              mtime: float | None = None, meta: dict | None = None) -> Path:
    folder = findings_root / key
    folder.mkdir(parents=True)
    (folder / "findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    (folder / "partition_status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "plans.json").write_text("[]")
    if planned_at is not None:
        (folder / "run.json").write_text(json.dumps({
            "dag_id": "kafka_lag_health_sweep", "run_id": key, "planned_at": planned_at.isoformat(),
            "group_pattern": None, "topic": None, **(meta or {})}))
    if mtime is not None:
        os.utime(folder, (mtime, mtime))
    return folder


# -- reading the exposition back, strictly -------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def _unescape(value: str) -> str:
    return re.sub(r'\\([\\"n])', lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """Samples by (name, labels); fails on anything the text format 0.0.4 does not allow."""
    assert text.endswith("\n")
    helped, typed, samples = set(), set(), {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            assert name not in helped, f"second HELP for {name}"
            helped.add(name)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind == "gauge" and name in helped and name not in typed
            typed.add(name)
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, body, value = match.groups()
        assert name in typed, f"{name} sampled before its TYPE"
        labels, pos = {}, 0
        while body and pos < len(body):
            lm = _LABEL.match(body, pos)
            assert lm, f"bad labels in {line!r}"
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
        key = (name, frozenset(labels.items()))
        assert key not in samples, f"duplicate series {line!r}"
        samples[key] = float(value)
    return samples


def series(samples, name, **labels):
    """The values of `name` whose labels include `labels`."""
    return [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]


def only(samples, name, **labels) -> float:
    found = series(samples, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


# -- exposition -----------------------------------------------------------------------

@pytest.fixture
def seeded(tmp_path) -> Path:
    """One sweep: orders-processor has a stalled owner on partition 1 (and an imbalance);
    billing is healthy on another topic and has a partition without time lag."""
    findings_root = tmp_path / "findings"
    owner = {"partition": 1, "owner_member_id": "consumer-1-9f2c", "owner_client_id": "orders-app",
             "owner_host": "/10.0.0.7", "lag": 12830}
    write_run(
        findings_root, "scheduled__2026-11-21T05_40_00_00_00",
        [
            finding("orders-processor", "partition_imbalance", "critical", pattern="steady_climb",
                    evidence=owner, partitions=[1]),
            finding("orders-processor", "stalled_consumer", "critical", pattern="steady_climb",
                    evidence=owner, partitions=[1]),
            finding("billing", topic="invoices"),
        ],
        [
            status_row("orders-processor", 0, "WARN", 12, 0.293),
            status_row("orders-processor", 1, "STOP", 12806, 1260.5, log_end_offset=99120),
            status_row("orders-processor", 2, "OK", 12, 0.293),
            status_row("billing", 0, "OK", 3, 0.25, topic="invoices"),
            status_row("billing", 1, "OK", 0, None, topic="invoices"),
        ],
        planned_at=T0,
    )
    return findings_root


def test_partition_metrics_carry_lag_time_lag_status_and_owner(seeded):
    samples = parse_exposition(render_metrics(str(seeded)))
    p1 = dict(cluster_name="local", group="orders-processor", topic="orders", partition="1")
    assert only(samples, "kafka_consumergroup_group_lag", **p1) == 12806
    assert only(samples, "kafka_consumergroup_group_lag_seconds", **p1) == 1260.5
    assert only(samples, "lagdoctor_partition_status", **p1) == 4  # STOP in Burrow's order
    # the owner named by the finding's evidence labels its partition, the others stay empty
    assert only(samples, "kafka_consumergroup_group_lag", member_host="/10.0.0.7",
                consumer_id="consumer-1-9f2c", client_id="orders-app") == 12806
    assert only(samples, "kafka_consumergroup_group_lag", group="orders-processor", partition="0",
                member_host="", consumer_id="", client_id="") == 12
    assert only(samples, "lagdoctor_partition_status", group="orders-processor", partition="0") == 2
    assert only(samples, "lagdoctor_partition_status", group="orders-processor", partition="2") == 1
    # every partition series has exactly kafka-lag-exporter's labels
    for (name, labels), _ in samples.items():
        assert {k for k, _ in labels} == set(FAMILY_LABELS[name]), name
    # no time lag known -> no sample (never NaN), lag still there
    assert series(samples, "kafka_consumergroup_group_lag_seconds", group="billing", partition="1") == []
    assert only(samples, "kafka_consumergroup_group_lag", group="billing", partition="1") == 0
    assert only(samples, "kafka_partition_latest_offset", cluster_name="local", topic="orders",
                partition="1") == 99120


def test_group_metrics_aggregate_partitions_and_findings(seeded):
    samples = parse_exposition(render_metrics(str(seeded)))
    orders, billing = dict(cluster_name="local", group="orders-processor"), dict(cluster_name="local", group="billing")
    assert only(samples, "kafka_consumergroup_group_max_lag", **orders) == 12806
    assert only(samples, "kafka_consumergroup_group_sum_lag", **orders) == 12830
    assert only(samples, "kafka_consumergroup_group_topic_sum_lag", topic="orders", **orders) == 12830
    assert only(samples, "kafka_consumergroup_group_max_lag_seconds", **orders) == 1260.5
    assert only(samples, "kafka_consumergroup_group_max_lag_seconds", **billing) == 0.25
    assert only(samples, "lagdoctor_group_status", **orders) == 4
    assert only(samples, "lagdoctor_group_status", **billing) == 1
    assert only(samples, "lagdoctor_group_severity", **orders) == 2
    assert only(samples, "lagdoctor_group_severity", **billing) == 0
    findings = {dict(ls)["diagnosis"]: (dict(ls), v) for (n, ls), v in samples.items() if n == "lagdoctor_finding"}
    assert set(findings) == {"partition_imbalance", "stalled_consumer"}  # healthy billing is no finding
    labels, value = findings["stalled_consumer"]
    assert value == 1
    assert labels == {"cluster_name": "local", "group": "orders-processor", "topic": "orders",
                      "diagnosis": "stalled_consumer", "severity": "critical", "pattern": "steady_climb"}
    assert only(samples, "lagdoctor_last_diagnosis_timestamp_seconds", cluster_name="local") == T0.timestamp()


def forecasts(catch_up=None, data_loss=None, **extra):
    """Issue 10's evidence: catch_up and data_loss as the job writes them."""
    ev = dict(extra)
    if catch_up is not None:
        ev["catch_up"] = {"state": catch_up[0], "seconds": catch_up[1]}
    if data_loss is not None:
        ev["data_loss"] = {"state": data_loss[0], "seconds": data_loss[1], "partitions": [0],
                           "retention_ms": 604800000, "retention_bytes": -1, "basis": "retention_ms"}
    return ev


def test_catch_up_and_data_loss_gauges_per_group_and_topic(tmp_path):
    groups = {  # group: (catch_up, data_loss)
        "clearing": (("clearing", 725.5), ("at_risk", 3900.0)),
        "never": (("never", None), ("already", None)),
        "steady": (("steady", None), ("safe", None)),  # the lag holds: it does not clear either
        "caught-up": (("caught_up", 0), ("safe", None)),
        "unknown": (("unknown", None), ("unknown", None)),
        "old-run": (None, None),  # written before the forecasts existed
    }
    write_run(tmp_path, "run", [finding(g, "slow_consumer", "warning", evidence=forecasts(*f))
                                for g, f in groups.items()],
              [status_row(g, 0, "WARN", 10) for g in groups], planned_at=T0)
    text = render_metrics(str(tmp_path))
    assert ('lagdoctor_lag_catch_up_seconds{cluster_name="local",group="never",topic="orders"} +Inf'
            in text.splitlines())
    samples = parse_exposition(text)
    where = dict(cluster_name="local", topic="orders")
    assert only(samples, "lagdoctor_lag_catch_up_seconds", group="clearing", **where) == 725.5
    assert only(samples, "lagdoctor_lag_catch_up_seconds", group="caught-up", **where) == 0
    assert only(samples, "lagdoctor_lag_catch_up_seconds", group="steady", **where) == math.inf
    assert only(samples, "lagdoctor_data_loss_seconds", group="clearing", **where) == 3900
    assert only(samples, "lagdoctor_data_loss_seconds", group="never", **where) == 0  # already losing
    # Unknown, safe or not forecast at all: no sample, never a 0 that reads as "now".
    assert series(samples, "lagdoctor_lag_catch_up_seconds", group="unknown") == []
    assert series(samples, "lagdoctor_lag_catch_up_seconds", group="old-run") == []
    for group in ("caught-up", "unknown", "old-run"):
        assert series(samples, "lagdoctor_data_loss_seconds", group=group) == [], group
    for name in ("lagdoctor_lag_catch_up_seconds", "lagdoctor_data_loss_seconds"):
        assert FAMILY_LABELS[name] == ("cluster_name", "group", "topic")
        assert f"# TYPE {name} gauge" in text and f"# HELP {name} " in text


def test_forecast_gauges_take_the_worst_of_a_groups_findings(tmp_path):
    write_run(tmp_path, "run", [
        finding("g", "slow_consumer", "warning", evidence=forecasts(("clearing", 600), ("at_risk", 7200))),
        finding("g", "partition_imbalance", "critical", evidence=forecasts(("clearing", 900), ("at_risk", 3600))),
    ], [status_row("g", 0, "WARN", 10)], planned_at=T0)
    samples = parse_exposition(render_metrics(str(tmp_path)))
    assert only(samples, "lagdoctor_lag_catch_up_seconds", group="g") == 900
    assert only(samples, "lagdoctor_data_loss_seconds", group="g") == 3600


def test_output_is_ordered_and_stable(tmp_path):
    write_run(tmp_path, "run", [finding("g")],
              [status_row("g", p, lag=p) for p in (10, 2, 0, 1)], planned_at=T0)
    text = render_metrics(str(tmp_path))
    assert render_metrics(str(tmp_path)) == text
    lag_lines = [line for line in text.splitlines() if line.startswith("kafka_consumergroup_group_lag{")]
    assert [re.search(r'partition="(\d+)"', line).group(1) for line in lag_lines] == ["0", "1", "2", "10"]
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert helps == [f.name for f in FAMILIES]
    assert lag_lines[0] == ('kafka_consumergroup_group_lag{cluster_name="local",group="g",topic="orders",'
                            'partition="0",member_host="",consumer_id="",client_id=""} 0')


def test_label_values_are_escaped(tmp_path):
    group, client = 'a"b\\c', "line1\nline2"
    write_run(tmp_path, "run",
              [finding(group, "slow_consumer", "warning", evidence={"partition": 0, "owner_client_id": client})],
              [status_row(group, 0, "WARN", 1500)], planned_at=T0)
    text = render_metrics(str(tmp_path))
    assert 'group="a\\"b\\\\c"' in text
    assert 'client_id="line1\\nline2"' in text
    samples = parse_exposition(text)  # one line per sample: the newline did not break a line
    assert only(samples, "kafka_consumergroup_group_lag", group=group, client_id=client) == 1500
    assert only(samples, "lagdoctor_finding", group=group, diagnosis="slow_consumer") == 1


def test_latest_run_wins_per_group_and_topic(tmp_path):
    # the older run saw both groups; the newer one (an incident run) only orders-processor
    write_run(tmp_path, "scheduled__1",
              [finding("orders-processor", "slow_consumer", "critical", pattern="steady_climb"),
               finding("billing", "crashed_consumer", "warning", topic="invoices")],
              [status_row("orders-processor", 0, "WARN", 25000), status_row("billing", 0, "STOP", 4000, topic="invoices")],
              planned_at=T0)
    write_run(tmp_path, "manual__2", [finding("orders-processor")],
              [status_row("orders-processor", 0, "OK", 40)], planned_at=T0.replace(minute=50))
    samples = parse_exposition(render_metrics(str(tmp_path)))
    assert only(samples, "kafka_consumergroup_group_lag", group="orders-processor") == 40
    assert only(samples, "lagdoctor_group_severity", group="orders-processor") == 0
    assert series(samples, "lagdoctor_finding", group="orders-processor") == []
    # billing was not looked at again: the older run still answers for it
    assert only(samples, "kafka_consumergroup_group_lag", group="billing") == 4000
    assert only(samples, "lagdoctor_finding", group="billing", diagnosis="crashed_consumer") == 1
    assert only(samples, "lagdoctor_last_diagnosis_timestamp_seconds", cluster_name="local") == \
        T0.replace(minute=50).timestamp()


def test_a_run_with_threshold_overrides_never_replaces_the_sweeps_verdict(tmp_path):
    """An incident run with {"warning_lag": 1} after a sweep: no alert changes, for its group or any other."""
    write_run(tmp_path, "sweep", [finding("orders-processor", "slow_consumer", "warning", pattern="steady_climb"),
                                  finding("billing", topic="invoices")],
              [status_row("orders-processor", 0, "WARN", 2500), status_row("billing", 0, "OK", 3, topic="invoices")],
              planned_at=T0)
    before = parse_exposition(render_metrics(str(tmp_path)))
    folder = write_run(tmp_path, "incident", [
        finding("orders-processor", "slow_consumer", "critical", pattern="steady_climb"),
        finding("billing", "slow_consumer", "critical", topic="invoices", pattern="flat"),
    ], [status_row("orders-processor", 0, "ERR", 2600), status_row("billing", 0, "ERR", 3, topic="invoices")],
        planned_at=T0.replace(minute=50))
    meta = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**meta, "dag_id": "kafka_lag_incident", "kind": "incident",
                                                 "threshold_overrides": {"warning_lag": 1}}))
    after = parse_exposition(render_metrics(str(tmp_path)))
    assert after == before
    assert only(after, "lagdoctor_group_severity", group="orders-processor") == 1
    assert only(after, "lagdoctor_group_severity", group="billing") == 0

    # The same run without overrides is a verdict like any other: the test above could fail.
    (folder / "run.json").write_text(json.dumps({**meta, "threshold_overrides": {}}))
    assert only(parse_exposition(render_metrics(str(tmp_path))), "lagdoctor_group_severity", group="billing") == 2


SWEPT = {"kind": "sweep", "clusters": ["local"], "clusters_unread": []}


def _stale_history(tmp_path, newest_meta, newest_findings, newest_rows):
    """A sweep saw orders-processor critical and billing healthy; a newer run (newest_meta) follows."""
    write_run(tmp_path, "sweep-1",
              [finding("orders-processor", "stalled_consumer", "critical", pattern="plateau"),
               finding("billing", topic="invoices")],
              [status_row("orders-processor", 0, "STOP", 25000, 1260.5),
               status_row("billing", 0, "OK", 3, topic="invoices")],
              planned_at=T0, meta=SWEPT)
    write_run(tmp_path, "next", newest_findings, newest_rows, planned_at=T0.replace(minute=50), meta=newest_meta)
    return parse_exposition(render_metrics(str(tmp_path)))


@pytest.mark.parametrize("newest_meta, billing_seen, why", [
    (SWEPT, True, "the group is gone: the next sweep of its cluster names billing only"),
    ({"kind": "sweep", "clusters": [], "clusters_unread": ["local"]}, False,
     "the cluster could not be read: the sweep names no group of it (and is no group's newest run)"),
])
def test_a_group_the_newest_sweep_did_not_collect_keeps_no_alerting_series(tmp_path, newest_meta, billing_seen, why):
    samples = _stale_history(
        tmp_path, newest_meta,
        [finding("billing", topic="invoices")] if billing_seen else [],
        [status_row("billing", 0, "OK", 5, topic="invoices")] if billing_seen else [])
    stale = [(n, dict(ls)) for (n, ls), _ in samples.items() if ("group", "orders-processor") in ls]
    assert stale == [("lagdoctor_not_collected_since_timestamp_seconds",
                      {"cluster_name": "local", "group": "orders-processor", "topic": "orders",
                       "last_severity": "critical"})], why
    # since its last data: the window end of its last run
    assert only(samples, "lagdoctor_not_collected_since_timestamp_seconds", group="orders-processor") == \
        datetime(2026, 11, 21, 5, 44, 4, 942791, tzinfo=timezone.utc).timestamp()
    assert series(samples, "lagdoctor_finding") == []
    # Every shipped rule reads only series the stale group no longer has, but the one that says it stopped.
    for rule in _rules():
        names = promql_references(rule["expr"])[0]
        kept = [n for (n, ls) in samples if n in names and ("group", "orders-processor") in ls]
        assert kept == ([] if rule["alert"] != "LagdoctorProblemGroupNotCollected"
                        else ["lagdoctor_not_collected_since_timestamp_seconds"]), rule["alert"]
    assert bool(series(samples, "kafka_consumergroup_group_lag", group="billing")) == billing_seen


def test_runs_that_look_at_a_few_groups_never_make_the_others_stale(tmp_path):
    """An incident run names only billing; so does a sweep with threshold overrides: orders-processor's verdict stands."""
    for meta in ({"kind": "incident", "dag_id": "kafka_lag_incident", "clusters": ["local"]},
                 {**SWEPT, "threshold_overrides": {"warning_lag": 1}}):
        shutil.rmtree(tmp_path, ignore_errors=True)
        samples = _stale_history(tmp_path, meta, [finding("billing", topic="invoices")],
                                 [status_row("billing", 0, "OK", 5, topic="invoices")])
        assert only(samples, "lagdoctor_finding", group="orders-processor", severity="critical") == 1, meta
        assert series(samples, "lagdoctor_not_collected_since_timestamp_seconds") == [], meta


def test_a_group_collected_again_is_current_again(tmp_path):
    write_run(tmp_path, "sweep-0", [finding("orders-processor")], [status_row("orders-processor", 0, lag=1)],
              planned_at=T0.replace(minute=40), meta=SWEPT)
    samples = _stale_history(tmp_path, SWEPT, [finding("orders-processor")], [status_row("orders-processor", 0, lag=7)])
    assert only(samples, "kafka_consumergroup_group_lag", group="orders-processor") == 7
    # billing was in sweep-1 only, and the sweep after it did not see it
    assert only(samples, "lagdoctor_not_collected_since_timestamp_seconds", group="billing", last_severity="ok")
    assert series(samples, "lagdoctor_group_severity", group="billing") == []


@pytest.mark.parametrize(
    "bare_offset_s, winner_lag",
    [
        (+600, 111),  # the run without run.json is newer by its folder mtime
        (-600, 222),  # ... or older: the planned run wins
    ],
)
def test_runs_without_run_json_are_dated_by_folder_mtime(tmp_path, bare_offset_s, winner_lag):
    write_run(tmp_path, "bare", [finding("g")], [status_row("g", 0, lag=111)],
              mtime=T0.timestamp() + bare_offset_s)
    write_run(tmp_path, "planned", [finding("g")], [status_row("g", 0, lag=222)], planned_at=T0)
    samples = parse_exposition(render_metrics(str(tmp_path)))
    assert only(samples, "kafka_consumergroup_group_lag", group="g") == winner_lag
    assert only(samples, "lagdoctor_last_diagnosis_timestamp_seconds") == max(
        T0.timestamp(), T0.timestamp() + bare_offset_s)


def test_unreadable_and_incomplete_runs_are_skipped(tmp_path):
    write_run(tmp_path, "good", [finding("g")], [status_row("g", 0, lag=7)], planned_at=T0)
    broken = write_run(tmp_path, "broken", [finding("g")], [status_row("g", 0, lag=9)],
                       planned_at=T0.replace(minute=55))
    (broken / "partition_status.jsonl").write_text('{"cluster": "local", "group_id"\n')
    half = tmp_path / "half"  # the job wrote findings, not yet the status rows
    half.mkdir()
    (half / "findings.jsonl").write_text(json.dumps(finding("g", "slow_consumer", "critical")) + "\n")
    samples = parse_exposition(render_metrics(str(tmp_path)))
    assert only(samples, "kafka_consumergroup_group_lag", group="g") == 7
    assert series(samples, "lagdoctor_finding") == []


def test_cache_rereads_a_run_whose_files_changed(tmp_path):
    """The server keeps parsed runs between scrapes; a retried plan rewrites run.json
    in place (the folder's own mtime does not move) and must still be seen."""
    cache = RunCache()
    first = write_run(tmp_path, "first", [finding("g")], [status_row("g", 0, lag=1)], planned_at=T0)
    write_run(tmp_path, "second", [finding("g")], [status_row("g", 0, lag=2)], planned_at=T0.replace(minute=50))
    assert only(parse_exposition(render_metrics(str(tmp_path), cache)), "kafka_consumergroup_group_lag") == 2
    folder_mtime = first.stat().st_mtime
    (first / "run.json").write_text(json.dumps({"planned_at": T0.replace(minute=55).isoformat()}))
    os.utime(first / "run.json", (T0.timestamp() + 60, T0.timestamp() + 60))
    os.utime(first, (folder_mtime, folder_mtime))
    assert only(parse_exposition(render_metrics(str(tmp_path), cache)), "kafka_consumergroup_group_lag") == 1
    for path in sorted(first.iterdir()):
        path.unlink()
    first.rmdir()
    assert only(parse_exposition(render_metrics(str(tmp_path), cache)), "kafka_consumergroup_group_lag") == 2


@pytest.mark.parametrize("make_root", [lambda p: p / "missing", lambda p: p])
def test_empty_data_root_exports_help_and_type_only(tmp_path, make_root):
    """Before the first run: every family declared, no samples; the diagnosis
    timestamp is absent (not 0), which the staleness rules test with absent()."""
    text = render_metrics(str(make_root(tmp_path)))
    assert parse_exposition(text) == {}
    lines = text.splitlines()
    assert len(lines) == 2 * len(FAMILIES)
    assert all(line.startswith(("# HELP ", "# TYPE ")) for line in lines)


# -- the server, end to end ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        raise AssertionError(f"no output within {timeout}s")
    return proc.stdout.readline()


def test_metrics_command_serves_scrapes_and_stops_on_sigterm(seeded):
    port = _free_port()
    script = Path(sys.executable).parent / "lagdoctor"
    env = {k: v for k, v in os.environ.items() if k != "LAGDOCTOR_DATA_ROOT"}
    proc = subprocess.Popen(
        [str(script), "metrics", "--port", str(port), "--data-root", str(seeded.parent)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert _read_line(proc, 30).strip() == f"serving metrics on http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            samples = parse_exposition(resp.read().decode())
        assert only(samples, "kafka_consumergroup_group_max_lag", group="orders-processor") == 12806
        # each scrape reads the data root again: a new run shows up without a restart
        write_run(seeded, "manual__later", [finding("orders-processor")],
                  [status_row("orders-processor", 1, "OK", 5)], planned_at=T0.replace(minute=59))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            samples = parse_exposition(resp.read().decode())
        assert only(samples, "kafka_consumergroup_group_max_lag", group="orders-processor") == 5
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert "/metrics" in resp.read().decode()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
        assert missing.value.code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_metrics_command_fails_in_one_line_when_the_port_is_taken(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [str(Path(sys.executable).parent / "lagdoctor"), "metrics", "--port", str(port),
             "--data-root", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0
    assert done.stderr.startswith(f"lagdoctor: error: cannot listen on 127.0.0.1:{port}")


# -- alert rules cannot drift from the exporter ------------------------------------------

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp_min", "clamp_max",
    "count_over_time", "delta", "deriv", "floor", "idelta", "increase", "irate", "last_over_time",
    "max_over_time", "min_over_time", "predict_linear", "rate", "resets", "round", "scalar",
    "sum_over_time", "time", "timestamp", "vector",
    "avg", "count", "max", "min", "sum", "topk", "bottomk", "quantile",
}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def promql_references(expr: str) -> tuple[set[str], set[str], list[tuple[str, set[str]]]]:
    """(metric names, functions, [(metric, matcher label names)]) used by an expression,
    plus grouping labels folded into the matcher list under the metric name ''."""
    matchers: list[tuple[str, set[str]]] = []
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}", text):
        matchers.append((m.group(1) or "", set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)))))
    for m in _GROUPING.finditer(text):
        matchers.append(("", {label.strip() for label in m.group(2).split(",") if label.strip()}))
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    names, functions = set(), set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = m.group(0)
        if word in PROMQL_KEYWORDS:
            continue
        (functions if text[m.end():].lstrip().startswith("(") else names).add(word)
    return names, functions, matchers


def rule_problems(rule: dict) -> list[str]:
    """Why a rule does not fit what lagdoctor.metrics exports (empty when it does)."""
    names, functions, matchers = promql_references(rule["expr"])
    problems = [f"unknown metric {n}" for n in sorted(names - METRIC_NAMES)]
    problems += [f"unknown function {f}" for f in sorted(functions - PROMQL_FUNCTIONS)]
    if not names:
        problems.append("uses no lagdoctor metric")
    available = set().union(*(FAMILY_LABELS.get(n, ()) for n in names)) if names else set()
    for metric, labels in matchers:
        allowed = set(FAMILY_LABELS.get(metric, ())) if metric else available
        problems += [f"{metric or 'grouping'} has no label {label}" for label in sorted(labels - allowed)]
    templated = " ".join(str(v) for v in (rule.get("annotations") or {}).values())
    used = set(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", templated))
    problems += [f"annotation uses label {label} no series carries" for label in sorted(used - available)]
    return problems


def _rules() -> list[dict]:
    doc = yaml.safe_load(ALERT_RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_reference_only_exported_metrics_and_labels():
    rules = _rules()
    assert rules
    problems = {rule["alert"]: rule_problems(rule) for rule in rules}
    assert {alert: p for alert, p in problems.items() if p} == {}
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_alert_rules_cover_what_the_issue_asks():
    rules = {rule["alert"]: rule for rule in _rules()}
    exprs = {alert: " ".join(rule["expr"].split()) for alert, rule in rules.items()}
    names = {alert: promql_references(expr)[0] for alert, expr in exprs.items()}
    assert any("kafka_consumergroup_group_max_lag_seconds" in n for n in names.values())  # time lag
    assert any("lagdoctor_finding" in n for n in names.values())  # a finding is present
    assert any("lagdoctor_not_collected_since_timestamp_seconds" in n for n in names.values())  # issue 17
    stale = [a for a, e in exprs.items() if "lagdoctor_last_diagnosis_timestamp_seconds" in e]
    assert any("time()" in exprs[a] for a in stale) and any("absent(" in exprs[a] for a in stale)


def test_alert_thresholds_are_the_seeds_thresholds():
    """Warning at warning_lag and growing, critical at critical_lag or doubling."""
    th = Thresholds()
    rules = {rule["alert"]: " ".join(rule["expr"].split()) for rule in _rules()}
    warning, critical = rules["KafkaConsumerLagGrowing"], rules["KafkaConsumerLagCritical"]
    assert f"kafka_consumergroup_group_topic_sum_lag >= {th.warning_lag}" in warning
    assert re.search(r"(delta|deriv)\(kafka_consumergroup_group_topic_sum_lag\[10m\]\) > 0", warning)
    assert f"kafka_consumergroup_group_topic_sum_lag >= {th.critical_lag}" in critical
    assert ">= 2 * (kafka_consumergroup_group_topic_sum_lag offset 30m)" in critical
    assert f"kafka_consumergroup_group_topic_sum_lag >= {th.warning_lag}" in critical


@pytest.mark.parametrize(
    "expr, problem",
    [
        ("kafka_consumergroup_lag > 1000", "unknown metric kafka_consumergroup_lag"),  # kafka_exporter's name
        ('lagdoctor_finding{severity="critical", consumergroup="x"} == 1', "lagdoctor_finding has no label consumergroup"),
        ("max by (consumergroup) (kafka_consumergroup_group_lag) > 5", "grouping has no label consumergroup"),
        ("lagdoctor_group_severity >= 2 and on (topic) lagdoctor_finding", None),
        ("time() - lagdoctor_last_diagnosis_timestamp > 900", "unknown metric lagdoctor_last_diagnosis_timestamp"),
        ("histogram_quantile(0.9, kafka_consumergroup_group_lag)", "unknown function histogram_quantile"),
    ],
)
def test_rule_checker_catches_drift(expr, problem):
    """The consistency check itself can fail: names and labels the exporter does not have."""
    problems = rule_problems({"alert": "x", "expr": expr})
    if problem is None:
        assert problems == []
    else:
        assert problem in problems


def test_rule_checker_catches_annotation_labels():
    rule = {"alert": "x", "expr": "kafka_consumergroup_group_max_lag > 10",
            "annotations": {"summary": "{{ $labels.group }} on {{ $labels.topic }}"}}
    assert rule_problems(rule) == ["annotation uses label topic no series carries"]
