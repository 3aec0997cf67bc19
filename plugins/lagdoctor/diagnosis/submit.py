"""Running the diagnosis job through spark-submit (Airflow side: no pyspark here).

    from lagdoctor.diagnosis.submit import build_spark_submit_command, run_diagnosis

    cmd = build_spark_submit_command("s3a://lake/lagdoctor/snapshots", "s3a://lake/lagdoctor/findings/run1",
                                     window_minutes=30, master="yarn")
    code = run_diagnosis("/data/snapshots", "/data/findings/run1")   # local[*]

The package travels to the cluster as `--py-files lagdoctor-<version>.zip`
(built by `build_package_zip` from the installed package); the entry script is
spark_jobs/diagnose_lag.py (override with $LAGDOCTOR_SPARK_JOB or `job_script=`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Mapping, Sequence

JOB_ENV = "LAGDOCTOR_SPARK_JOB"

# Spark's default log4j profile prints INFO/WARN lines on stderr; the job's
# contract is one line there on failure.
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _package_dir() -> Path:
    import lagdoctor

    return Path(lagdoctor.__file__).resolve().parent


def default_job_script() -> str:
    """spark_jobs/diagnose_lag.py of this checkout, or $LAGDOCTOR_SPARK_JOB."""
    if os.environ.get(JOB_ENV):
        return os.environ[JOB_ENV]
    candidate = _package_dir().parent.parent / "spark_jobs" / "diagnose_lag.py"
    if not candidate.exists():
        raise FileNotFoundError(f"diagnosis job script not found at {candidate}; set ${JOB_ENV}")
    return str(candidate)


def build_package_zip(dest_dir: str | os.PathLike | None = None) -> str:
    """Zip the installed `lagdoctor` package for `--py-files`; returns the zip's path.

    Its name carries a fingerprint of the package's location and files (path,
    size, mtime), so two checkouts never share a zip, and a changed, added or
    removed file gives a new one.
    """
    import hashlib

    import lagdoctor

    pkg = _package_dir()
    dest = Path(dest_dir) if dest_dir else Path(tempfile.gettempdir()) / "lagdoctor-spark"
    dest.mkdir(parents=True, exist_ok=True)
    sources = sorted(p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    fingerprint = hashlib.sha256(str(pkg.resolve()).encode())
    for p in sources:
        st = p.stat()
        fingerprint.update(f"\0{p.relative_to(pkg)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    target = dest / f"lagdoctor-{lagdoctor.__version__}-{fingerprint.hexdigest()[:12]}.zip"
    if target.exists():
        return str(target)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")  # concurrent builders
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sources:
            zf.write(path, Path("lagdoctor") / path.relative_to(pkg))
    os.replace(tmp, target)
    return str(target)


def quiet_log_config(dest_dir: str | os.PathLike | None = None) -> str:
    dest = Path(dest_dir) if dest_dir else Path(tempfile.gettempdir()) / "lagdoctor-spark"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "log4j2-quiet.properties"
    if not path.exists() or path.read_text() != QUIET_LOG4J2:
        path.write_text(QUIET_LOG4J2)
    return str(path)


def job_arguments(
    snapshots: str,
    output: str,
    as_of: str | None = None,
    window_minutes: float | None = None,
    thresholds: Mapping[str, object] | None = None,
    groups: str | None = None,
    topic: str | None = None,
    quarantine: bool = False,
    carry_from: str | None = None,
) -> list[str]:
    """The job's own arguments (contract 2), e.g. for SparkSubmitOperator(application_args=...).

    `groups` (RE2, full match on group_id) and `topic` limit the run to them:
    an incident run writes verdicts only for what it was asked about.
    """
    args = ["--snapshots", str(snapshots), "--output", str(output)]
    if as_of is not None:
        args += ["--as-of", str(as_of)]
    if window_minutes is not None:
        args += ["--window-minutes", f"{window_minutes:g}"]
    if groups is not None:
        args += ["--groups", str(groups)]
    if topic is not None:
        args += ["--topic", str(topic)]
    if quarantine:
        args.append("--quarantine")
    if carry_from is not None:
        args += ["--carry-from", str(carry_from)]
    for name, value in (thresholds or {}).items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return args


# A small local job lives seconds in one JVM (driver and executors): C2's
# background compiles cost more CPU than they give back there. On a big input
# they pay off. Measured on 2 cores: the sweep window of 200 groups (0.9 MB of
# Parquet) 17.5 -> 14.5 s with C1 only; 10M rows (263 MB) 87 -> 139 s. A
# cluster's executors are long-lived: never C1 there.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
C1_MAX_INPUT_BYTES = 32 * 2**20


def window_input_bytes(snapshots: str, as_of: datetime | None = None, window_minutes: float | None = None,
                       clusters: Sequence[str] | None = None) -> int | None:
    """Bytes of the Parquet files the window's date/hour folders hold: a listing,
    no file opened. None when unknown (no filesystem for the URI, a listing error)."""
    from lagdoctor.diagnosis.snapshots import SnapshotInputError, WindowBounds, list_store_files, store_filesystem

    try:
        fs, root = store_filesystem(snapshots)
    except SnapshotInputError:  # the job itself says so, in its one line
        return None
    try:
        if fs.isfile(root):
            return int(fs.size(root))
        if not fs.isdir(root):
            return None
        span = WindowBounds(as_of, window_minutes).fixed_range()
        files = list_store_files(fs, root, snapshots, span=span, clusters=list(clusters) if clusters else None)
    except OSError:
        return None
    return sum(f.size for f in files)


def driver_java_options(master: str | None, log_config: str | None = None, input_bytes: int | None = None) -> str:
    """The driver JVM's options: the quiet log4j config; C1 only for a local
    master and an input known to be small."""
    options = [f"-Dlog4j2.configurationFile=file:{log_config}"] if log_config else []
    small = input_bytes is not None and input_bytes <= C1_MAX_INPUT_BYTES
    if (master or "local").startswith("local") and small:
        options.append(LOCAL_JVM_OPTIONS)
    return " ".join(options)


def _as_of(value: str | None) -> datetime | None:
    from lagdoctor.diagnosis.snapshots import parse_as_of

    try:
        return parse_as_of(value)
    except ValueError:  # the job itself says so, in its one line
        return None


HADOOP_AWS_ENV = "LAGDOCTOR_HADOOP_AWS"  # "fetch" (default) or "provided" (the cluster's image has them)
# Spark conf whose values are lists of options or paths: lagdoctor's part and the user's are joined
APPENDED_CONF = {"spark.driver.extraJavaOptions": " ", "spark.executor.extraJavaOptions": " ",
                 "spark.driver.extraClassPath": os.pathsep, "spark.executor.extraClassPath": os.pathsep}


def merge_conf(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """Spark conf layers merged, later ones winning; java options and class paths are appended to."""
    merged: dict[str, str] = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            value = str(value)
            sep = APPENDED_CONF.get(key)
            if sep and merged.get(key) and value and value not in merged[key].split(sep):
                merged[key] = merged[key] + sep + value
            else:
                merged[key] = value
    return merged


def object_store_conf(uris: Sequence[str | None], environ: Mapping[str, str] | None = None
                      ) -> tuple[dict[str, str], dict[str, str]]:
    """(conf for the argv, secret conf for a 0600 properties file) when an input or
    output is s3:// or s3a://; both empty otherwise.

    Credentials come from the AWS connection (lagdoctor.objectstore); the
    hadoop-aws jars are fetched once and put on the driver's and executors'
    class path (LAGDOCTOR_HADOOP_AWS=provided: the cluster has them, add nothing).
    """
    from lagdoctor.objectstore import configure_for, is_s3, is_secret_conf, spark_conf

    env = os.environ if environ is None else environ
    s3 = [u for u in uris if is_s3(u)]
    if not s3:
        return {}, {}
    conf = spark_conf(configure_for(s3[0], env))
    public = {k: v for k, v in conf.items() if not is_secret_conf(k)}
    secret = {k: v for k, v in conf.items() if is_secret_conf(k)}
    mode = (env.get(HADOOP_AWS_ENV) or "fetch").strip().lower()
    if mode not in ("fetch", "provided"):
        raise ValueError(f"{HADOOP_AWS_ENV} must be fetch or provided, not {mode!r}")
    if mode == "fetch":
        from lagdoctor.s3jars import classpath_conf, hadoop_aws_jars

        public.update(classpath_conf(hadoop_aws_jars()))
    return public, secret


def split_secret_conf(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(conf safe on an argv, conf that goes to the properties file)."""
    from lagdoctor.objectstore import is_secret_conf

    return ({k: v for k, v in conf.items() if not is_secret_conf(k)},
            {k: v for k, v in conf.items() if is_secret_conf(k)})


def build_spark_submit_command(
    snapshots: str,
    output: str,
    as_of: str | None = None,
    window_minutes: float | None = None,
    master: str | None = "local[*]",
    *,
    py_files: str | None = None,
    job_script: str | None = None,
    spark_submit: str = "spark-submit",
    conf: Mapping[str, str] | None = None,
    thresholds: Mapping[str, object] | None = None,
    groups: str | None = None,
    topic: str | None = None,
    extra_args: Sequence[str] = (),
    quiet_logs: bool = True,
    work_dir: str | os.PathLike | None = None,
    secrets_dir: str | os.PathLike | None = None,
) -> list[str]:
    """The spark-submit argv for one diagnosis run.

    `py_files` defaults to a zip of the installed package; `conf` adds
    `--conf k=v`; `thresholds` are Thresholds overrides; `extra_args` go to
    the job verbatim (after its own arguments). For an s3:// input or output
    the S3A conf and hadoop-aws come from object_store_conf; secret values
    (keys, tokens) are written to a 0600 properties file in `secrets_dir`
    (required then), never put on the argv.
    """
    from lagdoctor.objectstore import write_properties_file

    cmd = [spark_submit, "--master", master or "local[*]", "--name", "lagdoctor-diagnose-lag"]
    cmd += ["--py-files", py_files or build_package_zip(work_dir)]
    store_public, store_secret = object_store_conf([snapshots, output])
    public, secret = split_secret_conf(merge_conf({"spark.ui.showConsoleProgress": "false"}, store_public,
                                                  store_secret, conf))
    if secret:
        if secrets_dir is None:
            raise ValueError("build_spark_submit_command: secret Spark conf needs secrets_dir (a private folder)")
        # --extra-properties-file: spark-defaults.conf is still read (--properties-file would replace it)
        cmd += ["--extra-properties-file", write_properties_file(secret, secrets_dir)]
    java_options = public.pop("spark.driver.extraJavaOptions", None)
    for key, value in public.items():
        cmd += ["--conf", f"{key}={value}"]
    input_bytes = window_input_bytes(snapshots, _as_of(as_of), window_minutes) if (master or "").startswith(
        "local") else None
    java_options = merge_conf(
        {"spark.driver.extraJavaOptions": driver_java_options(
            master, quiet_log_config(work_dir) if quiet_logs else None, input_bytes)},
        {"spark.driver.extraJavaOptions": java_options or ""})["spark.driver.extraJavaOptions"].strip()
    if java_options:
        cmd += ["--driver-java-options", java_options]
    cmd.append(job_script or default_job_script())
    cmd += job_arguments(snapshots, output, as_of, window_minutes, thresholds, groups=groups, topic=topic)
    cmd += list(extra_args)
    return cmd


def spark_submit_env(base: Mapping[str, str] | None = None, master: str | None = None) -> dict[str, str]:
    """Environment for spark-submit: this interpreter's bin first on PATH (the
    venv's spark-submit finds SPARK_HOME through `python3`) and as PYSPARK_PYTHON."""
    env = dict(os.environ if base is None else base)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if (master or "local").startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def run_diagnosis(
    snapshots: str,
    output: str,
    as_of: str | None = None,
    window_minutes: float | None = None,
    master: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    timeout: float | None = None,
    capture: bool = False,
    **command_options,
) -> int:
    """Run the job and return its exit code (0: outputs written).

    stderr passes through (the job's one-line reason on failure) unless
    `capture` is true, in which case it is returned via
    `subprocess.CompletedProcess` from `run_diagnosis_process`.
    """
    return run_diagnosis_process(
        snapshots, output, as_of, window_minutes, master, extra_args, timeout=timeout, capture=capture,
        **command_options,
    ).returncode


def run_diagnosis_process(
    snapshots: str,
    output: str,
    as_of: str | None = None,
    window_minutes: float | None = None,
    master: str | None = None,
    extra_args: Sequence[str] = (),
    *,
    timeout: float | None = None,
    capture: bool = True,
    **command_options,
) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="lagdoctor-submit-") as secrets_dir:  # 0700, removed after
        cmd = build_spark_submit_command(
            snapshots, output, as_of, window_minutes, master or "local[*]", extra_args=extra_args,
            secrets_dir=secrets_dir, **command_options
        )
        return subprocess.run(
            cmd,
            env=spark_submit_env(master=master),
            timeout=timeout,
            capture_output=capture,
            text=True,
            check=False,
        )
