"""Diagnosis job (contract 2): offset snapshots -> findings.jsonl, partition_status.jsonl.

    spark-submit [--py-files lagdoctor.zip] spark_jobs/diagnose_lag.py \\
        --snapshots PATH --output PATH [--as-of ISO-8601] [--window-minutes N] \\
        [--warning-lag N --critical-lag N ...]   (every field of Thresholds)

Extract -> transform -> load; the transforms live in lagdoctor.diagnosis.
Exit codes: 0 outputs written (empty input -> empty outputs), 2 bad
arguments or missing path, 3 unreadable input or a missing column, 1 any
other failure. Failures print one line on stderr.
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
    for f in fields(Thresholds):
        parser.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None, dest=f.name)
    args = parser.parse_args(argv)
    thresholds = Thresholds.from_overrides({name: getattr(args, name) for name in Thresholds.field_names()})
    return args, thresholds


def fail(code: int, message: str) -> int:
    from lagdoctor.diagnosis.output import print_error_line

    print_error_line(f"diagnose_lag: error: {message}")
    return code


def main(argv=None) -> int:
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, check_input_path, one_line, parse_as_of

    args, thresholds = parse_args(argv)
    try:
        check_input_path(args.snapshots)  # before the JVM starts: fails in a second
        as_of = parse_as_of(args.as_of)
    except SnapshotInputError as exc:
        return fail(EXIT_USAGE, str(exc))

    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.output import write_findings, write_partition_status
    from lagdoctor.diagnosis.session import start_spark
    from lagdoctor.diagnosis.snapshots import read_snapshots, resolve_window, select_window
    from lagdoctor.diagnosis.status_job import partition_status

    # FATAL: a failure is reported as the one line below, not as Spark's task logs
    spark = start_spark("lagdoctor-diagnose-lag", log_level="FATAL")
    try:
        # extract
        snapshots = read_snapshots(spark, args.snapshots)
        window = resolve_window(snapshots, as_of, args.window_minutes)
        if window is None:
            write_findings(None, args.output)
            write_partition_status(None, args.output)
            return EXIT_OK
        start, end = window
        # transform
        in_window = select_window(snapshots, start, end)
        partitions = partition_features(in_window, thresholds).cache()
        groups = group_features(group_series(in_window), thresholds).cache()
        found = findings(partitions, groups, thresholds, start, end)
        status = partition_status(partitions, groups, int(end.timestamp() * 1000), thresholds)
        # load
        write_findings(found, args.output)
        write_partition_status(status, args.output)
        return EXIT_OK
    except SnapshotInputError as exc:
        return fail(EXIT_BAD_INPUT, str(exc))
    except Exception as exc:  # Spark surfaces corrupt files only when it reads them
        message = one_line(exc)
        code = EXIT_BAD_INPUT if _is_input_error(message) else EXIT_FAILED
        return fail(code, f"cannot diagnose {args.snapshots}: {message}")
    finally:
        spark.stop()


def _is_input_error(message: str) -> bool:
    return any(s in message for s in ("FAILED_READ_FILE", "Could not read footer", "not a Parquet file",
                                      "CANNOT_READ_FILE_FOOTER", "PARQUET_COLUMN_DATA_TYPE_MISMATCH"))


if __name__ == "__main__":
    sys.exit(main())
