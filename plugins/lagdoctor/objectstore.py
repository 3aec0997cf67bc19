"""The data root on an S3-compatible object store, with one credential source.

The source is an Airflow AWS connection (id: $LAGDOCTOR_AWS_CONN_ID, default
"aws_default"), read only when the data root is s3:// or s3a://. The same
S3Access feeds:

- fsspec/s3fs, through `fsspec.config.conf["s3"]`: every fsspec.open /
  url_to_fs in lagdoctor (store, run index, reports, lag page, exporter)
  picks it up without passing options around;
- Spark's S3A, as `spark.hadoop.fs.s3a.*` conf written to a 0600 properties
  file (never on the spark-submit argv, which `ps` shows);
- in the Spark driver, fsspec again, rebuilt from the session's own
  `spark.hadoop.fs.s3a.*` conf (`access_from_spark_conf`).

    access = configure_for("s3://lake/lagdoctor")    # None for a local root
    conf = spark_conf(access)                          # {"spark.hadoop.fs.s3a.endpoint": ...}

Connection fields read (the amazon provider's own AwsConnectionWrapper):
login/password or extra aws_access_key_id/aws_secret_access_key
(aws_session_token), extra region_name, endpoint_url,
service_config.s3.endpoint_url, config_kwargs.s3.addressing_style.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

CONN_ID_ENV = "LAGDOCTOR_AWS_CONN_ID"
DEFAULT_CONN_ID = "aws_default"
S3_SCHEMES = ("s3", "s3a", "s3n")
S3A = "spark.hadoop.fs.s3a."
TEMPORARY_PROVIDER = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
SIMPLE_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"


class ObjectStoreError(ValueError):
    """The object store cannot be used as configured; str() is one line without a secret."""


@dataclass(frozen=True)
class S3Access:
    """How to reach the store: keys (None: the SDK's default chain), endpoint, region, addressing."""

    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    conn_id: str | None = None

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in (
            ("conn_id", self.conn_id), ("key", self.key), ("endpoint_url", self.endpoint_url),
            ("region", self.region), ("path_style", self.path_style)))
        hidden = ", ".join(f"{k}=***" for k in ("secret", "token") if getattr(self, k))
        return f"S3Access({shown}{', ' + hidden if hidden else ''})"

    __str__ = __repr__

    def redact(self, text: str) -> str:
        """`text` with the secret and token replaced (for any line that might echo them)."""
        for value in (self.secret, self.token):
            if value:
                text = text.replace(value, "***")
        return text


def scheme(uri: str) -> str:
    return urlparse(str(uri)).scheme.lower() if "://" in str(uri) else ""


def is_s3(uri: str | None) -> bool:
    return bool(uri) and scheme(uri) in S3_SCHEMES


def is_remote(uri: str | None) -> bool:
    """A URI with a scheme other than file:// (s3, gs, abfs, hdfs ...)."""
    return bool(uri) and scheme(uri) not in ("", "file")


def conn_id_from_env(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(CONN_ID_ENV) or DEFAULT_CONN_ID


def access_from_connection(conn_id: str) -> S3Access | None:
    """S3Access from the Airflow AWS connection `conn_id`.

    None when `conn_id` is the default and does not exist (the SDK's own
    credential chain then applies: instance roles, AWS_* variables). A
    named connection that does not exist is an ObjectStoreError.
    """
    try:
        from airflow.providers.amazon.aws.utils.connection_wrapper import AwsConnectionWrapper
        from airflow.sdk.bases.hook import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError as exc:  # the exporter or a bare CLI without the amazon provider
        raise ObjectStoreError(
            f"an s3:// data root needs apache-airflow-providers-amazon[s3fs] for connection {conn_id!r} "
            f"({exc.name or exc} is missing)") from None
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        if conn_id == DEFAULT_CONN_ID:
            return None
        raise ObjectStoreError(
            f"AWS connection {conn_id!r} (set by {CONN_ID_ENV}) does not exist: add it, "
            f"e.g. AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\":\"aws\",\"login\":KEY,\"password\":SECRET,"
            f"\"extra\":{{\"endpoint_url\":URL}}}}'") from None
    wrapper = AwsConnectionWrapper(conn=conn)
    extra = wrapper.extra_config or {}
    s3_config = (extra.get("config_kwargs") or {}).get("s3") or {}
    endpoint = wrapper.get_service_endpoint_url("s3")
    # a third-party store (an endpoint of its own) rarely has bucket DNS names: path style unless told otherwise
    style = s3_config.get("addressing_style")
    path_style = style == "path" or (style is None and bool(endpoint))
    return S3Access(key=wrapper.aws_access_key_id, secret=wrapper.aws_secret_access_key,
                    token=wrapper.aws_session_token, endpoint_url=endpoint, region=wrapper.region_name,
                    path_style=path_style, conn_id=conn_id)


def fsspec_options(access: S3Access) -> dict:
    """s3fs.S3FileSystem keyword arguments for `access`."""
    options: dict = {}
    if access.key:
        options.update(key=access.key, secret=access.secret)
    if access.token:
        options["token"] = access.token
    if access.endpoint_url:
        options["endpoint_url"] = access.endpoint_url
    if access.region:
        options["client_kwargs"] = {"region_name": access.region}
    options["config_kwargs"] = {"s3": {"addressing_style": "path" if access.path_style else "auto"}}
    # s3fs caches listings forever by default: a long-lived process (the lag page, the
    # exporter) or a listing after another writer's files would miss them
    options["use_listings_cache"] = False
    return options


# How long a process trusts the connection it read: a rotated key or a renewed session
# token reaches a long-lived process (the lag page, the exporter) within this, and at
# once after the store refuses the old credentials (retry_on_stale_credentials).
CREDENTIALS_TTL_S = 300.0
# S3 error codes that say the credentials (not the request) may be wrong or stale. A HEAD's
# answer has no body, only its status: a refused key is a bare 403, an expired token a bare
# 400. Reading the connection again costs little; a retry follows only if it changed.
AUTH_ERROR_CODES = frozenset({
    "AccessDenied", "ExpiredToken", "ExpiredTokenException", "InvalidAccessKeyId", "InvalidToken",
    "SignatureDoesNotMatch", "TokenRefreshRequired", "RequestExpired", "403", "400",
})


@dataclass(frozen=True)
class _Read:
    access: S3Access | None
    at: float  # time.monotonic() of the read


_lock = threading.Lock()
_configured: dict[str, _Read] = {}


def configure_fsspec(access: S3Access) -> None:
    """Make `access` the default of every s3:// and s3a:// fsspec filesystem in this process."""
    import fsspec.config

    options = fsspec_options(access)
    for protocol in S3_SCHEMES:
        fsspec.config.conf[protocol] = dict(options)


def _use(access: S3Access | None) -> None:
    """fsspec's defaults set to `access` (dropped for None: the SDK's chain). New options make
    fsspec build a new s3fs instance; the old ones are dropped from its instance cache so
    none is kept with stale keys."""
    import fsspec.config

    if access is not None:
        configure_fsspec(access)
    else:
        for protocol in S3_SCHEMES:
            fsspec.config.conf.pop(protocol, None)
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return
    S3FileSystem.clear_instance_cache()


def _reread(conn_id: str, held: _Read | None, now: float) -> S3Access | None:
    access = access_from_connection(conn_id)
    if held is None or access != held.access:
        _use(access)
    _configured[conn_id] = _Read(access, now)
    return access


def configure_for(data_root: str, env: Mapping[str, str] | None = None, *, now: float | None = None
                  ) -> S3Access | None:
    """For an s3:// or s3a:// data root: read the connection (again once CREDENTIALS_TTL_S
    passed) and configure fsspec with it; returns the S3Access (None: a local root, or the
    default connection is absent and the SDK's chain applies). `now`: time.monotonic()."""
    import time

    if not is_s3(data_root):
        return None
    conn_id = conn_id_from_env(env)
    now = time.monotonic() if now is None else now
    with _lock:
        held = _configured.get(conn_id)
        if held is not None and now - held.at < CREDENTIALS_TTL_S:
            return held.access
        return _reread(conn_id, held, now)


def reread_after_auth_error(exc: BaseException, env: Mapping[str, str] | None = None, *,
                            now: float | None = None) -> bool:
    """After `exc`: when the store refused the credentials (AUTH_ERROR_CODES), the connection
    read again at once; True when it now holds other credentials (one retry is worth it)."""
    import time

    if s3_error_code(exc) not in AUTH_ERROR_CODES:
        return False
    conn_id = conn_id_from_env(env)
    with _lock:
        held = _configured.get(conn_id)
        if held is None:
            return False  # this process never configured the store: nothing stale to replace
        try:
            access = _reread(conn_id, held, time.monotonic() if now is None else now)
        except Exception:  # noqa: BLE001 - the store's refusal is what the caller must see
            return False
        return access != held.access


def retry_on_stale_credentials(read):
    """`read` (a function) retried once when the store refused the credentials and the
    connection now holds others (rotated, a new session token)."""
    import functools

    @functools.wraps(read)
    def reading(*args, **kwargs):
        try:
            return read(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only an auth error with new credentials is retried
            if not reread_after_auth_error(exc):
                raise
        return read(*args, **kwargs)

    return reading


def s3_error_code(exc: BaseException | None) -> str | None:
    """The S3 error code (SlowDown, AccessDenied, ExpiredToken) behind an s3fs error, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        response = getattr(exc, "response", None)  # botocore's ClientError: a dict
        error = response.get("Error") if isinstance(response, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        if code:
            return str(code)
        exc = exc.__cause__ or exc.__context__
    return None


def forget_configured() -> None:
    """Read the connection again on the next configure_for (tests)."""
    with _lock:
        _configured.clear()
        _use(None)


def s3a_impl_conf() -> dict[str, str]:
    """s3:// resolves in Spark (Hadoop 3.5 maps only s3a://)."""
    return {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A"}


def spark_conf(access: S3Access | None) -> dict[str, str]:
    """`spark.hadoop.fs.s3a.*` (and fs.s3.impl) for `access`; None: only the s3:// mapping."""
    conf = s3a_impl_conf()
    if access is None:
        return conf
    if access.endpoint_url:
        conf[S3A + "endpoint"] = access.endpoint_url
        conf[S3A + "connection.ssl.enabled"] = str(access.endpoint_url.startswith("https")).lower()
    # a third-party store needs a region that is not sdk/auto/ec2 (hadoop-aws third_party_stores.md)
    conf[S3A + "endpoint.region"] = access.region or "us-east-1"
    conf[S3A + "path.style.access"] = str(access.path_style).lower()
    if access.key:
        conf[S3A + "access.key"] = access.key
        conf[S3A + "secret.key"] = access.secret or ""
        if access.token:
            conf[S3A + "session.token"] = access.token
            conf[S3A + "aws.credentials.provider"] = TEMPORARY_PROVIDER
        else:
            conf[S3A + "aws.credentials.provider"] = SIMPLE_PROVIDER
    return conf


def session_hadoop_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` for a session on a shared (Connect) server. A session's Hadoop conf takes its
    settings by their own names (fs.s3a.access.key): the spark.hadoop. prefix is read only
    when the server starts, so each spark.hadoop.* setting is sent under both names.

    Hadoop's FileSystem cache stays on: a long-lived server keeps one S3A filesystem per
    bucket, made with the first keys it was given, and a rotated key reaches it at its
    restart. With the cache off every query builds an S3 client that is never closed: 32
    threads more per session measured here (622 -> 1,582 over 30 sessions; HBASE-28222)."""
    hadoop = {k[len("spark.hadoop."):]: v for k, v in conf.items() if k.startswith("spark.hadoop.")}
    return {**conf, **hadoop}


def access_from_spark_conf(conf: Mapping[str, str]) -> S3Access | None:
    """The S3Access a Spark session was given (its spark.hadoop.fs.s3a.* conf), None without one."""
    get = lambda name: conf.get(S3A + name) or None  # noqa: E731
    if not any(k.startswith(S3A) for k in conf):
        return None
    endpoint = get("endpoint")
    if endpoint and "://" not in endpoint:  # s3a takes a bare host too
        ssl = (get("connection.ssl.enabled") or "true").lower() == "true"
        endpoint = ("https://" if ssl else "http://") + endpoint
    return S3Access(key=get("access.key"), secret=get("secret.key"), token=get("session.token"),
                    endpoint_url=endpoint, region=get("endpoint.region"),
                    path_style=(get("path.style.access") or "false").lower() == "true")


# Spark conf keys whose values must never reach an argv or a log line.
SECRET_KEY_MARKERS = ("secret", "password", "token", "access.key", "credentials")


def is_secret_conf(key: str) -> bool:
    lowered = key.lower()
    return any(marker in lowered for marker in SECRET_KEY_MARKERS)


def private_folder(directory: str | os.PathLike) -> Path:
    """`directory`, created 0700 when missing; ObjectStoreError unless it is this user's own
    folder (not a link) that no one else can enter: the only place a secrets file goes."""
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ObjectStoreError(f"secrets are written only to a private folder (this user's, mode 0700, "
                               f"not a link): {path} is not one")
    return path


def write_private_file(directory: str | os.PathLike, prefix: str, suffix: str, text: str) -> str:
    """`text` in a new file of a unique name in the private folder `directory`, mode 0600 from
    its first byte; never an existing file, never through a link planted at its name."""
    import secrets

    folder = private_folder(directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    path = folder / f"{prefix}{secrets.token_hex(8)}{suffix}"
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


def write_properties_file(conf: Mapping[str, str], directory: str | os.PathLike) -> str:
    """`conf` as a spark-submit --properties-file: a new 0600 file in the private folder
    `directory` (write_private_file); its caller removes it once Spark has read it."""
    lines = []
    for key, value in conf.items():
        # java.util.Properties: backslash escapes; one entry per line
        escaped = str(value).replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"{key}={escaped}\n")
    return write_private_file(directory, "spark-secrets-", ".conf", "".join(lines))


DISTRIBUTED_EXECUTORS = ("Celery", "Kubernetes", "Edge", "Batch", "Ecs")


def airflow_executor() -> str:
    """Airflow's [core] executor setting ("" when Airflow's config cannot be read)."""
    try:
        from airflow.configuration import conf

        return conf.get("core", "executor", fallback="") or ""
    except Exception:  # noqa: BLE001 - outside Airflow: nothing to judge
        return ""


def distributed_executor(executor: str | None) -> str | None:
    """The executor's short name ("CeleryExecutor") when its tasks land on hosts that share no disk; else None."""
    if any(name.lower() in (executor or "").lower() for name in DISTRIBUTED_EXECUTORS):
        return str(executor).rsplit(".", 1)[-1]
    return None


SHARED_ENV = "LAGDOCTOR_DATA_ROOT_SHARED"


def check_deployable(data_root: str, *, master: str | None = None, executor: str | None = None,
                     shared: bool = False) -> None:
    """Refuse, in one line, a local data root that other hosts would need to see:
    a remote Spark master (its executors read the snapshots) or a distributed
    Airflow executor (tasks land on workers that share no disk).

    `shared` (LAGDOCTOR_DATA_ROOT_SHARED=1): the operator says the root is mounted at the
    same path on every host; it is then proved at run time (lagdoctor.mount), not refused."""
    if is_remote(data_root):
        return
    remote_master = bool(master) and not str(master).startswith("local")
    distributed = distributed_executor(executor)
    if not remote_master and not distributed:
        return
    if shared:
        path = data_root[len("file://"):] if data_root.startswith("file://") else data_root
        if not os.path.isabs(path):  # each host would resolve it against its own working directory
            raise ObjectStoreError(
                f"{SHARED_ENV}=1 needs an absolute LAGDOCTOR_DATA_ROOT, the path every host mounts, "
                f"not {data_root!r}")
        return
    where = f"Spark runs on {master}" if remote_master else f"Airflow runs tasks with the {distributed}"
    raise ObjectStoreError(
        f"LAGDOCTOR_DATA_ROOT is a local path ({data_root}) but {where}, whose hosts share no disk: "
        f"set LAGDOCTOR_DATA_ROOT=s3://<bucket>/lagdoctor and the AWS connection {CONN_ID_ENV} "
        f"(default {DEFAULT_CONN_ID}), or, if it is mounted at that path on every host, {SHARED_ENV}=1")
