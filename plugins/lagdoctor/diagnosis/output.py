"""Writing the job's JSON Lines outputs: through the driver (one row per partition at most), atomically.

A temporary file next to the target, then a rename: readers (the Airflow
plugin, the Slack task) never see half a file. Local paths use os.replace;
URIs go through fsspec (s3a:// is spelled s3:// there).

A run folder is complete only once ``_SUCCESS`` is in it (``write_outputs``):
``_WRITING`` goes in first and any older ``_SUCCESS`` (a retried task writing
into the same folder) is removed, then the outputs, then ``_SUCCESS`` naming
each output's rows and bytes, last. A job killed anywhere in between leaves a
folder every reader skips (lagdoctor.runindex.run_completeness).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from typing import Any, Iterable

from lagdoctor.contracts import QUARANTINED_FILE  # noqa: F401  (kept importable from here)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def to_json_line(record: dict) -> str:
    # NaN and infinity are rare: encode as is, and walk the record to null them only when
    # the encoder refuses one (22k findings and statuses: _clean on every value took ~1 s)
    try:
        return _ENCODE(record)
    except ValueError:
        return _ENCODE(_clean(record))


def _fsspec_url(path: str) -> str:
    return "s3://" + path[len("s3a://"):] if path.startswith("s3a://") else path


def write_jsonl(records: Iterable[dict], output: str, filename: str) -> str:
    """Write records as JSON Lines to output/filename atomically; returns the path."""
    return write_text(output, filename, "".join(to_json_line(r) + "\n" for r in records))


def write_text(output: str, filename: str, text: str) -> str:
    """Write text to output/filename atomically (temporary name, then rename); returns the path."""
    return write_lines(output, filename, [text])[0]


def write_lines(output: str, filename: str, pieces: Iterable[str]) -> tuple[str, dict[str, int]]:
    """Write `pieces` (text, e.g. JSON lines, produced as they are written: never all held at once)
    to output/filename atomically (temporary name, then rename); (path, _stats of what was written)."""
    from lagdoctor.diagnosis.store_files import is_local_path, local_path

    stats = {"rows": 0, "bytes": 0}

    def counted(fh):
        for piece in pieces:
            fh.write(piece)
            stats["rows"] += piece.count("\n")
            stats["bytes"] += len(piece.encode("utf-8"))

    if is_local_path(output):
        directory = local_path(output)
        os.makedirs(directory, exist_ok=True)
        final = os.path.join(directory, filename)
        tmp = os.path.join(directory, f".{filename}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                counted(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return final, stats
    import fsspec

    fs, base = fsspec.core.url_to_fs(_fsspec_url(output))
    base = base.rstrip("/")
    fs.makedirs(base, exist_ok=True)
    final = f"{base}/{filename}"
    tmp = f"{base}/.{filename}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with fs.open(tmp, "w", encoding="utf-8") as fh:
            counted(fh)
        fs.mv(tmp, final)
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)
    return f"{output.rstrip('/')}/{filename}", stats


def remove_file(output: str, filename: str) -> None:
    """Remove output/filename if it is there."""
    from lagdoctor.diagnosis.store_files import is_local_path, local_path

    if is_local_path(output):
        try:
            os.remove(os.path.join(local_path(output), filename))
        except FileNotFoundError:
            pass
        return
    import fsspec

    fs, base = fsspec.core.url_to_fs(_fsspec_url(output))
    path = f"{base.rstrip('/')}/{filename}"
    if fs.exists(path):
        fs.rm(path)


def _stats(text: str) -> dict[str, int]:
    return {"rows": text.count("\n"), "bytes": len(text.encode("utf-8"))}


def begin_outputs(output: str, *, now: str) -> None:
    """Mark the folder as being written, then drop an older completion marker (a retry):
    from here until ``finish_outputs`` every reader skips the folder."""
    from lagdoctor.contracts import SUCCESS_FILE, WRITING_FILE

    write_text(output, WRITING_FILE, json.dumps({"started_at": now}) + "\n")
    remove_file(output, SUCCESS_FILE)


def finish_outputs(output: str, written: dict[str, dict[str, int]], *, now: str) -> str:
    """The completion marker, written last: each output's rows and bytes (readers check the bytes)."""
    from lagdoctor.contracts import SUCCESS_FILE, WRITING_FILE

    path = write_text(output, SUCCESS_FILE, json.dumps({"outputs": written, "finished_at": now}, sort_keys=True) + "\n")
    remove_file(output, WRITING_FILE)
    return path


def write_outputs(findings_df, status_df, quarantined: Iterable[dict], output: str, *, now: str) -> dict[str, dict[str, int]]:
    """Every output of a run, then the marker that says they are complete; returns the marker's outputs.

    The rows are collected before the first file is written, so the folder is
    incomplete only for the few milliseconds the writes take.
    """
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE, QUARANTINED_FILE

    texts = {
        FINDINGS_FILE: "".join(to_json_line(r) + "\n" for r in findings_records(findings_df)),
        PARTITION_STATUS_FILE: "".join(to_json_line(r) + "\n" for r in status_records(status_df)),
        QUARANTINED_FILE: "".join(to_json_line({k: r[k] for k in ("path", "moved_to", "reason")}) + "\n"
                                  for r in quarantined),
    }
    begin_outputs(output, now=now)
    written = {}
    for name, text in texts.items():
        write_text(output, name, text)
        written[name] = _stats(text)
    finish_outputs(output, written, now=now)
    return written


def dataframe_records(df, order_by: Iterable[str] = ()) -> list[dict]:
    """Collect a DataFrame as plain dicts (nested structs -> dicts).

    Through Arrow batches, not pickled Rows: a status row per partition is
    200k rows at 10,000 groups x 20 partitions, and Row objects cost seconds there.
    """
    ordered = df.orderBy(*order_by) if order_by else df
    return _arrow_table(ordered).to_pylist()


def _arrow_table(df):
    """df.toArrow(); on Spark Connect in one round trip: its toArrow asks the server for the
    schema before it executes, a second analysis of the whole plan (1-3 s for the findings')."""
    from lagdoctor.diagnosis.session import is_connect

    to_table = getattr(df, "_to_table", None)
    if is_connect(df.sparkSession) and to_table is not None:
        from pyspark.sql.pandas.types import to_arrow_schema

        table, schema = to_table()  # the schema comes with the result
        if schema is not None:
            return table.cast(to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True,
                                              timezone="UTC"))
    return df.toArrow()


def findings_records(findings_df) -> list[dict]:
    """findings.jsonl's rows, ordered by cluster, group, topic, then the contract's diagnosis order."""
    from lagdoctor.contracts import DIAGNOSES

    records = [] if findings_df is None else dataframe_records(findings_df)
    rank = {d: i for i, d in enumerate(DIAGNOSES)}
    records.sort(key=lambda r: (r["cluster"], r["group_id"], r["topic"], rank.get(r["diagnosis"], 99)))
    return records


def status_records(status_df) -> list[dict]:
    records = [] if status_df is None else dataframe_records(status_df)
    records.sort(key=lambda r: (r["cluster"], r["group_id"], r["topic"], r["partition"]))
    return records


def write_findings(findings_df, output: str) -> str:
    """findings.jsonl alone (no completion marker: the job writes through ``write_outputs``)."""
    from lagdoctor.contracts import FINDINGS_FILE

    return write_jsonl(findings_records(findings_df), output, FINDINGS_FILE)


def write_partition_status(status_df, output: str) -> str:
    from lagdoctor.contracts import PARTITION_STATUS_FILE

    return write_jsonl(status_records(status_df), output, PARTITION_STATUS_FILE)


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
