"""Slack notification: render (render.py, templates.py), decide per thread
(threads.py), send (slack.py). Cheap to import: slack_sdk loads when sending.

Task-level API:
    post_or_update_incident(finding, plan, run_id=...)   post / reply-if-changed / recovery
    post_action_result(record)                            remediation record -> thread reply
    notify_failure                                        on_failure_callback (SlackNotifier)
    slack_sender()                                        provider SlackHook or local outbox
    with_partition_status(finding, rows)                  evidence table from partition_status.jsonl
"""

from lagdoctor.notify.incidents import notify_failure, post_action_result, post_or_update_incident
from lagdoctor.notify.render import with_partition_status
from lagdoctor.notify.slack import SlackDeliveryError, slack_sender

__all__ = ["SlackDeliveryError", "notify_failure", "post_action_result", "post_or_update_incident", "slack_sender",
           "with_partition_status"]
