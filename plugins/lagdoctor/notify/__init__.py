"""Slack notification: render (render.py, templates.py; its words in
formatting.py, lag_text.py, provisional.py, read from evidence.py), decide per
thread (threads.py), queue and deliver (outbox.py, slack.py); while the state
database is unreachable, keep calls in a local spool and replay them once
(spool.py). Cheap to import: slack_sdk loads when sending.

Task-level API (each queues in the state database, then delivers what waits):
    post_or_update_incident(finding, plan, run_id=...)   post / reply-if-changed / recovery
    post_incident_run(items, run_id=..., scope=...)       a manual incident run's one thread
    post_action_result(record)                            remediation record -> thread reply
    post_notice(message, dedupe_key=...)                  a one-off message, once
    deliver_pending()                                     send what an outage left waiting
    notify_failure / notify_recovery                      one failure thread per DAG
    record_task_failure / notify_run_failed               the DAGs' callbacks: a failure is said
                                                          once the run has failed, not before
    slack_sender()                                        provider SlackHook or local outbox
    with_partition_status(finding, rows)                  evidence table from partition_status.jsonl
"""

from lagdoctor.notify.incidents import (
    deliver_pending,
    notify_failure,
    notify_recovery,
    notify_run_failed,
    post_action_result,
    post_incident_run,
    post_notice,
    post_or_update_incident,
    record_task_failure,
)
from lagdoctor.notify.evidence import with_partition_status
from lagdoctor.notify.slack import SlackDeliveryError, slack_sender

__all__ = ["SlackDeliveryError", "deliver_pending", "notify_failure", "notify_recovery", "notify_run_failed",
           "post_action_result", "post_incident_run", "post_notice", "post_or_update_incident", "record_task_failure",
           "slack_sender", "with_partition_status"]
