"""Issue 31, build item 2: the whole sweep, measured. The real `kafka_lag_health_sweep` DAG,
end to end, each task's seconds and the margin left in its minute.

    .venv/bin/python bench/sweep_bench.py                                  # 2,000 groups x 10 partitions
    .venv/bin/python bench/sweep_bench.py --groups 10000 --partitions 20   # issue 9's scale

What runs, all on this machine, each a real server on free loopback ports, all
stopped (process groups, temporary folders) on exit, Ctrl-C or an exception:

- Kafka: the embedded Apache Kafka (lagdoctor.kafka.broker); bench/scale_bench.py's
  `setup` creates the topics (--groups-per-topic groups read each, default 10),
  produces --records records per partition and commits every group's offsets below them;
  then all groups but a --lagging-share of them (default 1%) commit the log end: a steady
  minute, most groups healthy, a few crashed consumers (EMPTY, lag > 0). With
  --lagging-share 1 every group is an incident (write_reports then renders one report each);
- the warm engine: a Spark Connect server (lagdoctor.connectserver, --master local[2],
  its default driver memory unless --driver-memory, hadoop-aws on its class path) with
  its token; the `spark_default` connection is of type spark_connect, as `make airflow` has it;
- lagdoctor's state in PostgreSQL (a throwaway server, tests/fixtures/postgres.py's);
- the data root on S3: SeaweedFS `weed mini` (tests/fixtures/objectstore.py's),
  LAGDOCTOR_DATA_ROOT=s3://lagdoctor/lagdoctor, its keys in the lagdoctor_s3 AWS connection;
- Slack: no connection, so the outbox (the product's default without a token).

Airflow runs the DAG with `dag.test()` in a child process (as tests/test_connect_engine.py
does), its own metadata in SQLite: tasks run one after another in that process, so
prune_history and compact_history, which a real executor runs beside the diagnosis, add
to the wall time here; the table says which tasks those are.

History: the diagnosis reads 30 minutes of it. Before the timed runs one real snapshot of
the broker (lagdoctor.kafka.collector.collect_snapshot, as the snapshot task takes it) is
written into the store --history-minutes times, one a minute before now, keyed as the
sweep's scheduled runs key theirs (the offsets are the same in each: a quiet cluster).
Then the DAG runs --runs times (default 2); the LAST run is reported: the first warms
the Connect server and posts what is new, so the last one's post_findings has nothing
new to say, as in a steady minute.

Printed: the baselines measured in the same run, Kafka's own
`ConsumerGroupCommand --describe --all-groups` (the kafka-tools jar from Maven
Central with the broker's libs, as an operator runs kafka-consumer-groups.sh) on the same
broker, a trivial `spark-submit` (bench/diagnose_bench.py's) and a trivial Connect query;
the ratios first (snapshot task = N x ConsumerGroupCommand, diagnose task = N x trivial
spark-submit), then a table of every task that ran in the last run: seconds and share of
60 s; then the run's wall time and the margin left in its minute. Figures, no assertions.

Goals (issue 31): the whole run at 2,000 x 10 <= 50% of its minute (30 s); 10,000 x 20
fits its minute (60 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))  # tests.fixtures: the throwaway PostgreSQL and SeaweedFS

MINUTE_S = 60.0
GOALS = {(2_000, 10): 0.5, (10_000, 20): 1.0}  # share of the minute the whole run may take
CLUSTER = "kafka_default"
STATE_DB = "lagdoctor_state"
DATA_ROOT = "s3://lagdoctor/lagdoctor"  # the bucket tests/fixtures/objectstore.py creates
# prune_history and compact_history depend on the snapshot only: a real executor runs them beside the diagnosis
BESIDE_THE_DIAGNOSIS = ("prune_history", "compact_history")
KAFKA_TOOLS_MAIN = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


def say(line: str) -> None:
    print(line, flush=True)


# -- the servers ------------------------------------------------------------------------------


@contextlib.contextmanager
def throwaway_postgres():
    """A PostgreSQL server (tests/fixtures/postgres.py's), with lagdoctor's state database;
    yields its SQLAlchemy URL; stopped and removed on exit."""
    import sqlalchemy as sa

    from lagdoctor.lab.postgres import as_server_user, pg_bin
    from tests.fixtures.postgres import ThrowawayPostgres

    bindir = pg_bin()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries (make test installs Debian's postgresql)")
    # a folder of its own: the server runs as `postgres` when we are root, and `work` is 0700
    base = Path(tempfile.mkdtemp(prefix="sweep-bench-pg-"))
    server = ThrowawayPostgres(bindir, base)
    try:
        server.init()
        server.start()
        admin = sa.create_engine(server.url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{STATE_DB}"')
        admin.dispose()
        yield sa.make_url(server.url).set(database=STATE_DB).render_as_string(hide_password=False)
    finally:
        if (server.data / "postmaster.pid").exists():
            subprocess.run(as_server_user([str(bindir / "pg_ctl"), "-D", str(server.data), "-m", "immediate",
                                           "-w", "stop"]), capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


def connect_server(work: Path, master: str, driver_memory: str | None, event_log: Path | None):
    """The warm engine, started (not yet waited for): S3A on its class path; each session sends its keys."""
    from lagdoctor.connectserver import ConnectServer
    from lagdoctor.objectstore import s3a_impl_conf
    from lagdoctor.s3jars import classpath_conf, hadoop_aws_jars

    conf = {**classpath_conf(hadoop_aws_jars()), **s3a_impl_conf()}
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        conf.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.resolve().as_uri()})
    return ConnectServer(work / "connect-server", master=master, conf=conf, driver_memory=driver_memory).start()


def settle_groups(bootstrap: str, args, in_flight: int = 500) -> int:
    """All groups but every 1/--lagging-share-th commit their partitions' log end (lag 0: healthy);
    the others keep scale_bench's commits below it (EMPTY with lag: crashed_consumer). Returns
    how many lag. A steady minute: most groups healthy, a few incidents."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    from lagdoctor.kafka.clients import admin_client
    from scale_bench import GROUP_PREFIX, topic_of

    step = max(1, round(1 / args.lagging_share)) if args.lagging_share > 0 else None
    lagging = [g for g in range(args.groups) if step and g % step == 0]
    if step == 1:
        return len(lagging)
    admin = admin_client(bootstrap)
    pending = []
    for g in range(args.groups):
        if step and g % step == 0:
            continue
        offsets = [TopicPartition(topic_of(g, args.groups_per_topic), p, args.records) for p in range(args.partitions)]
        request = ConsumerGroupTopicPartitions(f"{GROUP_PREFIX}{g:05d}", offsets)
        pending.extend(admin.alter_consumer_group_offsets([request], request_timeout=60).values())
        if len(pending) >= in_flight:
            for fut in pending:
                fut.result()
            pending = []
    for fut in pending:
        fut.result()
    return len(lagging)


# -- the baselines ----------------------------------------------------------------------------


def kafka_tools_classpath() -> str:
    """kafka-tools (ConsumerGroupCommand) from Maven Central, with the embedded broker's libs."""
    from lagdoctor.kafka.broker import KAFKA_VERSION, kafka_libs

    m2 = Path.home() / ".m2" / "repository" / "org" / "apache" / "kafka" / "kafka-tools" / KAFKA_VERSION
    jar = m2 / f"kafka-tools-{KAFKA_VERSION}.jar"
    if not jar.exists():
        say(f"  fetching org.apache.kafka:kafka-tools:{KAFKA_VERSION} with Maven (once)")
        subprocess.run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact=org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
                        "-Dtransitive=false"], check=True, capture_output=True, timeout=600)
    return f"{jar}{os.pathsep}{kafka_libs()}/*"


def consumer_group_command(bootstrap: str, work: Path) -> tuple[float, int]:
    """(seconds, lines of output) of `kafka-consumer-groups.sh --describe --all-groups`, JVM start included."""
    from lagdoctor.kafka.broker import java_binary

    log4j = work / "tools-log4j2.properties"
    log4j.write_text("status = error\nrootLogger.level = error\n")
    cmd = [java_binary(), "-Xmx512m", f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", kafka_tools_classpath(),
           KAFKA_TOOLS_MAIN, "--bootstrap-server", bootstrap, "--describe", "--all-groups", "--timeout", "60000"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"ConsumerGroupCommand failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    rows = sum(1 for line in proc.stdout.splitlines() if line.strip() and not line.startswith("GROUP "))
    return took, rows


def baselines(args, bootstrap: str, server, work: Path) -> dict[str, list[float]]:
    from diagnose_bench import trivial_submit

    from lagdoctor.connectserver import trivial_query
    from lagdoctor.diagnosis.submit import spark_submit_env

    out: dict[str, list[float]] = {"kafka": [], "submit": [], "connect": []}
    for _ in range(args.baseline_repeat):
        took, rows = consumer_group_command(bootstrap, work)
        out["kafka"].append(took)
        say(f"  baseline: ConsumerGroupCommand --describe --all-groups {took:.1f} s ({rows:,} lines)")
    env = spark_submit_env(master=args.master)
    for _ in range(args.baseline_repeat):
        out["submit"].append(trivial_submit(args.master, env, work))
        say(f"  baseline: trivial spark-submit --master {args.master} {out['submit'][-1]:.1f} s")
    for _ in range(args.baseline_repeat):
        out["connect"].append(trivial_query(server.client_url))
    say(f"  baseline: trivial Connect query {', '.join(f'{w:.2f}' for w in out['connect'])} s")
    return out


# -- the child: Airflow, the history, the DAG runs ----------------------------------------------


def airflow_env(work: Path, *, bootstrap: str, server, store, state_url: str) -> dict[str, str]:
    from lagdoctor.connectserver import connection_json
    from tests.fixtures.objectstore import CONN_ID

    home = work / "airflow"
    home.mkdir()
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": connection_json(server.url, server.token),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": store.connection_json(),
        "LAGDOCTOR_AWS_CONN_ID": CONN_ID,
        "LAGDOCTOR_DATA_ROOT": DATA_ROOT,
        "LAGDOCTOR_STATE_URL": state_url,
    }
    for name in ("LAGDOCTOR_SWEEP_CLUSTERS", "KAFKA_BOOTSTRAP_SERVERS", "AIRFLOW_CONN_SLACK_API_DEFAULT",
                 "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "LAGDOCTOR_SPARK_CONF"):
        env.pop(name, None)
    return env


def seed_history(bootstrap: str, minutes: int, now: datetime) -> dict:
    """One real snapshot of the broker, written `minutes` times one minute apart before `now`,
    keyed as scheduled sweeps key theirs: the window the diagnosis reads."""
    import pyarrow as pa

    from lagdoctor.contracts import SWEEP_DAG_ID
    from lagdoctor.kafka.clients import admin_client
    from lagdoctor.kafka.collector import collect_snapshot
    from lagdoctor.settings import Settings
    from lagdoctor.stages.common import run_key
    from lagdoctor.store import write_snapshot

    settings = Settings.from_env()
    admin = admin_client(bootstrap)
    t = time.perf_counter()
    table = collect_snapshot(admin, CLUSTER, None, now, bootstrap=bootstrap,
                             record_partitions=settings.record_partitions, record_budget_s=settings.record_budget_s)
    took_snapshot = time.perf_counter() - t
    column = table.schema.get_field_index("snapshot_ts")
    t = time.perf_counter()
    for back in range(minutes, 0, -1):
        ts = (now - timedelta(minutes=back)).replace(second=0, microsecond=0)
        stamps = pa.array([ts] * table.num_rows, type=table.schema.field(column).type)
        key = run_key(f"scheduled__{ts.isoformat()}", SWEEP_DAG_ID) + "-0"
        write_snapshot(table.set_column(column, "snapshot_ts", stamps), settings.snapshots_root, CLUSTER, ts, key=key)
    return {"rows": table.num_rows, "groups": len(set(table.column("group_id").to_pylist())),
            "committed": table.num_rows - table.column("committed_offset").null_count,
            "read_errors": table.num_rows - table.column("read_error").null_count,
            "snapshot_s": took_snapshot, "write_s": time.perf_counter() - t, "files": minutes}


def run_dag_child(args) -> int:
    """In the child (Airflow configured by its environment): migrate, seed, run the DAG; results to JSON."""
    result: dict = {}
    t = time.perf_counter()
    migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], capture_output=True,
                             text=True, timeout=600)
    if migrate.returncode != 0:
        print(migrate.stderr[-3000:], file=sys.stderr)
        return 1
    result["migrate_s"] = time.perf_counter() - t
    result["history"] = seed_history(args.bootstrap, args.history_minutes, datetime.now(timezone.utc))
    print(f"history: {json.dumps(result['history'])}", flush=True)

    from airflow.dag_processing.dagbag import DagBag

    from lagdoctor.contracts import SWEEP_DAG_ID

    bag = DagBag(dag_folder=str(ROOT / "dags" / f"{SWEEP_DAG_ID}.py"))
    if bag.import_errors:
        print(f"import errors: {bag.import_errors}", file=sys.stderr)
        return 1
    dag = bag.dags[SWEEP_DAG_ID]
    result["runs"] = []
    for n in range(args.runs):
        t = time.perf_counter()
        run = dag.test()
        wall = time.perf_counter() - t
        tis = []
        for ti in run.get_task_instances():
            tis.append({"task_id": ti.task_id, "map_index": ti.map_index, "state": str(ti.state),
                        "start": ti.start_date.timestamp() if ti.start_date else None,
                        "end": ti.end_date.timestamp() if ti.end_date else None, "try": ti.try_number})
        by_id = {ti.task_id: ti for ti in run.get_task_instances()}
        returned = {}
        for task_id in ("snapshot", "post_findings", "prune_history", "compact_history"):
            ti = by_id.get(task_id)
            if ti is not None:
                with contextlib.suppress(Exception):
                    value = ti.xcom_pull(task_ids=task_id, map_indexes=ti.map_index)
                    returned[task_id] = value
        plan = by_id.get("plan")
        if plan is not None:
            with contextlib.suppress(Exception):
                summary = plan.xcom_pull(task_ids="plan") or {}
                returned["plan"] = {k: v for k, v in summary.items() if k != "plans"}
        result["runs"].append({
            "run_id": run.run_id, "state": str(run.state), "test_wall_s": wall,
            "start": run.start_date.timestamp() if run.start_date else None,
            "end": run.end_date.timestamp() if run.end_date else None, "tis": tis, "returned": returned})
        print(f"run {n + 1}: {run.run_id} {run.state} in {wall:.1f} s", flush=True)
    Path(args.run_dag).write_text(json.dumps(result, default=str))
    return 0


def run_child(args, env: dict[str, str], work: Path, log_path: Path, stack: contextlib.ExitStack) -> dict:
    from lagdoctor.connectserver import stop_process_group

    results = work / "child.json"
    cwd = work / "child-cwd"  # where a relative path the DAG writes by mistake would land
    cwd.mkdir()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run-dag", str(results), "--bootstrap", args.bootstrap,
           "--runs", str(args.runs), "--history-minutes", str(args.history_minutes)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    stack.callback(stop_process_group, proc)
    code = proc.wait()
    if code != 0 or not results.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
        raise SystemExit(f"the DAG runs failed (exit {code}); the last lines of {log_path}:\n" + "\n".join(tail))
    out = json.loads(results.read_text())
    out["stray"] = sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*") if p.is_file())
    return out


# -- the report -------------------------------------------------------------------------------


def task_rows(run: dict) -> list[dict]:
    rows = []
    for ti in run["tis"]:
        if ti["start"] is None or ti["end"] is None:
            continue
        name = ti["task_id"] if ti["map_index"] < 0 else f"{ti['task_id']}[{ti['map_index']}]"
        rows.append({**ti, "name": name, "seconds": ti["end"] - ti["start"]})
    return sorted(rows, key=lambda r: r["start"])


def seconds_of(run: dict, task_id: str) -> float | None:
    found = [r["seconds"] for r in task_rows(run) if r["task_id"] == task_id]
    return sum(found) if found else None


def median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def ratio_line(what: str, task_s: float | None, base_name: str, base_s: float | None) -> str:
    if task_s is None or not base_s:
        return f"- {what}: not measured"
    return f"- {what} = {task_s / base_s:.2f}x {base_name} ({task_s:.1f} s vs {base_s:.1f} s)"


def report(args, out: dict, base: dict[str, list[float]], env_line: str) -> None:
    runs = out["runs"]
    last = runs[-1]
    history = out["history"]
    shape = f"{args.groups:,} groups x {args.partitions} partitions"
    wall = last["end"] - last["start"] if last["start"] and last["end"] else last["test_wall_s"]
    rows = task_rows(last)
    beside = sum(r["seconds"] for r in rows if r["task_id"] in BESIDE_THE_DIAGNOSIS)
    kafka, submit, connect = median(base["kafka"]), median(base["submit"]), median(base["connect"])

    say(f"\n## kafka_lag_health_sweep, {shape} ({history['rows']:,} snapshot rows, {history['groups']:,} groups), "
        f"{args.lagging:,} of them lagging with no consumer, run {len(runs)} of {len(runs)} (the last)")
    say(env_line)
    if history["groups"] != args.groups or history["rows"] != args.groups * args.partitions:
        say(f"WARNING: the broker holds {history['groups']:,} of the {args.groups:,} groups set up "
            f"({history['rows']:,} of {args.groups * args.partitions:,} rows): scale_bench.setup does not check its "
            f"commits' per-partition errors; these figures are for the smaller shape")
    say(f"history before the runs: {history['files']} snapshots one minute apart ({history['rows']:,} rows each: "
        f"{history['committed']:,} with a committed offset, {history['read_errors']} read errors)")
    for n, run in enumerate(runs, 1):
        w = run["end"] - run["start"] if run["start"] and run["end"] else run["test_wall_s"]
        parts = ", ".join(f"{t} {s:.1f} s" for t in ("snapshot", "diagnose", "post_findings")
                          if (s := seconds_of(run, t)) is not None)
        posted = run["returned"].get("post_findings")
        say(f"- run {n}: {run['state']}, {w:.1f} s ({parts}); post_findings returned {posted}")

    say("\nratios to the same-run baselines first, seconds second:")
    say(ratio_line("snapshot task", seconds_of(last, "snapshot"), "ConsumerGroupCommand --describe --all-groups",
                   kafka))
    say(ratio_line("diagnose task", seconds_of(last, "diagnose"), "trivial spark-submit", submit))
    say(ratio_line("diagnose task", seconds_of(last, "diagnose"), "trivial Connect query", connect))
    say(ratio_line("whole run", wall, "trivial spark-submit", submit))

    say("\n| baseline (same run) | median s | runs |")
    say("|---|---|---|")
    say(f"| Kafka's ConsumerGroupCommand --describe --all-groups, JVM start included | "
        f"{kafka:.1f} | {len(base['kafka'])} |" if kafka else "| ConsumerGroupCommand | - | 0 |")
    say(f"| trivial `spark-submit --master {args.master}` (session up, count 1,000 rows, stop) | "
        f"{submit:.1f} | {len(base['submit'])} |" if submit else "| trivial spark-submit | - | 0 |")
    say(f"| trivial Connect query on the warm server | {connect:.2f} | {len(base['connect'])} |"
        if connect else "| trivial Connect query | - | 0 |")

    say(f"\n| task (last run, in the order they started) | state | seconds | share of {MINUTE_S:.0f} s |")
    say("|---|---|---|---|")
    for r in rows:
        note = " (beside the diagnosis under a real executor)" if r["task_id"] in BESIDE_THE_DIAGNOSIS else ""
        say(f"| {r['name']}{note} | {r['state']} | {r['seconds']:.2f} | {r['seconds'] / MINUTE_S:.1%} |")
    tasks_s = sum(r["seconds"] for r in rows)
    say(f"| sum of the task instances | | {tasks_s:.2f} | {tasks_s / MINUTE_S:.1%} |")
    say(f"| between tasks (Airflow's dag.test loop) | | {wall - tasks_s:.2f} | {(wall - tasks_s) / MINUTE_S:.1%} |")
    say(f"| **whole run** (DagRun start to end) | {last['state']} | **{wall:.2f}** | **{wall / MINUTE_S:.1%}** |")
    not_run = sorted({ti["task_id"] for ti in last["tis"] if ti["start"] is None})
    if not_run:
        say(f"\nnot run (skipped by the branch, or nothing failed): {len(not_run)} task(s): {', '.join(not_run)}")
    say(f"\nmargin left in the minute: {MINUTE_S - wall:.1f} s ({1 - wall / MINUTE_S:.0%}); without "
        f"{' and '.join(BESIDE_THE_DIAGNOSIS)} (concurrent under a real executor): "
        f"{MINUTE_S - (wall - beside):.1f} s")
    goal = GOALS.get((args.groups, args.partitions))
    if goal is not None:
        met = "met" if wall <= goal * MINUTE_S else "NOT met"
        say(f"goal (issue 31): the whole run <= {goal:.0%} of its minute ({goal * MINUTE_S:.0f} s): {met} "
            f"({wall:.1f} s)")
    if out.get("stray"):
        say(f"\nfiles the DAG wrote under its working directory (relative paths; expected none): "
            f"{', '.join(out['stray'][:5])}{' ...' if len(out['stray']) > 5 else ''}")


def print_diagnosis_breakdown(run: dict, event_log: Path) -> None:
    """The Spark executions of the last run's diagnose task, from the server's event log."""
    from eventlog import breakdown, format_breakdown, read_events

    (diag,) = [r for r in task_rows(run) if r["task_id"] == "diagnose"] or [None]
    if diag is None:
        return
    span = (int(diag["start"] * 1000), int(diag["end"] * 1000))
    try:
        executions, stages = breakdown(list(read_events(event_log)), *span)
    except (FileNotFoundError, ImportError) as exc:
        say(f"\nevent log: {exc}")
        return
    say(f"\nthe last run's diagnose task ({diag['seconds']:.1f} s) on the server, from {event_log}:")
    say("\n".join(format_breakdown(executions, stages, run_span=span)))


# -- main -------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--groups-per-topic", type=int, default=10, help="scale_bench's shape: groups read each topic")
    parser.add_argument("--records", type=int, default=3, help="records per partition; groups commit below them")
    parser.add_argument("--lagging-share", type=float, default=0.01,
                        help="share of groups left lagging with no consumer (crashed_consumer); the rest are healthy "
                             "(lag 0). 1: every group lags, as scale_bench.setup leaves them")
    parser.add_argument("--runs", type=int, default=2, help="DAG runs; the last is reported (at least 2)")
    parser.add_argument("--history-minutes", type=int, default=30)
    parser.add_argument("--master", default="local[2]", help="the Connect server's and the trivial spark-submit's")
    parser.add_argument("--driver-memory", default=None, help="the Connect server's (default: its own, 1g)")
    parser.add_argument("--baseline-repeat", type=int, default=2)
    parser.add_argument("--event-log", default=None, metavar="DIR",
                        help="the Connect server's spark.eventLog.dir (a new folder under DIR); the stage "
                             "breakdown of the last run's diagnosis is printed (bench/eventlog.py)")
    parser.add_argument("--log-dir", default=str(ROOT / ".bench" / "sweep"),
                        help="where the DAG runs' log is kept (git ignores .bench/)")
    parser.add_argument("--run-dag", metavar="RESULTS", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_dag:
        return run_dag_child(args)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    from lagdoctor.lab.stopping import raise_on_stop_signals, restore

    began = time.perf_counter()
    say(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (cpus={os.cpu_count()})")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # child interpreters write pyspark's .pyc once
    work = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"sweep-{args.groups}x{args.partitions}-{datetime.now():%Y%m%d-%H%M%S}.log"
    previous = raise_on_stop_signals(say)
    try:
        with contextlib.ExitStack() as stack:
            from lagdoctor.kafka.broker import KAFKA_VERSION, EmbeddedBroker
            from scale_bench import setup
            from tests.fixtures.objectstore import seaweed_store

            event_log = Path(args.event_log) / f"sweep-{datetime.now():%Y%m%d-%H%M%S}" if args.event_log else None
            server = connect_server(work, args.master, args.driver_memory, event_log)  # its JVM starts while the rest comes up
            stack.callback(server.stop)
            state_url = stack.enter_context(throwaway_postgres())
            say(f"PostgreSQL for lagdoctor's state: {state_url.rsplit('@', 1)[-1]}")
            store = stack.enter_context(seaweed_store())
            say(f"SeaweedFS S3 on {store.endpoint}, data root {DATA_ROOT}")
            broker = stack.enter_context(EmbeddedBroker())
            args.bootstrap = broker.bootstrap
            t = time.perf_counter()
            steps = setup(broker.bootstrap, args.groups, args.partitions, args.groups_per_topic, args.records, 500)
            say(f"Kafka {KAFKA_VERSION} on {broker.bootstrap}: {args.groups:,} groups x {args.partitions} partitions "
                f"on {-(-args.groups // args.groups_per_topic):,} topics in {time.perf_counter() - t:.1f} s "
                f"({', '.join(f'{k} {v:.1f} s' for k, v in steps.items())})")
            t = time.perf_counter()
            lagging = args.lagging = settle_groups(broker.bootstrap, args)
            say(f"  {args.groups - lagging:,} groups committed at the log end (healthy), {lagging:,} left lagging with "
                f"no consumer ({time.perf_counter() - t:.1f} s)")
            t = time.perf_counter()
            server.wait_ready(progress=say)
            say(f"Spark Connect server on {server.url} ({args.master}, driver memory "
                f"{args.driver_memory or 'default'}) ready ({time.perf_counter() - t:.1f} s more)")

            env = airflow_env(work, bootstrap=broker.bootstrap, server=server, store=store, state_url=state_url)
            say(f"seeding {args.history_minutes} minutes of history, then {args.runs} DAG run(s) with dag.test() "
                f"(log: {log_path})")
            t = time.perf_counter()
            out = run_child(args, env, work, log_path, stack)
            say(f"  done in {time.perf_counter() - t:.1f} s (airflow db migrate {out['migrate_s']:.1f} s; a snapshot "
                f"for the history {out['history']['snapshot_s']:.1f} s, {out['history']['files']} files written "
                f"{out['history']['write_s']:.1f} s)")
            for n, run in enumerate(out["runs"], 1):
                say(f"  run {n}: {run['state']} in {run['test_wall_s']:.1f} s (dag.test)")
            base = baselines(args, broker.bootstrap, server, work)
            env_line = (f"engine: Spark Connect server {args.master} (driver memory {args.driver_memory or 'default'}); "
                        f"lagdoctor state: PostgreSQL; data root {DATA_ROOT} on SeaweedFS; Kafka: embedded Apache "
                        f"Kafka {KAFKA_VERSION}, one node; Slack: the outbox (no connection); Airflow: dag.test() "
                        f"(its metadata in SQLite, tasks one after another); cpus={os.cpu_count()}, load average "
                        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; commit {git_commit()}")
            report(args, out, base, env_line)
            if event_log is not None:
                print_diagnosis_breakdown(out["runs"][-1], event_log)
    except KeyboardInterrupt:
        say("interrupted: everything this started is stopped")
        return 130
    finally:
        restore(previous)
        shutil.rmtree(work, ignore_errors=True)
    say(f"\n{(time.perf_counter() - began) / 60:.1f} min in all; the DAG runs' log: {log_path}")
    return 0


def git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
