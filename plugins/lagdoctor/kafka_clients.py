"""Building confluent-kafka clients from a bootstrap list and librdkafka config.

librdkafka writes its own log lines to stderr by default; they are routed into
Python logging instead so that a command's error is the one line it prints.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
_rdkafka_log = logging.getLogger("lagdoctor.librdkafka")


class ConfigError(ValueError):
    """Client configuration is missing or malformed; the message is one line."""


def resolve_bootstrap(explicit: str | None, environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    value = (explicit or env.get(BOOTSTRAP_ENV) or "").strip()
    if not value:
        raise ConfigError(f"no Kafka bootstrap servers: pass --bootstrap-servers or set {BOOTSTRAP_ENV}")
    return value


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """A Java-style .properties file, as kafka-*.sh --command-config takes."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"client config file not found: {p}")
    props: dict[str, str] = {}
    for lineno, raw in enumerate(p.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{p}:{lineno}: expected key=value")
        props[key.strip()] = value.strip()
    return props


def client_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _rdkafka_log}
    # Fail fast on a dead address instead of librdkafka's long default retries.
    config.setdefault("socket.connection.setup.timeout.ms", 10000)
    config.update(extra or {})
    return config


def admin_client(bootstrap: str, extra: Mapping[str, Any] | None = None):
    from confluent_kafka.admin import AdminClient

    return AdminClient(client_config(bootstrap, extra))
