"""The Slack buttons lagdoctor posts and the action ids they carry.

Below both the renderer (which puts them in messages) and the click handler
(lagdoctor.notify.interactive, which reads them back): neither imports the other.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

APPROVE, REJECT, ACK, SNOOZE_ACTION = "lagdoctor.approve", "lagdoctor.reject", "lagdoctor.ack", "lagdoctor.snooze"
REJECT_ALL, APPROVE_ALL = "Reject all", "all"  # stages.plan.REJECT_ALL; a button value's suffix
TARGET_BUTTONS_MAX = 20


def _button(text: str, action_id: str, value: str, style: str | None = None,
             confirm: Mapping[str, Any] | None = None) -> dict[str, Any]:
    button: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": text},
                              "action_id": action_id, "value": value}
    if style:
        button["style"] = style
    if confirm:
        button["confirm"] = dict(confirm)
    return button


def incident_buttons(key_digest: str) -> dict[str, Any]:
    """Acknowledge and Snooze 1 h for one incident key (the value is its digest only)."""
    return {"type": "actions", "block_id": f"lagdoctor_incident_{key_digest}", "elements": [
        _button("Acknowledge", ACK, key_digest),
        _button("Snooze 1 h", SNOOZE_ACTION, key_digest),
    ]}


def approval_buttons(approval_id: str | int) -> dict[str, Any]:
    value = str(approval_id)
    confirm = {"title": {"type": "plain_text", "text": "Approve?"},
               "text": {"type": "plain_text", "text": "Airflow runs the action once you approve."},
               "confirm": {"type": "plain_text", "text": "Approve"},
               "deny": {"type": "plain_text", "text": "Cancel"}}
    return {"type": "actions", "block_id": f"lagdoctor_approval_{value.partition('.')[0]}", "elements": [
        _button("Approve", APPROVE, value, "primary", confirm),
        _button("Reject", REJECT, value, "danger"),
    ]}


def target_buttons(approval_id: str | int, targets: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A per-target approval: "Approve n" for each target offered (a click approves that
    one alone, the others are rejected), "Approve all" (when every one has its own
    button) and "Reject all". Values carry the row's approval_ref and the target's number only."""
    offered = [t for t in targets if t.get("option")]
    numbers = [str(t["option"]).split(":", 1)[0].removeprefix("Approve ") for t in offered]
    confirm = {"title": {"type": "plain_text", "text": "Approve?"},
               "text": {"type": "plain_text", "text": "Airflow runs the action for what you approve, and for "
                                                      "nothing else."},
               "confirm": {"type": "plain_text", "text": "Approve"},
               "deny": {"type": "plain_text", "text": "Cancel"}}
    elements = [_button(f"Approve {n} only" if len(offered) > 1 else "Approve", APPROVE, f"{approval_id}:{n}",
                        "primary", confirm) for n in numbers[:TARGET_BUTTONS_MAX]]
    if 1 < len(offered) <= TARGET_BUTTONS_MAX:
        elements.append(_button(f"Approve all {len(offered)}", APPROVE, f"{approval_id}:{APPROVE_ALL}", None, confirm))
    elements.append(_button(REJECT_ALL, REJECT, str(approval_id), "danger"))
    return [{"type": "actions", "block_id": f"lagdoctor_approval_{str(approval_id).partition('.')[0]}",
             "elements": elements}]
