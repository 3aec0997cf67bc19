"""Diagnosis job (contract 2): offset snapshots -> findings.jsonl, partition_status.jsonl.

    spark-submit [--py-files lagdoctor.zip] spark_jobs/diagnose_lag.py \\
        --snapshots PATH --output PATH [--as-of ISO-8601] [--window-minutes N] \\
        [--clusters NAME[,NAME...]] [--groups REGEX] [--topic NAME] \\
        [--carry-from PATH] [--warning-lag N --critical-lag N ...]   (every field of Thresholds)

Extract -> transform -> load; the transforms live in lagdoctor.diagnosis.
--clusters lists only those cluster=<name> folders of the store (and drops
rows of other clusters from files outside cluster= folders); a name with no
folder gets a one-line warning, not an error (nothing to read is empty
output). Without it every cluster is read. --groups (RE2, full match on
group_id) and --topic limit what is diagnosed and written.
With --as-of and --window-minutes only the date=/hour= folders that can hold
the window are listed; without --as-of the window ends at the latest
snapshot_ts in the footers' statistics of the input, and with
--window-minutes older folders are never opened. A file that is not a
snapshot file (not Parquet, a corrupt footer, a schema that cannot be
contract 1) is moved to <store>/_quarantine/ (with --quarantine), listed in
quarantined.jsonl and named once on stderr; the rest is diagnosed. A file
the store fails to serve (a timeout, a 503 SlowDown, denied access), during
the inspection or Spark's own read, fails the run with exit 1 and moves
nothing: the next run reads it.
The outputs are written last, after every row is collected, and then
_SUCCESS (rows and bytes of each output): a folder without it is incomplete.
--carry-from names the previous run's findings.jsonl (or its folder): a surge
that outlasts the window keeps the baseline that run measured (rule case 27);
one that cannot be read gets a one-line warning, and the run goes on without.
--check-mount (the DAGs pass it with LAGDOCTOR_DATA_ROOT_SHARED=1): a local
--snapshots folder on a cluster master is first proved seen by every executor
(lagdoctor.mount); one that is not fails the run, exit 1, with nothing written.
Exit codes: 0 outputs written (empty input -> empty outputs), 2 bad
arguments or missing path, 3 a missing column in every file or an
unreadable input, 1 any other failure (a store that failed to serve a file
among them). Failures print one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_INPUT = 0, 1, 2, 3


def parse_args(argv):
    from lagdoctor.diagnosis.thresholds import Thresholds

    parser = argparse.ArgumentParser(prog="diagnose_lag", description=__doc__.splitlines()[0])
    parser.add_argument("--snapshots", required=True, metavar="PATH")
    parser.add_argument("--output", required=True, metavar="PATH")
    parser.add_argument("--as-of", default=None, metavar="ISO-8601")
    parser.add_argument("--window-minutes", type=float, default=None, metavar="N")
    parser.add_argument("--clusters", default=None, metavar="NAME[,NAME...]",
                        help="only these clusters' cluster= folders (default: every cluster)")
    parser.add_argument("--groups", default=None, metavar="REGEX", help="RE2, matched in full against group_id")
    parser.add_argument("--topic", default=None, metavar="NAME")
    parser.add_argument("--quarantine", action="store_true",
                        help="move files that are not snapshot files to <snapshots>/_quarantine/ and diagnose the "
                             "rest (without it such a file fails the job, and nothing under --snapshots is moved; "
                             "a file the store fails to serve is never moved)")
    parser.add_argument("--carry-from", default=None, metavar="PATH",
                        help="the previous run's findings.jsonl or its folder: surges older than the window")
    parser.add_argument("--check-mount", action="store_true",
                        help="the local --snapshots folder is declared mounted on every Spark host "
                             "(LAGDOCTOR_DATA_ROOT_SHARED=1): on a cluster master, first prove every executor sees it")
    for f in fields(Thresholds):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None, dest=f.name)
    args = parser.parse_args(argv)
    thresholds = Thresholds.from_overrides({name: getattr(args, name) for name in Thresholds.field_names()})
    return args, thresholds


def fail(code: int, message: str) -> int:
    from lagdoctor.diagnosis.output import print_error_line

    print_error_line(f"diagnose_lag: error: {message}")
    return code


def absolute(path: str | None) -> str | None:
    """A local path made absolute: a Spark Connect server resolves relative paths
    against its own working directory, not this process's."""
    import os

    from lagdoctor.diagnosis.store_files import is_local_path, local_path

    return os.path.abspath(local_path(path)) if path and is_local_path(path) else path


def use_spark_s3_access(spark) -> None:
    """The driver's fsspec (listing, footers, quarantine, JSONL) reaches s3:// with the
    session's own spark.hadoop.fs.s3a.* conf: one credential source for both (on Spark
    Connect, the settings this client gave its session)."""
    from lagdoctor.objectstore import access_from_spark_conf, configure_fsspec

    from lagdoctor.diagnosis.session import is_connect, session_conf_file

    conf = dict(spark.conf.getAll)
    if is_connect(spark):
        conf.update(session_conf_file())  # what a server returns has its secrets redacted
    access = access_from_spark_conf(conf)
    if access is not None:
        configure_fsspec(access)


def main(argv=None) -> int:
    from datetime import datetime, timezone

    from lagdoctor.diagnosis.input_errors import SnapshotInputError
    from lagdoctor.diagnosis.snapshots import compile_groups, parse_clusters
    from lagdoctor.diagnosis.store_files import check_input_path
    from lagdoctor.diagnosis.window import parse_as_of, window_bounds

    args, thresholds = parse_args(argv)
    die_with_parent()
    try:
        check_input_path(args.snapshots)  # before the JVM starts: fails in a second
        as_of = parse_as_of(args.as_of)
        groups = compile_groups(args.groups) if args.groups is not None else None
        clusters = parse_clusters(args.clusters)
    except (SnapshotInputError, ValueError) as exc:
        return fail(EXIT_USAGE, str(exc))

    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.output import print_error_line, write_outputs
    from lagdoctor.diagnosis.session import right_size_codegen, right_size_shuffle
    from lagdoctor.diagnosis.snapshots import read_snapshot_store, scope_snapshots
    from lagdoctor.diagnosis.status_job import partition_status
    from lagdoctor.diagnosis.window import resolve_window, select_window

    spark, code = open_session("lagdoctor-diagnose-lag")
    if spark is None:
        return code
    persisted = []
    try:
        use_spark_s3_access(spark)
        if args.check_mount:
            from lagdoctor.mount import MountNotSeen, check_executors_see

            try:  # before anything is read: an unseen mount reads as an empty, healthy store
                check_executors_see(spark, absolute(args.snapshots))
            except MountNotSeen as exc:
                return fail(EXIT_FAILED, str(exc))
        # extract
        read = read_snapshot_store(spark, absolute(args.snapshots), datetime.now(timezone.utc),
                                   window=window_bounds(as_of, args.window_minutes), clusters=clusters,
                                   quarantine=args.quarantine)
        if read.missing_clusters:
            print_error_line(f"diagnose_lag: WARNING: no snapshots for cluster(s) {', '.join(read.missing_clusters)} "
                             f"under {args.snapshots}")
        for q in read.quarantined:
            print_error_line(f"diagnose_lag: WARNING: quarantined {q['path']} ({q['reason']}); moved to {q['moved_to']}")
        # no 200-task stages on kilobytes: shuffle width from the bytes read, and no Java
        # compiled for a few thousand rows (unless the user set either)
        right_size_shuffle(spark, read.input_bytes)
        right_size_codegen(spark, read.input_bytes)
        snapshots = scope_snapshots(read.snapshots, groups, args.topic)
        window = resolve_window(snapshots, as_of, args.window_minutes, ts_range=read.ts_range)
        # (a window from footers is the whole input's: scoped rows may hold nothing in it,
        # and then the transforms below give empty outputs without a scan to check first)
        if window is None:
            write_outputs(None, None, read.quarantined, absolute(args.output), now=datetime.now(timezone.utc).isoformat())
            return EXIT_OK
        start, end = window
        in_window = select_window(snapshots, start, end)
        # transform
        # local checkpoints, not cache(): every later plan starts from the stored rows, not from
        # the whole lineage, so findings and status are analysed in a fraction of the time
        # (a Connect server re-analyses a cached frame's lineage on each execution). A lost
        # executor fails the run instead of recomputing it: the next sweep runs it again.
        partitions = partition_features(in_window, thresholds).localCheckpoint()
        group_feats = group_features(group_series(in_window, partitions), thresholds).localCheckpoint()
        carried = read_carried(spark, absolute(args.carry_from)) if args.carry_from else None
        if carried is not None:
            persisted.append(carried)
        found = findings(partitions, group_feats, thresholds, start, end, carried=carried)
        status = partition_status(partitions, group_feats, int(end.timestamp() * 1000), thresholds)
        # load: the outputs, then _SUCCESS last (a reader skips the folder until then)
        write_outputs(found, status, read.quarantined, absolute(args.output), now=datetime.now(timezone.utc).isoformat())
        return EXIT_OK
    except Exception as exc:
        return failure_exit(exc, f"cannot diagnose {args.snapshots}", moved=True)
    finally:
        # a Connect server's cache outlives this session: a run every minute must not pile up
        for df in persisted:
            try:
                df.unpersist()
            except Exception:  # noqa: BLE001 (the session is going; the server's cleaner takes the rest)
                pass
        spark.stop()


def open_session(app_name: str):
    """(SparkSession, None), or (None, exit code) after its one line; FATAL logs: a failure is said
    as that line, not as Spark's task logs. On Connect, a SIGTERM interrupts the session's queries."""
    from lagdoctor.diagnosis.input_errors import one_line
    from lagdoctor.diagnosis.session import is_connect, start_spark

    try:
        spark = start_spark(app_name, log_level="FATAL")
    except ValueError as exc:
        return None, fail(EXIT_USAGE, str(exc))
    except Exception as exc:  # a Connect server that does not answer: worth a retry
        return None, fail(EXIT_FAILED, f"cannot start a Spark session{_remote_name()}: {one_line(exc)[:300]}")
    if is_connect(spark):
        stop_on_term(spark)
    return spark, None


# Spark's words for a JVM that ran out of memory (local: the driver's heap holds every task's)
OUT_OF_MEMORY = ("SparkOutOfMemoryError", "java.lang.OutOfMemoryError", "UNABLE_TO_ACQUIRE_MEMORY")


def failure_exit(exc: BaseException, what: str, *, moved: bool = False) -> int:
    """The exit code and one line for a job's failure after its session started (`what`: e.g.
    "cannot diagnose PATH"); `moved`: the job may move files aside (the line says none was)."""
    from lagdoctor.diagnosis.input_errors import SnapshotInputError, StoreReadError, one_line, store_failure_in

    if isinstance(exc, SnapshotInputError):
        return fail(EXIT_BAD_INPUT, str(exc))
    if isinstance(exc, StoreReadError):  # the store's failure, not the input's: worth a retry
        return fail(EXIT_FAILED, str(exc))
    # Spark surfaces corrupt files only when it reads them
    message = one_line(exc)
    if any(sign in str(exc) for sign in OUT_OF_MEMORY):  # before the store's signs: its stack names InternalError
        return fail(EXIT_FAILED, f"{what}: Spark ran out of memory: give its driver more (spark.driver.memory) "
                                 f"or ask for less at once: {message}")
    store = store_failure_in(str(exc))  # the whole text: the JVM's cause is past one_line's cut
    if store:
        return fail(EXIT_FAILED, f"{what}: the store failed while Spark read a file ({store}), not the file"
                                 f"{': nothing was moved' if moved else ''}: {message}")
    return fail(EXIT_BAD_INPUT if _is_input_error(message) else EXIT_FAILED, f"{what}: {message}")


def _remote_name() -> str:
    """ on sc://host:port (never the URL's parameters: a token may be among them)."""
    import os

    remote = os.environ.get("SPARK_REMOTE", "")
    return f" on {remote.split(';', 1)[0].rstrip('/')}" if remote else ""


PARENT_PID_ENV = "LAGDOCTOR_PARENT_PID"  # set by DiagnoseLagOperator for its Connect client


def die_with_parent() -> None:
    """With $LAGDOCTOR_PARENT_PID (the Airflow task that started this client): a SIGTERM when that
    process dies, even by SIGKILL, so the client never outlives its task and never writes a
    run the task has given up on (Linux; elsewhere the task's on_kill alone stops it)."""
    import ctypes
    import os
    import signal

    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the task died before prctl took: nobody waits for this run
        raise SystemExit(128 + signal.SIGTERM)


def stop_on_term(spark) -> None:
    """SIGTERM (Airflow killing the task) interrupts this session's queries on the server:
    a Connect server would otherwise run them to the end for a client that is gone."""
    import signal

    def on_term(signum, _frame):
        try:
            spark.interruptAll()
        finally:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


def read_carried(spark, path: str):
    """The previous run's surges (lagdoctor.diagnosis.classify.carried_baselines), or None with a
    one-line warning when its findings cannot be read: the run is then judged on its window alone."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.diagnosis.classify import carried_baselines
    from lagdoctor.diagnosis.input_errors import one_line
    from lagdoctor.diagnosis.output import print_error_line

    source = path if path.endswith(".jsonl") else path.rstrip("/") + "/" + FINDINGS_FILE
    schema = ("cluster string, group_id string, topic string, diagnosis string, provisional boolean, "
              "evidence struct<baseline_produce_rate: double, baseline_consume_rate: double, data_end: string>")
    try:
        return carried_baselines(spark.read.schema(schema).json(source)).cache()
    except Exception as exc:  # missing or unreadable: nothing carried, said once
        print_error_line(f"diagnose_lag: WARNING: nothing carried from {source} ({one_line(exc)[:200]})")
        return None


def _is_input_error(message: str) -> bool:
    return any(s in message for s in ("FAILED_READ_FILE", "Could not read footer", "not a Parquet file",
                                      "CANNOT_READ_FILE_FOOTER", "PARQUET_COLUMN_DATA_TYPE_MISMATCH"))


if __name__ == "__main__":
    sys.exit(main())
