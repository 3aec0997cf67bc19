"""Issue 10's evidence as people see it: time lag source, catch-up and data-loss
forecasts, and a stalled consumer's stuck record, in Slack, on the lag page and
in the incident report. Findings from older runs (no such fields) look as before."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from lagdoctor.notify.render import render_incident, render_update, with_partition_status
from lagdoctor.settings import Settings
from lagdoctor.web.report import write_incident_report
from tests.test_web_app import client_for

NEW_FIELDS = ("time_lag_source", "committed_record", "catch_up", "data_loss")

RECORD = {"offset": 120, "timestamp": "2026-11-21T01:14:00.000Z", "key_sha256": "3fa9c0d1e2f3a4b5", "size": 2048,
          "headers": ["traceparent", "retry"], "error": None}


def stalled(**evidence):
    """A stalled_consumer finding as the job writes it (flat engine evidence, partition 2 in focus)."""
    ev = {"lag": 12_000, "partition_count": 4, "partition": 2, "partition_lag": 11_000, "owner_member_id": "c-9",
          "owner_client_id": "orders-9", "owner_host": "/10.0.0.9", "produce_rate": 40.0, "consume_rate": 12.0,
          "partition_produce_rate": 10.0, "partition_consume_rate": 0.0, "time_lag_seconds": 2400.0,
          "max_time_lag_seconds": 2400.0, "time_lag_lower_bound": False, "group_members": 2,
          "time_lag_source": "record", "committed_record": RECORD,
          "catch_up": {"state": "never", "seconds": None},
          "data_loss": {"state": "at_risk", "seconds": 3900, "partitions": [0, 3], "retention_ms": 604_800_000,
                        "retention_bytes": -1, "basis": "log_start"}}
    return {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partitions": [2],
            "diagnosis": "stalled_consumer", "pattern": "plateau", "severity": "critical",
            "summary": "partition 2 stopped committing", "evidence": {**ev, **evidence},
            "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"}


def old_finding(f):
    """The same finding as a run before issue 10 wrote it."""
    f = copy.deepcopy(f)
    for k in NEW_FIELDS:
        f["evidence"].pop(k, None)
    return f


def texts(message) -> str:
    out = [message["text"]]
    for b in message["blocks"]:
        out += [b["text"]["text"]] if b["type"] == "section" and "text" in b else []
        out += [f["text"] for f in b.get("fields", [])]
    return "\n".join(out)


def time_lag_field(message) -> str:
    (field,) = [f["text"] for b in message["blocks"] for f in b.get("fields", []) if f["text"].startswith("*Time lag*")]
    return field


# ---------------------------------------------------------------- Slack

def test_first_message_shows_exact_time_lag_catch_up_data_loss_and_stuck_record():
    msg = render_incident(stalled(), None)
    assert time_lag_field(msg) == "*Time lag*\n40m 00s (exact, from the record's timestamp)"
    text = texts(msg)
    assert "*Catch-up:* never at current rates (consuming 12.0 of 40.0 msg/s)" in text
    assert "*Data loss:* retention will delete unread records in ~1h05m (partitions 0, 3)" in text
    assert ("*Stuck record* (partition 2): offset 120, key #3fa9c0d1e2f3a4b5, 2,048 bytes, "
            "headers traceparent,retry, produced 2026-11-21T01:14:00Z") in text


def test_thread_reply_shows_the_forecasts_too():
    f = stalled(catch_up={"state": "clearing", "seconds": 725},
                data_loss={"state": "already", "seconds": None, "partitions": [1], "retention_ms": 3_600_000,
                           "retention_bytes": None, "basis": "log_start"})
    text = texts(render_update(f, ["severity warning -> critical"]))
    assert "*Catch-up:* in 12m at current rates" in text
    assert "*Data loss:* already lost on partition 1" in text
    assert "*Stuck record* (partition 2): offset 120" in text


@pytest.mark.parametrize("seconds, shown", [
    (0.4, "in under a minute"),  # never "in 0s": within a snapshot interval that is now
    (725, "in 12m"),             # a forecast is rounded to the minute
    (3900, "in 1h05m"),
    (2 * 86400 + 3 * 3600, "in 2d03h"),
])
def test_catch_up_durations_read_like_the_job_summaries(seconds, shown):
    text = texts(render_incident(stalled(catch_up={"state": "clearing", "seconds": seconds}), None))
    assert f"*Catch-up:* {shown} at current rates" in text


def test_lower_bound_time_lag_says_at_least_in_the_field_and_the_table():
    status = [{"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": 2, "lag": 11_000,
               "time_lag_seconds": 1800.0, "time_lag_lower_bound": True, "time_lag_source": "lower_bound",
               "status": "STALL", "consume_rate": 0.0, "produce_rate": 10.0},
              {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": 0, "lag": 5,
               "time_lag_seconds": 1.0, "time_lag_lower_bound": False, "time_lag_source": "interpolated",
               "status": "OK", "consume_rate": 10.0, "produce_rate": 10.0}]
    f = with_partition_status(stalled(time_lag_seconds=1800.0, max_time_lag_seconds=1800.0,
                                      time_lag_source="lower_bound", time_lag_lower_bound=True), status)
    msg = render_incident(f, None)
    assert time_lag_field(msg) == "*Time lag*\nat least 30m 00s (older than the window)"
    table = next(t for t in texts(msg).split("```") if "PARTITION" in t).strip().splitlines()
    assert "≥30m 00s" in table[1] and table[1].split()[2] == "2"
    assert "≥" not in table[2]  # interpolated: the usual estimate, unmarked


def test_the_focus_source_is_not_pinned_on_another_partitions_worse_time_lag():
    # Focus partition 2 (most lag) was read exactly at 40m, but partition 5 is 50m behind:
    # the field shows 50m, and nothing says where that one came from.
    msg = render_incident(stalled(max_time_lag_seconds=3000.0), None)
    assert time_lag_field(msg) == "*Time lag*\n50m 00s"
    # With status rows the shown partition's own source is known.
    status = [{"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": 5, "lag": 10,
               "time_lag_seconds": 3000.0, "time_lag_source": "lower_bound", "time_lag_lower_bound": True}]
    msg = render_incident(with_partition_status(stalled(max_time_lag_seconds=3000.0), status), None)
    assert time_lag_field(msg) == "*Time lag*\nat least 50m 00s (older than the window)"


@pytest.mark.parametrize("data_loss, retention_loss_partitions, shown", [
    # From retention.ms the forecast is the earliest a segment can go, not a certainty.
    ({"state": "at_risk", "seconds": 3900, "partitions": [3], "basis": "retention_ms"}, [],
     "retention can start deleting unread records in ~1h05m (partition 3)"),
    ({"state": "at_risk", "seconds": 20, "partitions": [3], "basis": "log_start"}, [],
     "retention will delete unread records in under a minute (partition 3)"),
    # "already" names the partitions that lost data, not those only at risk beside them.
    ({"state": "already", "seconds": None, "partitions": [1, 3], "basis": None}, [1],
     "already lost on partition 1"),
    ({"state": "already", "seconds": None, "partitions": [1, 3], "basis": None}, None,
     "already lost on partitions 1, 3"),
])
def test_data_loss_line(data_loss, retention_loss_partitions, shown):
    f = stalled(data_loss=data_loss, retention_loss_partitions=retention_loss_partitions)
    assert f"*Data loss:* {shown}\n" in texts(render_incident(f, None)) + "\n"


def test_a_record_that_could_not_be_read_says_why():
    f = stalled(committed_record={"offset": None, "timestamp": None, "key_sha256": None, "size": None,
                                  "headers": None, "error": "fetch timed out after 10 s"})
    text = texts(render_incident(f, None))
    assert "*Stuck record* (partition 2): not read: fetch timed out after 10 s" in text


def test_a_record_without_key_size_or_headers_names_only_what_is_known():
    f = stalled(committed_record={"offset": 7, "timestamp": None, "key_sha256": None, "size": None,
                                  "headers": [], "error": None})
    line = next(ln for ln in texts(render_incident(f, None)).splitlines() if "Stuck record" in ln)
    assert line.endswith("(partition 2): offset 7, no key")


def test_stuck_record_only_for_a_stalled_consumer():
    f = stalled(committed_record=RECORD)
    f["diagnosis"] = "slow_consumer"
    assert "Stuck record" not in texts(render_incident(f, None))


@pytest.mark.parametrize("catch_up, data_loss", [
    ({"state": "caught_up", "seconds": 0}, {"state": "safe", "seconds": None, "partitions": []}),
    ({"state": "unknown", "seconds": None}, {"state": "unknown", "seconds": None, "partitions": []}),
])
def test_nothing_to_act_on_says_nothing(catch_up, data_loss):
    f = stalled(catch_up=catch_up, data_loss=data_loss, committed_record=None)
    text = texts(render_incident(f, None))
    assert "Catch-up" not in text and "Data loss" not in text and "Stuck record" not in text


def test_a_lag_holding_steady_says_so_not_never():
    # forecast.py F2: consuming 39.9 of 40.0 msg/s is keeping pace, not "never"
    f = stalled(catch_up={"state": "steady", "seconds": None}, consume_rate=39.9, produce_rate=40.0)
    text = texts(render_incident(f, None))
    assert "*Catch-up:* lag holding steady at current rates\n" in text + "\n"
    assert "never" not in text


@pytest.mark.parametrize("retention_ms, retention_bytes, shown", [
    (604_800_000, -1, "none within 7d at current rates"),  # F3: how far it looked, never a date past it
    (-1, -1, "none expected at current rates"),            # nothing is ever deleted
])
def test_safe_says_how_far_the_forecast_looked(tmp_path, retention_ms, retention_bytes, shown):
    loss = {"state": "safe", "seconds": None, "partitions": [], "retention_ms": retention_ms,
            "retention_bytes": retention_bytes, "basis": "beyond_horizon", "horizon_seconds": 604_800.0}
    f = stalled(data_loss=loss)
    assert "Data loss" not in texts(render_incident(f, None))  # nothing to act on in Slack
    seed(tmp_path, [f], status_rows())
    assert facts(card(client_for(tmp_path).get("/").text))["Data loss"] == shown


def test_a_commit_above_the_log_end_is_not_said_to_have_gone_backwards():
    # classify.py case 10: the log end never moved; the commit is above it
    f = stalled(offset_reset_partitions=[0, 2], commit_above_partitions=[0], log_end_fell_partitions=[2])
    lines = [ln for ln in texts(render_incident(f, None)).splitlines() if ":rewind:" in ln]
    assert lines == [
        ":rewind: Committed offset above the log end on partition(s) 0 (topic recreated, or offsets set by "
        "hand): the group will reset per auto.offset.reset or read nothing.",
        ":rewind: Log end offset went backwards (topic recreated or truncated?) on partition(s) 2: lag there is "
        "not comparable across the window."]
    f = stalled(offset_reset_partitions=[0], commit_above_partitions=[0], log_end_fell_partitions=[])
    assert "went backwards" not in texts(render_incident(f, None))


@pytest.mark.parametrize("consume", [50.0, 39.9])  # above, or within the noise band of, 40 produced
def test_never_leaves_out_rates_that_contradict_it(consume):
    text = texts(render_incident(stalled(consume_rate=consume, produce_rate=40.0), None))
    assert "*Catch-up:* never at current rates\n" in text + "\n" and "consuming" not in text


def test_old_findings_render_exactly_as_before():
    f = stalled()
    old = old_finding(f)
    # New fields present but null are the same as absent ...
    nulls = copy.deepcopy(old)
    nulls["evidence"].update({k: None for k in NEW_FIELDS})
    for render in (lambda x: render_incident(x, None), lambda x: render_update(x, ["lag grew"])):
        assert render(nulls) == render(old)
        text = texts(render(old))
        assert not re.search(r"Catch-up|Data loss|Stuck record|exact|at least|≥", text)
        assert "*Time lag*\n40m 00s" in text
    # ... and the new ones do change the message (the comparison above could fail).
    assert render_incident(f, None) != render_incident(old, None)


def test_header_names_and_errors_from_a_broker_cannot_ping_or_forge_a_line():
    f = stalled(committed_record={**RECORD, "headers": ["<!channel>", "x\n:large_green_circle: *Recovered*"]})
    text = texts(render_incident(f, None))
    assert "<!channel>" not in text and "headers &lt;!channel&gt;,x :large_green_circle:" in text
    assert "\n:large_green_circle:" not in text
    f = stalled(committed_record={"offset": None, "error": "broker <@U1> said\nno"})
    text = texts(render_incident(f, None))
    assert "<@U1>" not in text and "not read: broker &lt;@U1&gt; said no" in text


# ---------------------------------------------------------------- lag page and report

def seed(root: Path, findings, status_rows) -> Path:
    run = root / "findings" / "scheduled__r1"
    run.mkdir(parents=True)
    (run / "findings.jsonl").write_text("".join(json.dumps(f) + "\n" for f in findings))
    (run / "partition_status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in status_rows))
    (run / "run.json").write_text(json.dumps({"dag_id": "kafka_lag_health_sweep", "run_id": "r1",
                                              "planned_at": "2026-11-21T10:31:00+00:00"}))
    return run


def status_rows(lower_bound_partition=2):
    return [{"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": p,
             "status": "STALL" if p == 2 else "OK", "lag": 11_000 if p == 2 else 5,
             "time_lag_seconds": 2400.0 if p == 2 else 1.0,
             "time_lag_lower_bound": p == lower_bound_partition,
             "time_lag_source": "lower_bound" if p == lower_bound_partition else "record",
             "consume_rate": 0.0, "produce_rate": 10.0} for p in range(4)]


def card(html: str) -> str:
    return html[html.index('data-group="orders"'):]


def facts(html: str) -> dict[str, str]:
    block = html[html.index('<dl class="facts"'):]
    block = block[:block.index("</dl>")]
    return {dt: re.sub(r"<[^>]+>", "", dd) for dt, dd in re.findall(r"<dt>([^<]+)</dt><dd[^>]*>(.*?)</dd>", block)}


def test_page_shows_catch_up_data_loss_and_the_time_lag_source(tmp_path):
    seed(tmp_path, [stalled(time_lag_source="lower_bound", time_lag_lower_bound=True)], status_rows())
    html = card(client_for(tmp_path).get("/").text)
    shown = facts(html)
    assert shown["Max time lag"] == "at least 40m 00s (older than the window)"
    assert shown["Catch-up"] == "never at current rates (consuming 12.0 of 40.0 msg/s)"
    assert shown["Data loss"] == "retention will delete unread records in ~1h05m (partitions 0, 3)"
    assert '<div class="data-loss at_risk">' in html  # drawn in the critical colour
    row2 = re.search(r"<td>2</td>.*?</tr>", html, re.S).group(0)
    assert ">≥40m 00s</td>" in row2 and "older than the window" in row2
    row0 = re.search(r"<td>0</td>.*?</tr>", html, re.S).group(0)
    assert 'title="exact, from the timestamp of the record at the committed offset">1s</td>' in row0


def test_page_shows_quiet_states_in_words_never_as_zero(tmp_path):
    f = stalled(catch_up={"state": "caught_up", "seconds": 0},
                data_loss={"state": "safe", "seconds": None, "partitions": [], "retention_ms": -1,
                           "retention_bytes": -1, "basis": None})
    seed(tmp_path, [f], status_rows())
    shown = facts(card(client_for(tmp_path).get("/").text))
    assert shown["Catch-up"] == "caught up" and shown["Data loss"] == "none expected at current rates"


def test_compacted_topic_says_retention_does_not_apply_on_the_page_not_in_slack(tmp_path):
    from lagdoctor.metrics import data_loss_seconds

    loss = {"state": "not_applicable", "seconds": None, "partitions": [], "retention_ms": 3_600_000,
            "retention_bytes": -1, "basis": "compacted topic: retention.ms does not delete unread records",
            "cleanup_policy": "compact"}
    f = stalled(data_loss=loss)
    assert "Data loss" not in texts(render_incident(f, None))  # nothing to act on
    assert data_loss_seconds([f]) is None  # the gauge is absent, never 0
    seed(tmp_path, [f], status_rows())
    shown = facts(card(client_for(tmp_path).get("/").text))
    assert shown["Data loss"] == "none from retention.ms: compacted topic (retention.ms does not delete unread records)"


def test_page_for_an_old_run_has_no_forecast(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "time_lag_source"} | {"time_lag_lower_bound": False}
            for r in status_rows()]
    seed(tmp_path, [old_finding(stalled())], rows)
    html = card(client_for(tmp_path).get("/").text)
    shown = facts(html)
    assert "Catch-up" not in shown and "Data loss" not in shown
    assert shown["Max time lag"] == "40m 00s"
    table = html.split("<table")[1].split("</table>")[0]
    assert "≥" not in table and "title=\"exact" not in table


def report_of(tmp_path, findings, rows) -> str:
    run = seed(tmp_path, findings, rows)
    (path,) = write_incident_report(str(run), settings=Settings(data_root=str(tmp_path)), base_url="")
    return Path(path).read_text(encoding="utf-8")


def test_report_shows_the_stuck_record_forecasts_and_retention(tmp_path):
    html = report_of(tmp_path, [stalled()], status_rows(lower_bound_partition=None))
    section = html[html.index('<section class="stuck-record">'):]
    section = section[:section.index("</section>")]
    assert "Stuck record (partition 2)" in section
    shown = facts(section)
    assert shown == {"Offset": "120", "Key (SHA-256, first 16 hex)": "3fa9c0d1e2f3a4b5", "Value size": "2,048 bytes",
                     "Header names": "traceparent, retry", "Produced": "2026-11-21T01:14:00Z"}
    top = facts(html)
    assert top["Max time lag"] == "40m 00s (exact, from the record&#39;s timestamp)"
    assert top["Catch-up"].startswith("never at current rates")
    assert top["Data loss"].endswith("in ~1h05m (partitions 0, 3)")
    assert top["Retention"] == "retention.ms 7d · retention.bytes infinite"
    assert top["Data loss estimated"] == "from how fast the log start offset advances"


def test_report_says_why_the_stuck_record_was_not_read(tmp_path):
    f = stalled(committed_record={"offset": None, "timestamp": None, "key_sha256": None, "size": None,
                                  "headers": None, "error": "<b>no</b> fetch permission"})
    html = report_of(tmp_path, [f], status_rows())
    assert "Not read: &lt;b&gt;no&lt;/b&gt; fetch permission" in html
    assert "<dt>Offset</dt>" not in html


def test_report_of_an_old_run_has_no_stuck_record_or_forecast(tmp_path):
    html = report_of(tmp_path, [old_finding(stalled())], status_rows(lower_bound_partition=None))
    assert "stuck-record" not in html
    assert not re.search(r"<dt>(Catch-up|Data loss|Retention)</dt>", html)


def test_a_failed_group_listing_shows_on_the_page_without_a_group_link(tmp_path):
    listing = {"cluster": "prod", "group_id": "", "topic": "", "partitions": [], "diagnosis": "healthy",
               "pattern": "flat", "severity": "warning",
               "summary": "Incomplete data: 1 read failed (group: group listing: Broker: Coordinator load in progress "
                          "(COORDINATOR_LOAD_IN_PROGRESS)); the cluster's group listing failed: groups may be "
                          "missing from this run",
               "evidence": {"data_complete": False, "read_error_count": 1,
                            "read_errors": ["group: group listing: Broker: Coordinator load in progress"]},
               "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"}
    seed(tmp_path, [stalled(), listing], status_rows())
    page = client_for(tmp_path).get("/").text
    assert "the cluster&#39;s group listing failed: groups may be missing from this run" in page
    assert re.findall(r'href="[^"]*/group/prod/[^"]*"', page) == ['href="/group/prod/orders"']
