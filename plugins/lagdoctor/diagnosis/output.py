"""Writing the job's JSON Lines outputs: through the driver (one row per partition at most), atomically.

A temporary file next to the target, then a rename: readers (the Airflow
plugin, the Slack task) never see half a file. Local paths use os.replace;
URIs go through fsspec (s3a:// is spelled s3:// there).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from typing import Any, Iterable


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json_line(record: dict) -> str:
    return json.dumps(_clean(record), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _fsspec_url(path: str) -> str:
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


def write_jsonl(records: Iterable[dict], output: str, filename: str) -> str:
    """Write records as JSON Lines to output/filename atomically; returns the path."""
    from lagdoctor.diagnosis.snapshots import is_local_path, local_path

    text = "".join(to_json_line(r) + "\n" for r in records)
    if is_local_path(output):
        directory = local_path(output)
        os.makedirs(directory, exist_ok=True)
        final = os.path.join(directory, filename)
        tmp = os.path.join(directory, f".{filename}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return final
    import fsspec

    fs, base = fsspec.core.url_to_fs(_fsspec_url(output))
    base = base.rstrip("/")
    fs.makedirs(base, exist_ok=True)
    final = f"{base}/{filename}"
    tmp = f"{base}/.{filename}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with fs.open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        fs.mv(tmp, final)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)
    return f"{output.rstrip('/')}/{filename}"


def dataframe_records(df, order_by: Iterable[str] = ()) -> list[dict]:
    """Collect a DataFrame as plain dicts (nested structs -> dicts).

    Through Arrow batches, not pickled Rows: a status row per partition is
    200k rows at 10,000 groups x 20 partitions, and Row objects cost seconds there.
    """
    ordered = df.orderBy(*order_by) if order_by else df
    return ordered.toArrow().to_pylist()


def write_findings(findings_df, output: str) -> str:
    """findings.jsonl, ordered by cluster, group, topic, then the contract's diagnosis order."""
    from lagdoctor.contracts import DIAGNOSES, FINDINGS_FILE

    records = [] if findings_df is None else dataframe_records(findings_df)
    rank = {d: i for i, d in enumerate(DIAGNOSES)}
    records.sort(key=lambda r: (r["cluster"], r["group_id"], r["topic"], rank.get(r["diagnosis"], 99)))
    return write_jsonl(records, output, FINDINGS_FILE)


def write_partition_status(status_df, output: str) -> str:
    from lagdoctor.contracts import PARTITION_STATUS_FILE

    records = [] if status_df is None else dataframe_records(status_df)
    records.sort(key=lambda r: (r["cluster"], r["group_id"], r["topic"], r["partition"]))
    return write_jsonl(records, output, PARTITION_STATUS_FILE)


QUARANTINED_FILE = "quarantined.jsonl"


def write_quarantined(records: Iterable[dict], output: str) -> str:
    """quarantined.jsonl: one {"path", "moved_to", "reason"} per file this run moved aside (empty: none)."""
    return write_jsonl([{k: r[k] for k in ("path", "moved_to", "reason")} for r in records], output, QUARANTINED_FILE)


def print_error_line(message: str) -> None:
    """Print the job's one-line failure reason on the process's stderr.

    Under spark-submit the Python driver's stderr is merged into the JVM's
    stdout (PythonRunner redirects it), so there the line goes through the
    already-running Py4J gateway to the JVM's own System.err; run directly
    with python, plain stderr.
    """
    import sys

    line = " ".join(message.split())
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        try:
            from pyspark.java_gateway import launch_gateway

            gateway = launch_gateway()  # connects to spark-submit's gateway; starts nothing
            gateway.jvm.System.err.println(line)
            gateway.jvm.System.err.flush()
            return
        except Exception:  # fall back to the merged stream rather than lose the reason
            pass
    print(line, file=sys.stderr, flush=True)
