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
from dataclasses import dataclass
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
    check_mount: bool = False,
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
    if check_mount:
        args.append("--check-mount")
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
    from lagdoctor.diagnosis.input_errors import SnapshotInputError
    from lagdoctor.diagnosis.store_files import list_store_files, store_filesystem
    from lagdoctor.diagnosis.window import WindowBounds

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
    from lagdoctor.diagnosis.window import parse_as_of

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
            if sep and merged.get(key):
                if value and value not in merged[key].split(sep):
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
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):  # spark-submit: a JVM, never a Connect client
        env.pop(name, None)
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


# -- submitting from Airflow to any master (DiagnoseLagOperator) ----------------------------

SPARK_CONF_ENV = "LAGDOCTOR_SPARK_CONF"  # JSON object of Spark conf, merged over lagdoctor's
SPARK_PYTHON_ENV = "LAGDOCTOR_SPARK_PYTHON"  # the interpreter on the cluster's nodes (spark.pyspark.python)
SPARK_APP_URI_ENV = "LAGDOCTOR_SPARK_APP_URI"  # a folder URI holding diagnose_lag.py and lagdoctor.zip
APP_ZIP_NAME = "lagdoctor.zip"  # its name there (build_package_zip's output, renamed)
APP_UPLOAD_DIR = "_spark"


def is_local_master(master: str | None) -> bool:
    return (master or "local").startswith("local")


@dataclass
class SubmissionPlan:
    """What DiagnoseLagOperator hands the provider's hook for one run."""

    application: str
    py_files: str
    spark_binary: str | None  # None: the hook's own (the connection's spark-binary extra)
    conf: dict[str, str]  # safe on the argv
    secret_conf: dict[str, str]  # to the 0600 properties file
    env_vars: dict[str, str]


def _json_conf(raw: str | None, source: str) -> dict[str, str]:
    import json

    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise ValueError(f"{source} must be a JSON object of Spark conf, e.g. "
                         '{"spark.executor.memory": "2g"}') from None
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object of Spark conf, not {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


def stage_app_files(data_root: str, files: Sequence[str]) -> dict[str, str]:
    """Upload local files to <data_root>/_spark/<content hash>/ once; {local path: URI (s3a:// for s3)}.

    A cluster-mode driver runs on another host: it can read the store, not this worker's disk.
    """
    import hashlib

    from lagdoctor.diagnosis.store_files import store_filesystem

    digest = hashlib.sha256()
    for path in files:
        digest.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes())
    folder = f"{data_root.rstrip('/')}/{APP_UPLOAD_DIR}/{digest.hexdigest()[:16]}"
    fs, base = store_filesystem(folder)
    uris = {}
    for path in files:
        target = f"{base}/{Path(path).name}"
        if not fs.exists(target):
            fs.put(str(path), target)
        uri = f"{folder}/{Path(path).name}"
        uris[str(path)] = "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri
    return uris


def plan_submission(prep: Mapping[str, object], *, master: str, deploy_mode: str | None,
                    binary_from_connection: bool, data_root: str,
                    connection_conf: Mapping[str, str] | str | None = None,
                    operator_conf: Mapping[str, str] | None = None,
                    environ: Mapping[str, str] | None = None) -> SubmissionPlan:
    """The submission for `prep` (orchestration.prepare_diagnosis) on `master`.

    - spark-submit: the connection's `spark-binary` extra when it has one, else this venv's
      pyspark's (bin/spark-submit in the package, for a remote master: it needs no PATH);
    - Python: spark.pyspark.python / PYSPARK_PYTHON / PATH only for a local master,
      spark.pyspark.driver.python for a client-mode driver (it runs here), and
      spark.pyspark.python=$LAGDOCTOR_SPARK_PYTHON when set (the cluster's interpreter);
    - conf: lagdoctor's, then the object store's, then the connection's `conf` extra,
      then $LAGDOCTOR_SPARK_CONF, then the operator's `conf` (later wins; java options and
      class paths are appended to); secrets go to `secret_conf`;
    - files: in cluster mode the zip and the job script from $LAGDOCTOR_SPARK_APP_URI, or
      uploaded once under <data_root>/_spark/ (a remote data root), never a worker path.
    """
    env = os.environ if environ is None else environ
    local = is_local_master(master)
    cluster_mode = (deploy_mode or "client") == "cluster" and not local
    app, py_files = str(prep["application"]), str(prep["py_files"])
    if cluster_mode:
        base = env.get(SPARK_APP_URI_ENV)
        if base:
            app, py_files = f"{base.rstrip('/')}/{Path(app).name}", f"{base.rstrip('/')}/{APP_ZIP_NAME}"
        elif "://" in data_root and not data_root.startswith("file://"):
            uris = stage_app_files(data_root, [app, py_files])
            app, py_files = uris[app], uris[py_files]
        else:
            raise ValueError(f"cluster deploy mode needs the job's files where the driver can read them: set "
                             f"{SPARK_APP_URI_ENV} (e.g. local:///opt/lagdoctor) or an object-store "
                             f"LAGDOCTOR_DATA_ROOT (s3://...)")
    args = [str(a) for a in prep["args"]]
    uris = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--snapshots", "--output")]
    store_public, store_secret = object_store_conf(uris, env)
    ours: dict[str, str] = {"spark.ui.enabled": "false"} if local else {}
    env_vars: dict[str, str] = {}
    python = env.get(SPARK_PYTHON_ENV)
    if local:
        ours["spark.pyspark.python"] = str(prep["python"])
        env_vars.update(PATH=str(prep["path"]), PYSPARK_PYTHON=str(prep["python"]))
    elif not cluster_mode and not binary_from_connection:
        # a client-mode driver runs here, with this interpreter; executors use their own python3
        ours["spark.pyspark.driver.python"] = str(prep["python"])
    if python:
        ours["spark.pyspark.python"] = python
    if not cluster_mode:  # the driver runs here: its log config is a local file
        ours["spark.driver.extraJavaOptions"] = driver_java_options(
            master, str(prep["log_config"]), prep.get("input_bytes"))  # type: ignore[arg-type]
    merged = merge_conf(ours, store_public, store_secret, _json_conf(connection_conf, "the Spark connection's conf extra"),
                        _json_conf(env.get(SPARK_CONF_ENV), SPARK_CONF_ENV), operator_conf)
    public, secret = split_secret_conf(merged)
    binary = None if binary_from_connection else str(prep["spark_submit"])
    if binary and not local:
        # pyspark's own bin/spark-submit finds its SPARK_HOME beside it: no PATH or python3 needed
        import pyspark

        binary = str(Path(pyspark.__file__).parent / "bin" / "spark-submit")
    return SubmissionPlan(application=app, py_files=py_files, spark_binary=binary,
                          conf=public, secret_conf=secret, env_vars=env_vars)


# -- the same job as a Spark Connect client (a warm server; lagdoctor.connectserver) --------------

from lagdoctor.diagnosis.session import SESSION_CONF_ENV  # noqa: E402  (the job's session reads the file)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def connect_host(url: str) -> str:
    """The host of an sc://host:port/;params URL."""
    from urllib.parse import urlparse

    return urlparse(url.split(";", 1)[0]).hostname or ""


def connect_params(url: str) -> dict[str, str]:
    """The ;key=value parameters of an sc:// URL (token, use_ssl, user_id)."""
    from urllib.parse import unquote

    params = url.split(";")[1:]
    return {k.strip().lower(): unquote(v) for k, _, v in (p.partition("=") for p in params) if k.strip()}


def client_remote(url: str) -> str:
    """`url` as the job's client dials it. pyspark sends a token without TLS only to `localhost`
    (gRPC local credentials): a loopback address with a token becomes `localhost`, or pyspark
    would try TLS against the plain server. ValueError for a server on another host with
    neither TLS (use_ssl) nor a token (pyspark encrypts whenever it sends one): the session's
    settings, the store's keys among them, would cross the network in clear text."""
    from urllib.parse import urlparse

    params = connect_params(url)
    tls = params.get("use_ssl", "").lower() == "true"
    host = connect_host(url)
    base = url.split(";", 1)[0].rstrip("/")
    if host not in LOOPBACK_HOSTS and not (tls or params.get("token")):
        raise ValueError(f"the Spark Connect server {base} is not on this host and its connection has no TLS: "
                         f"the store's keys would cross the network in clear text; set use_ssl true (and its "
                         f"token as the password) in the spark_connect connection")
    if host in LOOPBACK_HOSTS and host != "localhost" and params.get("token") and not tls:
        parsed = urlparse(base)
        return url.replace(parsed.netloc, f"localhost:{parsed.port}" if parsed.port else "localhost", 1)
    return url


def connect_master(url: str) -> str:
    """What check_deployable should treat the server as: local on loopback, remote elsewhere
    (a remote server's executors cannot read this host's disk)."""
    return "local" if connect_host(url) in LOOPBACK_HOSTS else url.split(";", 1)[0]


def write_session_conf(conf: Mapping[str, str], directory: str | os.PathLike) -> str:
    """`conf` as the JSON file the job's Connect session reads (SESSION_CONF_ENV): a new 0600
    file in the private folder `directory` (objectstore.write_private_file)."""
    import json

    from lagdoctor.objectstore import write_private_file

    return write_private_file(directory, "spark-session-conf-", ".json", json.dumps(dict(conf)))


def connect_client_env(remote: str, *, py_files: str | None = None, session_conf_file: str | None = None,
                       base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of the job as a Connect client: SPARK_REMOTE (pyspark's own variable),
    lagdoctor importable (the same zip spark-submit ships), the session's settings file."""
    env = dict(os.environ if base is None else base)
    env["SPARK_REMOTE"] = remote
    if py_files:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (py_files, env.get("PYTHONPATH", "")) if p)
    if session_conf_file:
        env[SESSION_CONF_ENV] = session_conf_file
    env.pop("PYSPARK_GATEWAY_PORT", None)  # never a stale JVM gateway: this client has no JVM
    return env


@dataclass
class ConnectPlan:
    """What DiagnoseLagOperator runs for one diagnosis on a Spark Connect server."""

    command: list[str]
    env: dict[str, str]
    session_conf: dict[str, str]  # written to a 0600 file: may hold the store's secrets


def plan_connect(prep: Mapping[str, object], *, remote: str, connection_conf: Mapping[str, str] | str | None = None,
                 operator_conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None,
                 session_conf_dir: str | os.PathLike | None = None) -> ConnectPlan:
    """The job on `remote` (sc://...): this worker's Python runs spark_jobs/diagnose_lag.py with
    the arguments spark-submit would get; the session's settings are the object store's
    (spark.hadoop.fs.s3a.*: the server's own S3A reads, per session), then the connection's
    `conf` extra, then $LAGDOCTOR_SPARK_CONF, then the operator's `conf` (later wins).
    Settings a session cannot change (the server's memory, its class path) are the server's."""
    from lagdoctor.objectstore import session_hadoop_conf

    env = os.environ if environ is None else environ
    args = [str(a) for a in prep["args"]]
    uris = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--snapshots", "--output")]
    store_public, store_secret = object_store_conf(uris, {**env, HADOOP_AWS_ENV: "provided"})
    session = merge_conf(store_public, store_secret, _json_conf(connection_conf, "the Spark connection's conf extra"),
                         _json_conf(env.get(SPARK_CONF_ENV), SPARK_CONF_ENV), operator_conf)
    if store_public or store_secret:
        session = session_hadoop_conf(session)
    remote = client_remote(remote)  # before any secret is written
    conf_file = write_session_conf(session, session_conf_dir) if session and session_conf_dir else None
    command = [str(prep["python"]), str(prep["application"]), *args]
    return ConnectPlan(command=command, env=connect_client_env(remote, py_files=str(prep["py_files"]),
                                                               session_conf_file=conf_file, base=env),
                       session_conf=session)


def run_connect_process(
    snapshots: str,
    output: str,
    as_of: str | None = None,
    window_minutes: float | None = None,
    *,
    remote: str,
    extra_args: Sequence[str] = (),
    thresholds: Mapping[str, object] | None = None,
    job_script: str | None = None,
    session_conf: Mapping[str, str] | None = None,
    timeout: float | None = None,
    capture: bool = True,
) -> subprocess.CompletedProcess:
    """The job as a Spark Connect client of `remote`, as the operator runs it (tests, benchmarks)."""
    remote = client_remote(remote)
    cmd = [sys.executable, job_script or default_job_script(),
           *job_arguments(snapshots, output, as_of, window_minutes, thresholds), *extra_args]
    with tempfile.TemporaryDirectory(prefix="lagdoctor-connect-") as private:  # 0700, removed after
        conf_file = write_session_conf(session_conf, private) if session_conf else None
        env = connect_client_env(remote, py_files=str(_package_dir().parent), session_conf_file=conf_file)
        return subprocess.run(cmd, env=env, timeout=timeout, capture_output=capture, text=True, check=False)
