"""Approval per group and action (issue 17): the form offers each target on its own,
the guard is asked before anybody is, every name is Markdown-escaped, and the run
acts for exactly the targets approved. State on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from markdown_it import MarkdownIt

from lagdoctor.stages.plan import (REJECT_ALL, approval_form, approval_needed, approved_targets,
                                    not_offered_targets)
from lagdoctor.stages.remediate import RemediationBlocked, remediate
from tests.fixtures.k8s import k8s_server  # noqa: F401
from tests.fixtures.slack import slack_connection, slack_server  # noqa: F401
from tests.test_remediation import T0, audit, finding, k8s, settings, write_plans  # noqa: F401


def two_groups_config(k8s_url, **extra):
    return json.dumps({"deployments": {"orders": {"namespace": "shop", "name": "orders-consumer"},
                                       "billing": {"namespace": "shop", "name": "billing-consumer"}},
                       "kubernetes": {"host": k8s_url}, "require_approval": ["restart_consumers"], **extra})


def test_each_group_is_its_own_choice_and_only_the_ticked_one_runs(settings, k8s, slack_connection, tmp_path,
                                                                  monkeypatch):
    k8s.add_deployment("shop", "billing-consumer", replicas=2)
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config(k8s.url))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    assert form["options"] == ["Approve 1: orders on prod / orders.v1", "Approve 2: billing on prod / orders.v1",
                               REJECT_ALL]
    assert form["subject"] == "lagdoctor: restart_consumers for 2 groups?"

    # The approver ticks billing only: orders is not restarted, and says so.
    keys = approved_targets(form, ["Approve 2: billing on prod / orders.v1"])
    assert remediate("restart_consumers", plans, "manual__1", dry_run=False, approved_keys=keys,
                     approval_by={"by": "oncall", "chosen": ["Approve 2: billing on prod / orders.v1"]},
                     settings=settings) == {"rejected": 1, "executed": 1}
    writes = k8s.writes()
    assert len(writes) == 1 and "billing-consumer" in writes[0].path
    by_group = {(r["group_id"], r["status"]) for r in audit(settings)}
    assert ("orders", "rejected") in by_group and ("billing", "executed") in by_group
    assert ("orders", "started") not in by_group
    rejected = [m for m in slack_connection.messages if "rejected" in json.dumps(m) and "orders" in json.dumps(m)]
    assert rejected, "the rejected group's thread was not told"


def test_reject_all_wins_over_a_ticked_group(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config("http://127.0.0.1:9"))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    assert approved_targets(form, [form["options"][0], REJECT_ALL]) == set()
    assert approved_targets(form, [REJECT_ALL]) == set()
    # An option the form never offered approves nothing.
    assert approved_targets(form, ["Approve 3: payments on prod / orders.v1"]) == set()


def test_a_target_its_guard_blocks_now_is_shown_blocked_and_not_offered(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config("http://127.0.0.1:9",
                                                                         deny_groups=["billing"]))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    assert form["options"] == ["Approve 1: orders on prod / orders.v1", REJECT_ALL]
    # As the Airflow UI renders it:
    html = MarkdownIt("commonmark").render(form["body"])
    assert ("<li><strong>billing</strong> on prod, topic orders.v1: <strong>blocked now</strong>: deny_list: "
            "group matches deny pattern 'billing' (not offered)") in html
    assert approval_needed("restart_consumers", plans, dry_run=False, now=T0) is True


def test_when_the_guard_blocks_every_target_nobody_is_asked_and_the_run_says_blocked(settings, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config("http://127.0.0.1:9",
                                                                         deny_groups=["orders", "billing"]))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    assert approval_needed("restart_consumers", plans, dry_run=False, now=T0) is False
    # The run task, reached without an approval, records them blocked and raises (not green).
    with pytest.raises(RemediationBlocked, match="blocked for 2 of 2 group"):
        remediate("restart_consumers", plans, "manual__1", dry_run=False, settings=settings)


def test_a_dry_run_never_waits(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config("http://127.0.0.1:9"))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers")])
    assert approval_needed("restart_consumers", plans, dry_run=True, now=T0) is False
    assert approval_needed("restart_consumers", plans, dry_run=False, now=T0) is True


CRAFTED = "evil\n- [click me](https://attacker.example) *bold* `code` <b>x</b>\n# Approve all"


def test_a_crafted_group_id_adds_no_line_link_or_formatting_to_the_form(settings, tmp_path, monkeypatch):
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", json.dumps({
        "deployments": {CRAFTED: {"namespace": "shop", "name": "evil"}, "orders": {"namespace": "shop",
                                                                                   "name": "orders-consumer"}},
        "require_approval": ["restart_consumers"]}))
    plans = write_plans(tmp_path, [(finding("crashed_consumer", group=CRAFTED), "restart_consumers"),
                                   (finding("crashed_consumer"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    html = MarkdownIt("commonmark").render(form["body"])
    assert "<a " not in html and "<em>" not in html and "<h1>" not in html and "<b>" not in html
    assert "<code>restart_consumers</code>" in html and html.count("<code>") == 1  # the form's own span only
    # Two targets, two top-level items, each with its target and why: the name added none.
    tokens = MarkdownIt("commonmark").parse(form["body"])
    assert sum(1 for t in tokens if t.type == "list_item_open" and t.level == 1) == 2
    # The name is all there, shown: its line breaks as \n.
    assert "evil\\n- [click me](https://attacker.example) *bold* `code` &lt;b&gt;x&lt;/b&gt;\\n# Approve all" in html
    # The option (plain text) is one line.
    assert all("\n" not in o for o in form["options"])


def test_a_group_the_finding_shows_stable_is_not_offered_a_poison_pill_skip(settings, tmp_path):
    """Issue 17: a STABLE group got a skip_poison_pill form with no "blocked now"; approved, it was skipped."""
    from tests.test_remediation import stuck_at

    stable = {**stuck_at(120), "evidence": {**stuck_at(120)["evidence"], "group_state": "STABLE",
                                            "group_members": 3}}
    empty = {**stuck_at(120, group="ledger-2"), "evidence": {**stuck_at(120)["evidence"], "group_state": "EMPTY",
                                                             "group_members": 0}}
    plans = write_plans(tmp_path, [(stable, "skip_poison_pill"), (empty, "skip_poison_pill")])
    form = approval_form("skip_poison_pill", plans, now=T0)
    assert form["options"] == ["Approve 1: ledger-2 on prod / payments", REJECT_ALL]
    html = MarkdownIt("commonmark").render(form["body"])
    assert ("<strong>payments-ledger</strong> on prod, topic payments: <strong>blocked now</strong>: group was "
            "STABLE with 3 member(s) at the window's end, not EMPTY: stop its consumers first, then run the "
            "incident again (not offered)") in html
    # Only the STABLE one: nobody is asked.
    assert approval_needed("skip_poison_pill", write_plans(tmp_path, [(stable, "skip_poison_pill")]),
                           dry_run=False, now=T0) is False
    # The run task, reached without asking, records it blocked and raises: not green.
    with pytest.raises(RemediationBlocked, match="group was STABLE with 3 member"):
        remediate("skip_poison_pill", write_plans(tmp_path, [(stable, "skip_poison_pill")]), "manual__1",
                  dry_run=False, settings=settings)
    assert [(r["status"], r["rule"]) for r in audit(settings)] == [("blocked", "action")]


def test_a_target_not_offered_because_blocked_is_recorded_blocked_not_rejected(settings, tmp_path):
    from tests.test_remediation import stuck_at

    stable = {**stuck_at(120), "evidence": {**stuck_at(120)["evidence"], "group_state": "STABLE",
                                            "group_members": 3}}
    plans = write_plans(tmp_path, [(stable, "skip_poison_pill")])
    # The approver ticked nothing that covers it (other targets, or Reject all).
    with pytest.raises(RemediationBlocked):
        remediate("skip_poison_pill", plans, "manual__1", dry_run=False, approved_keys=set(), settings=settings)
    assert [r["status"] for r in audit(settings)] == ["blocked"]


def test_a_reapproval_after_a_rejection_in_the_same_run_is_acted_on_once(settings, k8s, slack_connection, tmp_path,
                                                                          monkeypatch):
    """Try 1 of `approve` ended "Reject all"; approve and run cleared, try 2 says yes: it restarts, once."""
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config(k8s.url))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    rejected = {"by": "oncall", "at": "2026-11-21T10:01:00+00:00", "chosen": [REJECT_ALL], "try": 1}
    for _ in range(2):  # run, and its retry: rejected, once
        assert remediate("restart_consumers", plans, "manual__1", dry_run=False, settings=settings,
                         approved_keys=approved_targets(form, [REJECT_ALL]), approval_by=rejected) == {"rejected": 1}
    assert k8s.writes() == []

    yes = {"by": "oncall", "at": "2026-11-21T10:07:00+00:00", "chosen": [form["options"][0]], "try": 2}
    keys = approved_targets(form, [form["options"][0]])
    for _ in range(2):  # the re-approved run, and a retry of it: executed, never twice
        assert remediate("restart_consumers", plans, "manual__1", dry_run=False, settings=settings,
                         approved_keys=keys, approval_by=yes) == {"executed": 1}
    assert len(k8s.writes()) == 1
    assert [(r["status"], r["approval"]["try"]) for r in audit(settings)] == [
        ("rejected", 1), ("started", 2), ("executed", 2)]
    # A late retry of the run under the first answer does not undo or repeat anything.
    assert remediate("restart_consumers", plans, "manual__1", dry_run=False, settings=settings,
                     approved_keys=set(), approval_by=rejected) == {"executed": 1}
    assert len(k8s.writes()) == 1


def test_the_approval_answer_names_its_try():
    from datetime import datetime, timezone

    from lagdoctor.remediation.approval import approval_meta

    answer = {"chosen_options": ["Approve 1: x"], "responded_by_user": {"id": "1", "name": "oncall"},
              "responded_at": datetime(2026, 11, 21, 10, 7, tzinfo=timezone.utc), "approval_try": 2}
    assert approval_meta(answer) == {"by": "oncall", "at": "2026-11-21T10:07:00+00:00",
                                     "chosen": ["Approve 1: x"], "try": 2}


@pytest.mark.parametrize("asked", [True, False], ids=["others-offered", "nobody-asked"])
@pytest.mark.parametrize("cleared", [False, True], ids=["still-blocked", "guard-cleared-by-run-time"])
def test_a_target_shown_blocked_now_is_recorded_blocked_with_the_forms_reason_and_fails_the_run(
        settings, k8s, slack_connection, tmp_path, monkeypatch, asked, cleared):
    k8s.add_deployment("shop", "billing-consumer", replicas=2)
    deny = ["billing"] if asked else ["billing", "orders"]
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config(k8s.url, deny_groups=deny))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    not_offered = not_offered_targets(form)
    assert sorted(not_offered.values()) == sorted(f"deny_list: group matches deny pattern '{g}'" for g in deny)
    if cleared:  # the deny list was emptied between the question and the run
        monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config(k8s.url))
    keys = approved_targets(form, form["options"][:1]) if asked else None
    by = {"by": "oncall", "at": "2026-11-21T10:01:00+00:00", "chosen": form["options"][:1], "try": 1} if asked else None
    with pytest.raises(RemediationBlocked) as raised:
        remediate("restart_consumers", plans, "manual__1", dry_run=False, settings=settings, approved_keys=keys,
                  approval_by=by, not_offered=not_offered)
    assert "group billing on prod: not offered for approval, blocked when asked: deny_list: group matches deny " \
           "pattern 'billing'" in str(raised.value)
    by_group = {r["group_id"]: r for r in audit(settings)}
    assert by_group["billing"]["status"] == "blocked" and by_group["billing"]["rule"] == "not_offered"
    assert "rejected" not in {r["status"] for r in audit(settings)}
    assert [w.path for w in k8s.writes() if "billing" in w.path] == []
    if asked:  # the ticked one ran
        assert by_group["orders"]["status"] == "executed" and raised.value.changed
    else:
        assert by_group["orders"]["status"] == "blocked" and not raised.value.changed


def test_a_target_over_the_forms_limit_is_not_called_rejected_by_a_human():
    from lagdoctor.stages.plan import APPROVAL_OPTIONS_MAX

    form = {"targets": [{"key": "a", "option": "Approve 1: a", "blocked": None},
                        {"key": "b", "option": None, "blocked": None}]}
    assert not_offered_targets(form) == {"b": f"over the form's {APPROVAL_OPTIONS_MAX} choices: ask again in "
                                               "another run"}
    assert not_offered_targets(None) == {}


def test_a_deployment_shared_by_two_findings_is_one_choice_and_changes_once(settings, k8s, slack_connection,
                                                                            tmp_path, monkeypatch):
    """Issue 30: the form offers what an action changes. A group lagging on two topics is two
    findings but one Deployment: one line ("one change for group orders on topics ..."), one
    restart when approved, and the second finding says the change covered it: not blocked by the
    first's cooldown, so the run does not fail."""
    from lagdoctor.notify.render import render_approval_prompt

    k8s.add_deployment("shop", "billing-consumer", replicas=2)
    monkeypatch.setenv("LAGDOCTOR_REMEDIATION_CONFIG", two_groups_config(k8s.url))
    plans = write_plans(tmp_path, [(finding("crashed_consumer"), "restart_consumers"),
                                   ({**finding("crashed_consumer"), "topic": "orders.v2"}, "restart_consumers"),
                                   (finding("crashed_consumer", group="billing"), "restart_consumers")])
    form = approval_form("restart_consumers", plans, now=T0)
    assert form["options"] == [
        "Approve 1: Deployment shop/orders-consumer, one change for group orders on topics orders.v1, orders.v2",
        "Approve 2: billing on prod / orders.v1", REJECT_ALL]
    html = MarkdownIt("commonmark").render(form["body"])
    assert ("<li>Approve 1: <strong>Deployment shop/orders-consumer</strong> on prod, one change for group orders "
            "on topics orders.v1, orders.v2: rollout restart shop/orders-consumer") in html
    prompt = json.dumps(render_approval_prompt(form["subject"], form["body"], approval_id="7.n", answer_url=None,
                                               targets=form["targets"]))
    assert "Approve all 2" in prompt and "Approve 3" not in prompt

    keys = approved_targets(form, form["options"][:2])
    assert remediate("restart_consumers", plans, "manual__1", dry_run=False, approved_keys=keys, settings=settings,
                     approval_by={"by": "oncall", "chosen": form["options"][:2]}) == {"executed": 2, "noop": 1}
    assert sorted(w.path.rsplit("/", 1)[-1] for w in k8s.writes()) == ["billing-consumer", "orders-consumer"]
    covered = [r for r in audit(settings) if r["status"] == "noop"]
    assert [(r["group_id"], r["topic"], r["message"]) for r in covered] == [
        ("orders", "orders.v2", "done in this run for topic orders.v1: Deployment shop/orders-consumer is shared, "
                                "its change covers this topic too")]
    # a retry of the task repeats nothing
    assert remediate("restart_consumers", plans, "manual__1", dry_run=False, approved_keys=keys, settings=settings,
                     approval_by={"by": "oncall", "chosen": form["options"][:2]}) == {"executed": 2, "noop": 1}
    assert len(k8s.writes()) == 2
