"""Issue 30: history is not destroyed by a passing error. Only a file whose bytes are
not a snapshot file is quarantined; a store that fails to serve a file (a timeout, a
503 SlowDown, a reset, denied access) fails the run and moves nothing, and the next
run reads the file. Local files, no Spark: the S3 server's side is in test_objectstore.
"""

from __future__ import annotations

import errno
import io
from datetime import datetime, timezone

import pytest

NOW = datetime(2026, 11, 21, 13, 0, tzinfo=timezone.utc)
DAY = "cluster=prod/date=2026-11-21"


def snapshot_bytes() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lagdoctor.contracts import snapshot_arrow_schema

    rows = [dict(snapshot_ts=datetime(2026, 11, 21, 12, k, tzinfo=timezone.utc), cluster="prod", group_id="g",
                 group_state="STABLE", topic="t", partition=0, log_start_offset=0, log_end_offset=100,
                 committed_offset=90, lag=10, member_id="m", client_id="c", host="h", group_members=1)
            for k in range(3)]
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=snapshot_arrow_schema()), out)
    return out.getvalue()


def corrupt_footer(good: bytes) -> bytes:
    """Magic and footer length intact, the footer itself garbage: pyarrow raises a plain
    OSError ("Couldn't deserialize thrift"), the same type s3fs raises for a 503."""
    length = int.from_bytes(good[-8:-4], "little")
    return good[:-8 - length] + b"\xff" * length + good[-8:]


class FailingReads:
    """A file object whose every read fails as `error`."""

    def __init__(self, fh, error):
        self._fh, self._error = fh, error

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def read(self, *args):
        raise self._error

    def readinto(self, *args):
        raise self._error

    def __getattr__(self, name):
        return getattr(self._fh, name)


class FailingStore:
    """The local filesystem, but one file fails as a store fails: when opened, or when read."""

    def __init__(self, fs, path, error, when):
        self._fs, self._path, self._error, self._when = fs, path, error, when

    def __getattr__(self, name):
        return getattr(self._fs, name)

    def open(self, path, mode="rb", **kwargs):
        if path == self._path and self._when == "open":
            raise self._error
        fh = self._fs.open(path, mode, **kwargs)
        return FailingReads(fh, self._error) if path == self._path else fh


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("error, when, said", [
    # an expired token or a missing grant: s3fs says PermissionError (AccessDenied, ExpiredToken)
    (PermissionError(errno.EACCES, "Access Denied"), "open", "PermissionError: [Errno 13] Access Denied"),
    # deleted between the listing and the read (a prune, a compaction's clean-up): nothing to quarantine
    (FileNotFoundError(errno.ENOENT, "No such file"), "open", "FileNotFoundError: [Errno 2] No such file"),
    # what s3fs raises for a 503 SlowDown once its retries are spent
    (OSError(errno.EBUSY, "Please reduce your request rate."), "read",
     "OSError: [Errno 16] Please reduce your request rate."),
    (TimeoutError("read timed out"), "read", "TimeoutError: read timed out"),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "read",
     "ConnectionResetError: [Errno 104] Connection reset by peer"),
    # a disk or NFS error: the bytes never arrived, so nothing is known about them
    (OSError(errno.EIO, "Input/output error"), "read", "OSError: [Errno 5] Input/output error"),
])
def test_a_file_the_store_fails_to_serve_is_not_moved_and_read_next_run(tmp_path, monkeypatch, error, when, said):
    import fsspec

    from lagdoctor.diagnosis import store_files
    from lagdoctor.diagnosis.snapshots import StoreReadError, inspect_store, read_snapshot_store

    root = tmp_path / "snapshots"
    (root / DAY).mkdir(parents=True)
    good = snapshot_bytes()
    (root / DAY / "a.parquet").write_bytes(good)
    (root / DAY / "b.parquet").write_bytes(good)  # the one the store fails on
    (root / DAY / "corrupt.parquet").write_bytes(b"PAR1 half a file")  # bad: waits for a run that succeeds
    before = files_under(root)

    failing = FailingStore(fsspec.filesystem("file"), str(root / DAY / "b.parquet"), error, when)
    monkeypatch.setattr(store_files, "store_filesystem", lambda path: (failing, str(root)))
    with pytest.raises(StoreReadError) as err:
        read_snapshot_store(None, str(root), NOW, quarantine=True)  # fails before any Spark read
    message = str(err.value)
    assert message == (f"cannot read snapshot file {root}/{DAY}/b.parquet: {said} "
                       "(the store failed, not the file: nothing was moved)")
    assert files_under(root) == before  # nothing moved, not even the corrupt file; no reason file

    monkeypatch.undo()  # the error has passed: the next run reads b and quarantines only the corrupt file
    inspection = inspect_store(str(root))
    assert sorted(f.relative for files in inspection.groups.values() for f in files) == [
        f"{DAY}/a.parquet", f"{DAY}/b.parquet"]
    assert [bad.file.relative for bad in inspection.bad] == [f"{DAY}/corrupt.parquet"]


@pytest.mark.parametrize("content, reason", [
    (lambda good: b"not parquet at all", "Parquet magic bytes not found"),
    (lambda good: good[:len(good) // 2], "Parquet magic bytes not found"),  # a writer cut off mid-file
    (lambda good: b"", "Parquet file size is 0 bytes"),
    # pyarrow's own OSError: its type alone would pass for the store's
    (corrupt_footer, "Couldn't deserialize thrift"),
])
def test_a_file_whose_bytes_are_not_parquet_is_still_bad(tmp_path, content, reason):
    from lagdoctor.diagnosis.snapshots import inspect_store

    root = tmp_path / "snapshots"
    (root / DAY).mkdir(parents=True)
    good = snapshot_bytes()
    (root / DAY / "a.parquet").write_bytes(good)
    (root / DAY / "bad.parquet").write_bytes(content(good))
    inspection = inspect_store(str(root))
    assert [(bad.file.relative, bad.reason.split(": ", 1)[0]) for bad in inspection.bad] == [
        (f"{DAY}/bad.parquet", "not a readable Parquet file")]
    assert reason in inspection.bad[0].reason


def test_a_value_read_the_store_fails_is_not_a_damaged_column(tmp_path, monkeypatch):
    """A narrowing column's values are read to check they fit: a failure there is the store's too."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lagdoctor.diagnosis import store_files
    from lagdoctor.diagnosis.snapshots import StoreReadError, inspect_store

    root = tmp_path / "snapshots"
    (root / DAY).mkdir(parents=True)
    table = pq.read_table(io.BytesIO(snapshot_bytes()))
    at = table.schema.get_field_index("log_end_offset")
    narrow = table.set_column(at, "log_end_offset", table["log_end_offset"].cast(pa.float64()))
    pq.write_table(narrow, root / DAY / "a.parquet")
    real = fsspec.filesystem("file")
    opens = []

    class SecondOpenFails(FailingStore):
        def open(self, path, mode="rb", **kwargs):
            opens.append(path)
            if len(opens) == 2:  # the footer read; then the column's values
                raise TimeoutError("read timed out")
            return real.open(path, mode, **kwargs)

    monkeypatch.setattr(store_files, "store_filesystem",
                        lambda path: (SecondOpenFails(real, None, None, None), str(root)))
    with pytest.raises(StoreReadError, match=r"a\.parquet: TimeoutError: read timed out"):
        inspect_store(str(root))
    monkeypatch.undo()
    assert inspect_store(str(root)).bad == []  # float values that fit int64: a good file


FILE = "s3a://lake/lagdoctor/snapshots/cluster=prod/date=2026-11-21/a.parquet"
READ_FAILED = f"[FAILED_READ_FILE.NO_HINT] Encountered error while reading file {FILE}. SQLSTATE: KD001"


@pytest.mark.parametrize("spark_error, store_failure", [
    # spark-submit (Py4J): the JVM's cause follows Spark's FAILED_READ_FILE, past one_line's 300 characters
    (f"An error occurred while calling o123.count.\n: org.apache.spark.SparkException: {READ_FAILED}\n"
     + "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.cannotReadFilesError(Q.scala:1)\n" * 8
     + "Caused by: org.apache.hadoop.fs.s3a.AWSServiceThrottledException: GET a.parquet: S3Exception: Please "
       "reduce your request rate. (Service: S3, Status Code: 503, Request ID: X):SlowDown", "SlowDown"),
    # Spark Connect: the server's stack after "JVM stacktrace:"
    (f"{READ_FAILED}\n\nJVM stacktrace:\norg.apache.spark.SparkException\nCaused by: "
     "java.net.SocketTimeoutException: Read timed out", "SocketTimeoutException"),
    (f"{READ_FAILED}\nCaused by: java.nio.file.AccessDeniedException: {FILE}: S3Exception: The provided token "
     "has expired. (Service: S3, Status Code: 400, Request ID: X):ExpiredToken", "AccessDeniedException"),
    (f"{READ_FAILED}\nCaused by: software.amazon.awssdk.core.exception.SdkClientException: Unable to execute "
     "HTTP request: Connection reset", "Connection reset"),
    # the bytes are bad: bad input (exit 3), quarantined by the next run's inspection
    (f"{READ_FAILED}\nCaused by: java.lang.RuntimeException: {FILE} is not a Parquet file. Expected magic "
     "number at tail, but found [110, 101, 115, 115]", None),
    (f"[CANNOT_READ_FILE_FOOTER] Could not read footer for file: {FILE}. SQLSTATE: KD001\n"
     "Caused by: java.io.EOFException: Reached the end of stream with 12 bytes left to read", None),
    ("[PARQUET_COLUMN_DATA_TYPE_MISMATCH] Data type mismatches when reading Parquet column lag. Expected "
     "Spark type bigint, actual Parquet type BINARY. SQLSTATE: 42846", None),
])
def test_a_read_that_failed_in_the_store_is_retried_not_bad_input(spark_error, store_failure):
    from lagdoctor.diagnosis.snapshots import store_failure_in

    # diagnose_lag exits 1 (Airflow retries) for a store failure, 3 (no retry) for bad input
    assert store_failure_in(spark_error) == store_failure
