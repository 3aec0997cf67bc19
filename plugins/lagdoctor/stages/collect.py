"""Snapshots: each cluster's samples into the store, keyed by the run; a pattern that matches nothing named."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from lagdoctor.settings import Settings
from lagdoctor.stages.common import DEFAULT_KAFKA_CONN_ID, run_key

log = logging.getLogger(__name__)


class ClusterUnreadable(RuntimeError):
    """One cluster of a run could not be snapshotted: one line naming it (the others go on)."""


class NoGroupMatched(ValueError):
    """An incident's group_pattern (or topic) selects nothing on its cluster: one line with
    the closest group ids. A retry cannot fix it, and diagnosing nothing would read as healthy."""


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

    from lagdoctor.contracts import GROUP_ROW_PARTITION, GROUP_ROW_TOPIC
    from lagdoctor.kafka.collector import collect_snapshot, undiagnosed_groups
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
    started = time.monotonic()
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
    from lagdoctor.kafka.group_listing import compile_group_pattern, list_group_ids

    everything = list_group_ids(admin, compile_group_pattern(None), 30.0)
    compiled = compile_group_pattern(pattern)
    if not any(compiled.fullmatch(g) for g in everything):
        raise NoGroupMatched(no_match_message(pattern, cluster, everything))


def snapshotted_clusters(clusters: list[str], results: list[Any]) -> list[str]:
    """The clusters whose snapshot task succeeded (`results`: each map index's XCom,
    None where it failed), in the run's order."""
    return [c for c, r in zip(clusters, results) if isinstance(r, Mapping)]
