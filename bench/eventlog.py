"""Read a Spark event log and print where a run's time went.

    .venv/bin/python bench/eventlog.py EVENT_LOG_DIR [--from-ms T0 --to-ms T1]

EVENT_LOG_DIR is a spark.eventLog.dir (the newest application in it is read),
one application's rolling v2 folder (eventlog_v2_<app>/events_<n>_<app>[.zstd]),
or a single event file. Files ending .zstd are decompressed with the zstandard
module (the bench extra); others are read as plain JSON lines.

The breakdown lists each SQL execution (start, wall ms, the physical plan's
operators), its jobs and their stages (wall ms, tasks, summed task run time,
the operators the stage's RDDs were built for). `--from-ms/--to-ms` (epoch
milliseconds) keep the executions that started in that span: one client run
on a long-lived Connect server.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
CONNECT_OPERATION = "org.apache.spark.sql.connect.service.SparkListenerConnectOperation"
CONNECT_TAG = "SparkConnect_OperationTag_"
# plan wrappers that say nothing about the work
PLAN_WRAPPERS = {"AdaptiveSparkPlan", "ResultQueryStage", "ShuffleQueryStage", "BroadcastQueryStage",
                 "TableCacheQueryStage", "InputAdapter", "WholeStageCodegen", "ReusedExchange", "ColumnarToRow",
                 "AQEShuffleRead", "CommandResult"}


def event_files(path: str | Path) -> list[Path]:
    """The event files of one application, in order."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"no event log at {path}")
    rolled = sorted(path.glob("events_*"), key=_roll_index)
    if rolled:
        return rolled
    # an eventLog.dir, or a folder of them: the newest application anywhere under it
    apps = [p for p in path.rglob("eventlog_v2_*") if p.is_dir()] or \
        [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
    if not apps:
        raise FileNotFoundError(f"no Spark application's event log in {path}")
    return event_files(max(apps, key=lambda p: p.stat().st_mtime))


def _roll_index(p: Path) -> int:
    m = re.match(r"events_(\d+)_", p.name)
    return int(m.group(1)) if m else 0


def read_events(path: str | Path) -> Iterator[dict]:
    for f in event_files(path):
        with open(f, "rb") as raw:
            if f.suffix == ".zstd":
                import zstandard

                stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
                text = io.TextIOWrapper(stream, encoding="utf-8")
            else:
                text = io.TextIOWrapper(raw, encoding="utf-8")
            for line in text:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line)
                except ValueError:  # the last line of a log still being written
                    break


@dataclass
class Stage:
    stage_id: int
    start_ms: int
    end_ms: int
    tasks: int
    operators: list[str]
    task_ms: int = 0  # summed executor run time of its tasks
    gc_ms: int = 0  # summed JVM GC time of its tasks (memory pressure shows here)
    spill_bytes: int = 0  # summed disk bytes spilled by its tasks

    @property
    def wall_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass
class Job:
    job_id: int
    start_ms: int
    end_ms: int | None
    stage_ids: list[int]


@dataclass
class Execution:
    execution_id: int
    start_ms: int
    end_ms: int | None
    operators: list[str]
    jobs: list[Job] = field(default_factory=list)
    operation_tag: str = ""  # a Spark Connect operation's job tag
    # epoch ms of that operation's Started, Analyzed, ReadyForExecution events (Connect only)
    operation: dict[str, int] = field(default_factory=dict)

    @property
    def wall_ms(self) -> int:
        return (self.end_ms or self.start_ms) - self.start_ms


def _plan_operators(info: dict) -> list[str]:
    """Operator names of a sparkPlanInfo tree, depth first, wrappers and repeats left out."""
    seen: list[str] = []

    def walk(node: dict) -> None:
        name = node.get("nodeName", "")
        base = name.split(" (")[0].strip()
        if base and base not in PLAN_WRAPPERS and base not in seen:
            seen.append(base)
        for child in node.get("children", []):
            walk(child)

    walk(info)
    return seen


def _scope_operators(rdds: list[dict]) -> list[str]:
    """Operators a stage's RDDs were built for, in RDD order (input first), wrappers left out."""
    names: list[str] = []
    for rdd in sorted(rdds, key=lambda r: int(r.get("RDD ID", 0))):
        try:
            scope = json.loads(rdd.get("Scope") or "{}")
        except ValueError:
            continue
        name = re.sub(r"\s*\(\d+\)$", "", scope.get("name", "")).strip()
        if name and name not in names and name not in PLAN_WRAPPERS:
            names.append(name)
    return names


def breakdown(events, from_ms: int | None = None, to_ms: int | None = None) -> tuple[list[Execution], dict[int, Stage]]:
    """(SQL executions started in [from_ms, to_ms], with their jobs; every completed stage by id)."""
    executions: dict[int, Execution] = {}
    jobs: dict[int, Job] = {}
    job_exec: dict[int, int] = {}
    stages: dict[int, Stage] = {}
    task_ms: dict[int, list[int]] = {}  # stage: [run ms, GC ms, spilled bytes]
    operations: dict[str, dict[str, int]] = {}
    for e in events:
        kind = e.get("Event")
        if kind == SQL_START:
            info = e.get("sparkPlanInfo") or {}
            tags = [t for t in e.get("jobTags") or [] if str(t).startswith(CONNECT_TAG)]
            executions[int(e["executionId"])] = Execution(int(e["executionId"]), int(e["time"]), None,
                                                          _plan_operators(info),
                                                          operation_tag=tags[0] if tags else "")
        elif kind.startswith(CONNECT_OPERATION) and e.get("jobTag"):
            step = kind[len(CONNECT_OPERATION):]
            operations.setdefault(e["jobTag"], {})[step] = int(e["eventTime"])
        elif kind == SQL_END and int(e["executionId"]) in executions:
            executions[int(e["executionId"])].end_ms = int(e["time"])
        elif kind == "SparkListenerJobStart":
            job = Job(int(e["Job ID"]), int(e["Submission Time"]), None, [int(s) for s in e.get("Stage IDs", [])])
            jobs[job.job_id] = job
            exec_id = (e.get("Properties") or {}).get("spark.sql.execution.id")
            if exec_id is not None:
                job_exec[job.job_id] = int(exec_id)
        elif kind == "SparkListenerJobEnd" and int(e["Job ID"]) in jobs:
            jobs[int(e["Job ID"])].end_ms = int(e["Completion Time"])
        elif kind == "SparkListenerStageCompleted":
            si = e["Stage Info"]
            if "Submission Time" in si and "Completion Time" in si:
                stages[int(si["Stage ID"])] = Stage(int(si["Stage ID"]), int(si["Submission Time"]),
                                                    int(si["Completion Time"]), int(si["Number of Tasks"]),
                                                    _scope_operators(si.get("RDD Info", [])))
        elif kind == "SparkListenerTaskEnd":
            metrics = e.get("Task Metrics") or {}
            sid = int(e["Stage ID"])
            total = task_ms.setdefault(sid, [0, 0, 0])
            total[0] += int(metrics.get("Executor Run Time", 0))
            total[1] += int(metrics.get("JVM GC Time", 0))
            total[2] += int(metrics.get("Disk Bytes Spilled", 0))
    for sid, (run, gc, spill) in task_ms.items():
        if sid in stages:
            stages[sid].task_ms, stages[sid].gc_ms, stages[sid].spill_bytes = run, gc, spill
    for x in executions.values():
        x.operation = operations.get(x.operation_tag, {})
    for job_id, exec_id in job_exec.items():
        if exec_id in executions:
            executions[exec_id].jobs.append(jobs[job_id])
    chosen = [x for x in sorted(executions.values(), key=lambda x: x.start_ms)
              if (from_ms is None or x.start_ms >= from_ms) and (to_ms is None or x.start_ms <= to_ms)]
    return chosen, stages


def format_breakdown(executions: list[Execution], stages: dict[int, Stage], *,
                     run_span: tuple[int, int] | None = None,
                     top_stages: int = 8) -> list[str]:
    """Lines: one per SQL execution and its jobs' stages, then the stages that took longest.
    `run_span`: the client run's (start, end) epoch ms, to say how much of it no execution covers."""
    if not executions:
        return ["  (no SQL execution in the event log for this run)"]
    t0 = executions[0].start_ms
    lines = []
    sql_ms = 0
    run_stages: list[Stage] = []
    for x in executions:
        sql_ms += x.wall_ms
        ops = ", ".join(x.operators[:8]) + (", ..." if len(x.operators) > 8 else "")
        lines.append(f"  sql {x.execution_id:>4}  at {x.start_ms - t0:>7,} ms  {x.wall_ms:>7,} ms  "
                     f"{len(x.jobs)} jobs  {ops}")
        op = x.operation
        if "Started" in op and "Analyzed" in op and "ReadyForExecution" in op:
            # the server's analysis and planning of the client's plan, before any job runs
            lines.append(f"      connect operation: received {x.start_ms - op['Started']:,} ms before the execution; "
                         f"analysed in {op['Analyzed'] - op['Started']:,} ms, planned in "
                         f"{op['ReadyForExecution'] - op['Analyzed']:,} ms")
        for job in sorted(x.jobs, key=lambda j: j.job_id):
            for sid in job.stage_ids:
                st = stages.get(sid)
                if st is None:  # skipped: its shuffle output was reused
                    continue
                run_stages.append(st)
                lines.append(f"      job {job.job_id:>4} stage {sid:>4}  {st.wall_ms:>7,} ms wall  "
                             f"{st.tasks:>4} tasks  {st.task_ms:>8,} ms in tasks ({st.gc_ms:,} GC"
                             f"{f', {st.spill_bytes / 2**20:,.0f} MiB spilled' if st.spill_bytes else ''})  "
                             f"{', '.join(st.operators)}")
    end = max((x.end_ms or x.start_ms) for x in executions)
    summary = (f"  {len(executions)} SQL executions, {sum(len(x.jobs) for x in executions)} jobs, "
               f"{len(run_stages)} stages ({sum(st.task_ms for st in run_stages) / 1000:.1f} s in tasks, "
               f"{sum(st.gc_ms for st in run_stages) / 1000:.1f} s of it GC); {sql_ms / 1000:.1f} s inside SQL executions, "
               f"{(end - t0) / 1000:.1f} s from the first start to the last end")
    if run_span is not None:
        run_ms = run_span[1] - run_span[0]
        summary += (f"; client run {run_ms / 1000:.1f} s ({(run_ms - sql_ms) / 1000:.1f} s outside any execution: "
                    f"{(t0 - run_span[0]) / 1000:.1f} s before the first, {(run_span[1] - end) / 1000:.1f} s "
                    f"after the last)")
    lines.append(summary)
    if run_stages:
        lines.append("  longest stages:")
        for st in sorted(run_stages, key=lambda s: -s.wall_ms)[:top_stages]:
            lines.append(f"    stage {st.stage_id:>4}  {st.wall_ms:>7,} ms  {st.tasks:>4} tasks  "
                         f"{', '.join(st.operators)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--from-ms", type=int, default=None)
    parser.add_argument("--to-ms", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        executions, stages = breakdown(read_events(args.path), args.from_ms, args.to_ms)
    except (FileNotFoundError, ImportError) as exc:
        print(f"eventlog: {exc}", file=sys.stderr)
        return 1
    print("\n".join(format_breakdown(executions, stages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
