"""Block Kit rendering: what an on-call engineer sees in Slack for a finding."""

from __future__ import annotations

import json
import re

import pytest

from lagdoctor.notify.render import (
    DESCRIBE_COLUMNS,
    render_action_result,
    render_incident,
    render_run_header,
    render_recovery,
    render_update,
    worst_partitions,
)


def finding(**kw):
    rows = [
        {"partition": 0, "committed_offset": 1000, "log_end_offset": 1010, "lag": 10, "member_id": "consumer-1-aaa",
         "host": "/10.0.0.1", "client_id": "orders-1", "time_lag_seconds": 2, "consume_rate": 50.0, "produce_rate": 50.0},
        {"partition": 3, "committed_offset": 41, "log_end_offset": 90_041, "lag": 90_000, "member_id": "consumer-2-bbb",
         "host": "/10.0.0.7", "client_id": "orders-2", "time_lag_seconds": 3723, "consume_rate": 0.0, "produce_rate": 25.0},
        {"partition": 5, "committed_offset": 500, "log_end_offset": 5500, "lag": 5000, "member_id": "consumer-2-bbb",
         "host": "/10.0.0.7", "client_id": "orders-2", "time_lag_seconds": 200, "consume_rate": 1.5, "produce_rate": 25.0},
    ]
    base = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partitions": [3, 5],
            "diagnosis": "partition_imbalance", "pattern": "steady_climb", "severity": "critical",
            "summary": "Lag is concentrated on 2 of 6 partitions, both owned by /10.0.0.7",
            "evidence": {"partitions": rows, "lag_total": 95_010, "time_lag_seconds": 3723},
            "window_start": "2026-11-21T10:00:00Z", "window_end": "2026-11-21T10:30:00Z"}
    return {**base, **kw}


PLAN = {"runbook": "partition_imbalance", "next_steps": ["Check the owner of the hot partitions."],
        "actions": [{"action": "restart_consumers", "requires_approval": True, "irreversible": False,
                     "description": "rollout restart"}]}


def all_text(message) -> str:
    return json.dumps(message["blocks"]) + message["text"]


def section_texts(message):
    return [b["text"]["text"] for b in message["blocks"] if b["type"] == "section" and "text" in b]


def code_block(message) -> str:
    (text,) = [t for t in section_texts(message) if "```" in t]
    return text.split("```")[1].strip("\n")


def test_incident_message_has_header_summary_fields_evidence_steps_actions():
    msg = render_incident(finding(), PLAN, run_id="scheduled__2026-11-21T10:30:00")
    types = [b["type"] for b in msg["blocks"]]
    assert types[0] == "header"
    header = msg["blocks"][0]["text"]["text"]
    assert header.startswith(":red_circle:") and "Partition imbalance" in header and "orders" in header
    texts = "\n".join(section_texts(msg))
    assert "Lag is concentrated on 2 of 6 partitions" in texts
    fields = " ".join(f["text"] for b in msg["blocks"] for f in b.get("fields", []))
    for expected in ("prod", "orders.v1", "steady_climb", "1h 02m", "95,010"):
        assert expected in fields
    assert "Check the owner of the hot partitions." in texts
    assert "restart_consumers" in texts and "needs approval" in texts
    assert "orders" in msg["text"] and "partition_imbalance" in msg["text"]  # notification fallback


def test_evidence_table_is_shaped_like_kafka_consumer_groups_describe_worst_first():
    table = code_block(render_incident(finding(), PLAN)).splitlines()
    assert table[0].split()[: len(DESCRIBE_COLUMNS)] == list(DESCRIBE_COLUMNS)
    partitions = [line.split()[2] for line in table[1:]]
    assert partitions == ["3", "5", "0"]
    worst = table[1].split()
    # CURRENT-OFFSET, LOG-END-OFFSET, LAG, CONSUMER-ID, HOST, CLIENT-ID, then time lag and rates
    assert worst[3:9] == ["41", "90041", "90000", "consumer-2-bbb", "/10.0.0.7", "orders-2"]
    assert "1h 02m" in table[1]
    # columns line up: every row starts its PARTITION column at the same position
    starts = {line.index(line.split()[2], len(line.split()[0]) + 1) for line in table[1:]}
    assert len(starts) == 1


def test_missing_evidence_shows_dashes_and_still_renders():
    msg = render_incident(finding(evidence={}, partitions=[4]), None)
    table = code_block(msg).splitlines()
    assert table[1].split()[:4] == ["orders", "orders.v1", "4", "-"]
    fields = " ".join(f["text"] for b in msg["blocks"] for f in b.get("fields", []))
    assert "*Time lag*\n-" in fields


def test_only_the_worst_five_partitions_are_shown():
    rows = [{"partition": p, "lag": p * 10} for p in range(12)]
    assert [r["partition"] for r in worst_partitions(finding(evidence={"partitions": rows}))] == [11, 10, 9, 8, 7]


def test_group_and_topic_names_are_escaped_in_mrkdwn():
    msg = render_incident(finding(group_id="<!channel> pay&ments", topic="a>b<@U123>"), PLAN)
    mrkdwn = json.dumps([b for b in msg["blocks"] if b["type"] != "header"]) + msg["text"]
    assert "<!channel>" not in mrkdwn and "<@U123>" not in mrkdwn
    assert "&lt;!channel&gt; pay&amp;ments" in mrkdwn
    assert "a&gt;b&lt;@U123&gt;" in mrkdwn
    # plain_text header is not mrkdwn: shown as written, no entity noise
    assert "<!channel> pay&ments" in msg["blocks"][0]["text"]["text"]


def test_backticks_and_newlines_in_names_cannot_break_the_code_block():
    msg = render_incident(finding(group_id="evil```\n*bold*", topic="t`x"), PLAN)
    (evidence,) = [t for t in section_texts(msg) if "```" in t]
    assert evidence.count("```") == 2
    body = code_block(msg)
    assert all(len(line.split()) >= 9 for line in body.splitlines())  # each row still one line


def test_long_ids_and_many_rows_stay_within_slack_limits():
    rows = [{"partition": p, "lag": 1000 - p, "member_id": "consumer-" + "x" * 200, "host": "/" + "h" * 100}
            for p in range(50)]
    msg = render_incident(finding(group_id="g" * 300, evidence={"partitions": rows}), PLAN)
    assert len(msg["blocks"][0]["text"]["text"]) <= 150
    assert all(len(t) <= 3000 for t in section_texts(msg))
    assert len(msg["blocks"]) <= 50


def test_recovery_and_action_replies():
    rec = render_recovery(finding(diagnosis="healthy", group_id="a&b"), diagnosis="partition_imbalance",
                          duration_seconds=1500)
    assert "Recovered" in rec["blocks"][0]["text"]["text"] and "25m 00s" in rec["blocks"][0]["text"]["text"]
    assert "a&amp;b" in rec["blocks"][0]["text"]["text"]
    reply = render_action_result({"action": "add_partitions", "status": "awaiting_approval",
                                  "message": "needs approval: grow orders.v1 by 6 partitions",
                                  "warning": "Irreversible: partitions can never be removed."})
    text = reply["blocks"][0]["text"]["text"]
    assert "waiting for approval" in text and "Irreversible" in text
    assert re.search(r"add_partitions", reply["text"])


ENGINE_EVIDENCE = {  # the flat struct lagdoctor.diagnosis.classify writes
    "lag": 12_000, "partition_count": 6, "partition": 2, "partition_lag": 11_000, "owner_member_id": "c-9",
    "owner_client_id": "orders-9", "owner_host": "/10.0.0.9", "partition_produce_rate": 40.0,
    "partition_consume_rate": 2.0, "time_lag_seconds": 300.0, "max_time_lag_seconds": 301.0,
}


def test_engine_flat_evidence_fills_the_focus_row_and_totals():
    msg = render_incident(finding(evidence=ENGINE_EVIDENCE, partitions=[2, 4]), None)
    table = code_block(msg).splitlines()
    # focus partition's time lag (300 s) in the row; the group's worst (301 s) in the field
    assert table[1].split()[2:] == ["2", "-", "-", "11000", "c-9", "/10.0.0.9", "orders-9", "5m", "00s", "40.0", "2.0"]
    assert table[2].split()[2] == "4"
    fields = " ".join(f["text"] for b in msg["blocks"] for f in b.get("fields", []))
    assert "12,000 messages" in fields and "5m 01s" in fields


def test_partition_status_rows_fill_the_table_for_this_group_only():
    from lagdoctor.notify.render import with_partition_status

    status = [
        {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": 2, "lag": 11_000,
         "time_lag_seconds": 300.0, "consume_rate": 2.0, "produce_rate": 40.0, "status": "STALL"},
        {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partition": 0, "lag": 5,
         "time_lag_seconds": 1.0, "consume_rate": 40.0, "produce_rate": 40.0, "status": "OK"},
        {"cluster": "prod", "group_id": "other", "topic": "orders.v1", "partition": 1, "lag": 10**9,
         "time_lag_seconds": 1.0, "consume_rate": 0.0, "produce_rate": 0.0, "status": "ERR"},
    ]
    f = with_partition_status(finding(evidence=ENGINE_EVIDENCE), status)
    rows = [line.split() for line in code_block(render_incident(f, None)).splitlines()[1:]]
    assert [r[2] for r in rows] == ["2", "0"]
    assert rows[0][6:8] == ["c-9", "/10.0.0.9"] and rows[1][6] == "-"


# ---------------------------------------------------------------- hostile names, every message

HOSTILE = {
    "channel ping": "<!channel>",
    "user mention": "<@U123>",
    "fake link": "<https://evil.example|click>",
    "link separator": "a|b",
    "ampersand entity": "a&lt;b",
    "backticks close a code span": "or`ders``",
    "bold markup": "*bold*",
    "newline forges a line": "orders\n:large_green_circle: *Recovered*",
}


def _hostile_messages(h: str):
    """Every render_* function that reaches Slack, with `h` in each value a broker or user chooses."""
    from lagdoctor.notify.render import (
        render_approval_prompt,
        render_data_incomplete,
        render_failure,
        render_failure_recovery,
        render_quarantine_notice,
        render_run_header,
        render_update,
    )

    f = finding(group_id=h, topic=h, cluster=h, summary=f"lag on {h}",
                evidence={"partitions": finding()["evidence"]["partitions"], "data_complete": False,
                          "read_errors": [f"OffsetFetch {h}: timed out"], "offset_reset_partitions": [3]})
    record = {"status": "awaiting_approval", "action": "restart_consumers", "group_id": h, "topic": h, "cluster": h,
              "message": f"needs approval: restart {h}", "warning": f"careful with {h}"}
    # Header names and a read error come from producers and brokers (issue 10's stuck record).
    stuck = finding(group_id=h, topic=h, cluster=h, diagnosis="stalled_consumer", summary=f"stuck on {h}",
                    evidence={"partition": 3, "catch_up": {"state": "never", "seconds": None},
                              "data_loss": {"state": "at_risk", "seconds": 60, "partitions": [3]},
                              "committed_record": {"offset": 1, "key_sha256": "00ff", "headers": [h, "retry"],
                                                   "timestamp": h, "size": 2, "error": None}})
    unread = finding(group_id=h, topic=h, cluster=h, diagnosis="stalled_consumer",
                     evidence={"partition": 3, "committed_record": {"offset": None, "error": f"fetch {h} failed"}})
    return {
        "render_incident": render_incident(f, PLAN, run_id=h),
        "render_incident stuck record": render_incident(stuck, None, run_id=h),
        "render_incident unread record": render_incident(unread, None, run_id=h),
        "render_update": render_update(f, [f"severity warning -> critical on {h}"], run_id=h),
        "render_recovery": render_recovery(f, diagnosis="partition_imbalance", duration_seconds=60),
        "render_action_result": render_action_result(record),
        "render_failure": render_failure(dag_id=h, task_id=h, run_id=h, reason=f"cannot reach {h}"),
        "render_failure_recovery": render_failure_recovery(dag_id=h, run_id=h, failed_runs=2),
        "render_run_header": render_run_header([f], scope=f"prod / {h}", run_id=h),
        "render_data_incomplete": render_data_incomplete(f, "partition_imbalance"),
        "render_quarantine_notice": render_quarantine_notice([{"path": f"/s/{h}.parquet", "moved_to": f"/q/{h}",
                                                               "reason": f"not Parquet: {h}"}]),
        "render_action_result approved, then blocked": render_action_result(
            {**record, "status": "blocked", "message": f"deny_list: {h}",
             "approval": {"by": h, "slack": f"slack:U1 ({h})", "chosen": [f"Approve 1: {h}"]}}),
        "render_approval_prompt per target": render_approval_prompt(
            f"lagdoctor: restart {h}?", None, approval_id=7, answer_url=None, targets=[
                {"key": "a", "option": f"Approve 1: {h}", "cluster": h, "group_id": h, "topic": h, "does": f"restart {h}",
                 "blocked": None},
                {"key": "b", "option": None, "cluster": h, "group_id": h, "topic": h, "does": "x",
                 "blocked": f"deny_list: {h}"}]),
        "slack answer line": {"text": _answer_text(h),
                              "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": _answer_text(h)}}]},
    }


def _answer_text(h: str) -> str:
    from lagdoctor.notify.interactive import APPROVED, Click, _answer_text as answer

    row = {"task_id": h, "run_id": h, "targets": [
        {"option": f"Approve 1: {h}", "group_id": h, "cluster": h}, {"option": f"Approve 2: {h}", "group_id": h,
                                                                       "cluster": h}]}
    return answer(Click(user_id="U1", user_name=h, action_id="lagdoctor.approve", value="7:1"), row, APPROVED,
                  row["targets"][:1], h)


def test_slack_names_who_approved_what_was_then_blocked():
    record = {"status": "blocked", "action": "restart_consumers", "group_id": "orders", "cluster": "prod",
              "message": "deny_list: group matches deny pattern 'orders'",
              "approval": {"by": "alice", "slack": "slack:U1 (alice)", "chosen": ["Approve 1: orders on prod / t"]}}
    text = render_action_result(record)["blocks"][0]["text"]["text"]
    assert text.endswith("\n:bust_in_silhouette: Approved by slack:U1 (alice) in Slack (Airflow user alice)")
    answered_in_airflow = {**record, "status": "rejected", "approval": {"by": "bob", "chosen": ["Reject all"]}}
    assert render_action_result(answered_in_airflow)["blocks"][0]["text"]["text"].endswith(
        "\n:bust_in_silhouette: Rejected in Airflow by bob")
    assert "bust_in_silhouette" not in render_action_result({**record, "approval": None})["blocks"][0]["text"]["text"]


def _mrkdwn_strings(message) -> list[str]:
    out = [message["text"]]
    for b in message["blocks"]:
        if b["type"] == "section":
            out += [b["text"]["text"]] if "text" in b else []
            out += [f["text"] for f in b.get("fields", [])]
        elif b["type"] == "context":
            out += [e["text"] for e in b["elements"]]
    return out


BENIGN = _hostile_messages("orders")


@pytest.mark.parametrize("name", sorted(BENIGN))
@pytest.mark.parametrize("label", sorted(HOSTILE))
def test_no_name_can_ping_link_break_code_or_forge_a_line(label, name):
    hostile = HOSTILE[label]
    message = _hostile_messages(hostile)[name]
    benign = _mrkdwn_strings(BENIGN[name])
    texts = _mrkdwn_strings(message)
    for text, plain in zip(texts, benign):
        # Slack's control characters only as escapes: no mention, no link, no stray entity.
        assert "<" not in text and ">" not in text, text
        assert not re.search(r"&(?!amp;|lt;|gt;)", text), text
        # A name adds no backtick: every code span the message opens, it closes.
        assert text.count("`") == plain.count("`"), text
        # A line break in a name never starts a line of its own.
        assert "\n:large_green_circle: *Recovered*" not in text
    # What was written is still there for a person to read.
    shown = hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")
    assert " ".join(shown.split()) in "\n".join(texts)
    if message["blocks"][0]["type"] == "header":
        assert "\n" not in message["blocks"][0]["text"]["text"]


def test_incomplete_data_is_said_plainly_with_at_most_five_failed_reads():
    errors = [f"ListOffsets orders.v1/{p}: timed out" for p in range(8)]
    f = finding(evidence={**finding()["evidence"], "data_complete": False, "read_errors": errors,
                          "read_error_count": 9, "offset_reset_partitions": [4, 7]})
    text = "\n".join(section_texts(render_incident(f, PLAN)))
    assert "Incomplete data" in text and "9 failed read(s)" in text
    shown = [e for e in errors if e in text]
    assert shown == errors[:5]
    assert "… and 4 more" in text
    assert "partition(s) 4, 7" in text and "went backwards" in text
    # A complete finding says nothing of the kind.
    assert "Incomplete" not in json.dumps(render_incident(finding(), PLAN))


def test_quarantine_notice_names_each_file_and_reason():
    from lagdoctor.notify.render import render_quarantine_notice

    msg = render_quarantine_notice([
        {"path": "/data/snapshots/cluster=prod/date=2026-11-21/a.parquet", "moved_to": "/data/_quarantine/a.parquet",
         "reason": "not a Parquet file"},
        {"path": "/data/snapshots/cluster=prod/date=2026-11-21/b.parquet", "moved_to": "/data/_quarantine/b.parquet",
         "reason": "column partition: int64, expected int32"},
    ])
    (text,) = section_texts(msg)
    assert "2 snapshot file(s) moved aside" in text and "ran on the rest" in text
    assert "`/data/snapshots/cluster=prod/date=2026-11-21/a.parquet`: not a Parquet file" in text
    assert "column partition: int64, expected int32" in text
    assert "2 unreadable snapshot file(s)" in msg["text"]


def test_an_action_awaiting_approval_says_how_to_act():
    msg = render_action_result({"status": "awaiting_approval", "action": "restart_consumers", "group_id": "orders-eu",
                                "cluster": "prod", "message": "needs approval: rollout restart mail/mailer"})
    (text,) = section_texts(msg)
    assert "trigger `kafka_lag_incident`" in text and "dry_run off" in text
    assert "group_pattern `orders\\-eu`" in text and "cluster `prod`" in text


# ---------------------------------------------------------------- issue 11: links, the broker's excuse said once

TANSU = "owner unknown (the broker lists no members)"


def _tansu(group: str) -> dict:
    return {"cluster": "prod", "group_id": group, "topic": "orders", "partitions": [0, 1],
            "diagnosis": "stalled_consumer", "pattern": "plateau", "severity": "critical",
            "summary": f"partition 0 stopped committing: no progress for 10m while lag grew to 500; {TANSU}",
            "evidence": {"lag": 500, "partitions": [{"partition": 0, "lag": 500}, {"partition": 1, "lag": 0}]}}


def _all_text(msg: dict) -> str:
    return json.dumps(msg["blocks"], ensure_ascii=False)


def test_the_brokers_missing_members_are_said_once_per_message():
    from lagdoctor.notify.render import OWNER_UNKNOWN, render_run_header

    for msg in (render_incident(_tansu("a"), None, run_id="r1"),
                render_update(_tansu("a"), ["severity warning → critical"]),
                render_run_header([_tansu("a"), _tansu("b"), _tansu("c")], scope="prod", run_id="r1")):
        text = _all_text(msg)
        assert text.count("the broker lists no members") == 1
        assert OWNER_UNKNOWN not in text  # the summaries keep "owner unknown", not the reason
    header = _all_text(render_run_header([_tansu("a"), _tansu("b")], scope="prod", run_id="r1"))
    assert header.lower().count("owner unknown") == 3  # each summary's, and the one note


def test_a_message_without_the_excuse_has_no_note():
    f = {**_tansu("a"), "summary": "lag grows; owner consumer-2 on 10.0.1.15"}
    assert "broker lists no members" not in _all_text(render_incident(f, None, run_id="r1"))


def test_first_message_and_updates_link_the_run_the_group_view_and_the_report(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    f = {**_tansu("orders eu"), "report_url": "https://airflow.example.com/lagdoctor/reports/r1/a.html"}
    run = "https://airflow.example.com/dags/kafka_lag_incident/runs/manual__2026-11-21T10%3A00%3A00%2B00%3A00"
    # a space is not a plain name: the query form, its & escaped as Slack asks
    group = "https://airflow.example.com/lagdoctor/group?cluster=prod&amp;group=orders%20eu"
    for msg in (render_incident(f, None, run_id="manual__2026-11-21T10:00:00+00:00", dag_id="kafka_lag_incident"),
                render_update(f, ["pattern plateau → spiky"], run_id="manual__2026-11-21T10:00:00+00:00",
                              dag_id="kafka_lag_incident")):
        text = _all_text(msg)
        assert f"<{run}|Airflow run>" in text
        assert f"<{group}|group view>" in text
        assert "<https://airflow.example.com/lagdoctor/reports/r1/a.html|HTML report>" in text


def test_no_base_url_no_links(monkeypatch):
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    monkeypatch.setattr("lagdoctor.web.links.airflow_base_url", lambda environ=None: None)
    text = _all_text(render_incident(_tansu("a"), None, run_id="r1", dag_id="kafka_lag_incident"))
    assert "Airflow run" not in text and "group view" not in text


@pytest.mark.parametrize("group_id", ["a`b'c & <d>", "line\nbreak", "two  spaces"])
def test_the_slack_message_s_command_pasted_into_bash_names_the_exact_group(group_id):
    """The runbook's `kafka-consumer-groups.sh ... --group` step as the posted message carries
    it: the code span holds no backtick or line break, and bash reads the exact group id from it."""
    import html
    import subprocess
    from pathlib import Path

    from lagdoctor.runbooks import plan_for_finding

    f = finding(group_id=group_id, diagnosis="slow_consumer", partitions=[])
    plan = plan_for_finding(f, Path(__file__).resolve().parent.parent / "runbooks")
    msg = render_incident(f, plan)
    (section,) = [b["text"]["text"] for b in msg["blocks"] if b.get("text") and "--describe --group" in b["text"]["text"]]
    span = re.search(r"`(kafka-consumer-groups\.sh --describe --group [^`\n]*)`", section).group(1)
    word = html.unescape(span).split("--group ", 1)[1]  # what Slack shows and a person copies
    out = subprocess.run(["bash", "-c", f'set -- {word}\nprintf %s "$1"'], capture_output=True, check=True)
    assert out.stdout.decode("utf-8") == group_id


def provisional_finding(**kw):
    return finding(partitions=[3], provisional=True, deciding_between=["partition_imbalance", "stalled_consumer"],
                   decided_by="2026-11-21T10:40:00Z", samples_needed=2,
                   undecided_because="the commit on partition 3 has stood still for 1m00s with data waiting", **kw)


def test_a_provisional_finding_says_so_in_its_first_line_and_names_no_cause():
    plan = {"runbook": "partition_imbalance", "next_steps": ["Waiting for the diagnosis: still deciding"], "actions": []}
    msg = render_incident(provisional_finding(), plan, run_id="r1")
    first = "orders: still deciding between partition imbalance and stalled consumer on orders.v1[3]; " \
            "will know at the first sweep after 10:40 UTC"
    assert msg["text"] == first  # the notification line
    header = msg["blocks"][0]["text"]["text"]
    assert "Still deciding" in header and "imbalance" not in header.lower()
    lead = section_texts(msg)[0]
    assert lead.startswith(":hourglass: *orders: still deciding between partition imbalance and stalled consumer")
    assert "will know at the first sweep after 10:40 UTC" in lead
    texts = "\n".join(section_texts(msg))
    assert "Evidence so far:_ Lag is concentrated on 2 of 6 partitions" in texts
    assert "stood still for 1m00s" in texts
    assert "Partition imbalance" not in all_text(msg)  # no confident cause anywhere
    run = render_run_header([provisional_finding()], scope="prod", run_id="r1")
    assert "*Still deciding* (partition imbalance and stalled consumer)" in all_text(run)
    hostile = render_incident(provisional_finding(group_id="<!channel> & co"), None, run_id="r1")
    assert hostile["text"].startswith("&lt;!channel&gt; &amp; co: still deciding")  # pings nobody
    # a decided finding renders as before
    decided = render_incident(finding(provisional=False), None, run_id="r1")
    assert "Partition imbalance" in decided["blocks"][0]["text"]["text"]


def test_when_a_provisional_finding_will_be_decided_is_never_promised_early():
    from lagdoctor.notify.render import decided_by_text

    # the rule's time is 10:40:20: the minute shown is 10:41, and it is the first sweep after it
    f = provisional_finding(window_end="2026-11-21T10:36:00Z")
    f["decided_by"] = "2026-11-21T10:40:20Z"
    assert decided_by_text(f) == "will know at the first sweep after 10:41 UTC"
    f["decided_by"] = "2026-11-22T00:00:05Z"  # past midnight: the date too
    assert decided_by_text(f) == "will know at the first sweep after 2026-11-22 00:01 UTC"
