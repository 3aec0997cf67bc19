"""What the DAG tasks do, one function per task, so DAG files only wire.

Every function is keyed by the run (`run_key`) and safe to retry: a retried
snapshot task finds its samples already written, the diagnosis overwrites its
own run's output, Slack threads and remediation are deduplicated by their
stores. XCom carries paths and small summaries, never snapshot data.

Nothing heavy is imported at module level: DAG files import this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.settings import Settings, join

log = logging.getLogger(__name__)

DEFAULT_KAFKA_CONN_ID = "kafka_default"
SWEEP_CLUSTERS_ENV = "LAGDOCTOR_SWEEP_CLUSTERS"
SPARK_CONN_ID = "spark_default"
SWEEP_WINDOW_MINUTES = 30
SNAPSHOT_RETENTION_DAYS = 7
# The incident form accepts windows up to 7 days; retention keeps that much
# plus a day, so a diagnosis started near a day boundary still finds its files.
MAX_WINDOW_MINUTES = 10080
RETENTION_GRACE_DAYS = 1
# A snapshot task sleeps samples x interval at most this long (its timeout follows).
MAX_SAMPLING_SECONDS = 900
PLANS_FILE = "plans.json"
QUARANTINE_FILE = "quarantined.jsonl"
KINDS = ("sweep", "incident")
_RUN_KEY_PREFIX = 80
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class FormError(ValueError):
    """A run's params cannot work: one line naming the field. A retry cannot fix it."""


class SlackUndelivered(RuntimeError):
    """Slack did not take some messages; they wait in the outbox for the next run."""


class ClusterUnreadable(RuntimeError):
    """One cluster of a run could not be snapshotted: one line naming it (the others go on)."""


class RemediationBlocked(RuntimeError):
    """A real (not dry) remediation that a guardrail or the action itself blocked: one line
    with the reasons. `changed`: whether the task changed anything for another group."""

    def __init__(self, message: str, *, changed: bool) -> None:
        super().__init__(message)
        self.changed = changed


class NoGroupMatched(ValueError):
    """An incident's group_pattern (or topic) selects nothing on its cluster: one line with
    the closest group ids. A retry cannot fix it, and diagnosing nothing would read as healthy."""


def run_key(run_id: str, dag_id: str | None = None) -> str:
    """A folder/file name for one DAG run: readable, safe, stable across retries.

    The sanitised prefix is for people; the hash of the exact (dag_id, run_id)
    keeps two runs apart that sanitise alike (`a/b`, `a_b`) or that would
    otherwise name a path (`..`, `.`), and separates DAGs that share a run id.
    """
    raw = run_id if dag_id is None else f"{dag_id}__{run_id}"
    prefix = re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).strip("._-")[:_RUN_KEY_PREFIX].rstrip("._-") or "run"
    digest = hashlib.sha1(f"{dag_id or ''}\x00{run_id}".encode()).hexdigest()[:10]
    return f"{prefix}-{digest}"


# -- Kafka ---------------------------------------------------------------------

def kafka_admin(conn_id: str) -> tuple[Any, str]:
    """(AdminClient, bootstrap for messages) from an Airflow `kafka` connection.

    With no `kafka_default` connection, KAFKA_BOOTSTRAP_SERVERS is used, so a
    bare install works against the embedded broker; any other id must exist.
    """
    from lagdoctor.connections import connection_exists
    from lagdoctor.kafka.clients import admin_client, airflow_admin_client, resolve_bootstrap

    if connection_exists(conn_id):
        from airflow.sdk.bases.hook import BaseHook

        bootstrap = BaseHook.get_connection(conn_id).extra_dejson.get("bootstrap.servers", conn_id)
        # The provider's client (callbacks, MSK IAM), with librdkafka's own log
        # lines kept out of the task log and auth failures named as such.
        return airflow_admin_client(conn_id), str(bootstrap)
    if conn_id != DEFAULT_KAFKA_CONN_ID:
        raise ValueError(f"no Airflow connection {conn_id!r} of type kafka")
    try:
        bootstrap = resolve_bootstrap(None)
    except ValueError:
        raise ValueError(
            f"no Airflow connection {conn_id!r} of type kafka, and KAFKA_BOOTSTRAP_SERVERS is not set"
        ) from None
    return admin_client(bootstrap), bootstrap


# -- the form ------------------------------------------------------------------

def check_cluster(conn_id: Any, environ: Mapping[str, str] | None = None, *, field: str = "cluster") -> str:
    """The `cluster` param names a usable `kafka` connection (or the default's env fallback)."""
    import os

    from lagdoctor.connections import connection_exists
    from lagdoctor.kafka.clients import BOOTSTRAP_ENV

    if not isinstance(conn_id, str) or not conn_id.strip():
        raise FormError(f"{field}: required, the id of an Airflow connection of type kafka")
    conn_id = conn_id.strip()
    try:
        exists = connection_exists(conn_id)
    except Exception as exc:  # a malformed AIRFLOW_CONN_*: its text may hold a secret, so only the type
        raise FormError(f"{field}: connection {conn_id!r} cannot be read ({type(exc).__name__})") from None
    if exists:
        from airflow.sdk.bases.hook import BaseHook

        conn = BaseHook.get_connection(conn_id)
        if conn.conn_type != "kafka":
            raise FormError(f"{field}: connection {conn_id!r} is of type {conn.conn_type!r}, expected kafka")
        if not (conn.extra_dejson or {}).get("bootstrap.servers"):
            raise FormError(f"{field}: connection {conn_id!r} has no bootstrap.servers in its extra")
        return conn_id
    env = os.environ if environ is None else environ
    if conn_id == DEFAULT_KAFKA_CONN_ID and env.get(BOOTSTRAP_ENV):
        return conn_id
    hint = f", and {BOOTSTRAP_ENV} is not set" if conn_id == DEFAULT_KAFKA_CONN_ID else ""
    raise FormError(f"{field}: no Airflow connection {conn_id!r} of type kafka{hint}")


def parse_cluster_list(value: Any, field: str = "clusters") -> list[str]:
    """Connection ids from a JSON array or its text, or comma/space-separated text;
    de-duplicated in order. Empty (None, "", []) gives []."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise FormError(f"{field}: not valid JSON ({exc.msg} at character {exc.pos})") from None
        else:
            # Airflow connection ids hold no comma or space: either separates them.
            value = re.split(r"[,\s]+", text)
    if not isinstance(value, (list, tuple)):
        raise FormError(f"{field}: expected a list of connection ids like [\"kafka_eu\", \"kafka_us\"] "
                        f"or \"kafka_eu,kafka_us\", got {type(value).__name__}")
    ids: list[str] = []
    for item in value:
        if not isinstance(item, str):
            raise FormError(f"{field}: expected connection ids (text), got {item!r}")
        if item.strip() and item.strip() not in ids:
            ids.append(item.strip())
    return ids


def sweep_clusters_default(environ: Mapping[str, str] | None = None) -> list[str]:
    """The sweep's `clusters` default: LAGDOCTOR_SWEEP_CLUSTERS (comma-separated), else []
    (the single `cluster` param). Read where the DAG file is parsed, like its schedule."""
    import os

    env = os.environ if environ is None else environ
    try:
        return parse_cluster_list(env.get(SWEEP_CLUSTERS_ENV) or "", SWEEP_CLUSTERS_ENV)
    except FormError:
        return []  # a typo there must not break parsing; the run's form then shows []


def resolve_clusters(params: Mapping[str, Any], conf: Mapping[str, Any] | None = None) -> tuple[str, list[Any]]:
    """(the param they came from, the connection ids a run covers), before checking them. First wins:

    1. `clusters`, when the run's conf (form, API) gives a non-empty list;
    2. `cluster`, when the run's conf names it without `clusters` (an explicit single cluster);
    3. `clusters` from the params' default (LAGDOCTOR_SWEEP_CLUSTERS at parse time);
    4. `cluster` (default `kafka_default`).
    """
    conf = conf or {}
    if "cluster" in conf and not parse_cluster_list(conf.get("clusters")):
        return "cluster", [params.get("cluster")]
    listed = parse_cluster_list(params.get("clusters"))
    return ("clusters", listed) if listed else ("cluster", [params.get("cluster")])


def _number(value: Any, field: str, *, whole: bool = False, low: float | None = None,
            high: float | None = None) -> float | int:
    """`value` (a number or its text) as a number, or FormError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise FormError(f"{field}: expected a number, got {value!r}")
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except ValueError:
        raise FormError(f"{field}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise FormError(f"{field}: expected a finite number, got {value!r}")
    if whole and not number.is_integer():
        raise FormError(f"{field}: expected a whole number, got {value!r}")
    if low is not None and number < low:
        raise FormError(f"{field}: must be at least {low:g}, got {value!r}")
    if high is not None and number > high:
        raise FormError(f"{field}: must be at most {high:g}, got {value!r}")
    return int(number) if whole else number


def check_thresholds(overrides: Any) -> dict[str, Any]:
    """Threshold overrides (a JSON object or its text) checked by name, converted to numbers."""
    from lagdoctor.diagnosis.thresholds import Thresholds

    if overrides is None or (isinstance(overrides, str) and not overrides.strip()):
        return {}
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except ValueError as exc:
            raise FormError(f"thresholds: not valid JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(overrides, Mapping):
        raise FormError(f"thresholds: expected a JSON object like {{\"warning_lag\": 5000}}, "
                        f"got {type(overrides).__name__}")
    known = Thresholds.field_names()
    unknown = sorted(str(k) for k in overrides if k not in known)
    if unknown:
        raise FormError(f"thresholds.{unknown[0]}: unknown threshold; known: {', '.join(known)}")
    defaults = Thresholds()
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        if value is None:
            continue
        checked[name] = _number(value, f"thresholds.{name}", whole=isinstance(getattr(defaults, name), int), low=0)
    Thresholds.from_overrides(checked)
    return checked


def validate_params(params: Mapping[str, Any], environ: Mapping[str, str] | None = None, *,
                    conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The whole run form, checked before anything runs; raises FormError (one line, the field named).

    Returns the params the later tasks use: numbers as numbers, thresholds as
    a dict, empty pattern/topic as None, `clusters` the checked connection ids
    (see `resolve_clusters`; `conf` is the run's own conf) and `cluster` the first.
    """
    from lagdoctor.kafka.collector import compile_group_pattern

    field, ids = resolve_clusters(params, conf)
    clusters = [check_cluster(c, environ, field=field) for c in ids]
    clusters = list(dict.fromkeys(clusters))  # ids that differ only by spaces
    pattern = params.get("group_pattern") or None
    if pattern is not None:
        if not isinstance(pattern, str):
            raise FormError(f"group_pattern: expected a regex, got {type(pattern).__name__}")
        try:
            compile_group_pattern(pattern, what="group_pattern")
        except ValueError as exc:
            raise FormError(" ".join(str(exc).split())) from None
    topic = params.get("topic") or None
    if topic is not None and (not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic)):
        raise FormError(f"topic: {topic!r} is not a Kafka topic name "
                        "(1 to 249 letters, digits, '.', '_' or '-')")
    window = _number(params.get("window_minutes", SWEEP_WINDOW_MINUTES), "window_minutes",
                     low=1, high=MAX_WINDOW_MINUTES)
    samples = _number(params.get("samples", 1), "samples", whole=True, low=1, high=60)
    interval = _number(params.get("interval_seconds", 0), "interval_seconds", low=0, high=300)
    if samples * interval > MAX_SAMPLING_SECONDS:
        raise FormError(f"samples x interval_seconds: {samples} x {interval:g} s is more than the "
                        f"{MAX_SAMPLING_SECONDS} s a run may spend sampling")
    return {"cluster": clusters[0], "clusters": clusters, "group_pattern": pattern, "topic": topic,
            "window_minutes": window,
            "samples": samples, "interval_seconds": interval,
            "thresholds": check_thresholds(params.get("thresholds"))}


def take_snapshots(
    conn_id: str,
    run_id: str,
    *,
    group_pattern: str | None = None,
    topic: str | None = None,
    samples: int = 1,
    interval_s: float = 5.0,
    settings: Settings | None = None,
    dag_id: str | None = None,
    require_match: bool = False,
) -> dict[str, Any]:
    """Collect `samples` snapshots `interval_s` apart into the store; idempotent per run.

    `require_match` (incident runs): when the first sample taken holds no group
    matching `group_pattern` (or none on `topic`), raise NoGroupMatched before
    anything is written or slept, naming the closest group ids on the cluster.

    Each sample is keyed by the run and its index only, so a retried task finds
    the samples its earlier tries wrote (whatever time they were taken) and
    resumes at the first missing one. A cluster that cannot be read raises
    CollectionError (one line naming the address); samples already written stay.
    """
    import pyarrow.compute as pc

    from lagdoctor.kafka.collector import collect_snapshot, undiagnosed_groups
    from lagdoctor.contracts import GROUP_ROW_PARTITION, GROUP_ROW_TOPIC
    from lagdoctor.store import find_keyed_snapshots, write_snapshot

    settings = settings or Settings.from_env()
    key = run_key(run_id, dag_id)
    keys = [f"{key}-{i}" for i in range(samples)]
    done = find_keyed_snapshots(settings.snapshots_root, conn_id, keys)
    missing = [i for i in range(samples) if keys[i] not in done]
    if done:
        log.info("run %s: %d of %d samples already written; %s", run_id, len(done), samples,
                 f"resuming at sample {missing[0] + 1}" if missing else "nothing to sample")
    written, rows = [], 0
    undiagnosed: list[str] | None = None
    if missing:
        admin, bootstrap = kafka_admin(conn_id)
    for n, i in enumerate(missing):
        if n:
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
        started = time.monotonic()
        now = datetime.now(timezone.utc)
        table = collect_snapshot(admin, conn_id, group_pattern, now, bootstrap=bootstrap,
                                 record_partitions=settings.record_partitions,
                                 record_budget_s=settings.record_budget_s)
        if require_match and n == 0 and table.num_rows == 0:
            _raise_no_match(admin, conn_id, group_pattern)
        matched = table
        undiagnosed = undiagnosed_groups(table)
        if topic:
            # A group whose topics could not be read (topic "") may be on this topic: keep it.
            unknown = pc.and_(pc.equal(table["topic"], GROUP_ROW_TOPIC),
                              pc.equal(table["partition"], GROUP_ROW_PARTITION))
            table = table.filter(pc.or_(pc.equal(table["topic"], topic), unknown))
        if require_match and n == 0 and table.num_rows == 0:
            raise NoGroupMatched(no_topic_message(topic, group_pattern, conn_id, matched))
        path = write_snapshot(table, settings.snapshots_root, conn_id, now, key=keys[i])
        if path is None:
            log.info("sample %d of run %s was written meanwhile by another try; kept that one", i + 1, run_id)
            continue
        written.append(path)
        rows += table.num_rows
        failed = sum(1 for e in table["read_error"].to_pylist() if e)
        log.info("sample %d/%d: %d rows%s -> %s", i + 1, samples, table.num_rows,
                 f" ({failed} with read errors)" if failed else "", path)
    # Share and streams groups matching the pattern: listed, not diagnosed (None: not known).
    return {"cluster": conn_id, "store": settings.snapshots_root, "files": len(written), "rows": rows,
            "already_written": len(done), "not_diagnosed_groups": None if undiagnosed is None else len(undiagnosed)}


def snapshot_cluster(cluster: str, run_id: str, form: Mapping[str, Any], *, dag_id: str | None = None,
                     settings: Settings | None = None, require_match: bool = False) -> dict[str, Any]:
    """One cluster's part of a run (one mapped task instance): `take_snapshots` with
    the run's form. Failing, it says which cluster in one line; its samples are
    keyed by (run, cluster), so its retry never touches another cluster's.
    `require_match`: see `take_snapshots` (NoGroupMatched passes through as is)."""
    try:
        return take_snapshots(cluster, run_id, group_pattern=form.get("group_pattern"), topic=form.get("topic"),
                              samples=int(form.get("samples") or 1),
                              interval_s=float(form.get("interval_seconds") or 0), settings=settings, dag_id=dag_id,
                              require_match=require_match)
    except NoGroupMatched:
        raise  # already one line naming the cluster; the cluster was read fine
    except Exception as exc:  # noqa: BLE001 (a timeout is a BaseException and passes through)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ClusterUnreadable(f"cluster {cluster}: {reason[:400]}") from exc


# -- a pattern that matches nothing ---------------------------------------------------

CLOSEST_GROUPS = 3
_REGEX_SYNTAX = re.compile(r"[\\^$.|?*+()\[\]{}]")


def _literal(pattern: str) -> str:
    """The pattern's text with regex syntax dropped (`orders\\-eu.*` -> `orders-eu`): what a
    person meant to type, for comparing with group ids."""
    return _REGEX_SYNTAX.sub("", pattern.replace("\\", "")).lower()


def closest_groups(pattern: str, group_ids: list[str], limit: int = CLOSEST_GROUPS) -> list[str]:
    """The group ids a mistyped pattern most likely meant: those containing its text
    first (prefix before infix), then by difflib similarity; at most `limit`, and
    none that look nothing alike."""
    import difflib

    text = _literal(pattern)
    scored = []
    for gid in group_ids:
        low = gid.lower()
        ratio = difflib.SequenceMatcher(None, text, low).ratio()
        contains = 2 if text and low.startswith(text) else 1 if text and text in low else 0
        if contains or ratio >= 0.5:
            scored.append((-contains, -ratio, gid))
    return [gid for *_, gid in sorted(scored)[:limit]]


def suggest_pattern(pattern: str, closest: list[str]) -> str | None:
    """A full-match pattern for what was probably meant: `orders` with orders-processor and
    orders-archiver -> `orders-.*`; None when the pattern is not plain text or nothing fits."""
    import os

    if not pattern or _REGEX_SYNTAX.search(pattern):
        return None
    starts = [g for g in closest if g.startswith(pattern)]
    if starts:
        common = os.path.commonprefix(starts) if len(starts) > 1 else pattern
        return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", common) + ".*"
    if any(pattern in g for g in closest):
        return f".*{pattern}.*"
    if closest:  # a typo: the likeliest id itself
        return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", closest[0])
    return None


def no_match_message(pattern: str | None, cluster: str, group_ids: list[str]) -> str:
    """One line: `group_pattern 'orders' (full match) matched none of 7 groups on kafka_default;
    closest: orders-processor, orders-archiver. Did you mean 'orders-.*'?`"""
    pattern = pattern or ".*"
    # Quoted as typed, not repr(): a backslash must not show doubled.
    shown = " ".join(pattern.split())
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if not group_ids:
        return f"group_pattern '{shown}' (full match) matched no group on {cluster}: it has no consumer groups"
    count = f"{len(group_ids)} group{'' if len(group_ids) == 1 else 's'}"
    line = f"group_pattern '{shown}' (full match) matched none of {count} on {cluster}"
    closest = closest_groups(pattern, group_ids)
    line += "; closest: " + (", ".join(closest) if closest else "none alike")
    suggestion = suggest_pattern(pattern, closest)
    return line + (f". Did you mean '{suggestion}'?" if suggestion else "")


def no_topic_message(topic: str | None, pattern: str | None, cluster: str, table: Any) -> str:
    """One line when the pattern's groups have no offsets on the run's topic, naming theirs."""
    groups = sorted(set(table["group_id"].to_pylist()))
    topics = sorted({t for t in table["topic"].to_pylist() if t})
    shown = ", ".join(topics[:5]) + (f" and {len(topics) - 5} more" if len(topics) > 5 else "")
    return (f"topic '{topic}': none of the {len(groups)} group(s) matching '{pattern or '.*'}' on {cluster} "
            f"has offsets on it; their topics: {shown or 'none'}")


def _raise_no_match(admin: Any, cluster: str, pattern: str | None) -> None:
    """Raise NoGroupMatched when no group id on the cluster matches `pattern` in full.
    An empty sample whose groups do match (read errors, say) is left to the diagnosis."""
    from lagdoctor.kafka.collector import compile_group_pattern, list_group_ids

    everything = list_group_ids(admin, compile_group_pattern(None), 30.0)
    compiled = compile_group_pattern(pattern)
    if not any(compiled.fullmatch(g) for g in everything):
        raise NoGroupMatched(no_match_message(pattern, cluster, everything))


def snapshotted_clusters(clusters: list[str], results: list[Any]) -> list[str]:
    """The clusters whose snapshot task succeeded (`results`: each map index's XCom,
    None where it failed), in the run's order."""
    return [c for c, r in zip(clusters, results) if isinstance(r, Mapping)]


def prune_history(keep_days: int = SNAPSHOT_RETENTION_DAYS, settings: Settings | None = None,
                  now: datetime | None = None) -> int:
    """Retention: snapshot days and per-run findings/report folders older than `keep_days`.

    Never less than the longest window a diagnosis may read plus a grace day:
    a 7-day incident diagnosis running now must not lose its oldest files
    mid-read. A run folder goes only when its newest file is older than that
    too; a job still writing one (its time limit is 30 minutes) is far younger.
    """
    import fsspec

    from lagdoctor.store import prune_snapshots

    settings = settings or Settings.from_env()
    now = now or datetime.now(timezone.utc)
    keep_days = max(keep_days, math.ceil(MAX_WINDOW_MINUTES / 1440) + RETENTION_GRACE_DAYS)
    removed = prune_snapshots(settings.snapshots_root, keep_days, now)
    cutoff = now.timestamp() - keep_days * 86400
    for root in (settings.findings_root, settings.reports_root):
        fs, path = fsspec.core.url_to_fs(root)
        if not fs.exists(path):
            continue
        for run_dir in fs.ls(path, detail=True):
            if run_dir["type"] != "directory":
                continue
            stamps = [f.get("mtime") or f.get("LastModified") for f in fs.ls(run_dir["name"], detail=True)]
            newest = max((s.timestamp() if hasattr(s, "timestamp") else float(s) for s in stamps if s), default=None)
            if newest is not None and newest < cutoff:
                fs.rm(run_dir["name"], recursive=True)
                removed.append(run_dir["name"])
    for path in removed:
        log.info("retention: removed %s", path)
    from lagdoctor.state import StateConfigError, prune_state

    try:
        pruned = prune_state(keep_days, now, settings=settings)
    except StateConfigError as exc:  # files are pruned; the state's own retention waits for its config
        log.error("retention: state database not pruned: %s", " ".join(str(exc).split()))
    else:
        log.info("retention: state rows removed: %s", pruned)
    return len(removed)


def compact_history(settings: Settings | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Fold each closed hour's snapshot files into one (lagdoctor.store.compact_snapshots):
    a day holds tens of files per cluster, not 864, so a week's window reads fast."""
    from lagdoctor.store import compact_snapshots

    settings = settings or Settings.from_env()
    result = compact_snapshots(settings.snapshots_root, now or datetime.now(timezone.utc))
    log.info("compaction: %s", result.summary())
    return {"hours": len(result.compacted_hours), "files_folded": result.files_folded,
            "files_removed": result.files_removed, "left_alone": len(result.left_alone)}


# -- Spark -----------------------------------------------------------------------

def prepare_diagnosis(
    clusters: str | list[str],
    run_id: str,
    *,
    window_minutes: float,
    thresholds: Mapping[str, Any] | None = None,
    group_pattern: str | None = None,
    topic: str | None = None,
    dag_id: str | None = None,
    as_of: datetime | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """Arguments for the SparkSubmitOperator, built at run time (the package zip too).

    `group_pattern`/`topic` scope the job: an incident run writes findings only
    for the groups it was asked about, never a verdict on everyone else.
    `as_of` (default: now, after this run's samples were written) ends the
    window, so the job opens only the date folders the window reaches instead
    of every file's footer in a week of history.

    `clusters`: the connection ids to diagnose, in one job. One cluster reads
    its own `cluster=` folder, as it always did; several read the store's root
    with `--clusters a,b`, which limits the job to those folders, so a cluster
    this run could not snapshot is not judged on its stale history.
    """
    import os
    import sys
    from pathlib import Path

    from lagdoctor.diagnosis.submit import (
        build_package_zip,
        default_job_script,
        job_arguments,
        quiet_log_config,
        window_input_bytes,
    )

    settings = settings or Settings.from_env()
    work_dir = Path(os.environ.get("AIRFLOW_HOME", "/tmp")) / "lagdoctor-spark"
    output = join(settings.findings_root, run_key(run_id, dag_id))
    clusters = [clusters] if isinstance(clusters, str) else list(dict.fromkeys(clusters))
    if not clusters:
        raise ValueError("prepare_diagnosis: no cluster to diagnose")
    if len(clusters) == 1:
        from lagdoctor.store import cluster_folder_name

        snapshots = join(settings.snapshots_root, cluster_folder_name(clusters[0]))
        only: list[str] = []
    else:
        snapshots, only = settings.snapshots_root, ["--clusters", ",".join(clusters)]
    bindir = str(Path(sys.executable).parent)
    scope = {k: v for k, v in (("groups", group_pattern), ("topic", topic)) if v}
    as_of = as_of or datetime.now(timezone.utc)
    carry_from = previous_findings(settings, dag_id, output, as_of) if dag_id else None
    return {
        "application": default_job_script(),
        "py_files": build_package_zip(work_dir),
        "args": job_arguments(snapshots, output, as_of=as_of.isoformat(),
                              window_minutes=window_minutes, thresholds=check_thresholds(thresholds),
                              quarantine=True, carry_from=carry_from, **scope) + only,
        "output": output,
        "clusters": clusters,
        "python": sys.executable,
        "spark_submit": str(Path(bindir) / "spark-submit"),
        "path": bindir + os.pathsep + os.environ.get("PATH", ""),
        "log_config": quiet_log_config(work_dir),
        # decides the driver JVM's options (C1 only for a small local job)
        "input_bytes": window_input_bytes(snapshots, as_of, window_minutes, clusters if only else None),
    }


def previous_findings(settings: Settings, dag_id: str, output: str, before: datetime) -> str | None:
    """findings.jsonl of the newest planned run of `dag_id` before `before` (not this run's own
    folder, a retry's): a surge older than the window keeps that run's baseline (rule case 27).
    None when there is none, or the run index cannot be read (the run is judged on its window alone)."""
    from lagdoctor.contracts import FINDINGS_FILE
    from lagdoctor.runindex import parse_time, refresh

    try:
        index = refresh(settings.findings_root)
    except (OSError, ValueError) as exc:
        log.warning("no previous run to carry surges from: the run index could not be read (%s)", exc)
        return None
    before = before if before.tzinfo else before.replace(tzinfo=timezone.utc)
    own = output.rstrip("/").rsplit("/", 1)[-1]
    newest = None
    for key, rec in index.runs.items():
        meta = rec.get("meta") or {}
        at = parse_time(meta.get("planned_at"))
        if key != own and meta.get("dag_id") == dag_id and at is not None and at < before:
            newest = max(newest or (at, key), (at, key))
    return join(settings.findings_root, newest[1], FINDINGS_FILE) if newest else None


# Exit codes of spark_jobs/diagnose_lag.py that a retry cannot change.
DIAGNOSIS_USAGE_EXIT, DIAGNOSIS_BAD_INPUT_EXIT = 2, 3


def diagnosis_failure_line(message: str) -> tuple[int | None, str]:
    """(exit code, one line) from spark-submit's failure text: the job's own
    `diagnose_lag: error:` line when the log tail holds it."""
    code = re.search(r"Error code is: (\d+)", message)
    reason = re.search(r"diagnose_lag: error: ([^\n]+)", message)
    exit_code = int(code.group(1)) if code else None
    line = reason.group(1).strip() if reason else f"spark-submit failed (exit code {exit_code})"
    return exit_code, "diagnosis: " + " ".join(line.split())[:400]


# -- findings and runbooks ---------------------------------------------------------

def _read_jsonl(path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_findings(output: str) -> list[dict[str, Any]]:
    """The run's findings, each with its partitions' status rows as evidence; ValueError (one
    line) when the folder is not a complete run (lagdoctor.runindex.run_completeness)."""
    from lagdoctor.contracts import FINDINGS_FILE, PARTITION_STATUS_FILE
    from lagdoctor.notify.render import with_partition_status
    from lagdoctor.runindex import filesystem, run_completeness

    state = run_completeness(*filesystem(output))
    if not state.complete:
        raise ValueError(f"diagnosis output {output} is incomplete: {state.reason or 'no findings'}")

    status_rows = _read_jsonl(join(output, PARTITION_STATUS_FILE))
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in status_rows:
        by_key.setdefault((row["cluster"], row["group_id"], row["topic"]), []).append(row)
    return [
        with_partition_status(f, by_key.get((f["cluster"], f["group_id"], f["topic"]), []))
        for f in _read_jsonl(join(output, FINDINGS_FILE))
    ]


def read_quarantined(output: str) -> list[dict[str, Any]]:
    """Files the job moved aside this run ({"path", "moved_to", "reason"}); [] when none."""
    import fsspec

    path = join(output, QUARANTINE_FILE)
    fs, local = fsspec.core.url_to_fs(path)
    if not fs.exists(local):
        return []
    return [e for e in _read_jsonl(path) if isinstance(e, Mapping) and e.get("path")]


RUN_FILE = "run.json"


def plan_findings(
    output: str,
    *,
    group_pattern: str | None = None,
    topic: str | None = None,
    runbooks_dir: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    kind: str = "sweep",
    threshold_overrides: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    clusters: list[str] | None = None,
    clusters_unread: list[str] | None = None,
) -> dict[str, Any]:
    """Pair each finding with its runbook plan; write them, and which DAG run
    produced them (run.json: the lag page links back to it; `threshold_overrides`
    keeps an experiment from replacing the sweep's verdict), beside the findings.
    `clusters`/`clusters_unread`: what the run diagnosed, and what it could not
    read (no finding for those: unknown, never healthy).

    Returns a small summary: counts and, per registered action, how many
    findings want it (the branch task reads this).
    """
    import fsspec

    from lagdoctor.kafka.collector import compile_group_pattern
    from lagdoctor.runbooks import choose_actions, load_runbooks

    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
    # RE2 (linear time): group ids are chosen by clients, the pattern by whoever triggers.
    pattern = compile_group_pattern(group_pattern, what="group_pattern") if group_pattern else None
    findings = [
        f for f in read_findings(output)
        if (pattern is None or pattern.fullmatch(f["group_id"])) and (not topic or f["topic"] == topic)
    ]
    quarantined = read_quarantined(output)
    for entry in quarantined:
        log.warning("quarantined %s: %s (moved to %s)", entry.get("path"), " ".join(str(entry.get("reason")).split()),
                    entry.get("moved_to"))
    runbooks = load_runbooks(runbooks_dir)
    planned = [{"finding": f, "plan": choose_actions(f, runbooks).as_dict()} for f in findings]
    plans_path = join(output, PLANS_FILE)
    with fsspec.open(plans_path, "wt") as fh:
        json.dump(planned, fh)
    with fsspec.open(join(output, RUN_FILE), "wt") as fh:
        json.dump({"dag_id": dag_id, "run_id": run_id, "kind": kind,
                   "planned_at": (now or datetime.now(timezone.utc)).isoformat(),
                   "group_pattern": group_pattern, "topic": topic,
                   "threshold_overrides": dict(threshold_overrides or {}),
                   "clusters": list(clusters or []), "clusters_unread": list(clusters_unread or [])}, fh)
    wanted: dict[str, int] = {}
    for item in planned:
        for action in item["plan"]["actions"]:
            wanted[action["action"]] = wanted.get(action["action"], 0) + 1
    by_severity: dict[str, int] = {}
    for f in findings:
        by_severity[f["severity"]] = by_severity.get(f["severity"], 0) + 1
    return {
        "plans": plans_path,
        "output": output,
        "findings": len(findings),
        "problems": sum(1 for f in findings if f["diagnosis"] != "healthy"),
        "by_severity": by_severity,
        "actions": wanted,
        "quarantined": len(quarantined),
        "clusters_unread": list(clusters_unread or []),
    }


def read_plans(plans_path: str) -> list[dict[str, Any]]:
    import fsspec

    with fsspec.open(plans_path, "rt") as fh:
        return json.load(fh)


def action_task_id(action: str) -> str:
    return f"remediate_{action}"


def branch_target(action: str, *, approvals: bool = True) -> str:
    """The first task of an action's group: its approval gate, or its run for
    advice-only actions and in a DAG that never waits for a human (the sweep)."""
    from lagdoctor.remediation import get_action

    step = "gate" if approvals and get_action(action).changes_state else "run"
    return f"{action_task_id(action)}.{step}"


def choose_branches(summary: Mapping[str, Any] | None, *, approvals: bool = True) -> list[str]:
    """Branch targets: one remediation group per action some finding's runbook chose;
    none without a plan (the plan task failed)."""
    from lagdoctor.remediation import action_names

    if not summary or not summary.get("plans"):
        return []
    known = set(action_names())
    return [branch_target(a, approvals=approvals)
            for a in sorted(a for a in summary.get("actions", {}) if a in known)]


def write_reports(output: str) -> int:
    """One HTML report per problem (linked from Slack when LAGDOCTOR_REPORT_BASE_URL is set)."""
    from lagdoctor.runindex import record_run
    from lagdoctor.web.report import write_incident_report

    record_run(output)  # the lag page and the exporter find this run without a scan (never raises)

    try:
        paths = write_incident_report(output)
    except Exception as exc:  # a report is an extra: it must never hold back the Slack post
        log.error("could not write the incident reports: %s", " ".join(str(exc).split()))
        return 0
    for path in paths:
        log.info("report: %s", path)
    return len(paths)


# -- Slack ---------------------------------------------------------------------------

def _undelivered(results: list[Mapping[str, Any]]) -> tuple[int | None, str | None]:
    """(messages still in the outbox, why) after the last call: each call tries the
    whole outbox, so the last one's count is the outbox's, not a share to add up.
    None: some wait, how many is unknown (the state database went away mid-call)."""
    reported = [r for r in results if isinstance(r, Mapping) and "undelivered" in r]
    if not reported:
        return 0, None
    raw = reported[-1].get("undelivered")
    count = None if raw is None else int(raw)
    error = reported[-1].get("delivery_error") or next(
        (r.get("delivery_error") for r in reversed(reported) if r.get("delivery_error")), None)
    return count, error


def raise_if_undelivered(results: list[Mapping[str, Any]]) -> None:
    """After everything was queued: one line when Slack kept some of it back."""
    count, error = _undelivered(results)
    if count is None or count:
        from lagdoctor.notify.redact import one_line

        how_many = "an unknown number of" if count is None else str(count)
        raise SlackUndelivered(f"Slack: {how_many} message(s) not delivered, kept in the outbox: "
                               f"{one_line(error) if error else 'no reason given'}")


def post_quarantine_notice(output: str, *, settings: Settings | None = None) -> dict[str, Any] | None:
    """One Slack notice for the files this run's diagnosis moved aside; None when none were."""
    from lagdoctor.notify.incidents import post_notice
    from lagdoctor.notify.render import render_quarantine_notice

    entries = read_quarantined(output)
    if not entries:
        return None
    # Keyed by the run's folder: a retried task does not post it again.
    key = "quarantine:" + output.rstrip("/").rsplit("/", 1)[-1]
    return post_notice(render_quarantine_notice(entries), dedupe_key=key, settings=settings)


def _finding_key(finding: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(finding.get(k) or "") for k in ("cluster", "group_id", "topic"))


def post_findings(
    plans_path: str, run_id: str, *, incident_scope: str | None = None, settings: Settings | None = None
) -> dict[str, int]:
    """Tell Slack. A sweep posts, updates or closes each incident key's own thread;
    a manual incident run (`incident_scope` set) keeps the whole run in one thread.
    Both are deduplicated by their stores, so a retried task posts nothing twice.

    Everything is handed to the notify layer first; only then, if Slack kept
    messages back (they wait in the outbox), SlackUndelivered says how many.
    """
    from lagdoctor.notify.incidents import delivery_batch, post_incident_run, post_or_update_incident

    items = read_plans(plans_path)
    results: list[Mapping[str, Any]] = []
    with delivery_batch():  # Slack down: queue everything, retry it once, not once per finding
        notice = post_quarantine_notice(plans_path.rstrip("/").rsplit("/", 1)[0], settings=settings)
        if notice is not None:
            results.append(notice)
        if incident_scope is not None:
            result = post_incident_run(items, run_id=run_id, scope=incident_scope, settings=settings)
            results.append(result)
            summary = {"problems": result["problems"], "findings": result["findings"]}
        else:
            summary = {}
            # each finding with its sweep's others of the same (cluster, group, topic): a provisional thread
            # one of them still lands in is not superseded by another (notify.threads rule 8)
            sweeps: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
            for item in items:
                sweeps.setdefault(_finding_key(item["finding"]), []).append(item["finding"])
            for item in items:
                result = post_or_update_incident(item["finding"], item["plan"], run_id=run_id, settings=settings,
                                                 sweep=sweeps[_finding_key(item["finding"])])
                results.append(result)
                summary[result["decision"]] = summary.get(result["decision"], 0) + 1
    log.info("slack: %s", summary)
    raise_if_undelivered(results)
    return summary


def incident_scope(params: Mapping[str, Any]) -> str:
    """How an incident run names what it looked at, e.g. `kafka_default / orders-.* / orders`."""
    clusters = params.get("clusters") or [params.get("cluster", "")]
    parts = [", ".join(str(c) for c in clusters), str(params.get("group_pattern") or ".*")]
    if params.get("topic"):
        parts.append(str(params["topic"]))
    return " / ".join(parts)


# -- remediation ------------------------------------------------------------------------

REJECT_ALL = "Reject all"
APPROVAL_OPTIONS_MAX = 50  # a form with more targets asks for the first 50 (the rest: not approved)


def approval_target_key(finding: Mapping[str, Any]) -> str:
    """One approval choice per group on a cluster and topic (its findings share it)."""
    raw = json.dumps([str(finding.get(k) or "") for k in ("cluster", "group_id", "topic")])
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def approval_targets(action: str, plans_path: str, *, settings: Settings | None = None,
                     now: datetime | None = None) -> list[dict[str, Any]]:
    """Each (group on cluster/topic) the run would apply `action` to, in plan order, with the
    action's own preview (does, target) and `blocked`: why it would not run as things stand
    (a guardrail or the plan), evaluated now, before anybody is asked. `needs_approval`:
    whether this target waits for a human at all (advice, or not configured: no)."""
    from lagdoctor.remediation import needs_approval, preview_action

    targets: dict[str, dict[str, Any]] = {}
    for item in read_plans(plans_path):
        for planned in item["plan"]["actions"]:
            if planned["action"] != action:
                continue
            key = approval_target_key(item["finding"])
            if key in targets:
                continue
            p = preview_action(action, item["finding"], params=planned.get("params") or {},
                               guardrails=planned.get("guardrails") or {}, settings=settings, now=now)
            targets[key] = {"key": key, "cluster": p["cluster"], "group_id": p["group_id"], "topic": p["topic"],
                            "does": p["does"], "target": p["target"], "blocked": p["blocked"],
                            "diagnosis": item["finding"].get("diagnosis"), "summary": item["finding"].get("summary"),
                            "needs_approval": needs_approval(action, dry_run=False,
                                                             guardrails=planned.get("guardrails"))}
    return list(targets.values())


def approval_needed(action: str, plans_path: str, *, dry_run: bool, settings: Settings | None = None,
                    now: datetime | None = None) -> bool:
    """Whether a human must approve `action` for this run: never on a dry run (dag.test()
    and the demo never wait), and not when the guard blocks every target that needs it:
    nobody is asked to approve what cannot run (the run task then records it blocked)."""
    if dry_run:
        return False
    return any(t["needs_approval"] and not t["blocked"]
               for t in approval_targets(action, plans_path, settings=settings, now=now))


APPROVAL_SUBJECT_MAX = 200


def approval_option(index: int, target: Mapping[str, Any]) -> str:
    """The HITL option (and Slack button) approving one target: numbered, so labels stay
    unique however names are shortened; plain text, one line."""
    from lagdoctor.notify.templates import plain_label

    return (f"Approve {index}: {plain_label(target['group_id'], 60)} on {plain_label(target['cluster'], 40)}"
            f" / {plain_label(target['topic'] or '(all)', 60)}")


def approval_form(action: str, plans_path: str, *, settings: Settings | None = None,
                  now: datetime | None = None) -> dict[str, Any]:
    """The approval form: `subject`, `body` (Markdown for the Airflow UI), `options` (one
    "Approve n: ..." per target its guard lets run now, then "Reject all") and `targets`
    (every target, with its `option` or None when blocked now, for the run task and Slack).

    Per target: the concrete change (the action's own describe() of its plan),
    "irreversible" when it is, why it was proposed; a target whose guard blocks it now
    is listed as "blocked now: <why>" and not offered. Every name is escaped for
    Markdown: a group id cannot add a line, a link or emphasis to the form."""
    from lagdoctor.notify.redact import one_line
    from lagdoctor.notify.templates import escape_markdown as md, plain_label
    from lagdoctor.remediation import get_action

    spec = get_action(action)
    targets = [t for t in approval_targets(action, plans_path, settings=settings, now=now) if t["needs_approval"]]

    def change(t: Mapping[str, Any]) -> str:
        does = one_line(t["does"])
        return does + ("; irreversible" if spec.irreversible and "irreversible" not in does else "")

    offered = 0
    for t in targets:
        t["option"] = None
        if not t["blocked"] and offered < APPROVAL_OPTIONS_MAX:
            offered += 1
            t["option"] = approval_option(offered, t)
    open_targets = [t for t in targets if t["option"]]
    groups = f"{len(open_targets)} group{'' if len(open_targets) == 1 else 's'}"
    if len(open_targets) == 1:
        t = open_targets[0]
        subject = (f"lagdoctor: {plain_label(change(t), 120)} (group {plain_label(t['group_id'], 60)} "
                   f"on {plain_label(t['cluster'], 40)})?")
    else:
        subject = f"lagdoctor: {action} for {groups}{' (irreversible)' if spec.irreversible else ''}?"
    if len(subject) > APPROVAL_SUBJECT_MAX:
        subject = subject[:APPROVAL_SUBJECT_MAX - 2] + "…?"
    lines = [f"Approve runs `{action}`{' (**irreversible**)' if spec.irreversible else ''} for each group you "
             f"tick, and for no other ({groups} can run now):", ""]
    for t in targets:
        head = f"**{md(t['group_id'])}** on {md(t['cluster'])}, topic {md(t['topic'] or '(all)')}"
        if t["option"]:
            lines.append(f"- {md(t['option'].split(':', 1)[0])}: {head}: {md(change(t))}")
        else:
            why = (f"**blocked now**: {md(one_line(t['blocked']))}" if t["blocked"]
                   else f"over the form's {APPROVAL_OPTIONS_MAX} choices: ask again in another run")
            lines.append(f"- {head}: {why} (not offered)")
        lines.append(f"  - target: {md(t['target'])}")
        lines.append(f"  - why: {md(one_line(t.get('diagnosis') or ''))}: {md(one_line(t.get('summary') or ''))}")
    if spec.warning:
        lines += ["", f"Effect: {md(spec.warning)}"]
    lines += ["", f"Tick the groups to approve. \"{REJECT_ALL}\" (the default, also on timeout) changes nothing, "
                  "and wins over any ticked group."]
    return {"subject": subject, "body": "\n".join(lines),
            "options": [t["option"] for t in open_targets] + [REJECT_ALL], "targets": targets}


def approved_targets(form: Mapping[str, Any] | None, chosen: list[str] | None) -> set[str]:
    """The target keys a HITL answer approves: the ticked "Approve n" options, none when
    "Reject all" is among them (never more than the approver saw)."""
    chosen = list(chosen or [])
    if not form or REJECT_ALL in chosen:
        return set()
    return {t["key"] for t in form.get("targets") or [] if t.get("option") and t["option"] in chosen}


def not_offered_targets(form: Mapping[str, Any] | None) -> dict[str, str]:
    """Target key -> why the form did not offer it (blocked when asked, or over its limit)."""
    return {t["key"]: (t.get("blocked") or f"over the form's {APPROVAL_OPTIONS_MAX} choices: ask again in "
                                          "another run")
            for t in (form or {}).get("targets") or [] if not t.get("option")}


def remediate(
    action: str,
    plans_path: str,
    run_id: str,
    *,
    dry_run: bool,
    approved: bool | None = None,
    settings: Settings | None = None,
    approval_by: Mapping[str, Any] | None = None,
    approved_keys: set[str] | None = None,
    not_offered: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Run one registered action for every finding that wants it; report each in its thread.

    `approved=None` where an action needs approval records it `awaiting_approval`
    and posts how to act: the sweep proposes, it never waits for a human.
    `approved_keys` (a per-target answer, see `approved_targets`): each target is
    approved only when its key is in it; the others are recorded `rejected`.
    `not_offered` (`not_offered_targets` of the form): a target the form showed blocked
    is recorded `blocked` with the form's reason and fails the run, whatever the answer.
    """
    from lagdoctor.notify.incidents import delivery_batch, post_action_result
    from lagdoctor.remediation import RemediationFailed, run_action

    statuses: dict[str, int] = {}
    failures: list[str] = []
    blocked: list[str] = []
    posted: list[Mapping[str, Any]] = []
    planned_items = [(item, planned) for item in read_plans(plans_path)
                     for planned in item["plan"]["actions"] if planned["action"] == action]
    with delivery_batch():
        for item, planned in planned_items:
            target_key = approval_target_key(item["finding"])
            if approved_keys is not None:
                approved = target_key in approved_keys
            try:
                record = run_action(
                    action, item["finding"], run_id=run_id, dry_run=dry_run, approved=approved,
                    params=planned.get("params") or {}, guardrails=planned.get("guardrails") or {},
                    settings=settings, approval_by=approval_by, not_offered=(not_offered or {}).get(target_key),
                )
            except RemediationFailed as exc:
                # One group's failure must not stop the action for the others;
                # the runner has audited it and the task fails at the end.
                failures.append(f"cluster {item['finding'].get('cluster')}: {exc}")  # exc names the group
                statuses["failed"] = statuses.get("failed", 0) + 1
                continue
            posted.append(post_action_result(record, settings=settings))
            statuses[record["status"]] = statuses.get(record["status"], 0) + 1
            if record["status"] == "blocked" and not dry_run:
                blocked.append(f"group {record.get('group_id')} on {record.get('cluster')}: {record.get('message')}")
    log.info("%s: %s", action, statuses)
    if failures:
        raise RemediationFailed(f"{action} failed for {len(failures)} group(s); first: {failures[0]}")
    count, error = _undelivered(posted)
    if count is None or count:
        # The action was taken and audited; its reply waits in the outbox for the next
        # run. Failing here would read as "the action failed" (post_findings shows Slack).
        log.warning("Slack: %s message(s) not delivered, kept in the outbox: %s", "some" if count is None else count, error)
    if blocked:
        # Recorded and posted above; raised last so the grid does not show a blocked change as done.
        changed = bool(statuses.get("executed") or statuses.get("noop"))
        line = (f"{action} blocked for {len(blocked)} of {len(planned_items)} group(s), not run: "
                + "; ".join(blocked[:3]) + (f"; and {len(blocked) - 3} more" if len(blocked) > 3 else ""))
        log.warning("%s", line)
        raise RemediationBlocked(" ".join(line.split())[:1000], changed=changed)
    return statuses
