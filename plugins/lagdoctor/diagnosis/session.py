"""The one place a SparkSession is built (pyspark-example-project's start_spark)."""

from __future__ import annotations

import os
import sys
from typing import Mapping

# Settings that make a small job behave on a laptop and a cluster alike: UTC
# everywhere (snapshot_ts is UTC), Arrow for the few driver hand-offs.
_DEFAULT_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.mergeSchema": "true",
    # cluster=1 must stay the string "1" (the column is a string in the files too).
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # retention may delete a day folder while a job reads it: skip, do not fail
    "spark.sql.files.ignoreMissingFiles": "true",
    # nanosecond timestamps (pyarrow's default for pandas data) read as epoch ns;
    # snapshots.read_snapshot_store converts them to µs
    "spark.sql.legacy.parquet.nanosAsLong": "true",
}


def start_spark(
    app_name: str = "lagdoctor-diagnose",
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
):
    """Build (or get) the SparkSession.

    `master=None` leaves the master to spark-submit (`--master`) or the
    cluster's defaults; tests and local runs pass `local[N]`. `log_level`
    applies from the context's start unless spark-submit was given
    `--conf spark.log.level=...` (which wins, for debugging).
    """
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    conf = {**_DEFAULT_CONF, **dict(extra_conf or {})}
    if (master or "").startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        # local Python workers: this interpreter (the venv with lagdoctor), not python3 on PATH
        conf.setdefault("spark.pyspark.python", sys.executable)
    if not SparkConf().contains("spark.log.level"):
        conf.setdefault("spark.log.level", log_level)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
