"""Slack's Interactivity request URL, mounted by the Airflow plugin at /lagdoctor-slack:

    POST /actions     Slack's block_actions payload (form field ``payload``)

Not behind Airflow's login: Slack cannot hold an Airflow session. Instead
every request must carry Slack's v0 signature (HMAC-SHA256 of
``v0:{timestamp}:{raw body}`` with the app's signing secret, the timestamp
within 5 minutes, compared in constant time); anything else is 401, and
without a signing secret everything is. The headers and timestamp are checked
before the secret is looked up, and nothing else is looked up before the
signature holds. A body over 64 KiB is 413, refused as it streams (never held
whole); a signed payload of the wrong shape (a JSON field of the wrong type) 400. A request seen before (same
signature, or the same click) is answered 200 and not acted on again.
What a click does is lagdoctor.notify.interactive; who answered is shown to
the clicker alone (chat.postEphemeral) and, once acted on, in the thread.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from lagdoctor.notify.interactive import ACTIONS_PATH, URL_PREFIX
from lagdoctor.settings import Settings

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # Slack's payloads are a few KiB; a bigger body is not Slack's


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class SlackWeb:
    """The two Web API calls a click needs, through the Slack connection (its token, its base_url)."""

    def __init__(self) -> None:
        from lagdoctor.notify.slack import ProviderSlackSender

        self._client = ProviderSlackSender().hook.client

    def group_members(self, group: str) -> Iterable[str]:
        return self._client.usergroups_users_list(usergroup=group)["users"] or []

    def ephemeral(self, channel: str, user: str, text: str) -> None:
        self._client.chat_postEphemeral(channel=channel, user=user, text=text)


def _slack_web() -> SlackWeb | None:
    from lagdoctor.connections import connection_exists
    from lagdoctor.notify.slack import DEFAULT_CONN_ID

    return SlackWeb() if connection_exists(DEFAULT_CONN_ID) else None


def create_app(
    *,
    clock: Callable[[], datetime] = _utcnow,
    settings_factory: Callable[[], Settings] = Settings.from_env,
    hitl_factory: Callable[[], Any] | None = None,
    slack_factory: Callable[[], SlackWeb | None] = _slack_web,
) -> FastAPI:
    """The app the plugin mounts; ``clock`` and the factories are for tests (pass ``now`` in)."""
    app = FastAPI(title="lagdoctor Slack actions", docs_url=None, redoc_url=None, openapi_url=None)

    def refuse(reason: str) -> JSONResponse:
        log.warning("Slack request refused: %s", reason)  # the reason only: never a header or the secret
        return JSONResponse({"ok": False, "error": "request not signed by Slack"}, status_code=401)

    def act(body: bytes, timestamp: str | None, signature: str | None,
            background: BackgroundTasks) -> JSONResponse:
        from lagdoctor.notify import interactive
        from lagdoctor.notify.redact import one_line
        from lagdoctor.state import state_db

        now = clock()
        # Headers and the timestamp window first: a request that cannot be Slack's
        # costs no connection lookup (the secret lives in the Slack connection).
        reason = interactive.verify_signature("-", timestamp, body, signature, now=now.timestamp())
        if reason and reason != "signature mismatch":
            return refuse(reason)
        secret = interactive.signing_secret()
        reason = interactive.verify_signature(secret, timestamp, body, signature, now=now.timestamp())
        if reason:
            return refuse(reason)
        try:
            click = interactive.Click.from_payload(interactive.payload_from_form(body) or {})
        except (TypeError, ValueError, AttributeError, IndexError, KeyError):
            click = None  # signed, but not the shape Slack sends: a JSON field of the wrong type
        if click is None or not click.user_id:
            return JSONResponse({"ok": False, "error": "not a block_actions payload"}, status_code=400)
        settings = settings_factory()
        db = state_db(settings)
        if not interactive.first_seen(db, [f"sig:{signature}", click.replay_key()], now):
            log.info("Slack request seen before (replay or Slack's retry): not acted on again")
            return JSONResponse({"ok": True, "outcome": "replayed"})
        try:
            slack = slack_factory()
        except Exception as exc:  # noqa: BLE001 - a broken Slack connection: act anyway, no ephemeral reply
            log.warning("Slack connection unusable for replies: %s", one_line(exc))
            slack = None
        if hitl_factory is not None:
            hitl = hitl_factory()
        else:
            from lagdoctor.notify.airflow_api import hitl_client

            hitl = hitl_client()
        outcome = interactive.handle_click(
            click, db=db, now=now, hitl=hitl,
            group_members=slack.group_members if slack is not None else (lambda _g: ()))
        log.info("Slack click %s by %s on %s: %s", click.action_id, click.who,
                 interactive.shown_value(click.value), outcome.outcome)
        if outcome.ephemeral and slack is not None and click.channel_id:
            try:
                slack.ephemeral(click.channel_id, click.user_id, outcome.ephemeral)
            except Exception as exc:  # noqa: BLE001 - the answer still stands; only the note is lost
                log.warning("Slack: could not tell %s: %s", click.who, one_line(exc))
        if outcome.posted:
            background.add_task(_deliver, settings, now)
        return JSONResponse({"ok": True, "outcome": outcome.outcome, "text": outcome.ephemeral})

    @app.post(ACTIONS_PATH)
    async def actions(request: Request, background: BackgroundTasks) -> JSONResponse:
        body = await read_at_most(request, MAX_BODY)
        if body is None:
            log.warning("Slack request refused: body over %d bytes", MAX_BODY)
            return JSONResponse({"ok": False, "error": f"body over {MAX_BODY} bytes"}, status_code=413)
        # The database and Airflow's API are blocking calls: off the event loop.
        return await run_in_threadpool(act, body, request.headers.get("X-Slack-Request-Timestamp"),
                                       request.headers.get("X-Slack-Signature"), background)

    return app


async def read_at_most(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is over `limit` bytes (a declared Content-Length
    over it is refused before reading): never more than `limit` bytes held in memory."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _deliver(settings: Settings, now: datetime) -> None:
    """After the 200: post who did what (Slack wants its answer within 3 s)."""
    from lagdoctor.notify.incidents import deliver_pending

    deliver_pending(settings, now=now)
