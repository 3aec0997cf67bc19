"""Keep secrets and multi-line noise out of log lines, Slack messages and errors."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

# librdkafka / client config keys whose values are secrets.
_SECRET_KEY = re.compile(r"(password|secret|token|sasl\.oauthbearer\.config|ssl\.key\.pem|api[._-]?key)", re.I)
# Slack tokens and bearer headers that might hide in a library's error text.
_TOKEN_SHAPES = re.compile(r"(xox[abposr]-[A-Za-z0-9-]+|xapp-[A-Za-z0-9-]+|Bearer\s+[A-Za-z0-9._~+/=-]+)")
MAX_ERROR_CHARS = 300


def secret_values(config: Mapping[str, Any] | None) -> list[str]:
    """The values of secret-looking keys in a client config (kept for scrubbing)."""
    if not config:
        return []
    return [str(v) for k, v in config.items() if _SECRET_KEY.search(str(k)) and v not in (None, "")]


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _TOKEN_SHAPES.sub("***", text)


def one_line(exc: BaseException | str, secrets: Iterable[str] = ()) -> str:
    """``Type: message`` on one line, secrets replaced, at most MAX_ERROR_CHARS."""
    text = exc if isinstance(exc, str) else (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    text = " ".join(scrub(text, secrets).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
