"""The run form: each param checked before anything runs, clusters resolved; FormError names the field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from lagdoctor.stages.common import DEFAULT_KAFKA_CONN_ID, MAX_WINDOW_MINUTES


SWEEP_CLUSTERS_ENV = "LAGDOCTOR_SWEEP_CLUSTERS"
SWEEP_WINDOW_MINUTES = 30
# The sweep's default cadence and each run's own samples (issue 20). With a run every minute
# the history is already dense: one sample per run gives the window 30 evenly spaced samples,
# the best accuracy on the simulator (bursts of 2-3 samples 5 s apart added pairs whose short
# steps carry noise, not evidence), and the snapshot phase is one read (about 1 s at 100
# groups, 2-3 s at 2,000), leaving most of the minute to diagnose, plan and notify.
# The interval matters only when a run's form asks for more samples.
SWEEP_SCHEDULE = "* * * * *"


def sweep_schedule() -> str:
    """The sweep DAG's cron: LAGDOCTOR_SWEEP_SCHEDULE, else SWEEP_SCHEDULE (read where the DAG is parsed)."""
    import os

    return os.environ.get("LAGDOCTOR_SWEEP_SCHEDULE", SWEEP_SCHEDULE)
SWEEP_SAMPLES = 1
SWEEP_SAMPLE_INTERVAL_S = 10.0


# A snapshot task sleeps samples x interval at most this long (its timeout follows).
MAX_SAMPLING_SECONDS = 900
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def late_run_line(run_type: Any, scheduled_for: datetime | None, next_due: datetime | None,
                  now: datetime) -> str | None:
    """One line when a scheduled run starts so late that the next scheduled run is already
    due (a run before it overran and this one waited): it skips, the next covers it.
    None otherwise; a manual or API-triggered run is never skipped this way."""
    if getattr(run_type, "value", run_type) != "scheduled" or scheduled_for is None or next_due is None:
        return None
    if now < next_due:
        return None
    late = (now - scheduled_for).total_seconds()
    return (f"skipped: this scheduled run starts {late:.0f} s after its time ({scheduled_for:%Y-%m-%d %H:%M:%S} UTC), "
            f"past the next run's ({next_due:%H:%M:%S} UTC); nothing snapshotted, diagnosed or posted, "
            "the next run covers it")


def next_scheduled_after(timetable: Any, start: datetime, end: datetime) -> datetime | None:
    """When the run after the scheduled one of data interval [start, end] becomes due
    (None: none, or the timetable cannot say)."""
    import pendulum
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import DataInterval, TimeRestriction

    try:
        info = coerce_to_core_timetable(timetable).next_dagrun_info(
            last_automated_data_interval=DataInterval(pendulum.instance(start), pendulum.instance(end)),
            restriction=TimeRestriction(earliest=None, latest=None, catchup=True))
    except Exception:  # noqa: BLE001 (a timetable that cannot say: the run goes ahead, never skipped)
        return None
    return None if info is None else info.run_after


class FormError(ValueError):
    """A run's params cannot work: one line naming the field. A retry cannot fix it."""


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
    from lagdoctor.kafka.group_listing import compile_group_pattern

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
