"""Building confluent-kafka clients from a bootstrap list and librdkafka config.

librdkafka writes its own log lines (`%3|FAIL|...`) to stderr by default, a
few hundred of them when a cluster is down or refuses our credentials. Every
client built here sends them to the `lagdoctor.librdkafka` logger at DEBUG
instead, so a command's or task's error is the one line it prints, and
records the errors librdkafka reports through `error_cb`, so that line can
say "cannot authenticate" rather than librdkafka's generic "Broker transport
failure".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
_rdkafka_log = logging.getLogger("lagdoctor.librdkafka")
# The attribute under which a client built here carries its ClientErrors.
_CONFIG_ATTR = "_lagdoctor_config"
_ERRORS_ATTR = "lagdoctor_errors"


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


class _DebugLogger:
    """librdkafka's log lines, whatever their syslog level, at DEBUG: they are
    detail for whoever debugs; the error a user sees is built from `ClientErrors`."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        _rdkafka_log.debug(msg, *args)


def is_auth_error(error: Any) -> bool:
    """A KafkaError that means the cluster refused our credentials or TLS handshake."""
    from confluent_kafka import KafkaError

    code = error.code() if hasattr(error, "code") else None
    return code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL)


def error_text(error: Any) -> str:
    """A KafkaError, KafkaException or any exception as one line of readable text."""
    first = error.args[0] if isinstance(error, BaseException) and error.args else error
    text = first.str() if hasattr(first, "str") else str(first)
    return " ".join(text.split())


def failure_reason(exc: BaseException) -> str:
    """One line for a failed future: librdkafka's text and, when it has one, the error name."""
    first = exc.args[0] if exc.args else None
    text = error_text(exc) or type(exc).__name__
    name = first.name() if hasattr(first, "name") else None
    return f"{text} ({name})" if name and name not in text else text


class ClientErrors:
    """The client's `error_cb`: remembers the last error and the last authentication error.

    librdkafka queues these until the client is polled; `failure_message`
    polls first. Errors are kept, not logged: the caller decides what to say.
    """

    def __init__(self) -> None:
        self.last: Any = None
        self.last_auth: Any = None

    def __call__(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        if is_auth_error(error):
            self.last_auth = error
        # "n/n brokers are down" says less than the connect error before it.
        if error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.last = error


def forget_errors(client: Any) -> None:
    """Serve and drop the errors a client queued so far: a later failure message
    names only what went wrong since (a blip an hour ago is not today's reason)."""
    errors = getattr(client, _ERRORS_ATTR, None)
    if errors is None:
        return
    try:
        client.poll(0)
    except Exception:
        pass
    errors.last = errors.last_auth = None


def client_config(bootstrap: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _DebugLogger()}
    # Fail fast on a dead address instead of librdkafka's long default retries.
    config.setdefault("socket.connection.setup.timeout.ms", 10000)
    config.update(extra or {})
    return config


def quiet_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], ClientErrors]:
    """An existing librdkafka config (e.g. the Airflow provider hook's) with our logger
    and error recorder added; a logger or error_cb the config already has is kept."""
    errors = ClientErrors()
    quiet = dict(config)
    quiet.setdefault("logger", _DebugLogger())
    quiet.setdefault("error_cb", errors)
    return quiet, errors


def admin_client(bootstrap: str, extra: Mapping[str, Any] | None = None):
    config, errors = quiet_config(client_config(bootstrap, extra))
    return _admin_from_config(config, errors)


def _admin_from_config(config: Mapping[str, Any], errors: ClientErrors):
    from confluent_kafka.admin import AdminClient

    client = AdminClient(dict(config))
    setattr(client, _ERRORS_ATTR, errors)
    # kept (in memory only) so a reader of the same cluster can open a consumer with it
    setattr(client, _CONFIG_ATTR, dict(config))
    return client


def config_of(client: Any) -> dict[str, Any] | None:
    """The librdkafka config an admin client here was built with; None for any other client."""
    config = getattr(client, _CONFIG_ATTR, None)
    return dict(config) if isinstance(config, dict) else None


def airflow_admin_client(conn_id: str):
    """The provider hook's AdminClient for an Airflow `kafka` connection (its callbacks,
    MSK IAM and Google token handling included), with librdkafka's log lines and
    errors routed as for every other client here."""
    from airflow.providers.apache.kafka.hooks.client import KafkaAdminClientHook

    class _QuietHook(KafkaAdminClientHook):
        def _get_client(self, config):
            quiet, errors = quiet_config(config)
            return _admin_from_config(quiet, errors)

    return _QuietHook(kafka_config_id=conn_id).get_conn


def failure_message(exc: BaseException, client: Any, where: str, what: str = "cannot reach Kafka") -> str:
    """One line for a request that failed against the whole cluster.

    An authentication or TLS failure says so ("cannot authenticate to Kafka at
    HOST: <librdkafka's reason>"); otherwise "<what> at HOST: <reason>",
    with the connection error librdkafka reported when there was one, which
    says more than the request's own "Broker transport failure".
    """
    errors = getattr(client, _ERRORS_ATTR, None)
    if errors is not None:
        try:
            client.poll(0)  # serve the queued error_cb (and log) events
        except Exception:  # a closed client: fall back to the exception alone
            pass
    reason = exc.args[0] if exc.args else exc
    if errors is not None and errors.last_auth is not None:
        return f"cannot authenticate to Kafka at {where}: {error_text(errors.last_auth)}"
    if is_auth_error(reason):
        return f"cannot authenticate to Kafka at {where}: {error_text(reason)}"
    detail = error_text(exc)
    if errors is not None and errors.last is not None and error_text(errors.last) not in detail:
        detail = f"{detail} ({error_text(errors.last)})"
    return f"{what} at {where}: {detail}"
