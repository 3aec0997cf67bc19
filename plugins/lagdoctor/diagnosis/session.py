"""The one place a SparkSession is built (pyspark-example-project's start_spark)."""

from __future__ import annotations

import math
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
    # PySpark 4 records the Python call site of every Column call for error
    # messages: four Py4J round trips each, two thirds of the ~17k calls that
    # build the plan. The job's errors are one line without it anyway.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

# A 0600 JSON file of settings a Spark Connect client sets on its session (the
# object store's credentials among them): written by the operator, never on an argv.
SESSION_CONF_ENV = "LAGDOCTOR_SPARK_SESSION_CONF"

# Adaptive execution that really coalesces small shuffles, also under cache():
# without canChangeCachedPlanOutputPartitioning a cached plan keeps every one of
# spark.sql.shuffle.partitions tasks. Set at runtime unless the user set them.
_ADAPTIVE_CONF: dict[str, str] = {
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}
# Parquet bytes (zstd) per shuffle partition: about 128 MiB or more once decoded.
BYTES_PER_SHUFFLE_PARTITION = 16 * 2**20
PARTITIONS_PER_CORE = 2
MAX_SHUFFLE_PARTITIONS = 2_000


def shuffle_partitions_for(input_bytes: int, cores: int) -> int:
    """A few partitions per core for small inputs, one per BYTES_PER_SHUFFLE_PARTITION for big ones."""
    by_size = math.ceil(max(0, input_bytes) / BYTES_PER_SHUFFLE_PARTITION)
    return max(PARTITIONS_PER_CORE * max(1, cores), min(by_size, MAX_SHUFFLE_PARTITIONS))


def is_connect(spark) -> bool:
    """True for a Spark Connect session (no SparkContext, no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# the parallelism assumed when a Connect session's master does not tell it (a cluster's
# executors are not visible to a client); adaptive execution coalesces what is too many
CONNECT_DEFAULT_PARALLELISM = 8


def default_parallelism(spark) -> int:
    """The context's default parallelism; on Connect, read from the server's master or conf."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    given = spark.conf.get("spark.default.parallelism", None)
    if given:
        return int(given)
    master = spark.conf.get("spark.master", None) or ""
    if master == "local":
        return 1
    if master.startswith("local["):
        n = master[len("local["):].split(",")[0].rstrip("]")
        return (os.cpu_count() or 1) if n == "*" else int(n)
    return CONNECT_DEFAULT_PARALLELISM


def right_size_shuffle(spark, input_bytes: int | None) -> int | None:
    """Set spark.sql.shuffle.partitions from the input's size (call before the first
    action and before cache()). A value the user set (spark-submit --conf,
    spark-defaults, start_spark's extra_conf) wins: returns None and changes nothing.
    `cores` is the context's default parallelism (executor cores on a cluster)."""
    if input_bytes is None or spark.conf.get("spark.sql.shuffle.partitions", None) is not None:
        return None
    n = shuffle_partitions_for(input_bytes, default_parallelism(spark))
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    return n


# Below this many Parquet bytes read (about 350,000 snapshot rows) the job runs
# without whole-stage code generation: compiling the generated Java of its dozens
# of stages costs more than it saves on so few rows (200 groups x 10 partitions
# through spark-submit, with the window check below: 21.8 s -> 20.5 s; at 1M rows
# it is 20% slower off).
SMALL_INPUT_BYTES = 8 * 2**20
WHOLE_STAGE_CODEGEN = "spark.sql.codegen.wholeStage"


def right_size_codegen(spark, input_bytes: int | None) -> bool | None:
    """Turn whole-stage code generation off for a small input (call before the first action).
    A value the user set wins: returns None and changes nothing; else whether it is now on."""
    if input_bytes is None or spark.conf.get(WHOLE_STAGE_CODEGEN, None) is not None:
        return None
    on = input_bytes >= SMALL_INPUT_BYTES
    spark.conf.set(WHOLE_STAGE_CODEGEN, "true" if on else "false")
    return on


def start_spark(
    app_name: str = "lagdoctor-diagnose",
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
    remote: str | None = None,
):
    """Build (or get) the SparkSession.

    `master=None` leaves the master to spark-submit (`--master`) or the
    cluster's defaults; tests and local runs pass `local[N]`. `log_level`
    applies from the context's start unless spark-submit was given
    `--conf spark.log.level=...` (which wins, for debugging).

    `remote` (or SPARK_REMOTE in the environment, as pyspark reads it) makes a
    Spark Connect session on that server instead: no JVM here; the settings
    above are set on the session where the server lets a session change them
    (static ones, such as the log level, are the server's).
    """
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        return _start_connect(app_name, remote, {**_DEFAULT_CONF, **session_conf_file(), **dict(extra_conf or {})})
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # no SPARK_REMOTE: a JVM here, even if a Connect client in this process's parent set pyspark's flag
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
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
    spark = builder.getOrCreate()
    given = spark.sparkContext.getConf()
    for key, value in _ADAPTIVE_CONF.items():
        if key not in conf and not given.contains(key):
            spark.conf.set(key, value)
    return spark


def session_conf_file() -> dict[str, str]:
    """The settings a Connect client was given for its session (SESSION_CONF_ENV); {} without."""
    import json

    path = os.environ.get(SESSION_CONF_ENV)
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            return {str(k): str(v) for k, v in json.load(fh).items()}
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{SESSION_CONF_ENV}: cannot read the session settings file {path} "
                         f"({type(exc).__name__})") from None


# pyspark retries an unreachable server for 10 minutes and more by default: a sweep every
# minute would stack behind it. About 30 s of retries (a server restarting), then one line;
# the task's own retry comes after.
CONNECT_RETRIES = 5


class ConnectUnavailable(RuntimeError):
    """The Spark Connect server did not answer (after the retries); the reason in one line."""


def _connect_retry_policy():
    import warnings

    from pyspark.sql.connect.client.retries import DefaultPolicy

    # the job says it in one line; pyspark's own warning would be a second
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    return DefaultPolicy(max_retries=CONNECT_RETRIES, backoff_multiplier=2.0, initial_backoff=1_000,
                         max_backoff=10_000)


def _grpc_details(message: str) -> str:
    """gRPC's `details = "..."` (e.g. connection refused), not its multi-line dump."""
    import re

    found = re.search(r'details = "([^"]*)"', message)
    return found.group(1) if found else " ".join(message.split())


def _start_connect(app_name: str, remote: str, conf: Mapping[str, str]):
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    # no builder options: the builder would send them before the retry policy below applies
    spark = SparkSession.builder.remote(remote).getOrCreate()
    spark.client.set_retry_policies([_connect_retry_policy()])
    try:
        for key, value in conf.items():
            try:
                spark.conf.set(key, value)
            except PySparkException as exc:  # a static setting: the server's own value stands
                if "CANNOT_MODIFY" not in str(exc):
                    raise
    except Exception as exc:
        # closed: pyspark's exit hook would otherwise retry its goodbyes to a server that is not there
        spark.client.close()
        raise ConnectUnavailable(_grpc_details(str(exc))) from None
    for key, value in _ADAPTIVE_CONF.items():
        if key not in conf and spark.conf.get(key, None) is None:
            spark.conf.set(key, value)
    return spark
