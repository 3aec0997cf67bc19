"""How the diagnosis job's input fails, said in one line: SnapshotInputError
(the input cannot be diagnosed), StoreReadError and store_failure_in (the store
failed, not the file: worth a retry), one_line for any exception."""

from __future__ import annotations


class SnapshotInputError(ValueError):
    """The input cannot be diagnosed; str() is one line meant for stderr."""


class StoreReadError(OSError):
    """The store failed to serve a file (I/O, throttling, a timeout, auth): not a bad file.

    Nothing is moved; str() is one line naming the file; a later run may read it.
    """


# What Spark's own read error says when the store failed, not the file's bytes (S3A's exception
# names, S3's codes and statuses, the network's words): Spark wraps both in FAILED_READ_FILE.
_STORE_FAILURE_MARKERS = (
    "SlowDown", "Status Code: 5", "Status Code: 403", "Service Unavailable", "Throttled", "InternalError",
    "RequestTimeout", "SocketTimeoutException", "ConnectTimeoutException", "timed out", "Connection reset",
    "Connection refused", "NoHttpResponseException", "AWSNoResponseException", "AccessDeniedException",
    "ExpiredToken", "UnknownHostException",
)


def store_failure_in(spark_error: str) -> str | None:
    """The first sign in Spark's error text (all of it, the JVM's causes too) that the store
    failed while Spark read a file (throttled, timed out, refused): worth a retry, not bad
    input. None when nothing says so."""
    return next((m for m in _STORE_FAILURE_MARKERS if m in spark_error), None)


def _is_rpc_error(exc: BaseException) -> bool:
    try:
        import grpc
    except ImportError:  # no Spark Connect client here: no gRPC errors either
        return False
    return isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None))


def one_line(exc: BaseException) -> str:
    """First meaningful line of an exception message (Py4J errors carry JVM stacks; a gRPC error from
    Spark Connect is said as its status and details, not the first line of its repr)."""
    import re

    text = str(exc).strip()
    if _is_rpc_error(exc):
        try:
            status, said = exc.code(), exc.details()
        except Exception:  # noqa: BLE001 - a call without a status yet: read its text below
            status = said = None
        if status is not None:
            return f"gRPC call failed: {getattr(status, 'name', status)}: {' '.join(str(said or '').split())}"[:400]
    rpc = re.search(r'status = StatusCode\.(\w+)\s+details = "((?:[^"\\]|\\.)*)"', text)
    if rpc:  # the same error's text, as a wrapper carried it ("<_MultiThreadedRendezvous of RPC that ...")
        return f"gRPC call failed: {rpc.group(1)}: {' '.join(rpc.group(2).split())}"[:400]
    for line in text.splitlines():
        line = line.strip().lstrip(": ").strip()
        if not line or line.startswith(("JVM stacktrace", "at ", "py4j", "An error occurred while calling")):
            continue
        # "org.apache.spark.SparkException: [FAILED_READ_FILE...] ..." -> the message
        line = re.sub(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error):\s*", "", line)
        return line[:400]
    return type(exc).__name__
