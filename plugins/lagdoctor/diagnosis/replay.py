"""A backtest's Spark side: every sweep a time range would have had, diagnosed in one job.

Each snapshot row is copied once into every sweep whose window holds it, under a
cluster label of its own (``<sweep end, epoch µs>|<cluster>``), so the sweeps
run through the same transforms as one sweep of many clusters, each with its
own window (classify.findings takes per-row window edges).

The carry chain (rule case 27: a surge older than the window keeps the baseline
of the run before) makes sweep k depend on sweep k-1's verdict. Pass 0 carries
nothing; only groups with a decided surge in it can carry (a chain starts where
a surge is decided on its own window). Those groups' sweeps are then diagnosed
again, in passes, with what the sweep before them would hand on, guessing that
a carried surge stays one until a pass shows where it ends, until every sweep
was diagnosed with what its predecessor handed on (``MAX_CARRY_PASSES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from lagdoctor.diagnosis.features import GROUP_KEY
from lagdoctor.diagnosis.series import LABEL_SEP

MAX_CARRY_PASSES = 8
SURGE = "producer_surge"


def micros(value: datetime) -> int:
    """A datetime as epoch microseconds, exactly (no float on the way)."""
    delta = value.astimezone(timezone.utc) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=int(us))


def sweep_ends(start: datetime, end: datetime, step_minutes: float) -> list[datetime]:
    """The sweeps a schedule every `step_minutes` would have run in [start, end], each the end of its window."""
    if step_minutes <= 0:
        raise ValueError(f"step must be more than 0 minutes, not {step_minutes:g}")
    if end < start:
        raise ValueError(f"the range ends ({end.isoformat()}) before it starts ({start.isoformat()})")
    step_us, first, last = round(step_minutes * 60e6), micros(start), micros(end)
    return [from_micros(first + k * step_us) for k in range((last - first) // step_us + 1)]


def relabel(snapshots, ends_us: list[int], window_us: int):
    """Every row once per sweep whose window [end - window, end] holds it, its cluster labelled
    with that sweep's end; `sweep_end_us` is the end, as a column. A regular schedule finds a row's
    sweeps by arithmetic; an irregular list (the ends real runs had) by a filter over the list."""
    from pyspark.sql import functions as F

    ts = F.unix_micros("snapshot_ts")
    steps = {b - a for a, b in zip(ends_us, ends_us[1:])}
    if len(steps) == 1 and min(steps) > 0:
        e0, step, n = ends_us[0], steps.pop(), len(ends_us)
        lo = F.greatest(F.lit(0), F.ceil((ts - F.lit(e0)) / F.lit(step)).cast("long"))
        hi = F.least(F.lit(n - 1), F.floor((ts + F.lit(window_us) - F.lit(e0)) / F.lit(step)).cast("long"))
        ends = F.when(lo <= hi, F.transform(F.sequence(lo, hi), lambda k: F.lit(e0) + k * F.lit(step)))
    else:
        every = F.array(*(F.lit(e).cast("long") for e in sorted(set(ends_us))))
        ends = F.filter(every, lambda e: (e >= ts) & (e - F.lit(window_us) <= ts))
    out = snapshots.withColumn("sweep_end_us", F.explode(ends))
    return out.withColumn("cluster", F.concat(F.col("sweep_end_us").cast("string"), F.lit(LABEL_SEP), F.col("cluster")))


def with_window(df, window_us: int):
    """`window_start_us`/`window_end_us` of each row's sweep, read from its cluster label."""
    from pyspark.sql import functions as F

    end = F.split(F.col("cluster"), r"\|", 2).getItem(0).cast("long")
    return df.withColumns({"window_end_us": end, "window_start_us": end - F.lit(window_us)})


def unlabel(df):
    """Labelled rows -> their sweep's end (`sweep_end`, ISO text) and their own cluster."""
    from pyspark.sql import functions as F

    parts = F.split(F.col("cluster"), r"\|", 2)
    end_us = parts.getItem(0).cast("long")
    return df.withColumns({
        "sweep_end": F.date_format(F.timestamp_micros(end_us), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"),
        "cluster": parts.getItem(1),
    })


# -- the carry chain --------------------------------------------------------------------------

Key = tuple[str, str, str]  # (cluster, group_id, topic), the cluster unlabelled
Carry = tuple[float | None, float | None, str | None] | None  # what sweep k-1 hands on: None, nothing


@dataclass
class CarryPlan:
    """Which carried input each (key, sweep) of the carrying groups was diagnosed with, by pass."""

    ends: list[int]
    assigned: dict[tuple[Key, int], Carry] = field(default_factory=dict)
    # (key, sweep index, carry) -> (pass, what that result hands on)
    results: dict[tuple[Key, int, Carry], tuple[int, Carry]] = field(default_factory=dict)
    # (key, sweep index) -> its data's end, from pass 0 (data, never a verdict)
    present: set[tuple[Key, int]] = field(default_factory=set)
    data_end: dict[tuple[Key, int], str | None] = field(default_factory=dict)
    passes: int = 1
    settled: bool = True


def handed_on(rows: list[dict[str, Any]]) -> Carry:
    """What a sweep's findings of one key hand on (classify.carried_baselines: the decided surges' maxima)."""
    surges = [r for r in rows if r.get("diagnosis") == SURGE and not r.get("provisional")]
    if not surges:
        return None

    def most(name):
        values = [r[name] for r in surges if r.get(name) is not None]
        return max(values) if values else None

    return most("baseline_produce_rate"), most("baseline_consume_rate"), most("data_end")


def next_assignment(plan: CarryPlan, keys: list[Key]) -> dict[tuple[Key, int], Carry]:
    """Walk each key's sweeps in order with what its predecessor hands on; where no pass has
    diagnosed a sweep with that input yet, guess that a carried surge stays one (same baseline,
    this sweep's data end). Returns the (key, sweep) inputs that still need a pass."""
    needed: dict[tuple[Key, int], Carry] = {}
    for key in keys:
        carry: Carry = None
        for k in range(len(plan.ends)):
            if (key, k) not in plan.present:
                carry = None  # no finding for the key in this sweep: nothing to hand on
                continue
            plan.assigned[(key, k)] = carry
            known = plan.results.get((key, k, carry))
            if known is not None:
                carry = known[1]
                continue
            needed[(key, k)] = carry
            # the guess, checked by the next pass: a sweep that measured its own surge hands that on
            # (a carried baseline is used only where none was measured); another goes on with the carried one
            alone = plan.results[(key, k, None)][1]
            carry = alone if alone is not None else (carry[0], carry[1], plan.data_end.get((key, k)))
    return needed


def carried_frame(spark, inputs: dict[tuple[Key, int], Carry], ends: list[int]):
    """What each (key, sweep) is diagnosed with, as classify.carried_baselines makes it from a
    previous run's findings: the same expression, so the chain carries exactly what a real run would."""
    from lagdoctor.diagnosis.classify import carried_baselines

    rows = [(f"{ends[k]}{LABEL_SEP}{key[0]}", key[1], key[2], SURGE, False, (c[0], c[1], c[2]))
            for (key, k), c in inputs.items() if c is not None]
    schema = ("cluster string, group_id string, topic string, diagnosis string, provisional boolean, "
              "evidence struct<baseline_produce_rate: double, baseline_consume_rate: double, data_end: string>")
    return carried_baselines(spark.createDataFrame(rows, schema))


def carry_rows(found) -> list[dict[str, Any]]:
    """The fields the chain reads of labelled findings, collected (the carrying groups' only)."""
    from pyspark.sql import functions as F

    e = F.col("evidence")
    return [r.asDict() for r in found.select(
        "cluster", "group_id", "topic", "diagnosis", "provisional",
        e["baseline_produce_rate"].cast("double").alias("baseline_produce_rate"),
        e["baseline_consume_rate"].cast("double").alias("baseline_consume_rate"),
        e["data_end"].alias("data_end")).collect()]


def split_label(label: str) -> tuple[int, str]:
    end, cluster = label.split(LABEL_SEP, 1)
    return int(end), cluster


def record_pass(plan: CarryPlan, rows: list[dict[str, Any]], inputs: dict[tuple[Key, int], Carry],
                index: dict[int, int], pass_no: int) -> None:
    """Remember what each diagnosed (key, sweep) hands on, under the input it was diagnosed with."""
    by: dict[tuple[Key, int], list[dict[str, Any]]] = {}
    for r in rows:
        end, cluster = split_label(r["cluster"])
        by.setdefault(((cluster, r["group_id"], r["topic"]), index[end]), []).append(r)
    for (key, k), carry in inputs.items():
        plan.results[(key, k, carry)] = (pass_no, handed_on(by.get((key, k), [])))


def diagnose_sweeps(spark, partitions, group_feats, thresholds, window_us: int, ends: list[int]):
    """Labelled features -> labelled findings of every sweep, the carry chain followed
    (module docstring). Returns (findings, CarryPlan)."""
    from pyspark.sql import functions as F

    from lagdoctor.diagnosis.classify import findings

    def diagnose(parts, groups, carried=None):
        groups = with_window(groups, window_us)
        return findings(parts, groups, thresholds, F.col("window_start_us"), F.col("window_end_us"), carried=carried)

    plan = CarryPlan(ends=ends)
    first = diagnose(partitions, group_feats).localCheckpoint()
    index = {e: k for k, e in enumerate(ends)}
    surge_keys = {(split_label(r["cluster"])[1], r["group_id"], r["topic"]) for r in first.where(
        (F.col("diagnosis") == SURGE) & ~F.col("provisional")).select(*GROUP_KEY).collect()}
    if not surge_keys:
        return first, plan
    keys = sorted(surge_keys)
    clusters = sorted({k[0] for k in keys})
    groups_of = sorted({k[1] for k in keys})
    own = (F.split(F.col("cluster"), r"\|", 2).getItem(1).isin(clusters)) & F.col("group_id").isin(groups_of)
    base_rows = carry_rows(first.where(own))
    for r in base_rows:
        end, cluster = split_label(r["cluster"])
        key, k = (cluster, r["group_id"], r["topic"]), index[end]
        if key in surge_keys:
            plan.present.add((key, k))
            plan.data_end[(key, k)] = max(filter(None, [plan.data_end.get((key, k)), r["data_end"]]), default=None)
    record_pass(plan, [r for r in base_rows if (split_label(r["cluster"])[1], r["group_id"], r["topic"]) in surge_keys],
                {(key, k): None for key, k in plan.present}, index, 0)
    passes = {0: first}
    parts_c = partitions.where(own).localCheckpoint()
    groups_c = group_feats.where(own).localCheckpoint()
    while True:
        needed = next_assignment(plan, keys)
        if not needed:
            break
        if plan.passes > MAX_CARRY_PASSES:
            plan.settled = False
            break
        # the whole group in those sweeps, every topic: a group's read state spans its topics
        labels = spark.createDataFrame(
            sorted({(f"{ends[k]}{LABEL_SEP}{key[0]}", key[1]) for (key, k) in needed}),
            "cluster string, group_id string")
        scope = ["cluster", "group_id"]
        found = diagnose(parts_c.join(F.broadcast(labels), scope, "left_semi"),
                         groups_c.join(F.broadcast(labels), scope, "left_semi"),
                         carried_frame(spark, needed, ends)).localCheckpoint()
        record_pass(plan, carry_rows(found), needed, index, plan.passes)
        passes[plan.passes] = found
        plan.passes += 1
    # each (key, sweep) of the carrying groups from the pass that diagnosed it with its real input
    chosen = [(f"{ends[k]}{LABEL_SEP}{key[0]}", key[1], key[2], plan.results[(key, k, carry)][0])
              for (key, k), carry in plan.assigned.items() if (key, k, carry) in plan.results]
    pick = spark.createDataFrame(chosen, "cluster string, group_id string, topic string, pass int")
    scope = list(GROUP_KEY)
    out = first.join(F.broadcast(pick.select(*scope)), scope, "left_anti")
    for n, found in passes.items():
        mine = pick.where(F.col("pass") == n).drop("pass")
        out = out.unionByName(found.join(F.broadcast(mine), scope, "left_semi"))
    return out, plan


def window_group_series(rows, partitions, ends_us: list[int], window_us: int):
    """features.group_series of every sweep, labelled. A group's totals at one snapshot are the same
    in every window that holds the snapshot, so they are summed once and the group's rows (not each
    partition's) copied into the windows. The exception: in a window where a partition's offset
    reset falls, its rows before the reset are left out (partition_features' offset_reset_t); those
    (sweep, group, topic) are summed again from their own copied rows."""
    from pyspark.sql import functions as F

    from lagdoctor.diagnosis.features import group_series

    copied = relabel(group_series(rows), ends_us, window_us).drop("sweep_end_us")
    key = list(GROUP_KEY)
    resets = partitions.where(F.col("offset_reset_t").isNotNull()).select(*key).distinct().localCheckpoint()
    if resets.isEmpty():
        return copied
    own = resets.select(F.split(F.col("cluster"), r"\|", 2).getItem(1).alias("cluster"), "group_id", "topic").distinct()
    again = relabel(rows.join(F.broadcast(own), key, "left_semi"), ends_us, window_us).join(
        F.broadcast(resets), key, "left_semi")
    return copied.join(F.broadcast(resets), key, "left_anti").unionByName(group_series(again, partitions))


def replay_sets(spark, snapshots, ends: list[datetime], window_minutes: float, sets: list) -> list[tuple[Any, CarryPlan]]:
    """Per Thresholds of `sets`: (labelled findings of every sweep ending at `ends`, its CarryPlan);
    (None, CarryPlan) for no sweep. Each row is read once and copied into its sweeps' windows where
    that is cheap: in numpy, inside its partition's task (features.window_partition_features), and as
    its group's totals (window_group_series)."""
    from lagdoctor.diagnosis.features import group_features, window_partition_features
    from lagdoctor.diagnosis.window import select_window

    if not ends:
        return [(None, CarryPlan(ends=[])) for _ in sets]
    window_us = round(window_minutes * 60e6)
    ends_us = [micros(e) for e in ends]
    rows = select_window(snapshots, from_micros(ends_us[0] - window_us), ends[-1]).localCheckpoint()
    out = []
    for thresholds in sets:
        partitions = window_partition_features(rows, ends_us, window_us, thresholds).localCheckpoint()
        series = window_group_series(rows, partitions, ends_us, window_us)
        group_feats = group_features(series, thresholds).localCheckpoint()
        out.append(diagnose_sweeps(spark, partitions, group_feats, thresholds, window_us, ends_us))
    return out


# Findings on the driver at once, about (whole sweeps at a time): a day of 200 lagging groups is
# about 600 MB of findings.jsonl, a week seven times that, which no driver holds whole; each
# collect scans every finding kept, so not fewer than needed either.
FINDINGS_PER_COLLECT = 50_000


def iso_end(us: int) -> str:
    """A sweep's end as unlabel writes it (sortable text)."""
    return from_micros(us).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def set_outputs(found, ends_us: list[int]) -> tuple[Iterator[str], str]:
    """(findings.jsonl's lines, timeline.jsonl's text) of one set's labelled findings: every finding,
    with its sweep_end, of each (cluster, group, topic) with a problem in some sweep (what Slack could
    hear), sweep by sweep, collected about FINDINGS_PER_COLLECT at a time as the lines are written;
    and per (cluster, group, topic) each sweep where its verdict changed."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from lagdoctor.contracts import NO_PROBLEM_DIAGNOSES
    from lagdoctor.diagnosis.output import dataframe_records, findings_records, to_json_line

    found = unlabel(found).localCheckpoint()
    key = list(GROUP_KEY)
    problem = found.where(~F.col("diagnosis").isin(sorted(NO_PROBLEM_DIAGNOSES))).select(*key).distinct()
    heard = found.join(F.broadcast(problem), key, "left_semi").localCheckpoint()

    per_sweep = heard.count() / max(1, len(ends_us))
    step = max(1, int(FINDINGS_PER_COLLECT / max(per_sweep, 1.0)))

    def lines() -> Iterator[str]:
        for i in range(0, len(ends_us), step):
            first, last = iso_end(ends_us[i]), iso_end(ends_us[min(i + step, len(ends_us)) - 1])
            records = findings_records(heard.where(F.col("sweep_end").between(first, last)))
            records.sort(key=lambda r: r["sweep_end"])  # stable: each sweep keeps findings_records' order
            for r in records:
                yield to_json_line(r) + "\n"

    verdicts = found.groupBy("sweep_end", *key).agg(F.sort_array(F.collect_list(F.struct(
        "diagnosis", "severity", "provisional"))).alias("verdict"))
    w = Window.partitionBy(*key).orderBy("sweep_end")
    changes = verdicts.withColumn("before", F.lag("verdict").over(w)).where(
        F.col("before").isNull() | (F.col("before") != F.col("verdict"))).drop("before")
    timeline = dataframe_records(changes, order_by=[*key, "sweep_end"])
    return lines(), "".join(to_json_line(r) + "\n" for r in timeline)
