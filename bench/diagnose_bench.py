"""Benchmark the diagnosis job: simulated snapshot histories through spark-submit or a warm Connect server.

    .venv/bin/python bench/diagnose_bench.py --goals               # issue 20's targets, both engines (24-35 min, 2 loaded cores)

--goals (= --shape goals) runs, in one run on local[2]: the baselines (a trivial
`spark-submit`: session up, count 1,000 rows, stop; a trivial Connect query on
the warm server; DuckDB on each shape's files), then

    | sweep window through spark-submit, 200 x 10              | <= 1.3x the trivial spark-submit |
    | sweep window through spark-submit, 2,000 x 10            | <= 1.5x the trivial spark-submit |
    | sweep window on a warm Connect server, 2,000 x 10        | <= 0.25x the trivial spark-submit |
    | sweep window on a warm Connect server, 10,000 x 10       | runs in the server's default driver memory |
    | 10,000 x 20 diagnosis, warm server                       | <= 1x the trivial spark-submit |
    | 10M rows of short series (37,000 groups), warm server    | <= 3x DuckDB |

and prints them as a table: ratios to the same-run baselines first, seconds
(median of --repeat runs: 3 up to 1M rows, else 1) second, the peak RSS of the
server's and of the client's process trees apart, met / not met. The Connect
cases share ONE server (`lagdoctor.connectserver.ConnectServer`, --master, its
default driver memory), which first runs the job once on the smallest shape
(that run is discarded: it compiles what every later run reuses). The server
writes Spark's event log under .bench/diagnose-events/ and the stage breakdown
of each Connect case's last run is printed (bench/eventlog.py reads it).
--engine submit|connect limits it to one engine. With --event-log DIR (any
--shape) each spark-submit case also writes its own event log, one folder per
case, and its last run's breakdown is printed the same way.

    .venv/bin/python bench/diagnose_bench.py                 # 1M and 10M rows, local[2], spark-submit
    .venv/bin/python bench/diagnose_bench.py --rows 1000000 --master 'local[*]'

For each size: simulate the history once (cached under .bench/diagnose/, which
git ignores), run spark_jobs/diagnose_lag.py with spark-submit, and print wall
seconds, rows/s and the peak resident memory of the whole process tree (JVM +
Python workers). A run on an empty store first measures the fixed cost (JVM
start, session, writing empty outputs) so the rest can be read as data work.
Target: 10M rows in <= 90 s with local[2] on a 2-core machine.

    .venv/bin/python bench/diagnose_bench.py --shape sweep         # 200 and 2,000 groups x 10 partitions
    .venv/bin/python bench/diagnose_bench.py --shape short-series  # ~10M rows, ~37k short series
    .venv/bin/python bench/diagnose_bench.py --shape week          # the sweep window over 30 min vs 7 days of history

--shape writes the store as lagdoctor.store.write_snapshot does (one file per
sample under cluster=/date=, cached under .bench/diagnose/), runs the job as
the sweep DAG does (the cluster folder, --as-of the last sample,
--window-minutes, --quarantine, no shuffle setting, Spark's default driver
memory) on --engine (default both) and, in the same run, prints the baselines
above, including a single-process DuckDB query of comparable per-partition
features on the same files (the bench extra: pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "plugins"))  # run from a checkout without installing


def tree_rss_bytes(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class PeakRss:
    """Samples, every 0.2 s while open, the peak RSS of two process trees: the
    server's (`server_pid`, a Connect server) and everything else this process
    started (the client: spark-submit's JVM and Python workers, or the Connect client)."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.client = self.server = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._done.is_set():
            client = 0
            try:
                children = me.children(recursive=False)
            except psutil.NoSuchProcess:
                children = []
            for child in children:
                if child.pid != self.server_pid:
                    client += tree_rss_bytes(child.pid)
            self.client = max(self.client, client)
            if self.server_pid:
                self.server = max(self.server, tree_rss_bytes(self.server_pid))
            self._done.wait(0.2)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak tree RSS bytes, stderr) of one command."""
    with PeakRss() as rss:
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
    return proc.returncode, wall, rss.client, proc.stderr


def ensure_history(root: Path, rows: int, seed: int) -> Path:
    from lagdoctor.lab.sim import write_benchmark_history

    path = root / f"rows-{rows}-seed-{seed}"
    marker = path / "_COMPLETE"
    if marker.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    written = write_benchmark_history(str(path), rows=rows, seed=seed)
    marker.write_text(str(written))
    print(f"  simulated {written:,} rows in {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return path


# -- shapes users have (issue 9): the sweep's window, many short series ----------------------

SWEEP_START = datetime(2026, 1, 5, 12, 0, tzinfo=timezone.utc)


def _shape_tables(rng, n_groups, partitions, sample_rounds, cluster):
    """Yield (sample time, pyarrow table in contract 1's schema) per sample.

    `partitions[g]` partitions per group; `sample_rounds` is a list of
    (datetime, active group mask). Offsets grow at per-partition produce and
    consume rates, so lag and rates vary across partitions."""
    import numpy as np
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    schema = snapshot_arrow_schema()
    part_group = np.repeat(np.arange(n_groups), partitions)
    part_no = np.concatenate([np.arange(p) for p in partitions]).astype(np.int32)
    n_parts = len(part_group)
    produce = rng.uniform(1, 500, n_parts)
    consume = produce * rng.uniform(0.5, 1.2, n_parts)
    base = rng.integers(0, 10**9, n_parts)
    group_names = pa.array([f"group-{g:06d}" for g in range(n_groups)])
    topic_names = pa.array([f"topic-{g % 997:03d}" for g in range(n_groups)])
    members = pa.array([f"consumer-{g:06d}" for g in range(n_groups)])
    t0 = sample_rounds[0][0]
    for ts, active in sample_rounds:
        rows = np.flatnonzero(active[part_group])
        g = part_group[rows]
        secs = (ts - t0).total_seconds()
        end = base[rows] + (produce[rows] * secs).astype(np.int64) + 1_000
        committed = np.minimum(end, base[rows] + (consume[rows] * secs).astype(np.int64))
        n = len(rows)
        columns = {
            "snapshot_ts": pa.array(np.full(n, int(ts.timestamp() * 1e6), dtype="int64")).cast(
                pa.timestamp("us", tz="UTC")),
            "cluster": pa.array(np.full(n, cluster, dtype=object), pa.string()),
            "group_id": group_names.take(pa.array(g)),
            "group_state": pa.array(np.full(n, "STABLE", dtype=object), pa.string()),
            "topic": topic_names.take(pa.array(g)),
            "partition": pa.array(part_no[rows]),
            "log_start_offset": pa.array(base[rows]),
            "log_end_offset": pa.array(end),
            "committed_offset": pa.array(committed),
            "lag": pa.array(end - committed),
            "member_id": members.take(pa.array(g)),
            "client_id": members.take(pa.array(g)),
            "host": pa.array(np.full(n, "/10.0.0.1", dtype=object), pa.string()),
            "group_members": pa.array(np.ones(n, dtype=np.int32)),
        }
        yield ts, pa.Table.from_pydict(columns, schema=schema)


def ensure_shape(root: Path, shape: str, groups: int, seed: int,
                 partitions_per_group: int = 10) -> tuple[Path, datetime, float, int]:
    """Write (once) a store tree for `shape` as lagdoctor.store.write_snapshot does.

    Returns (the cluster= folder the DAG passes, as-of, window minutes, rows).
    `partitions_per_group` is the sweep and week shapes' (10 unless given)."""
    import json

    import numpy as np

    from lagdoctor.store import write_snapshot

    cluster = "bench"
    size = f"{groups}" if partitions_per_group == 10 or shape == "short-series" else f"{groups}x{partitions_per_group}"
    path = root / f"shape-{shape}-{size}-seed-{seed}"
    marker = path / "_COMPLETE"
    if marker.exists():
        meta = json.loads(marker.read_text())
        return (path / f"cluster={cluster}", datetime.fromisoformat(meta["as_of"]), meta["window_minutes"],
                meta["rows"])
    shutil.rmtree(path, ignore_errors=True)
    t_gen = time.perf_counter()
    rng = np.random.default_rng(seed)
    if shape in ("sweep", "week"):
        # the sweep's history: 3 samples 10 s apart every 5 minutes; 30 minutes of it
        # (18 samples), or a week of it (6,048 files) with the same 30-minute window
        partitions = np.full(groups, partitions_per_group)
        sweeps = 6 if shape == "sweep" else 12 * 24 * 7
        times = [SWEEP_START + timedelta(minutes=5 * r, seconds=10 * s) for r in range(sweeps) for s in range(3)]
        rounds = [(t, np.ones(groups, dtype=bool)) for t in times]
        window = 30.0
    else:
        # many short series: 3-12 partitions (mostly few), 30-60 samples each, one sample a minute
        partitions = np.clip(3 + rng.poisson(3, groups), 3, 12)
        length = rng.integers(30, 61, groups)
        n_samples = 120
        first = rng.integers(0, n_samples - length + 1)
        times = [SWEEP_START + timedelta(minutes=i) for i in range(n_samples)]
        rounds = [(t, (first <= i) & (i < first + length)) for i, t in enumerate(times)]
        window = float(n_samples)
    rows = 0
    for ts, table in _shape_tables(rng, groups, partitions, rounds, cluster):
        write_snapshot(table, str(path), cluster, ts)
        rows += table.num_rows
    as_of = times[-1]
    marker.write_text(json.dumps({"as_of": as_of.isoformat(), "window_minutes": window, "rows": rows}))
    print(f"  wrote {rows:,} rows ({groups:,} groups, {len(times)} samples) in "
          f"{time.perf_counter() - t_gen:.1f} s -> {path}", flush=True)
    return path / f"cluster={cluster}", as_of, window, rows


DUCKDB_FEATURES = """
SELECT cluster, group_id, topic, "partition",
       count(*) AS snapshots,
       min(snapshot_ts) AS first_ts,
       max(snapshot_ts) AS last_ts,
       arg_max(lag, snapshot_ts) AS lag_end,
       (arg_max(log_end_offset, snapshot_ts) - arg_min(log_end_offset, snapshot_ts))
         / nullif(epoch(max(snapshot_ts)) - epoch(min(snapshot_ts)), 0) AS produce_rate,
       (arg_max(committed_offset, snapshot_ts) - arg_min(committed_offset, snapshot_ts))
         / nullif(epoch(max(snapshot_ts)) - epoch(min(snapshot_ts)), 0) AS consume_rate
FROM read_parquet(?, hive_partitioning = false)
WHERE snapshot_ts > ? AND snapshot_ts <= ?
GROUP BY ALL
"""


def duckdb_baseline(store: Path, as_of: datetime, window_minutes: float) -> tuple[float, int] | None:
    """(wall seconds, partition rows) of the per-partition features in one DuckDB process, or None."""
    try:
        import duckdb
    except ImportError:
        print("  duckdb baseline skipped: install the bench extra (pip install -e '.[bench]')", flush=True)
        return None
    start = time.perf_counter()
    con = duckdb.connect()
    table = con.execute(DUCKDB_FEATURES, [str(store / "**" / "*.parquet"),
                                          as_of - timedelta(minutes=window_minutes), as_of]).fetchnumpy()
    rows = len(table["snapshots"])
    con.close()
    return time.perf_counter() - start, rows


# -- baselines every run prints (issue 20): a trivial spark-submit, a trivial Connect query, DuckDB

TRIVIAL_JOB = """\
from pyspark.sql import SparkSession

spark = SparkSession.builder.appName("lagdoctor-trivial").getOrCreate()
assert spark.range(1000).count() == 1000
spark.stop()
"""


def trivial_submit(master: str, env: dict[str, str], work: Path) -> float:
    """Seconds of a trivial `spark-submit`: session up, count 1,000 rows, stop (the job's quiet log config)."""
    from lagdoctor.diagnosis.submit import quiet_log_config

    script = work / "trivial.py"
    script.write_text(TRIVIAL_JOB)
    cmd = ["spark-submit", "--master", master, "--name", "lagdoctor-trivial", "--conf", "spark.ui.enabled=false",
           "--driver-java-options", f"-Dlog4j2.configurationFile=file:{quiet_log_config(work)}", str(script)]
    code, wall, _, err = run_measured(cmd, env)
    if code != 0:
        raise RuntimeError(f"the trivial spark-submit failed ({code}): {err.strip()[-300:]}")
    return wall


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


@dataclass
class Case:
    """One shape on one engine, and what it is held to."""

    shape: str  # sweep | week | short-series
    groups: int
    partitions: int  # per group (sweep, week)
    engine: str  # submit | connect
    measure: str = ""
    goal: str = ""  # "submit" / "duckdb": wall <= limit x that baseline; "runs": exits 0; "": none
    limit: float = 0.0
    repeat: int = 0
    rows: int = 0
    walls: list[float] = field(default_factory=list)
    client_peak: int = 0
    server_peak: int = 0
    statuses: int = 0
    error: str = ""
    span_ms: tuple[int, int] = (0, 0)  # epoch ms of its last run (the event log's executions)

    @property
    def label(self) -> str:
        if self.measure:
            return self.measure
        size = f"{self.groups:,} groups" if self.shape == "short-series" else f"{self.groups:,} x {self.partitions}"
        return f"{self.shape} {size}, {'warm Connect server' if self.engine == 'connect' else 'spark-submit'}"

    @property
    def key(self) -> tuple[str, int, int]:
        return self.shape, self.groups, self.partitions

    @property
    def wall(self) -> float | None:
        return median(self.walls) if self.walls and not self.error else None


GOALS = [  # issue 20's targets on local[2]
    Case("sweep", 200, 10, "submit", "sweep window through spark-submit, 200 x 10", "submit", 1.3),
    Case("sweep", 2_000, 10, "submit", "sweep window through spark-submit, 2,000 x 10", "submit", 1.5),
    Case("sweep", 2_000, 10, "connect", "sweep window on a warm Connect server, 2,000 x 10", "submit", 0.25),
    Case("sweep", 10_000, 10, "connect", "sweep window on a warm Connect server, 10,000 x 10 (memory)", "runs"),
    Case("sweep", 10_000, 20, "connect", "10,000 x 20 diagnosis, warm server", "submit", 1.0),
    Case("short-series", 37_000, 10, "connect",
         "10M rows, short series (37,000 groups, 30-60 samples each), warm server", "duckdb", 3.0),
]


def goal_text(case: Case) -> str:
    if case.goal == "runs":
        return "runs in the server's default driver memory"
    if case.goal:
        return f"<= {case.limit:g}x {'the trivial spark-submit' if case.goal == 'submit' else 'DuckDB'}"
    return ""


def plan_cases(args) -> list[Case]:
    if args.shape == "goals":
        return [c for c in (Case(**{f: getattr(g, f) for f in ("shape", "groups", "partitions", "engine", "measure",
                                                                   "goal", "limit")}) for g in GOALS)
                if args.engine in ("both", c.engine)]
    if args.shape == "sweep":
        keys = [("sweep", g) for g in args.groups or [200, 2_000]]
    elif args.shape == "week":
        # the same 30-minute window over 30 minutes and over 7 days of stored history
        keys = [(shape, g) for g in args.groups or [200] for shape in ("sweep", "week")]
    else:
        keys = [("short-series", g) for g in args.groups or [37_000]]
    engines = ["submit", "connect"] if args.engine == "both" else [args.engine]
    return [Case(shape, g, args.partitions, engine) for engine in engines for shape, g in keys]


def run_shapes(args, conf_base, env) -> int:
    from lagdoctor.connectserver import ConnectServer, ConnectServerError, trivial_query
    from lagdoctor.diagnosis.submit import build_spark_submit_command, run_connect_process

    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    conf = dict(conf_base)
    if args.shuffle_partitions_given:
        conf["spark.sql.shuffle.partitions"] = args.shuffle_partitions
    # a Connect session takes SQL settings only (the server's memory is the server's), as the DAG passes
    session_conf = {"spark.sql.shuffle.partitions": args.shuffle_partitions} if args.shuffle_partitions_given else None
    cases = plan_cases(args)
    began = time.time()
    print(f"diagnose_bench: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, commit {git_commit()}, "
          f"master={args.master}, {os.cpu_count()} cpus, load average {load_average()}", flush=True)
    stores = {}
    for case in cases:
        if case.key not in stores:
            stores[case.key] = ensure_shape(root, case.shape, case.groups, args.seed, case.partitions)
        case.rows = stores[case.key][3]
        case.repeat = args.repeat or (3 if case.rows <= 1_000_000 else 1)

    out_root = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    baselines: dict[str, tuple[float, int]] = {}
    duck: dict[tuple[str, int, int], tuple[float, int] | None] = {}
    profile_dir = None
    if args.event_log:
        profile_dir = Path(args.event_log).resolve() / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        profile_dir.mkdir(parents=True, exist_ok=True)
    try:
        walls = [trivial_submit(args.master, env, out_root) for _ in range(args.baseline_repeat)]
        baselines["submit"] = (median(walls), len(walls))
        print(f"  baseline: trivial spark-submit --master {args.master}: "
              f"{', '.join(f'{w:.1f}' for w in walls)} s -> median {median(walls):.1f} s", flush=True)

        def run_case(case: Case, server=None) -> None:
            store, as_of, window, _ = stores[case.key]
            for i in range(case.repeat):
                out = out_root / f"{case.engine}-{case.shape}-{case.groups}x{case.partitions}-{i}"
                t0_ms = int(time.time() * 1000)
                with PeakRss(server.pid if server else None) as rss:
                    start = time.perf_counter()
                    if server is None:
                        run_conf = dict(conf)
                        if profile_dir:  # one folder per case: its newest application is its last run
                            case_dir = submit_profile_dir(profile_dir, case)
                            case_dir.mkdir(exist_ok=True)
                            run_conf.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": case_dir.as_uri()})
                        # as the DAG does: the cluster folder, --as-of the last sample, the window, --quarantine
                        cmd = build_spark_submit_command(str(store), str(out), as_of=as_of.isoformat(),
                                                         window_minutes=window, master=args.master, conf=run_conf,
                                                         extra_args=["--quarantine"])
                        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                    else:
                        proc = run_connect_process(str(store), str(out), as_of.isoformat(), window,
                                                   remote=server.client_url, extra_args=["--quarantine"],
                                                   session_conf=session_conf)
                    wall = time.perf_counter() - start
                case.span_ms = (t0_ms, int(time.time() * 1000))
                case.client_peak = max(case.client_peak, rss.client)
                case.server_peak = max(case.server_peak, rss.server)
                if proc.returncode != 0:
                    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
                    case.error = f"exit {proc.returncode}: {lines[-1][:300] if lines else '(no stderr)'}"
                    print(f"  {case.label}: FAILED ({case.error})", flush=True)
                    return
                case.walls.append(wall)
                case.statuses = sum(1 for _ in open(out / "partition_status.jsonl"))
                shutil.rmtree(out, ignore_errors=True)
            mem = f"client peak {case.client_peak / 2**30:.2f} GiB"
            if server:
                mem = f"server peak {case.server_peak / 2**30:.2f} GiB, " + mem
            print(f"  {case.label}: {case.rows:,} rows, {', '.join(f'{w:.1f}' for w in case.walls)} s "
                  f"-> median {case.wall:.1f} s; {mem}; {case.statuses:,} partition statuses", flush=True)
            if case.key not in duck:
                duck[case.key] = duckdb_baseline(store, as_of, window)
                if duck[case.key]:
                    print(f"    duckdb on the same files: {duck[case.key][0]:.2f} s "
                          f"({duck[case.key][1]:,} partitions)", flush=True)

        for case in (c for c in cases if c.engine == "submit"):
            run_case(case)

        connect_cases = [c for c in cases if c.engine == "connect"]
        if connect_cases:
            server_conf = {}
            if profile_dir:
                server_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": profile_dir.as_uri()}
            # the server's default driver memory (1g), as `lagdoctor connect-server` and `make airflow` run it
            server = ConnectServer(out_root / "connect-server", master=args.master, conf=server_conf,
                                   env={k: v for k, v in env.items()})
            t_start = time.perf_counter()
            try:
                with server:
                    print(f"  Connect server on {server.url} ({args.master}, default driver memory) ready in "
                          f"{time.perf_counter() - t_start:.1f} s", flush=True)
                    warm = min(connect_cases, key=lambda c: c.rows)
                    store, as_of, window, _ = stores[warm.key]
                    t_warm = time.perf_counter()
                    proc = run_connect_process(str(store), str(out_root / "warm-up"), as_of.isoformat(), window,
                                               remote=server.client_url, extra_args=["--quarantine"],
                                               session_conf=session_conf)
                    print(f"  warm-up: the job once on {warm.shape} {warm.groups:,} x {warm.partitions} on the fresh "
                          f"server, {time.perf_counter() - t_warm:.1f} s (exit {proc.returncode}; discarded)",
                          flush=True)
                    walls = [trivial_query(server.client_url) for _ in range(args.baseline_repeat)]
                    baselines["connect"] = (median(walls), len(walls))
                    print(f"  baseline: trivial Connect query on the warm server: "
                          f"{', '.join(f'{w:.2f}' for w in walls)} s -> median {median(walls):.2f} s", flush=True)
                    for case in connect_cases:
                        if not server.alive():
                            case.error = "the Connect server had exited"
                            continue
                        run_case(case, server)
                        if not server.alive():
                            print(f"  the Connect server exited during {case.label}: "
                                  f"{last_server_line(server)}", flush=True)
            except ConnectServerError as exc:
                print(f"  {exc}", file=sys.stderr)
                return 1
    finally:
        shutil.rmtree(out_root, ignore_errors=True)

    print(f"\nmaster={args.master} cpus={os.cpu_count()} load average at the end {load_average()}; "
          f"{(time.time() - began) / 60:.1f} min; spark-submit driver memory "
          f"{args.driver_memory or 'default (1g)'}, Connect server driver memory default (1g); "
          f"shuffle partitions {'job default' if not args.shuffle_partitions_given else args.shuffle_partitions}")
    print_table(cases, baselines, duck)
    if profile_dir:
        print_profiles(cases, profile_dir)
    failed = [c for c in cases if c.error]
    return 1 if failed and args.shape != "goals" else 0


def print_table(cases: list[Case], baselines: dict[str, tuple[float, int]], duck) -> None:
    sub = baselines.get("submit", (None, 0))
    con = baselines.get("connect", (None, 0))
    print("\n| baseline (same run) | median s | runs |")
    print("|---|---|---|")
    if sub[0]:
        print(f"| trivial `spark-submit` (session up, count 1,000 rows, stop) | {sub[0]:.1f} | {sub[1]} |")
    if con[0]:
        print(f"| trivial Connect query on the warm server (new session, count 1,000 rows) | {con[0]:.2f} | {con[1]} |")
    for case in cases:
        d = duck.get(case.key)
        if d and case is next(c for c in cases if c.key == case.key):
            print(f"| DuckDB, the per-partition features of {case.shape} {case.groups:,} x {case.partitions}"
                  f"{'' if case.shape != 'short-series' else ' (3-12 partitions)'} | {d[0]:.2f} | 1 |")
    goals = any(c.goal for c in cases)
    head = "| measure | " + ("goal | met | " if goals else "") + \
           "x trivial spark-submit | x trivial Connect | x DuckDB | seconds (runs) | rows | server peak RSS | client peak RSS |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for case in cases:
        wall = case.wall
        d = duck.get(case.key)

        def ratio(base: float | None) -> str:
            return f"{wall / base:.2f}x" if wall is not None and base else "-"

        met = ""
        if case.goal == "runs":
            met = "not met" if case.error else "met"
        elif case.goal:
            base = sub[0] if case.goal == "submit" else (d[0] if d else None)
            met = ("met" if wall / base <= case.limit else "not met") if wall is not None and base else "not met"
        secs = f"{wall:.1f} ({len(case.walls)})" if wall is not None else f"failed: {case.error}"
        row = f"| {case.label} | " + (f"{goal_text(case)} | {met} | " if goals else "")
        row += (f"{ratio(sub[0])} | {ratio(con[0]) if case.engine == 'connect' else '-'} | "
                f"{ratio(d[0] if d else None)} | {secs} | {case.rows:,} | "
                f"{f'{case.server_peak / 2**30:.2f} GiB' if case.engine == 'connect' else '-'} | "
                f"{case.client_peak / 2**30:.2f} GiB |")
        print(row)


def submit_profile_dir(profile_dir: Path, case: Case) -> Path:
    return profile_dir / f"submit-{case.shape}-{case.groups}x{case.partitions}"


def print_profiles(cases: list[Case], profile_dir: Path) -> None:
    """The stage breakdown of each case's last run: a spark-submit case's own event log
    (its newest application), a Connect case's span of the server's."""
    from eventlog import breakdown, format_breakdown, read_events

    server_events = None
    for case in cases:
        if not case.walls:
            continue
        source = submit_profile_dir(profile_dir, case) if case.engine == "submit" else profile_dir
        try:
            if case.engine == "submit":
                events, span = list(read_events(source)), None
            else:
                if server_events is None:
                    server_events = list(read_events(source))
                events, span = server_events, case.span_ms
        except (FileNotFoundError, ImportError) as exc:
            print(f"\nevent log: {exc}")
            continue
        executions, stages = breakdown(events, *(span or ()))
        print(f"\n{case.label}, its last run ({case.walls[-1]:.1f} s), from {source}:")
        print("\n".join(format_breakdown(executions, stages, run_span=case.span_ms)))


def last_server_line(server) -> str:
    from lagdoctor.connectserver import last_log_line

    return last_log_line(server.log)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main(argv=None) -> int:
    from lagdoctor.diagnosis.submit import build_spark_submit_command, spark_submit_env

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / ".bench" / "diagnose"))
    parser.add_argument("--driver-memory", default=None,
                        help="spark-submit's driver memory (--rows runs: 4g unless given; --shape runs: "
                             "Spark's default, 1g, as the DAG; the Connect server always has its default)")
    parser.add_argument("--shuffle-partitions", default=None,
                        help="spark.sql.shuffle.partitions to pass (rows runs: 8 unless given; "
                             "--shape runs: nothing unless given, as the DAG passes nothing)")
    parser.add_argument("--shape", choices=["goals", "sweep", "week", "short-series"], default=None,
                        help="goals: issue 20's targets in one run (see --goals); "
                             "sweep: the sweep's 30-minute window of G groups x 10 partitions (G = 200, 2,000); "
                             "short-series: ~10M rows of ~37k groups with 30-60 samples each; "
                             "each also timed through DuckDB on the same files")
    parser.add_argument("--goals", action="store_const", const="goals", dest="shape",
                        help="the same as --shape goals")
    parser.add_argument("--engine", choices=["submit", "connect", "both"], default="both",
                        help="--shape runs: spark-submit per run, a client of one warm Connect server, or both")
    parser.add_argument("--groups", type=int, nargs="+", default=None, help="group counts for --shape")
    parser.add_argument("--partitions", type=int, default=10, help="partitions per group for --shape sweep|week")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed runs per shape, the median reported (default: 3 up to 1M rows, else 1)")
    parser.add_argument("--baseline-repeat", type=int, default=3,
                        help="runs of each trivial baseline, the median reported")
    parser.add_argument("--event-log", default=None, metavar="DIR",
                        help="spark.eventLog.dir of the Connect server and of each spark-submit case (a new folder "
                             "under DIR per run); the stage breakdown of each case's last run is printed (--shape goals: "
                             ".bench/diagnose-events unless --no-event-log)")
    parser.add_argument("--no-event-log", action="store_true")
    args = parser.parse_args(argv)
    if args.shape == "goals" and not args.event_log and not args.no_event_log:
        args.event_log = str(ROOT / ".bench" / "diagnose-events")
    if args.no_event_log:
        args.event_log = None
    args.shuffle_partitions_given = args.shuffle_partitions is not None
    if args.shuffle_partitions is None:
        args.shuffle_partitions = "8"

    root = Path(args.data_dir)
    root.mkdir(parents=True, exist_ok=True)
    # every child interpreter writes pyspark's .pyc once, as on users' machines (not recompiling per run)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    env = spark_submit_env(master=args.master)
    if args.shape:
        shape_conf = {"spark.ui.enabled": "false"}
        if args.driver_memory:
            shape_conf["spark.driver.memory"] = args.driver_memory
        return run_shapes(args, shape_conf, env)
    args.driver_memory = args.driver_memory or "4g"
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.memory": args.driver_memory,
        "spark.sql.shuffle.partitions": args.shuffle_partitions,
    }
    out_root = Path(tempfile.mkdtemp(prefix="diagnose-bench-"))
    results = []
    try:
        empty = root / "empty"
        empty.mkdir(exist_ok=True)
        cases = [("empty (fixed cost)", 0, empty)]
        for rows in args.rows:
            cases.append((f"{rows:,} rows", rows, ensure_history(root, rows, args.seed)))
        for label, rows, path in cases:
            cmd = build_spark_submit_command(str(path), str(out_root / label.split()[0]), master=args.master,
                                             conf=conf)
            code, wall, peak, err = run_measured(cmd, env)
            if code != 0:
                print(f"{label}: job failed ({code}): {err.strip()[-500:]}", file=sys.stderr)
                return 1
            findings = sum(1 for _ in open(out_root / label.split()[0] / "findings.jsonl"))
            results.append((label, rows, wall, peak, findings))
            rate = f"{rows / wall:>12,.0f}" if rows else f"{'-':>12}"
            print(f"{label:>22}: {wall:7.1f} s wall  {rate} rows/s  peak RSS {peak / 2**30:5.2f} GiB  "
                  f"{findings} findings", flush=True)
    finally:
        shutil.rmtree(out_root, ignore_errors=True)

    fixed = results[0][2]
    print(f"\nmaster={args.master} cpus={os.cpu_count()} driver-memory={args.driver_memory}")
    print("| input | wall s | rows/s | rows/s beyond fixed cost | peak RSS |")
    print("|---|---|---|---|---|")
    for label, rows, wall, peak, _ in results:
        beyond = f"{rows / (wall - fixed):,.0f}" if rows and wall > fixed else "-"
        rate = f"{rows / wall:,.0f}" if rows else "-"
        print(f"| {label} | {wall:.1f} | {rate} | {beyond} | {peak / 2**30:.2f} GiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
