"""lagdoctor's own state in a SQL database: Slack threads, the action log,
leases, the durable Slack outbox, failure threads, Slack's buttons
(approvals, acknowledge/snooze, seen requests, the click audit) and the
restart counts of the consumers' pods as sweeps saw them.

Where it lives (first that applies):

  1. ``LAGDOCTOR_STATE_URL``: a SQLAlchemy URL of SQLite or PostgreSQL (tests,
     or a plain deployment). Other databases are refused in one line: the
     check-then-act below relies on those two dialects' ``ON CONFLICT`` and locks.
  2. The Airflow connection ``lagdoctor_state`` (type postgres; sqlite also
     accepted): production, shared by every worker, so dedupe and guardrails
     hold across hosts.
  3. SQLite at ``<data root>/state/lagdoctor.db`` when the data root is local:
     the embedded default.

A non-local data root (s3a://...) with neither of the first two is refused
with one line: SQLite on each worker would keep per-host state, and
guardrails that hold per host only are not guardrails.

Retention (``prune_notifications`` here; lagdoctor.stages.housekeeping.prune_state runs it
with the action log's) removes what only grows: delivered Slack messages,
closed incident threads, manual runs' threads and leases that expired long
ago, and the old action log (lagdoctor.remediation.audit.prune_action_log);
never an undelivered message, nor anything an open thread still replies under.

This is never Airflow's own metadata database: tasks in Airflow 3 may not
touch it. Check-then-act goes through ``transaction()``: on SQLite it takes
the write lock at BEGIN (``BEGIN IMMEDIATE``), on PostgreSQL the callers rely
on unique keys and ``SELECT ... FOR UPDATE`` (``lock_row``), so two runs on
two workers cannot both pass a check and act.

Unreachable is bounded: PostgreSQL connections time out after
``PG_CONNECT_TIMEOUT_S`` (a stopped or paused server fails in seconds, not
minutes), statements after ``PG_STATEMENT_TIMEOUT_S`` and lock waits after
``PG_LOCK_TIMEOUT_S``; every transaction takes a fresh connection, so a pooled
one left over from before a pause cannot hang the next call. SQLite waits
``SQLITE_BUSY_TIMEOUT_S`` for the write lock. Such failures are
``StateUnavailable`` (``is_unavailable``): the notify layer then keeps its
messages in a local spool (lagdoctor.notify.spool) instead of losing them.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa

log = logging.getLogger(__name__)

STATE_CONN_ID = "lagdoctor_state"
STATE_URL_ENV = "LAGDOCTOR_STATE_URL"
SQLITE_BUSY_TIMEOUT_S = 30
SUPPORTED_DIALECTS = ("sqlite", "postgresql")
PG_CONNECT_TIMEOUT_S = 5
PG_STATEMENT_TIMEOUT_S = 60
PG_LOCK_TIMEOUT_S = 30

metadata = sa.MetaData()

# One row per incident key; `data` holds lagdoctor.notify.threads.ThreadState as JSON.
incident_threads = sa.Table(
    "incident_threads", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("cluster", sa.String(255), nullable=False),
    # Text: Kafka allows group ids far longer than any VARCHAR we would pick.
    sa.Column("group_id", sa.Text, nullable=False),
    sa.Column("topic", sa.Text, nullable=False),
    sa.Column("diagnosis", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # open | closed
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("cluster", "group_id", "topic", "diagnosis", name="uq_incident_threads_key"),
)

# A manual incident run's one thread (header message + the findings posted in it).
run_threads = sa.Table(
    "run_threads", metadata,
    sa.Column("run_key", sa.String(255), primary_key=True),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# The remediation audit log: every decision, append-only.
action_log = sa.Table(
    "action_log", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
    sa.Column("idempotency_key", sa.String(64), nullable=False, index=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("cluster", sa.String(255), nullable=False),
    sa.Column("group_id", sa.String(512), nullable=False),
    sa.Column("topic", sa.String(512), nullable=False),
    sa.Column("target", sa.String(512), nullable=True),  # e.g. namespace/deployment, for per-target cooldowns
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("record", sa.JSON, nullable=False),
    sa.Index("ix_action_log_status_ts", "status", "ts"),
)

# Leases: who may act on a key now; a lease that expired may be taken over.
leases = sa.Table(
    "leases", metadata,
    sa.Column("key", sa.String(768), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

# The durable Slack outbox: every message is queued here first and sent in id
# order; a reply waits for its parent (`parent_id`) to have a Slack ts.
slack_messages = sa.Table(
    "slack_messages", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedupe_key", sa.String(512), nullable=False, unique=True),
    sa.Column("channel", sa.String(255), nullable=True),
    sa.Column("parent_id", sa.Integer, nullable=True),
    sa.Column("thread_ts", sa.String(64), nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("blocks", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),  # pending | sent
    sa.Column("ts", sa.String(64), nullable=True),
    sa.Column("sent_channel", sa.String(255), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("ix_slack_messages_status_id", "status", "id"),
)

# One failure thread per DAG: later failures reply (deduplicated), success closes it.
failure_threads = sa.Table(
    "failure_threads", metadata,
    sa.Column("dag_id", sa.String(255), primary_key=True),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)


# -- Slack interactivity (lagdoctor.notify.interactive, lagdoctor.web.slack_actions) --

# Requests already seen, by Slack signature: a replayed request is acted on once.
# Rows older than Slack's 5-minute window are pruned (a replay that old fails the timestamp check).
slack_requests = sa.Table(
    "slack_requests", metadata,
    sa.Column("signature", sa.String(128), primary_key=True),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, index=True),
)

# Every click, allowed or not: who, what, on what, and what came of it (append-only).
slack_interactions = sa.Table(
    "slack_interactions", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("user_id", sa.String(64), nullable=False),
    sa.Column("user_name", sa.String(255), nullable=True),
    sa.Column("action", sa.String(64), nullable=False),  # approve | reject | ack | snooze | unknown
    sa.Column("target", sa.String(255), nullable=False),  # approval id or incident key digest
    sa.Column("outcome", sa.String(32), nullable=False),  # done | already | refused | superseded | failed | unknown_target
    sa.Column("detail", sa.Text, nullable=True),
)

# An approval a HITL task waits for, posted to Slack with a button per target; the
# buttons carry `id`, the row's random `nonce` (an id alone could name another row: a
# pruned or recreated database restarts ids) and the target's number. One row per try
# of the task: a cleared and re-run task asks again, and the older rows' buttons answer
# "superseded".
# `status` waiting | answering (claimed by a click whose call to Airflow is under way,
# no transaction held across it) | approved | rejected | superseded; `answered_by` is
# the Slack user, `airflow_user` whom Airflow recorded. (Table name new in issue 17:
# the first table, "slack_approvals", had one row per task instance; the second,
# "slack_approval_requests", had no nonce.) AUTOINCREMENT: SQLite never reuses an id.
slack_approvals = sa.Table(
    "slack_approval_prompts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dag_id", sa.String(250), nullable=False),
    sa.Column("run_id", sa.String(250), nullable=False),
    sa.Column("task_id", sa.String(250), nullable=False),
    sa.Column("map_index", sa.Integer, nullable=False),
    sa.Column("try_number", sa.Integer, nullable=False, default=1),
    sa.Column("nonce", sa.String(64), nullable=False, default=lambda: secrets.token_hex(16)),  # in the buttons
    sa.Column("subject", sa.Text, nullable=False),
    sa.Column("targets", sa.JSON, nullable=True),  # [{key, option, cluster, group_id, topic, blocked}]
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("message_id", sa.Integer, nullable=True),  # the outbox row of the request
    sa.Column("claimed_by", sa.String(255), nullable=True),
    sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("answered_by", sa.String(255), nullable=True),
    sa.Column("airflow_user", sa.String(255), nullable=True),
    sa.Column("chosen", sa.JSON, nullable=True),
    sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "try_number", name="uq_slack_approval_prompt_try"),
    sqlite_autoincrement=True,
)

# Acknowledge / Snooze per incident thread (IncidentKey.digest()); `root_message_id`
# ties them to one thread: a new thread for the same key starts loud again.
incident_controls = sa.Table(
    "incident_controls", metadata,
    sa.Column("key_digest", sa.String(32), primary_key=True),
    sa.Column("root_message_id", sa.Integer, nullable=True),
    sa.Column("ack_by", sa.String(255), nullable=True),
    sa.Column("ack_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ack_severity", sa.String(16), nullable=True),
    sa.Column("snoozed_by", sa.String(255), nullable=True),
    sa.Column("snoozed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("snoozed_until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)


# Spooled notify calls (lagdoctor.notify.spool) already replayed into the outbox:
# written in the same transaction as what the replay queued, so a spool file
# replayed twice (two workers, or a crash before the file was removed) acts once.
spool_replays = sa.Table(
    "spool_replays", metadata,
    sa.Column("entry_id", sa.String(64), primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=False, index=True),
)


# Each traced pod's restartCount as a sweep saw it (lagdoctor.workloads.remember_restarts):
# Kubernetes keeps only the total, so restarts in a window are the difference between two of these.
pod_restarts = sa.Table(
    "pod_restarts", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("namespace", sa.String(253), nullable=False),
    sa.Column("pod", sa.String(253), nullable=False),
    sa.Column("pod_uid", sa.String(64), nullable=True),  # a pod recreated under its name restarts from 0
    sa.Column("restarts", sa.Integer, nullable=False),
    sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_pod_restarts_pod_at", "namespace", "pod", "observed_at"),
    sa.Index("ix_pod_restarts_at", "observed_at"),
)


class StateConfigError(ValueError):
    """lagdoctor's state database is not configured usably; one line, no secret."""


class StateUnavailable(StateConfigError):
    """The state database is configured but cannot be reached now (down, paused,
    timed out); one line, no secret. A subclass, so callers that catch
    StateConfigError keep working."""


def is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` means "the state database cannot be reached now", as opposed
    to a bug or a configuration error: the call may work later, unchanged."""
    if isinstance(exc, StateUnavailable):
        return True
    # Connection refused/reset/timed out, statement or lock timeouts, SQLite's
    # "database is locked": all OperationalError; a dropped connection may also
    # surface as InterfaceError or as a DBAPIError that invalidated it.
    if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and bool(exc.connection_invalidated)


def unavailable_line(exc: BaseException) -> str:
    """One line for an unreachable state database, without the URL's password."""
    if isinstance(exc, StateConfigError):
        return str(exc)
    orig = getattr(exc, "orig", None)
    return f"lagdoctor's state database is unreachable: {_first_line(orig or exc)}"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes for timezone-aware columns: they are UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _is_local(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def _connection_url(conn_id: str) -> sa.URL | None:
    """The SQLAlchemy URL of an Airflow connection, or None when it is not defined."""
    from lagdoctor.connections import connection_exists

    if not connection_exists(conn_id):
        return None
    from airflow.sdk.bases.hook import BaseHook

    conn = BaseHook.get_connection(conn_id)
    kind = (conn.conn_type or "").lower()
    if kind in ("postgres", "postgresql"):
        return sa.URL.create("postgresql+psycopg", username=conn.login or None, password=conn.password or None,
                             host=conn.host or None, port=conn.port or None, database=conn.schema or None,
                             query={k: str(v) for k, v in (conn.extra_dejson or {}).items()
                                    if k in ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name")})
    if kind == "sqlite":
        return sa.make_url(f"sqlite:///{conn.host}")
    raise StateConfigError(f"connection {conn_id!r} has type {conn.conn_type!r}; lagdoctor's state needs postgres or sqlite")


def state_url(settings: Any = None, environ: dict[str, str] | None = None) -> sa.URL:
    """Where lagdoctor keeps its state (see the module docstring for the order)."""
    from lagdoctor.settings import Settings

    env = os.environ if environ is None else environ
    explicit = env.get(STATE_URL_ENV)
    if explicit:
        try:
            return sa.make_url(explicit)
        except Exception:
            raise StateConfigError(f"{STATE_URL_ENV} is not a SQLAlchemy URL") from None
    url = _connection_url(STATE_CONN_ID)
    if url is not None:
        return url
    settings = settings or Settings.from_env(env)
    root = settings.data_root
    if not _is_local(root):
        scheme = root.split("://", 1)[0]
        raise StateConfigError(
            f"LAGDOCTOR_DATA_ROOT is a {scheme}:// URI: define the Airflow connection {STATE_CONN_ID!r} "
            f"(PostgreSQL) for lagdoctor's state, or set {STATE_URL_ENV}"
        )
    path = Path(root[len("file://"):] if root.startswith("file://") else root) / "state" / "lagdoctor.db"
    return sa.make_url(f"sqlite:///{path}")


_engines: dict[str, sa.Engine] = {}
_engines_lock = threading.Lock()


def _sqlite_engine(url: sa.URL) -> sa.Engine:
    if url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):  # pragma: no cover - exercised by every SQLite test
        # Let SQLAlchemy's BEGIN (below) start transactions, not pysqlite.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        _enable_wal(cur)
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn):  # pragma: no cover
        # IMMEDIATE takes the write lock up front: a check and the write after it
        # cannot interleave with another process's.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _enable_wal(cur) -> None:
    """WAL lets readers run beside the writer. Switching to it takes a lock that
    ignores busy_timeout, so two processes opening a new file at once retry."""
    import sqlite3

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _postgres_engine(url: sa.URL) -> sa.Engine:
    """Bounded waits, set unless the URL sets them itself; no pool (see the module docstring)."""
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    if "options" not in url.query:
        connect_args["options"] = (f"-c statement_timeout={PG_STATEMENT_TIMEOUT_S * 1000} "
                                   f"-c lock_timeout={PG_LOCK_TIMEOUT_S * 1000}")
    # NullPool: a pooled connection to a server that was paused since hangs its
    # next query (and pre-ping) with no timeout; a new one times out in seconds.
    return sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)


def check_dialect(url: sa.URL) -> None:
    """Refuse, in one line, a database the state store does not support."""
    backend = url.get_backend_name()
    if backend not in SUPPORTED_DIALECTS:
        raise StateConfigError(
            f"lagdoctor's state database must be SQLite or PostgreSQL, not {backend!r} "
            f"({url.render_as_string(hide_password=True)})"
        )


def engine_for(url: sa.URL) -> sa.Engine:
    """One engine per database per process, with every table created."""
    check_dialect(url)
    key = url.render_as_string(hide_password=False)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            if url.get_backend_name() == "sqlite":
                engine = _sqlite_engine(url)
            else:
                engine = _postgres_engine(url)
            try:
                _create_tables(engine)
            except sa.exc.OperationalError as exc:
                engine.dispose()
                raise StateUnavailable(
                    f"cannot open lagdoctor's state database {url.render_as_string(hide_password=True)}: "
                    f"{_first_line(exc.orig or exc)}"
                ) from None
            _engines[key] = engine
        return engine


def _create_tables(engine: sa.Engine) -> None:
    try:
        metadata.create_all(engine, checkfirst=True)
    except (sa.exc.IntegrityError, sa.exc.ProgrammingError):
        # Another process created the same tables between the check and the
        # CREATE (PostgreSQL); the second look finds them.
        metadata.create_all(engine, checkfirst=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(text[0].split()) if text else type(exc).__name__


@dataclass(frozen=True)
class StateDB:
    """A handle on the state database; cheap to build, the engine is shared."""

    engine: sa.Engine

    @classmethod
    def from_settings(cls, settings: Any = None) -> "StateDB":
        return cls(engine_for(state_url(settings)))

    @classmethod
    def from_url(cls, url: str | sa.URL) -> "StateDB":
        return cls(engine_for(sa.make_url(url) if isinstance(url, str) else url))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """One transaction: commit on success, roll back on any exception."""
        with self.engine.begin() as conn:
            yield conn

    def lock_row(self, conn: sa.Connection, table: sa.Table, *where: Any):
        """SELECT the matching rows FOR UPDATE (PostgreSQL); SQLite's IMMEDIATE
        transaction already holds the database's write lock."""
        stmt = sa.select(table).where(*where)
        if self.dialect == "postgresql":
            stmt = stmt.with_for_update()
        return conn.execute(stmt).mappings().all()

    def insert_ignore(self, conn: sa.Connection, table: sa.Table, values: dict[str, Any],
                      conflict: tuple[str, ...]) -> bool:
        """Insert unless a row with the same unique key exists; True when inserted."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(table).values(**values).on_conflict_do_nothing(index_elements=list(conflict))
        # RETURNING, not rowcount: psycopg 3 under SQLAlchemy 2.1 reports rowcount -1 here,
        # which read every insert on PostgreSQL as a conflict.
        return conn.execute(stmt.returning(sa.literal_column("1"))).first() is not None

    # -- leases ------------------------------------------------------------------

    def acquire_lease(self, key: str, holder: str, ttl: timedelta, *, now: datetime | None = None,
                      conn: sa.Connection | None = None) -> bool:
        """Take the lease on `key` for `holder` until now + ttl.

        True when taken (free, expired, or already held by `holder`, which
        renews it); False when someone else holds it. Within `conn` when given,
        so the caller's check-then-act is one transaction.
        """
        now = now or utcnow()
        if conn is None:
            with self.transaction() as c:
                return self.acquire_lease(key, holder, ttl, now=now, conn=c)
        values = {"key": key, "holder": holder, "acquired_at": now, "expires_at": now + ttl}
        if self.insert_ignore(conn, leases, values, ("key",)):
            return True
        rows = self.lock_row(conn, leases, leases.c.key == key)
        if not rows:  # released between the insert and the select
            return self.insert_ignore(conn, leases, values, ("key",))
        row = rows[0]
        if row["holder"] != holder and as_utc(row["expires_at"]) > now:
            return False
        conn.execute(sa.update(leases).where(leases.c.key == key).values(**values))
        return True

    def release_lease(self, key: str, holder: str, *, conn: sa.Connection | None = None) -> None:
        if conn is None:
            with self.transaction() as c:
                return self.release_lease(key, holder, conn=c)
        conn.execute(sa.delete(leases).where(leases.c.key == key, leases.c.holder == holder))

    def lease_holder(self, key: str, *, now: datetime | None = None) -> str | None:
        """Who holds `key` now (None when free or expired)."""
        now = now or utcnow()
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(leases).where(leases.c.key == key)).mappings().first()
        if row is None or as_utc(row["expires_at"]) <= now:
            return None
        return str(row["holder"])


def state_db(settings: Any = None) -> StateDB:
    """The state database for these settings (see the module docstring)."""
    return StateDB.from_settings(settings)


def dispose_engines() -> None:
    """Close every pooled connection (tests, and forked workers)."""
    with _engines_lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


# -- retention -------------------------------------------------------------------

def _root_id(data: Any) -> int | None:
    value = data.get("root_message_id") if isinstance(data, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def prune_notifications(db: StateDB, before: datetime) -> dict[str, int]:
    """Delete Slack state older than ``before`` that nothing can use any more; rows deleted per table.

    - ``slack_messages``: sent or rejected before ``before``, unless a pending
      reply waits for it as its parent, or it is the first message of an open
      incident or failure thread or of a kept run thread (replies take their
      thread's ts from it). Pending messages are never deleted.
    - ``incident_threads``: closed and not updated since ``before`` (a new
      problem opens a new thread either way).
    - ``run_threads``: not updated since ``before``, unless an open incident
      thread still replies under its first message.
    - ``leases``: expired before ``before`` (an expired lease is a free one).
    - Slack clicks: seen request signatures, approvals, acknowledge/snooze
      and the click audit, older than ``before``.
    - ``spool_replays``: markers of spool files replayed before ``before`` (the
      replay removes its file at once; a marker only guards against a second
      replay in the meantime).
    - ``pod_restarts``: restart counts observed before ``before`` (a window's count
      reads those from its start on).
    """
    before = as_utc(before)
    with db.transaction() as conn:
        roots = [_root_id(d) for d in conn.execute(
            sa.select(incident_threads.c.data).where(incident_threads.c.status == "open")).scalars()]
        roots += [_root_id(d) for d in conn.execute(sa.select(failure_threads.c.data)).scalars()
                  if isinstance(d, dict) and d.get("status") == "open"]
        keep = {r for r in roots if r is not None}
        old_runs = []
        for row in conn.execute(sa.select(run_threads.c.run_key, run_threads.c.data, run_threads.c.updated_at)).all():
            root = _root_id(row.data)
            if as_utc(row.updated_at) < before and root not in keep:
                old_runs.append(row.run_key)
            elif root is not None:
                keep.add(root)
        counts = {"run_threads": 0}
        for i in range(0, len(old_runs), 500):
            counts["run_threads"] += conn.execute(
                sa.delete(run_threads).where(run_threads.c.run_key.in_(old_runs[i:i + 500]))).rowcount or 0
        counts["incident_threads"] = conn.execute(sa.delete(incident_threads).where(
            incident_threads.c.status == "closed", incident_threads.c.updated_at < before)).rowcount or 0
        waiting_parents = sa.select(slack_messages.c.parent_id).where(
            slack_messages.c.status == "pending", slack_messages.c.parent_id.is_not(None))
        stmt = sa.delete(slack_messages).where(
            slack_messages.c.status.in_(("sent", "rejected")),
            sa.func.coalesce(slack_messages.c.sent_at, slack_messages.c.created_at) < before,
            slack_messages.c.id.not_in(waiting_parents),
        )
        if keep:
            stmt = stmt.where(slack_messages.c.id.not_in(sorted(keep)))
        counts["slack_messages"] = conn.execute(stmt).rowcount or 0
        counts["leases"] = conn.execute(sa.delete(leases).where(leases.c.expires_at < before)).rowcount or 0
        counts["slack_requests"] = conn.execute(sa.delete(slack_requests).where(
            slack_requests.c.received_at < before)).rowcount or 0
        counts["slack_approvals"] = conn.execute(sa.delete(slack_approvals).where(
            slack_approvals.c.created_at < before)).rowcount or 0
        counts["incident_controls"] = conn.execute(sa.delete(incident_controls).where(
            incident_controls.c.updated_at < before)).rowcount or 0
        counts["slack_interactions"] = conn.execute(sa.delete(slack_interactions).where(
            slack_interactions.c.at < before)).rowcount or 0
        counts["spool_replays"] = conn.execute(sa.delete(spool_replays).where(
            spool_replays.c.replayed_at < before)).rowcount or 0
        counts["pod_restarts"] = conn.execute(sa.delete(pod_restarts).where(
            pod_restarts.c.observed_at < before)).rowcount or 0
    return counts
