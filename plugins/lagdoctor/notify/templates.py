"""Message bodies, as Jinja templates (Slack mrkdwn unless said otherwise).

Every ``{{ value }}`` is escaped for mrkdwn by the environment (``finalize``),
so a group called ``<!channel>`` or ``a&b`` shows as written and pings nobody;
it is also put on one line with backticks as ``'``, so no value can start a
line of its own or open a code span.
Literal template text is trusted markup. ``| code`` additionally keeps a value
from closing an inline code span; ``| shell`` makes it one shell word naming the
exact value, for a command inside Slack text (``shell_quote_inline``: bash's
$'...' where a backtick or line break cannot be shown in a code span; runbook
commands are quoted by lagdoctor.runbooks with ``shell_quote``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

TEMPLATES: dict[str, str] = {
    # Header block (plain_text, not mrkdwn: the renderer does not escape it).
    "header": "{{ emoji }} {{ diagnosis_title }} · {{ group }}",
    "summary": "*{{ summary }}*",
    # Issue 18: a provisional finding names no cause in its first line, only what is still open.
    "header_provisional": "{{ emoji }} Still deciding · {{ group }}",
    "provisional": ":hourglass: *{{ group }}: still deciding between {{ between }} on {{ where }}; {{ by }}*",
    "provisional_evidence": "_Evidence so far:_ {{ summary }}\n_Not decided yet because_ {{ because }}",
    "provisional_fallback": "{{ group }}: still deciding between {{ between }} on {{ where }}; {{ by }}",
    "decided": ":white_check_mark: *Decided:* {{ diagnosis }} (was still deciding between {{ between }})",
    "decided_fallback": "Decided for {{ group }} on {{ topic }}: {{ diagnosis }}",
    "own_action": ":wrench: *lagdoctor's own action:* {{ line }}",
    # The owner's pod and workload (lagdoctor.notify.workload_text builds the phrase).
    "workload_known": ":package: *Runs in:* {{ text }}",
    "workload_unknown": ":grey_question: *Pod and workload unknown:* {{ text }}",
    "action_check_worked": ":white_check_mark: *Checked:* {{ action }} worked: {{ text }}",
    "action_check_worked_fallback": "{{ action }} worked for {{ group }}: {{ text }}",
    "action_check_failed": ":warning: *Checked:* {{ action }} has not worked {{ after }} after it ran: {{ text }}",
    "action_check_failed_fallback": "{{ action }} has not worked for {{ group }}: {{ text }}",
    "cause_changed": "{{ emoji }} *Cause changed:* {{ was }} → {{ diagnosis }}",
    "cause_changed_fallback": "Cause changed for {{ group }} on {{ topic }}: {{ was }} -> {{ diagnosis }}",
    "cause_added": "{{ emoji }} *Also:* {{ diagnosis }} (beside {{ was }}, still open)",
    "cause_added_fallback": "Also for {{ group }} on {{ topic }}: {{ diagnosis }} (beside {{ was }})",
    # A provisional thread still undecided after the time it promised: said once per new promise.
    "still_undecided": ":hourglass: *Still deciding between {{ between }} on {{ where }}:* not decided at the "
                       "first sweep after {{ was }} as promised; {{ by }}\n_Not decided yet because_ {{ because }}",
    "still_undecided_changes": "*Changed:* {{ changes }}",
    "still_undecided_fallback": "{{ group }}: still deciding between {{ between }} after {{ was }}; {{ by }}",
    # A provisional thread the sweep's finding did not land in: closed, pointing at the thread that follows it.
    "superseded": "{% if decided %}:white_check_mark: *Decided:* {{ now }}{% else %}:arrow_right: *Now {{ now }}*"
                  "{% endif %} (was still deciding between {{ between }}): followed in {{ where }}. "
                  "This thread is closed.",
    "superseded_fallback": "{{ group }} on {{ topic }}: now {{ now }}, followed in {{ where }}",
    "field_cluster": "*Cluster*\n{{ cluster }}",
    "field_topic": "*Topic*\n{{ topic }}",
    "field_pattern": "*Lag pattern*\n{{ pattern }}",
    "field_time_lag": "*Time lag*\n{{ time_lag }}",
    "field_lag": "*Total lag*\n{{ lag_total }} messages",
    "field_severity": "*Severity*\n{{ severity }}",
    # Forecasts and the stuck record (issue 10); the phrases come from render.py, shared with the page.
    "catch_up": ":hourglass_flowing_sand: *Catch-up:* {{ text }}",
    "data_loss": ":warning: *Data loss:* {{ text }}",
    "stuck_record": ":pushpin: *Stuck record*{% if partition != '' %} (partition {{ partition }}){% endif %}: {{ text }}",
    "evidence_title": "*Worst partitions* (as `kafka-consumer-groups.sh --describe`, plus time lag and rates)",
    "next_steps_title": "*Next steps* ({{ runbook }})",
    "actions_title": "*Actions*",
    "action_line": "{{ emoji }} `{{ action | code }}` {{ state }}: {{ description }}",
    "context": "{{ window }} · run `{{ run_id | code }}` · lagdoctor",
    "fallback": "{{ severity_word }}: {{ diagnosis }} for group {{ group }} on {{ topic }} ({{ cluster }}): {{ summary }}",
    # Thread replies.
    "update": "{{ emoji }} *Changed:* {{ changes }}\n{{ summary }}",
    "update_fallback": "Update for {{ group }} on {{ topic }}: {{ changes }}",
    "recovery": ":large_green_circle: *Recovered:* group {{ group }} on {{ topic }} ({{ cluster }}) "
                "is healthy again; the {{ diagnosis }} incident lasted {{ duration }}.\n{{ summary }}",
    "recovery_fallback": "Recovered: {{ group }} on {{ topic }} is healthy again",
    "action_result": "{{ emoji }} *{{ action }}* {{ state }}: {{ message }}",
    "action_warning": ":warning: {{ warning }}",
    "action_fallback": "{{ action }} {{ state }} for {{ group }}: {{ message }}",
    "failure": ":x: Airflow DAG *{{ dag_id }}* failed: task `{{ task_id | code }}` in run `{{ run_id | code }}`"
               "{% if reason %}\n{{ reason }}{% endif %}",
    "failure_fallback": "Airflow DAG {{ dag_id }} failed: task {{ task_id }} in run {{ run_id }}",
    "failure_recovery": ":large_green_circle: Airflow DAG *{{ dag_id }}* recovered after {{ failed_runs }} failed "
                        "run(s): run `{{ run_id | code }}` succeeded.",
    "failure_recovery_fallback": "Airflow DAG {{ dag_id }} recovered after {{ failed_runs }} failed run(s)",
    # Unknown is never zero: said plainly wherever a verdict rests on incomplete data.
    "incomplete_data": ":warning: *Incomplete data:* this verdict rests on offsets lagdoctor could not "
                       "all read ({{ count }} failed read(s)):",
    "offset_reset": ":rewind: Log end offset went backwards (topic recreated or truncated?) on "
                    "partition(s) {{ partitions }}: lag there is not comparable across the window.",
    "commit_above": ":rewind: Committed offset above the log end on partition(s) {{ partitions }} (topic "
                    "recreated, or offsets set by hand): the group will reset per auto.offset.reset or read "
                    "nothing.",
    "open_transaction": ":hourglass: An open transaction holds the last stable offset on partition(s) "
                        "{{ partitions }}: read_committed consumers cannot read past it until it commits or "
                        "aborts (kafka-transactions.sh find-hanging).",
    "data_incomplete": ":grey_question: *Data incomplete* for group `{{ group | code }}` on `{{ topic | code }}`: "
                       "some offsets could not be read, so lagdoctor cannot tell whether the {{ diagnosis }} "
                       "has recovered. The thread stays open.",
    "data_incomplete_fallback": "Data incomplete for {{ group }}: the thread stays open",
    "approval_how_to": ":point_right: To act: trigger `kafka_lag_incident` with cluster `{{ cluster | code }}`, "
                       "group_pattern `{{ pattern | code }}` and dry_run off; it asks for approval in Airflow.",
    "quarantine": ":warning: *{{ count }} snapshot file(s) moved aside:* the diagnosis could not read them "
                  "and ran on the rest.",
    "quarantine_line": "• `{{ path | code }}`: {{ reason }} (now `{{ moved_to | code }}`)",
    "quarantine_fallback": "lagdoctor moved {{ count }} unreadable snapshot file(s) aside",
    # Issue 29: a new deployment says once which groups it watches and when its first verdicts come.
    "watching": ":eyes: *lagdoctor is watching {{ count }} consumer group{{ '' if count == 1 else 's' }} on cluster "
                "`{{ cluster | code }}`:* {% for n in names %}`{{ n | code }}`{{ '' if loop.last else ', ' }}"
                "{% endfor %}{% if more %} and {{ more }} more{% endif %}.\n"
                "First verdicts at {{ at }} UTC, once each group has {{ needed }} snapshots; until then each "
                "shows as collecting history (no rate from a single snapshot, never healthy).",
    "watching_crashed": ":red_circle: Posted now, in {{ 'its' if crashed == 1 else 'their' }} own thread"
                        "{{ '' if crashed == 1 else 's' }}: {{ crashed }} group{{ '' if crashed == 1 else 's' }} with "
                        "lag and no live member, possibly crashed (decided then: a consumer outside the group "
                        "protocol has no members either).",
    "watching_fallback": "lagdoctor is watching {{ count }} consumer group(s) on cluster {{ cluster }}; "
                         "first verdicts at {{ at }} UTC",
}

# HITL approval: Markdown for the Airflow UI, not Slack. render_approval_request
# escapes every value for Markdown (escape_markdown) before it gets here; no value sits
# in a code span (a backslash escape shows there).
APPROVAL_SUBJECT = "Approve {{ action }} for {{ group }} on {{ topic }} ({{ cluster }})?"
APPROVAL_BODY = """\
**{{ description }}**

- diagnosis: {{ diagnosis }}
- run: {{ run_id }}
{% if irreversible %}- **irreversible**{% endif %}

{% if warning %}> {{ warning }}{% endif %}

Reject skips the action; it is logged either way.
"""


def escape_mrkdwn(value: object) -> str:
    """Slack's three control characters; Slack asks for exactly these escapes."""
    text = "" if value is None else str(value)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MARKDOWN_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def visible_controls(text: str) -> str:
    """Line breaks and other control characters as visible escapes (\\n, \\x07): a name
    keeps every character, shown, without starting a line of its own."""
    names = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return _CONTROL.sub(lambda m: names.get(m.group(), f"\\x{ord(m.group()):02x}"
                                              if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}"), text)


def escape_markdown(value: object) -> str:
    """A broker- or user-chosen name as literal text in (CommonMark) Markdown, the Airflow
    approval form: every ASCII punctuation backslash-escaped (no emphasis, link, code span,
    list, heading or raw HTML) and line breaks shown as \\n, so a name cannot add a line."""
    text = "" if value is None else str(value)
    return _MARKDOWN_PUNCT.sub(r"\\\1", visible_controls(text))


def plain_label(value: object, limit: int = 80) -> str:
    """A name in plain text that must stay one line (an HITL option, a Slack button)."""
    text = visible_controls("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit - 1] + "…"


def shell_quote(value: object) -> str:
    """One shell word naming exactly ``value`` (`x; curl evil|sh` stays one argument):
    shlex.quote, or bash's $'...' when it holds a control character (a line break or an
    escape sequence would split or repaint a pasted command)."""
    import shlex

    text = "" if value is None else str(value)
    if any(_control(c) for c in text):
        return _ansi_c_quote(text, _control)
    return shlex.quote(text)


def shell_quote_inline(value: object) -> str:
    """``shell_quote`` for a Slack code span: also without a backtick (Slack cannot escape
    one), a line break or a run of whitespace (which the span would not keep), so the
    word pasted from Slack still names the exact group."""
    import shlex

    text = "" if value is None else str(value)
    if any(_inline_unsafe(c) for c in text) or text != text.strip() or "  " in text:
        return _ansi_c_quote(text, lambda c: _inline_unsafe(c) or c == " ")
    return shlex.quote(text)


def _control(c: str) -> bool:
    import unicodedata

    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def _inline_unsafe(c: str) -> bool:
    return c == "`" or _control(c) or (c.isspace() and c != " ")


def _ansi_c_quote(text: str, escape) -> str:
    """bash's $'...' (also zsh and ksh): each character ``escape`` picks as \\xHH bytes of its
    UTF-8 (never more than two hex digits, so the next character cannot join one)."""
    out = []
    for c in text:
        if c in "\\'":
            out.append("\\" + c)
        elif escape(c):
            out.append("".join(f"\\x{b:02x}" for b in c.encode("utf-8")))
        else:
            out.append(c)
    return "$'" + "".join(out) + "'"


def code_safe(value: object) -> str:
    """Keep a value inside a code span/block: no backtick, no line break."""
    text = "" if value is None else str(value)
    return " ".join(text.replace("`", "'").split()) if text.strip() else text


def mrkdwn_value(value: object) -> str:
    """A value as it enters a message: one line, no backtick (Slack cannot escape one),
    then escaped. A line break or backtick in a name or reason cannot forge a line or
    open a code span; the template's own text keeps its markup."""
    text = "" if value is None else str(value)
    return escape_mrkdwn(" ".join(text.replace("`", "'").split()) if "`" in text or "\n" in text or "\r" in text
                         else text)


@lru_cache(maxsize=1)
def mrkdwn_env():
    from jinja2 import Environment, StrictUndefined

    env = Environment(finalize=mrkdwn_value, autoescape=False, undefined=StrictUndefined,
                      keep_trailing_newline=False)
    env.filters["code"] = code_safe
    env.filters["shell"] = shell_quote_inline
    return env


@lru_cache(maxsize=1)
def plain_env():
    from jinja2 import Environment, StrictUndefined

    return Environment(autoescape=False, undefined=StrictUndefined)


# Compiled once per text: a sweep plans every finding, and compiling a runbook's three
# templates for each of 10,000 findings took 12 of the plan task's 22 s.
@lru_cache(maxsize=512)
def _mrkdwn_template(source: str):
    return mrkdwn_env().from_string(source)


@lru_cache(maxsize=512)
def _plain_template(source: str):
    return plain_env().from_string(source)


def render(name: str, **values: object) -> str:
    return _mrkdwn_template(TEMPLATES[name]).render(**values)


def render_mrkdwn_source(source: str, **values: object) -> str:
    """Render a template held as data (a runbook's Slack text) with the same escaping."""
    return _mrkdwn_template(source).render(**values)


def render_plain(source: str, **values: object) -> str:
    return _plain_template(source).render(**values)


def shared_by_text(target: Mapping[str, Any], limit: int = 5) -> str | None:
    """Who shares a target's one change, plain: "groups a, b and 2 more", "group a on topics x, y";
    None for a target of one finding."""
    pairs = [tuple(p) for p in target.get("shared_by") or []]
    if len(pairs) < 2:
        return None
    groups = list(dict.fromkeys(str(g) for g, _ in pairs))
    names, kind = (groups, "groups") if len(groups) > 1 else (
        list(dict.fromkeys(str(t or "(all)") for _, t in pairs)), f"group {groups[0]} on topics")
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{kind} {shown}"
