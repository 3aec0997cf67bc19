"""Senders: deliver a rendered message; nothing else.

``slack_sender()`` picks the provider's SlackHook when the ``slack_api_default``
connection exists, else an outbox file under the data root (plus a log line),
so a machine without Slack still runs every DAG to success. Callers never send
directly: messages go through the durable outbox (outbox.py), which calls a
sender for each pending row in order.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

from lagdoctor.connections import connection_exists
from lagdoctor.notify.redact import one_line

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = "slack_api_default"
CHANNEL_ENV = "LAGDOCTOR_SLACK_CHANNEL"
DEFAULT_CHANNEL = "#kafka-lag"
# slack-sdk's own handlers: 500/503 back off; resets/refusals retry. A 429 is not retried
# here: the outbox waits out its Retry-After within a budget per task (outbox.RATE_LIMIT_BUDGET_S).
SERVER_ERROR_RETRIES = 2
CONNECTION_RETRIES = 2
CLIENT_LOGGER = "lagdoctor.notify.slack_client"


# Slack errors about one message itself: no retry can fix them (the outbox
# marks the message rejected instead of letting it block every later one).
MESSAGE_ERRORS = frozenset({"invalid_blocks", "invalid_blocks_format", "msg_too_long", "no_text",
                            "too_many_attachments", "invalid_attachments", "markdown_text_conflict"})
# Errors about where a message goes: a thread's channel archived or left since
# the thread was opened. The outbox re-sends such a reply top-level.
PLACE_ERRORS = frozenset({"is_archived", "channel_not_found", "not_in_channel", "thread_not_found"})
RATE_LIMITED = "ratelimited"


class SlackDeliveryError(RuntimeError):
    """Slack refused or could not take a message; one line, no token.

    ``rejected`` is true when Slack refused this message for what it is
    (``MESSAGE_ERRORS``), false for outages, rate limits and configuration.
    ``retry_after``: seconds Slack asked to wait, set for a rate limit (429) only."""

    def __init__(self, message: str, *, rejected: bool = False, reason: str | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.rejected = rejected
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class Posted:
    channel: str
    ts: str


class Sender(Protocol):
    kind: str

    def post(self, *, text: str, blocks: Sequence[dict], thread_ts: str | None = None,
             channel: str | None = None) -> Posted: ...


def retry_handlers() -> list[Any]:
    from slack_sdk.http_retry.builtin_handlers import ConnectionErrorRetryHandler, ServerErrorRetryHandler

    return [
        ConnectionErrorRetryHandler(max_retry_count=CONNECTION_RETRIES),
        ServerErrorRetryHandler(max_retry_count=SERVER_ERROR_RETRIES),
    ]


def retry_after_seconds(headers: Any) -> float:
    """Slack's Retry-After (whole seconds) from a 429's headers; 1 s when absent or not a number."""
    for name, value in dict(headers or {}).items():
        if str(name).lower() == "retry-after":
            value = value[0] if isinstance(value, (list, tuple)) and value else value
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                break
    return 1.0


def default_channel() -> str:
    return os.environ.get(CHANNEL_ENV) or DEFAULT_CHANNEL


class ProviderSlackSender:
    """chat.postMessage through ``SlackHook``'s WebClient, with slack-sdk's retry handlers."""

    kind = "slack"

    def __init__(self, conn_id: str = DEFAULT_CONN_ID, channel: str | None = None) -> None:
        self.conn_id = conn_id
        self.channel = channel or default_channel()
        self._hook = None

    @property
    def hook(self):
        if self._hook is None:
            from airflow.providers.slack.hooks.slack import SlackHook

            # A plain stdlib logger: slack-sdk redacts the Authorization header in
            # its debug lines, and operators can turn that logger up on its own.
            self._hook = SlackHook(slack_conn_id=self.conn_id, retry_handlers=retry_handlers(),
                                   logger=logging.getLogger(CLIENT_LOGGER))
        return self._hook

    def _token(self) -> list[str]:
        try:
            from airflow.sdk.bases.hook import BaseHook

            return [BaseHook.get_connection(self.conn_id).password or ""]
        except Exception:
            return []

    def post(self, *, text: str, blocks: Sequence[dict], thread_ts: str | None = None,
             channel: str | None = None) -> Posted:
        kwargs: dict[str, Any] = {"channel": channel or self.channel, "text": text, "blocks": list(blocks),
                                  "unfurl_links": False, "unfurl_media": False}
        if thread_ts:
            kwargs["thread_ts"] = thread_ts
        try:
            response = self.hook.client.chat_postMessage(**kwargs)
        except Exception as exc:
            response = getattr(exc, "response", None)
            error = getattr(response, "data", None)
            reason = error.get("error") if isinstance(error, dict) else None
            if getattr(response, "status_code", None) == 429 or reason == RATE_LIMITED:
                wait = retry_after_seconds(getattr(response, "headers", None))
                raise SlackDeliveryError(f"Slack rate limit (Retry-After {wait:g} s)", reason=RATE_LIMITED,
                                         retry_after=wait) from None
            message = f"Slack API error: {reason}" if reason else exc
            raise SlackDeliveryError(one_line(message, self._token()), rejected=reason in MESSAGE_ERRORS,
                                     reason=reason) from None
        return Posted(channel=str(response["channel"]), ts=str(response["ts"]))


class OutboxSender:
    """Appends each message as a JSON line to a local outbox and logs its text."""

    kind = "outbox"
    _lock = threading.Lock()

    def __init__(self, path: str, channel: str | None = None) -> None:
        self.path = Path(path[len("file://"):] if path.startswith("file://") else path)
        self.channel = channel or default_channel()

    def post(self, *, text: str, blocks: Sequence[dict], thread_ts: str | None = None,
             channel: str | None = None) -> Posted:
        import fcntl

        with self._lock:
            # Slack-shaped ts, unique and increasing, so threads work the same way.
            ts = f"{time.time():.6f}"
            time.sleep(0.000002)
        channel = channel or self.channel
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"channel": channel, "ts": ts, "thread_ts": thread_ts, "text": text, "blocks": list(blocks)}
        with open(self.path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fcntl.flock(fh, fcntl.LOCK_UN)
        log.info("Slack outbox (no %r connection) %s%s: %s", DEFAULT_CONN_ID, channel,
                 f" thread {thread_ts}" if thread_ts else "", text)
        return Posted(channel=channel, ts=ts)


def outbox_path(settings: Any) -> str:
    """<data root>/outbox/slack.jsonl; with an object-store root, under $AIRFLOW_HOME/lagdoctor
    on this worker (a file appended to under a lock: an object store has neither)."""
    from lagdoctor.settings import join

    return join(settings.local_root, "outbox", "slack.jsonl")


def slack_sender(conn_id: str = DEFAULT_CONN_ID, *, channel: str | None = None, settings: Any = None) -> Sender:
    """The provider's Slack client when ``conn_id`` exists, else the outbox."""
    if connection_exists(conn_id):
        return ProviderSlackSender(conn_id, channel)
    from lagdoctor.settings import Settings

    settings = settings or Settings.from_env()
    return OutboxSender(outbox_path(settings), channel)
