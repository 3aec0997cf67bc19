"""Block Kit rendering: a finding (plus its runbook plan) -> a Slack message.

Renders only; never sends, never decides (threads.py decides, slack.py sends).
What it reads of a finding's evidence is listed in evidence.py; the words for
numbers, time lag and forecasts, and provisional findings come from
formatting.py, lag_text.py and provisional.py, which the page shares.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from lagdoctor.notify.buttons import approval_buttons, incident_buttons, target_buttons
from lagdoctor.notify.evidence import WORST_ROWS, evidence_of, lag_total, partition_rows, worst_partitions, worst_time_lag
from lagdoctor.notify.formatting import MAX_CELL, as_utc, fmt_duration, fmt_int, fmt_rate, one_line_id, parse_iso
from lagdoctor.notify.lag_text import forecast_text, table_time_lag, time_lag_source_of, time_lag_text
from lagdoctor.notify.provisional import (deciding_between_text, is_provisional, promise_time, promised_at,
                                          provisional_values)
from lagdoctor.notify.templates import (code_safe, escape_mrkdwn, mrkdwn_value, render, render_plain, shared_by_text,
                                        TEMPLATES)
from lagdoctor.notify.workload_text import workload_lines

# Importable from here, as before they moved to modules of their own.
from lagdoctor.notify.evidence import with_partition_status  # noqa: F401
from lagdoctor.notify.lag_text import (DATA_LOSS_BASIS, catch_up_text, data_loss_state,  # noqa: F401
                                       data_loss_text, is_lower_bound, retention_text, stuck_record_parts,
                                       stuck_record_text)
from lagdoctor.notify.provisional import decided_by_text, promise_overdue, promise_text  # noqa: F401

SEVERITY_EMOJI = {"critical": ":red_circle:", "warning": ":large_yellow_circle:", "ok": ":large_green_circle:"}
STATUS_EMOJI = {
    "dry_run": ":test_tube:", "blocked": ":no_entry:", "awaiting_approval": ":hourglass_flowing_sand:",
    "rejected": ":no_entry_sign:", "executed": ":white_check_mark:", "noop": ":heavy_minus_sign:",
    "failed": ":x:", "recommended": ":bulb:", "proposed": ":bulb:",
}
STATUS_WORDS = {
    "dry_run": "dry run", "blocked": "blocked", "awaiting_approval": "waiting for approval",
    "rejected": "rejected", "executed": "done", "noop": "nothing to do", "failed": "failed",
    "recommended": "recommended", "proposed": "proposed",
}
DESCRIBE_COLUMNS = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                    "CONSUMER-ID", "HOST", "CLIENT-ID")
EXTRA_COLUMNS = ("TIME-LAG", "IN/S", "OUT/S")
SECTION_LIMIT = 3000  # Slack's limit for a section's text
HEADER_LIMIT = 150


def _cell(value: Any) -> str:
    text = code_safe("-" if value is None or value == "" else value)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def evidence_table(finding: Mapping[str, Any], limit: int = WORST_ROWS) -> str:
    """A fixed-width table in a code block, columns as kafka-consumer-groups.sh --describe."""
    group, topic = finding.get("group_id"), finding.get("topic")
    lines = [DESCRIBE_COLUMNS + EXTRA_COLUMNS]
    for r in worst_partitions(finding, limit):
        current = r.get("committed_offset", r.get("current_offset"))
        lines.append(tuple(_cell(v) for v in (
            group, topic, r.get("partition"),
            current if current is not None else None, r.get("log_end_offset"), r.get("lag"),
            r.get("member_id") or r.get("consumer_id"), r.get("host"), r.get("client_id"),
        )) + (table_time_lag(r), fmt_rate(r.get("produce_rate")), fmt_rate(r.get("consume_rate"))))
    if len(lines) == 1:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = "\n".join(" ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)
    # Escaped after alignment so widths count what people see.
    return escape_mrkdwn(text)


def _title(diagnosis: str) -> str:
    return diagnosis.replace("_", " ").capitalize() if diagnosis else "Finding"


def _text_section(text: str) -> dict[str, Any]:
    if len(text) > SECTION_LIMIT:
        text = text[: SECTION_LIMIT - 1] + "…"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


# The job names no owner when the broker lists no group members (some
# Kafka-compatible brokers, missing DESCRIBE rights) and says why in every summary;
# a message says it once.
OWNER_UNKNOWN = "unknown (the broker lists no members)"
OWNER_UNKNOWN_NOTE = (":information_source: Owner unknown: the broker lists no members for this group "
                      "(as some Kafka-compatible brokers do), so no consumer can be named.")


def owner_unknown_once(text: Any) -> tuple[str, bool]:
    """``text`` with the broker's excuse cut to "unknown", and whether it was there."""
    value = "" if text is None else str(text)
    return value.replace(OWNER_UNKNOWN, "unknown"), OWNER_UNKNOWN in value


def _owner_note_block() -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": OWNER_UNKNOWN_NOTE}]}


def links_text(finding: Mapping[str, Any], *, dag_id: str | None, run_id: str) -> str:
    """`<run|Airflow run> · <group|group view> · <report|HTML report>`: each one only when it has a URL
    (an absolute one: Airflow's base URL must be configured, lagdoctor.web.links)."""
    from lagdoctor.web import links

    parts = [report_link(links.run_url(dag_id or "", run_id), "Airflow run") if dag_id and run_id else "",
             report_link(links.group_url(str(finding.get("cluster") or ""), str(finding.get("group_id") or "")),
                         "group view"),
             report_link(finding.get("report_url"))]
    return " · ".join(p for p in parts if p)


def _values(finding: Mapping[str, Any]) -> dict[str, Any]:
    diagnosis = one_line_id(finding.get("diagnosis"), "")
    severity = str(finding.get("severity") or "")
    summary, owner_unknown = owner_unknown_once(finding.get("summary"))
    return {
        "owner_unknown": owner_unknown,
        "group": one_line_id(finding.get("group_id")), "topic": one_line_id(finding.get("topic")),
        "cluster": one_line_id(finding.get("cluster")), "diagnosis": diagnosis,
        "diagnosis_title": _title(diagnosis), "severity": severity or "-",
        "severity_word": severity.upper() or "FINDING",
        "emoji": SEVERITY_EMOJI.get(severity, ":grey_question:"),
        "pattern": finding.get("pattern") or "-", "summary": summary,
        "time_lag": _time_lag_shown(finding), "lag_total": fmt_int(lag_total(finding)),
    }


def _time_lag_shown(finding: Mapping[str, Any]) -> str:
    seconds = worst_time_lag(finding)
    return time_lag_text(seconds, time_lag_source_of(seconds, [*partition_rows(finding), evidence_of(finding)]))


def action_lines(actions: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per planned action or action record (``status`` present) ."""
    out = []
    for a in actions:
        status = a.get("status") or "proposed"
        state = STATUS_WORDS.get(status, status)
        if status == "proposed":
            flags = [w for w, on in (("needs approval", a.get("requires_approval")), ("irreversible", a.get("irreversible"))) if on]
            state += f" ({', '.join(flags)})" if flags else ""
        out.append(render("action_line", emoji=STATUS_EMOJI.get(status, ":grey_question:"), action=a.get("action", "?"),
                          state=state, description=a.get("description") or a.get("message") or ""))
    return out


MAX_READ_ERRORS = 5


def incomplete_data_text(finding: Mapping[str, Any]) -> str:
    """What a person must know when the verdict rests on incomplete data; "" when it does not.

    Reads evidence ``data_complete`` (false), ``read_errors`` (one line each,
    the first MAX_READ_ERRORS shown), ``read_error_count`` and
    ``offset_reset_partitions`` (log end offsets that went backwards; in newer findings
    ``log_end_fell_partitions`` and ``commit_above_partitions`` say which) and
    ``hanging_transaction_partitions`` (an open transaction holds the last stable offset).
    """
    ev = evidence_of(finding)
    lines = []
    if ev.get("data_complete") is False:
        errors = [str(e) for e in ev.get("read_errors") or [] if e is not None]
        count = ev.get("read_error_count")
        count = count if isinstance(count, int) and not isinstance(count, bool) and count >= len(errors) else len(errors)
        lines.append(render("incomplete_data", count=count))
        lines += [f"• `{escape_mrkdwn(code_safe(e))}`" for e in errors[:MAX_READ_ERRORS]]
        if count > min(len(errors), MAX_READ_ERRORS):
            lines.append(f"… and {count - min(len(errors), MAX_READ_ERRORS)} more")
    resets = [p for p in ev.get("offset_reset_partitions") or [] if p is not None]
    if "commit_above_partitions" in ev or "log_end_fell_partitions" in ev:
        # said apart (classify.py case 10): only a log end that fell "went backwards"
        resets = [p for p in ev.get("log_end_fell_partitions") or [] if p is not None]
        above = [p for p in ev.get("commit_above_partitions") or [] if p is not None]
        if above:
            lines.append(render("commit_above", partitions=", ".join(one_line_id(p) for p in above)))
    if resets:
        lines.append(render("offset_reset", partitions=", ".join(one_line_id(p) for p in resets)))
    hanging = [p for p in ev.get("hanging_transaction_partitions") or [] if p is not None]
    if hanging and not ev.get("transaction_blocked_partitions"):  # else the summary says it already
        lines.append(render("open_transaction", partitions=", ".join(one_line_id(p) for p in hanging)))
    return "\n".join(lines)


# ---------------------------------------------------------------- messages

def render_incident(finding: Mapping[str, Any], plan: Mapping[str, Any] | None = None,
                    *, run_id: str = "", actions: Sequence[Mapping[str, Any]] | None = None,
                    dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """The first message of an incident thread: ``{"text": fallback, "blocks": [...]}``.

    ``plan`` is ``lagdoctor.runbooks.Plan.as_dict()`` (next steps, proposed actions);
    ``actions`` are action records to show instead of the plan's proposals.
    ``dag_id`` links the Airflow run; ``controls`` (the incident key's digest)
    adds Acknowledge / Snooze 1 h (lagdoctor.notify.interactive).
    """
    v = _values(finding)
    plan = plan or {}
    provisional = is_provisional(finding)
    if provisional:
        # No cause in the first line until one is decided: what is open, and until when.
        pv = {**provisional_values(finding), "summary": v["summary"]}
        header = render_plain(TEMPLATES["header_provisional"], **v)
        lead = [_text_section(render("provisional", **pv)), _text_section(render("provisional_evidence", **pv))]
    else:
        header = render_plain(TEMPLATES["header"], **v)
        lead = [_text_section(render("summary", **v))]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header[:HEADER_LIMIT], "emoji": True}},
        *lead,
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": render(name, **v)}
            for name in ("field_cluster", "field_topic", "field_pattern", "field_time_lag", "field_lag", "field_severity")
        ]},
    ]
    blocks.extend(_explaining_sections(finding))
    table = evidence_table(finding)
    if table:
        blocks.append(_text_section(render("evidence_title") + "\n```\n" + table + "\n```"))
    blocks.extend(_plan_blocks(plan, actions if actions is not None else plan.get("actions") or []))
    window = " → ".join(str(finding[k]) for k in ("window_start", "window_end") if finding.get(k))
    context = render("context", window=window or "-", run_id=run_id or "-")
    link = links_text(finding, dag_id=dag_id, run_id=run_id)
    if link:
        context += " · " + link
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    if v["owner_unknown"]:
        blocks.append(_owner_note_block())
    if controls:
        blocks.append(incident_buttons(controls))
    # the notification text is mrkdwn too: values escaped, so no name can ping or link
    fallback = render("provisional_fallback", **provisional_values(finding)) if provisional else render("fallback", **v)
    return {"text": fallback, "blocks": blocks}


def render_decided(finding: Mapping[str, Any], was_between: Sequence[str], plan: Mapping[str, Any] | None = None,
                   *, run_id: str = "", dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """The reply in a provisional incident's thread once a sweep decided the cause (not a change of
    diagnosis: the first message said it was still open), with the next steps and actions now planned."""
    v = _values(finding)
    between = deciding_between_text({"deciding_between": list(was_between), "diagnosis": finding.get("diagnosis")})
    decided = render("decided", diagnosis=v["diagnosis"].replace("_", " "), between=between)
    plan = plan or {}
    blocks = _reply_blocks(finding, v, decided + "\n" + render("summary", **v),
                           _plan_blocks(plan, plan.get("actions") or []),
                           run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render("decided_fallback", diagnosis=v["diagnosis"].replace("_", " "), group=v["group"],
                           topic=v["topic"]), "blocks": blocks}


def render_cause_change(finding: Mapping[str, Any], was: str, plan: Mapping[str, Any] | None = None, *,
                        still_open: bool, run_id: str = "", dag_id: str | None = None,
                        controls: str | None = None) -> dict[str, Any]:
    """A reply in the open thread of a (cluster, group, topic) when a sweep finds another cause there:
    the cause the thread named is gone (``still_open`` False: "Cause changed"), or holds beside the new
    one ("Also"). The whole finding, next steps and actions, as a first message has them: one incident,
    one top-level message."""
    v = _values(finding)
    names = {"was": one_line_id(was, "").replace("_", " "), "diagnosis": v["diagnosis"].replace("_", " ")}
    kind = "cause_added" if still_open else "cause_changed"
    plan = plan or {}
    blocks = _reply_blocks(finding, v, render(kind, emoji=v["emoji"], **names) + "\n" + render("summary", **v),
                           _plan_blocks(plan, plan.get("actions") or []),
                           run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render(f"{kind}_fallback", group=v["group"], topic=v["topic"], **names), "blocks": blocks}


def _plan_blocks(plan: Mapping[str, Any], actions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan's next steps and the action lines, each a section when there is any."""
    blocks = []
    steps = list(plan.get("next_steps") or [])
    if steps:
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
        blocks.append(_text_section(render("next_steps_title", runbook=plan.get("runbook", "")) + "\n" + body))
    lines = action_lines(actions)
    if lines:
        blocks.append(_text_section(render("actions_title") + "\n" + "\n".join(lines)))
    return blocks


def _explaining_sections(finding: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The forecast, incomplete data, lagdoctor's own actions and the owner's pod and workload: each
    a section when there is something to say."""
    texts = [forecast_text(finding), incomplete_data_text(finding), own_actions_text(finding)]
    workload = workload_lines(finding)
    if workload:
        texts.append(render(f"workload_{workload[0]}", text=workload[1]))
    return [_text_section(text) for text in texts if text]


def _reply_blocks(finding: Mapping[str, Any], v: Mapping[str, Any], lead: str,
                  middle: Sequence[Mapping[str, Any]] = (), *, run_id: str, dag_id: str | None,
                  controls: str | None) -> list[dict[str, Any]]:
    """A thread reply about a finding: ``lead``, the four fields, forecast, incomplete data, the
    evidence table, ``middle`` (e.g. the plan), links, the owner note and the buttons."""
    blocks = [_text_section(lead),
              {"type": "section", "fields": [
                  {"type": "mrkdwn", "text": render(n, **v)} for n in ("field_pattern", "field_time_lag", "field_lag", "field_severity")]}]
    blocks.extend(_explaining_sections(finding))
    table = evidence_table(finding)
    if table:
        blocks.append(_text_section("```\n" + table + "\n```"))
    blocks.extend(middle)
    link = links_text(finding, dag_id=dag_id, run_id=run_id)
    if link:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": link}]})
    if v["owner_unknown"]:
        blocks.append(_owner_note_block())
    if controls:
        blocks.append(incident_buttons(controls))
    return blocks


def render_still_undecided(finding: Mapping[str, Any], was_promised: Any,
                           changes: Sequence[str] = ()) -> dict[str, Any]:
    """The one reply in a provisional thread whose promised time passed while the sweep is still
    undecided (threads rule 9): that it is, why, and the new time."""
    pv = provisional_values(finding)
    by = promised_at(was_promised)
    was = promise_time(by, finding.get("window_end")) if by is not None else "the time promised"
    text = render("still_undecided", was=was, **pv)
    if changes:
        text += "\n" + render("still_undecided_changes", changes="; ".join(changes))
    return {"text": render("still_undecided_fallback", was=was, **pv), "blocks": [_text_section(text)]}


def render_superseded(finding: Mapping[str, Any], was_between: Sequence[str], *, existing: bool = False,
                      existing_since: Any = None) -> dict[str, Any]:
    """The closing reply of a provisional thread the finding did not land in (threads rule 8): what
    it became, and where that is followed: its own new thread, or (``existing``) the thread already
    open (since ``existing_since``, a datetime, when known). Short: the evidence is in that thread."""
    v = _values(finding)
    if is_provisional(finding):
        now = "still deciding between " + deciding_between_text(finding)
    else:
        now = v["diagnosis"].replace("_", " ")
    between = deciding_between_text({"deciding_between": list(was_between), "diagnosis": finding.get("diagnosis")})
    decided = not is_provisional(finding) and finding.get("diagnosis") in set(was_between)
    where = "its own thread"
    if existing:
        where = ("its existing thread" + (f", opened {as_utc(existing_since):%H:%M} UTC"
                                          if existing_since is not None else ""))
    text = render("superseded", decided=decided, now=now, between=between, where=where)
    return {"text": render("superseded_fallback", now=now, where=where, group=v["group"], topic=v["topic"]),
            "blocks": [_text_section(text)]}


def report_link(url: object, label: str = "HTML report") -> str:
    """A mrkdwn link to the incident report (lagdoctor.web.report), or "" without a URL.

    Only http(s) URLs are linked; ``|`` and ``>`` would end Slack's link syntax
    early, so they are percent-encoded, and ``&``/``<`` escaped as Slack asks.
    """
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        return ""
    safe = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C").replace("&", "&amp;")
    return f"<{safe}|{label}>"


def render_update(finding: Mapping[str, Any], changes: Sequence[str], *, run_id: str = "",
                  dag_id: str | None = None, controls: str | None = None) -> dict[str, Any]:
    """A reply in an incident's thread: what changed, with the same links and buttons as the first message."""
    v = _values(finding)
    changes_text = "; ".join(changes)
    lead = render("update", changes=changes_text, **{k: v[k] for k in ("emoji", "summary")})
    blocks = _reply_blocks(finding, v, lead, run_id=run_id, dag_id=dag_id, controls=controls)
    return {"text": render("update_fallback", changes=changes_text, group=v["group"], topic=v["topic"]), "blocks": blocks}


def render_recovery(finding: Mapping[str, Any], *, diagnosis: str, duration_seconds: float | None) -> dict[str, Any]:
    v = {**_values(finding), "diagnosis": diagnosis.replace("_", " "), "duration": fmt_duration(duration_seconds)}
    blocks = [_text_section(render("recovery", **v))] + ([_owner_note_block()] if v["owner_unknown"] else [])
    return {"text": render("recovery_fallback", **v), "blocks": blocks}


def own_actions_text(finding: Mapping[str, Any]) -> str:
    """What lagdoctor itself changed that explains part of this finding (``evidence.own_actions``,
    lines from lagdoctor.remediation.postcheck.attribution), one line each; "" for none."""
    lines = [str(x) for x in evidence_of(finding).get("own_actions") or [] if x]
    return "\n".join(render("own_action", line=" ".join(line.split())) for line in lines)


def render_action_check(record: Mapping[str, Any], verdict: str, text: str, *, after_seconds: float) -> dict[str, Any]:
    """The one reply that says whether an action lagdoctor took did what it was for."""
    v = {"action": one_line_id(record.get("action"), "?"), "group": one_line_id(record.get("group_id")),
         "text": " ".join(str(text).split()), "after": fmt_duration(after_seconds)}
    kind = "action_check_worked" if verdict == "worked" else "action_check_failed"
    return {"text": render(f"{kind}_fallback", **v), "blocks": [_text_section(render(kind, **v))]}


def render_action_result(record: Mapping[str, Any]) -> dict[str, Any]:
    status = str(record.get("status", ""))
    v = {"emoji": STATUS_EMOJI.get(status, ":grey_question:"), "action": one_line_id(record.get("action"), "?"),
         "state": STATUS_WORDS.get(status, status), "message": record.get("message", ""),
         "group": one_line_id(record.get("group_id"))}
    text = render("action_result", **v)
    if record.get("warning") and status in ("dry_run", "awaiting_approval", "executed"):
        text += "\n" + render("action_warning", warning=record["warning"])
    who = approval_line(record)
    if who:
        text += "\n" + who
    if status == "awaiting_approval":
        import re

        # How to act: the sweep never waits for a human; an incident run with dry_run off asks.
        text += "\n" + render("approval_how_to", pattern=re.escape(str(record.get("group_id", ""))),
                               cluster=one_line_id(record.get("cluster")))
    return {"text": render("action_fallback", **v), "blocks": [_text_section(text)]}


def approval_line(record: Mapping[str, Any]) -> str | None:
    """Who answered the approval this record ran (or was rejected, or blocked) under:
    the Slack user when answered with Slack's buttons, and the Airflow user Airflow
    recorded; None when nobody was asked."""
    approval = record.get("approval")
    if not isinstance(approval, Mapping) or not (approval.get("by") or approval.get("slack")):
        return None
    chosen = approval.get("chosen") or []
    verb = "Rejected" if record.get("status") == "rejected" or chosen in (["Reject"], ["Reject all"]) else "Approved"
    airflow = mrkdwn_value(approval.get("by") or approval.get("airflow_user") or "-")
    if approval.get("slack"):
        return f":bust_in_silhouette: {verb} by {mrkdwn_value(approval['slack'])} in Slack (Airflow user {airflow})"
    return f":bust_in_silhouette: {verb} in Airflow by {airflow}"


def render_failure(*, dag_id: str, task_id: str, run_id: str, reason: str = "") -> dict[str, Any]:
    v = {"dag_id": one_line_id(dag_id), "task_id": task_id, "run_id": run_id, "reason": " ".join(str(reason).split())}
    return {"text": render("failure_fallback", **v), "blocks": [_text_section(render("failure", **v))]}


def render_failure_recovery(*, dag_id: str, run_id: str, failed_runs: int) -> dict[str, Any]:
    """The one reply in a DAG's failure thread once a run succeeds again."""
    v = {"dag_id": one_line_id(dag_id), "run_id": run_id, "failed_runs": failed_runs}
    return {"text": render("failure_recovery_fallback", **v), "blocks": [_text_section(render("failure_recovery", **v))]}


def render_data_incomplete(finding: Mapping[str, Any], diagnosis: str) -> dict[str, Any]:
    """A reply in an open thread: the group looks healthy, but on incomplete data,
    so the thread stays open (unknown is never recovery)."""
    v = {**_values(finding), "diagnosis": one_line_id(diagnosis, "").replace("_", " ")}
    text = render("data_incomplete", **v)
    detail = incomplete_data_text(finding)
    return {"text": render("data_incomplete_fallback", **v),
            "blocks": [_text_section(text + ("\n" + detail if detail else ""))]
            + ([_owner_note_block()] if v["owner_unknown"] else [])}


def render_quarantine_notice(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One notice per run: the snapshot files the diagnosis could not read and moved
    aside (``{"path", "moved_to", "reason"}`` each); the diagnosis ran on the rest."""
    lines = [render("quarantine_line", path=code_safe(e.get("path")), reason=" ".join(str(e.get("reason") or "-").split()),
                    moved_to=code_safe(e.get("moved_to") or "-"))
             for e in entries[:20]]
    if len(entries) > 20:
        lines.append(f"… and {len(entries) - 20} more (see the plan task's log)")
    text = render("quarantine", count=len(entries)) + "\n" + "\n".join(lines)
    return {"text": render("quarantine_fallback", count=len(entries)), "blocks": [_text_section(text)]}


WATCHING_NAMES = 10  # group names a watching notice lists; the rest are counted


def render_watching_notice(cluster: str, findings: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The one notice of a new deployment: how many groups of ``cluster`` it watches
    (the first WATCHING_NAMES named), and when the first verdicts come: the earliest
    ``evidence.decides_at`` of the findings, to the minute (as their summaries say it)."""
    from datetime import timedelta

    groups = sorted({str(f.get("group_id") or "") for f in findings} - {""})
    due = [t for t in (parse_iso(evidence_of(f).get("decides_at")) for f in findings) if t is not None]
    first = min(due) if due else None
    at = (first + timedelta(seconds=30)).strftime("%H:%M") if first else "-"
    needed = next((evidence_of(f).get("snapshots_needed") for f in findings
                   if isinstance(evidence_of(f).get("snapshots_needed"), int)), "-")
    crashed = len({str(f.get("group_id")) for f in findings if f.get("diagnosis") == "crashed_consumer"})
    v = {"count": len(groups), "cluster": one_line_id(cluster), "names": [one_line_id(g) for g in groups[:WATCHING_NAMES]],
         "more": max(0, len(groups) - WATCHING_NAMES), "at": at, "needed": needed, "crashed": crashed}
    text = render("watching", **v) + ("\n" + render("watching_crashed", **v) if crashed else "")
    return {"text": render("watching_fallback", **v), "blocks": [_text_section(text[:SECTION_LIMIT])]}


def render_approval_request(record: Mapping[str, Any]) -> dict[str, str]:
    from lagdoctor.notify.templates import APPROVAL_BODY, APPROVAL_SUBJECT, escape_markdown, plain_label

    message = str(record.get("message", ""))
    raw = {"action": record.get("action"), "group": record.get("group_id"), "topic": record.get("topic"),
           "cluster": record.get("cluster"), "diagnosis": record.get("diagnosis"), "run_id": record.get("run_id"),
           "warning": record.get("warning"), "description": message.removeprefix("needs approval: ")}
    flags = {"irreversible": record.get("irreversible")}
    # The subject is plain text (one line); the body Markdown, every value escaped.
    return {"subject": render_plain(APPROVAL_SUBJECT, **{k: plain_label(v, 200) for k, v in raw.items()}, **flags),
            "body": render_plain(APPROVAL_BODY, **{k: escape_markdown(v) if v else v for k, v in raw.items()},
                                 **flags)}


def render_run_header(findings: Sequence[Mapping[str, Any]], *, scope: str, run_id: str,
                      dag_id: str | None = None) -> dict[str, Any]:
    """The first message of a manual incident run: what was looked at and what was found."""
    from lagdoctor.web import links

    link = report_link(links.run_url(dag_id, run_id), "Airflow run") if dag_id and run_id else ""
    from lagdoctor.contracts import COLLECTING_HISTORY, NO_PROBLEM_DIAGNOSES

    problems = [f for f in findings if f.get("diagnosis") not in NO_PROBLEM_DIAGNOSES]
    # still collecting history: no verdict yet, neither a problem nor healthy
    collecting = sum(1 for f in findings if f.get("diagnosis") == COLLECTING_HISTORY)
    worst = "critical" if any(f.get("severity") == "critical" for f in problems) else (
        "warning" if problems else "ok")
    owner_unknown = any(owner_unknown_once(f.get("summary"))[1] for f in problems[:20])
    lines = [
        f"{SEVERITY_EMOJI.get(f.get('severity', ''), ':grey_question:')} "
        + (f"*Still deciding* ({escape_mrkdwn(deciding_between_text(f))}) " if is_provisional(f) else
           f"*{escape_mrkdwn(_title(one_line_id(f.get('diagnosis'), '')))}* ")
        + f"· `{escape_mrkdwn(code_safe(f.get('group_id', '')))}` on `{escape_mrkdwn(code_safe(f.get('topic', '')))}`: "
        f"{mrkdwn_value(owner_unknown_once(f.get('summary', ''))[0])}"
        + (" _(incomplete data)_" if evidence_of(f).get("data_complete") is False else "")
        for f in problems[:20]
    ] or ([f"No problem found yet: {collecting} (group, topic) pair(s) still collecting history, no verdict."]
          if collecting else ["No problem found: every matching group keeps up."])
    if len(problems) > 20:
        lines.append(f"… and {len(problems) - 20} more in this thread.")
    healthy = len(findings) - len(problems) - collecting
    still = f", {collecting} collecting history" if collecting else ""
    text = (f"Incident run for {escape_mrkdwn(one_line_id(scope))}: {len(problems)} problem(s), {healthy} healthy"
            f"{still} (group, topic) pair(s)")
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "emoji": True,
                                    "text": f"{SEVERITY_EMOJI[worst]} lagdoctor incident run"[:150]}},
        _text_section(f"*Scope* `{escape_mrkdwn(code_safe(scope))}` · {len(problems)} problem(s), {healthy} healthy"
                      f"{still}"),
        _text_section("\n".join(lines)[:2900]),
        {"type": "context", "elements": [{"type": "mrkdwn",
                                          "text": f"run `{escape_mrkdwn(code_safe(run_id))}` · details in this thread"
                                                  + (" · " + link if link else "")}]},
    ]
    if owner_unknown:
        blocks.append(_owner_note_block())
    return {"text": text, "blocks": blocks}


APPROVAL_LINES_MAX = 20


def approval_target_label(target: Mapping[str, Any]) -> str:
    """One approval line's subject in mrkdwn: the group on cluster / topic; for a target several
    groups share (a topic, a Deployment), the target and its groups (one change for all)."""
    shared = shared_by_text(target)
    if shared:
        return f"{mrkdwn_value(target.get('target'))}, one change for {mrkdwn_value(shared)}"
    return (f"`{escape_mrkdwn(code_safe(target.get('group_id')))}` on {mrkdwn_value(target.get('cluster'))}"
            f" / `{escape_mrkdwn(code_safe(target.get('topic') or '(all)'))}`")


def render_approval_prompt(subject: str, body: str | None, *, approval_id: str | int | None,
                           answer_url: str | None, targets: Sequence[Mapping[str, Any]] | None = None,
                           dag_id: str | None = None) -> dict[str, Any]:
    """A HITL task waits: its question, and where to answer in Airflow. With `targets`
    (a per-target approval): one line per target, "blocked now: <why>" for those not
    offered, and, when ``approval_id`` is given (buttons enabled: the row's
    interactive.approval_ref, id and nonce), a button per offered
    target, "Approve all" and "Reject all". Without: the body's lines and Approve / Reject.
    Every name goes through mrkdwn_value (one line, escaped)."""
    subject_text = mrkdwn_value(subject)
    owner_unknown = False
    if targets is not None:
        lines = []
        for n, t in enumerate(targets[:APPROVAL_LINES_MAX]):
            where = approval_target_label(t)
            if t.get("option"):
                number = str(t["option"]).split(":", 1)[0].removeprefix("Approve ")
                lines.append(f"{number}. {where}: {mrkdwn_value(t.get('does'))}")
            else:
                why = (f"*blocked now*: {mrkdwn_value(t.get('blocked'))}" if t.get("blocked")
                       else "over the form's limit")
                lines.append(f":no_entry: {where}: {why} (not offered)")
        if len(targets) > APPROVAL_LINES_MAX:
            lines.append(f"… and {len(targets) - APPROVAL_LINES_MAX} more: see the form in Airflow.")
    else:
        body_text, owner_unknown = owner_unknown_once(body or "")
        # The form's body is Markdown for the Airflow UI: Slack's bold is one asterisk.
        lines = [escape_mrkdwn(" ".join(line.replace("**", "*").split()))
                 for line in body_text.splitlines() if line.strip()][:20]
    text = f":raised_hand: *Approval needed:* {subject_text}" + ("\n" + "\n".join(lines) if lines else "")
    blocks: list[dict[str, Any]] = [_text_section(text[:2900])]
    where = report_link(answer_url, "answer in Airflow")
    if approval_id is not None:
        hint = ("Buttons answer the task in Airflow (approvers for this DAG and cluster only)"
                + (f" · or {where}" if where else ""))
    else:
        hint = f"Answer in Airflow: {where}" if where else "Answer in the Airflow UI (Required actions)."
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": hint}]})
    if owner_unknown:
        blocks.append(_owner_note_block())
    if approval_id is not None:
        if targets is None:
            blocks.append(approval_buttons(approval_id))
        else:
            blocks.extend(target_buttons(approval_id, targets))
    return {"text": f"Approval needed: {subject_text}", "blocks": blocks}
