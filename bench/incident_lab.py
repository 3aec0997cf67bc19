"""The live incident lab: each cause and each hard negative played by real producer
and consumer processes on a real Apache Kafka broker, the sweep's own task bodies
run again and again, and what an on-call engineer would have seen measured.

    .venv/bin/python bench/incident_lab.py [--rounds 3] [--bootstrap HOST:PORT]

Every round plays all twelve workloads at once, each on its own topic and group,
with a fresh data root (snapshots, findings, state, Slack outbox). After a
healthy warm-up, each incident starts at an onset the lab records (a random
moment within one sweep interval, so onsets fall at every phase of the sweep).
The sweep runs back to back: `snapshot_cluster` (2 samples, 10 s apart),
`prepare_diagnosis` + spark-submit on local[*], `plan_findings` and
`post_findings` to the local Slack outbox; `write_reports` and remediation are
left out (neither changes what Slack is told first).

Time is compressed: a sweep every ~1 minute standing in for the 5-minute sweep
the lab was built for (the DAG's default before issue 20; it now sweeps every
minute, uncompressed, one sample a run), so the rules' time thresholds are
divided by the same factor, and so are the lag counts (severity,
pattern): a backlog built for a fifth of the time is a fifth as deep. All are
printed at the start. A negative's warnings are reported beside its critical
findings.

Measured per workload, over the rounds:
- first sweep: the first sweep with enough samples after onset (the stall
  rule's own need: `stall_min_snapshots` samples spanning `stall_min_seconds`)
  gives the expected cause, decided, on the expected partitions;
- onset -> Slack: from onset to the end of the first sweep that posted a
  message for the group while its finding was the expected cause, decided;
- flips: sweeps after the first right one whose decided finding for the
  group no longer has the expected cause; wrong posts: sweeps after onset
  that posted a decided, wrong, non-healthy cause first;
- negatives: critical (and warning) findings after the warm-up;
- time lag: each lagging partition's reported time lag against the
  producer's own send time of the record at the committed offset (read back
  from the topic), for the sweep's last sample: exact where the collector
  read the record, the interpolation error otherwise.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lagdoctor.diagnosis.thresholds import Thresholds
from lagdoctor.lab.scoring import Score, Sweep, decided, score

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = "kafka_default"
SWEEP_DAG = "kafka_lag_health_sweep"

COMPRESSION = 5.0  # a 5-minute sweep's timeline played about every minute (see the docstring)
SAMPLES, SAMPLE_INTERVAL_S = 2, 10.0
WINDOW_MINUTES = 30 / COMPRESSION
# Time thresholds shrink with time; so do lag counts: a backlog built at the same rate
# for a fifth of the time is a fifth as deep.
SCALED = {"stall_min_seconds": 120.0, "pattern_min_seconds": 60.0, "baseline_min_seconds": 60.0,
          "warning_lag": 1_000, "critical_lag": 10_000, "pattern_min_lag": 100}
THRESHOLDS = {k: type(v)(v / COMPRESSION) for k, v in SCALED.items()}
WARMUP_S = 150.0
AFTER_ONSET_S = 330.0
SWEEP_MIN_INTERVAL_S = 60.0
# a stall, a loop: counted in time. The stall rule counts the snapshots after the first that shows the
# commit still (frozen_snapshots), so it needs stall_min_snapshots + 1 samples after onset.
STALL_NEED = (Thresholds().stall_min_snapshots + 1, THRESHOLDS["stall_min_seconds"])
PATTERN_NEED = (2, THRESHOLDS["pattern_min_seconds"])  # any rate rule: two samples a pattern's time apart


def say(message: str) -> None:
    print(f"[lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- what is played ------------------------------------------------------------------

@dataclass
class Play:
    name: str
    expect: str  # the cause; "healthy" for a hard negative
    story: str
    partitions: int
    rate: float
    members: list[dict[str, Any]]
    expect_partitions: tuple[int, ...] = ()
    rate_at: Callable[[float], float] | None = None  # producer rate by seconds since the round began
    at_onset: Callable[["Live"], str] | None = None
    preload: int = 0  # records per partition produced before the consumers start
    # the evidence the expected rule needs after onset: (samples, seconds); None: the pattern rule's
    need: tuple[int, float] | None = None

    @property
    def negative(self) -> bool:
        return self.expect == "healthy"


@dataclass
class Live:
    play: Play
    topic: str
    group: str
    onset: float  # epoch seconds
    bootstrap: str
    producer: Any = None
    consumers: list[Any] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    first_post: str | None = None  # the text of the first Slack message about it after onset


LOOP_CONFIG = {"session.timeout.ms": 3000, "max.poll.interval.ms": 4000}


def _kill_all(live: Live) -> str:
    for member in live.consumers:
        member.kill()
    return "SIGKILL of its only consumer process"


def _surge(live: Live) -> str:
    live.producer.rate = 80.0
    return "producer 10 -> 80 msg/s per partition"


def _rolling_restart(live: Live) -> str:
    """Each static member closed and started again, one at a time, 15 s apart, well
    within its 30 s session: the group keeps its assignment, no rebalance."""
    from lagdoctor.lab.workload import ConsumerProcess

    def roll() -> None:
        for i, old in enumerate(list(live.consumers)):
            old.stop()
            new = ConsumerProcess(live.bootstrap, live.group, live.topic, client_id=old.client_id,
                                  **live.play.members[i]).start()
            live.consumers[i] = new
            new.assigned.wait(30)
            time.sleep(15)

    threading.Thread(target=roll, daemon=True).start()
    return "rolling restart of 3 static members begins"


def plays(onset: float) -> list[Play]:
    def static(i: int) -> dict[str, Any]:
        return {"config": {"group.instance.id": f"static-{i}", "session.timeout.ms": 30000}}

    return [
        Play("imbalance", "partition_imbalance", "owner of partition 1 drops to 3 of 20 msg/s", 3, 20.0,
             [{"max_rate": {1: 3}, "onset_at": onset} for _ in range(3)], (1,)),
        Play("surge", "producer_surge", "produce 10 -> 80 msg/s per partition; consumer caps at 30", 2, 10.0,
             [{"max_rate": {0: 30, 1: 30}}], at_onset=_surge),
        Play("slow", "slow_consumer", "consumer drops to 12 msg/s on every partition; 20 arrive", 2, 20.0,
             [{"max_rate": {0: 12, 1: 12}, "onset_at": onset}]),
        Play("stalled", "stalled_consumer", "consumer stuck on one record of partition 0, alive", 2, 10.0,
             [{"stuck_at": {0: -1}, "onset_at": onset}], (0,), need=STALL_NEED),
        Play("crashed", "crashed_consumer", "the only consumer process is SIGKILLed", 2, 10.0, [{}],
             at_onset=_kill_all),
        Play("rebalance", "rebalance_loop", "member 2's batches take 6 s, max.poll.interval.ms 4 s", 2, 10.0,
             [{"config": LOOP_CONFIG}, {"config": LOOP_CONFIG, "batch_processing_s": 6.0, "onset_at": onset}],
             need=STALL_NEED),
        # the hard negatives
        Play("assign", "healthy", "assign() consumer, no group membership, keeps up", 2, 10.0, [{"assign": True}]),
        Play("static", "healthy", "static members restarted one by one within their session", 3, 10.0,
             [static(i) for i in range(3)], at_onset=_rolling_restart),
        Play("diurnal", "healthy", "produce rate 5..35 msg/s over a 4-minute 'day'; consumer keeps up", 2, 20.0,
             [{}], rate_at=lambda s: 20.0 + 15.0 * math.sin(2 * math.pi * s / 240.0)),
        Play("batch", "healthy", "batch consumer: drains and commits every 75 s (sawtooth)", 2, 10.0,
             [{"batch_every_s": 75.0}]),
        Play("idle", "healthy", "idle topic: 200 records long consumed, nothing new", 2, 0.0, [{}], preload=200),
        Play("bursty", "healthy", "3 s bursts of 80 msg/s every 30 s over 5; consumer absorbs them", 2, 5.0,
             [{}], rate_at=lambda s: 80.0 if s % 30.0 < 3.0 else 5.0),
    ]


def start(plays_: list[Play], bootstrap: str, tag: str, onset_of: dict[str, float]) -> list[Live]:
    from lagdoctor.lab.workload import ConsumerProcess, SteadyProducer, create_topic, produce_counts

    lives = []
    for play in plays_:
        topic = f"lab-{play.name}-{tag}"
        live = Live(play, topic, f"{topic}-consumer", onset_of[play.name], bootstrap)
        create_topic(bootstrap, topic, play.partitions)
        if play.preload:
            produce_counts(bootstrap, topic, {p: play.preload for p in range(play.partitions)}, exact=False)
        live.producer = SteadyProducer(bootstrap, topic, list(range(play.partitions)), play.rate, stamp=True).start()
        live.consumers = [ConsumerProcess(bootstrap, live.group, topic, client_id=f"{live.group}-{i}", **options).start()
                          for i, options in enumerate(play.members, 1)]
        lives.append(live)
    deadline = time.monotonic() + 90
    for live in lives:
        for member in live.consumers:
            if not member.assigned.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"{member.client_id} got no partitions within 90 s")
    return lives


def stop(lives: list[Live]) -> None:
    for live in lives:
        for member in live.consumers:
            member.stop()
        live.producer.stop()


class Director(threading.Thread):
    """Drives rate shapes and fires each workload's onset action at its time."""

    def __init__(self, lives: list[Live], began: float) -> None:
        super().__init__(daemon=True)
        self.lives, self.began = lives, began
        self.halt = threading.Event()
        self.fired: set[str] = set()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            now = time.time()
            for live in self.lives:
                if live.play.rate_at is not None:
                    live.producer.rate = max(0.0, live.play.rate_at(now - self.began))
                if live.play.at_onset is not None and live.group not in self.fired and now >= live.onset:
                    self.fired.add(live.group)
                    live.events.append(f"{time.strftime('%H:%M:%S')} {live.play.at_onset(live)}")


# -- one sweep: the DAG's task bodies, in order ----------------------------------------

def run_sweep(n: int, tag: str, groups: set[str]) -> Sweep:
    import pyarrow.parquet as pq

    from lagdoctor.settings import Settings
    from lagdoctor.stages.collect import snapshot_cluster
    from lagdoctor.stages.common import run_key
    from lagdoctor.stages.diagnose import prepare_diagnosis, read_findings
    from lagdoctor.stages.notify import post_findings
    from lagdoctor.stages.plan import plan_findings
    from lagdoctor.store import find_keyed_snapshots

    settings = Settings.from_env()
    run_id = f"lab__{tag}_{n:03d}"
    started = time.time()
    form = {"group_pattern": None, "topic": None, "samples": SAMPLES, "interval_seconds": SAMPLE_INTERVAL_S}
    snapshot_cluster(CLUSTER, run_id, form, dag_id=SWEEP_DAG, settings=settings)
    keys = [f"{run_key(run_id, SWEEP_DAG)}-{i}" for i in range(SAMPLES)]
    paths = find_keyed_snapshots(settings.snapshots_root, CLUSTER, keys)
    samples, last_sample = [], {}
    for i, key in enumerate(keys):
        table = pq.read_table(paths[key], columns=["snapshot_ts", "group_id", "topic", "partition",
                                                   "committed_offset"])
        rows = table.to_pylist()
        if rows:
            samples.append(rows[0]["snapshot_ts"].timestamp())
        if i == SAMPLES - 1:
            last_sample = {(r["topic"], r["partition"]): (r["committed_offset"], r["snapshot_ts"].timestamp())
                           for r in rows if r["group_id"] in groups and r["committed_offset"] is not None}
    prep = prepare_diagnosis([CLUSTER], run_id, window_minutes=WINDOW_MINUTES, thresholds=THRESHOLDS,
                                           dag_id=SWEEP_DAG, settings=settings)
    cmd = [prep["spark_submit"], "--master", "local[*]", "--name", "lagdoctor-diagnose-lag",
           "--py-files", prep["py_files"], "--conf", f"spark.pyspark.python={prep['python']}",
           "--conf", "spark.ui.enabled=false",
           "--driver-java-options", f"-Dlog4j2.configurationFile=file:{prep['log_config']}",
           prep["application"], *prep["args"]]
    env = {**os.environ, "PATH": prep["path"], "PYSPARK_PYTHON": prep["python"], "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"diagnosis of sweep {n} failed ({done.returncode}): {done.stderr[-800:]}")
    summary = plan_findings(prep["output"], dag_id=SWEEP_DAG, run_id=run_id, kind="sweep",
                                          threshold_overrides=THRESHOLDS, clusters=[CLUSTER])
    outbox = Path(settings.data_root) / "outbox" / "slack.jsonl"
    before = len(outbox.read_text().splitlines()) if outbox.exists() else 0
    post_findings(summary["plans"], run_id, settings=settings)
    posted = time.time()
    lines = outbox.read_text().splitlines()[before:] if outbox.exists() else []
    texts = [json.dumps(json.loads(line)) for line in lines if line.strip()]
    findings: dict[str, list[dict[str, Any]]] = {}
    for f in read_findings(prep["output"]):
        if f["group_id"] in groups:
            findings.setdefault(f["group_id"], []).append(f)
    statuses = [json.loads(line) for line in
                (Path(prep["output"]) / "partition_status.jsonl").read_text().splitlines() if line.strip()]
    messages = {g: [t for t in texts if g in t] for g in groups}
    return Sweep(n, started, samples, posted, findings, [s for s in statuses if s["group_id"] in groups],
                 messages, last_sample)


# -- time lag against the producer's clock ---------------------------------------------

def produced_at(bootstrap: str, topic: str, partition: int, offset: int) -> float | None:
    """The producer's send time (epoch s) of the record at `offset`, from its value."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lab-reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            value = msg.value() or b""
            return int(value[2:]) / 1000.0 if value.startswith(b"t=") else None
    finally:
        consumer.close()
    return None


def time_lag_errors(sweep: Sweep, bootstrap: str) -> list[tuple[str, float | None]]:
    """(source, reported - truth) for each lagging partition of the lab's groups; the
    error is None where it could not be checked (source "lower_bound", "unknown", or
    the record unreadable), so the table says how many were left out."""
    out: list[tuple[str, float | None]] = []
    for s in sweep.statuses:
        if not s.get("lag"):
            continue
        if s.get("time_lag_seconds") is None or s.get("time_lag_lower_bound"):
            out.append(("lower_bound" if s.get("time_lag_lower_bound") else "unknown", None))
            continue
        committed, snapshot_ts = sweep.last_sample.get((s["topic"], s["partition"]), (None, None))
        sent = None if committed is None else produced_at(bootstrap, s["topic"], s["partition"], committed)
        if sent is None:
            out.append((f"{s.get('time_lag_source') or '?'}, record unreadable here", None))
            continue
        # A record written after the snapshot's time but before its end offset was read
        # waited for nobody at that time: the truth is 0, never negative.
        out.append((s.get("time_lag_source") or "?", s["time_lag_seconds"] - max(0.0, snapshot_ts - sent)))
    return out


# -- a round and the table ----------------------------------------------------------------

def run_round(r: int, bootstrap: str, workdir: Path, seed: int) -> tuple[list[Play], list[Live], list[Sweep],
                                                                          list[tuple[str, float]], float]:
    rng = random.Random(seed)
    tag = f"r{r}-{uuid.uuid4().hex[:4]}"
    root = workdir / f"round-{r}"
    os.environ["LAGDOCTOR_DATA_ROOT"] = str(root)
    began = time.time()
    warmup_end = began + WARMUP_S
    names = [p.name for p in plays(0.0)]
    onset_of = {name: warmup_end + rng.uniform(0, SWEEP_MIN_INTERVAL_S) for name in names}
    plays_ = [next(p for p in plays(onset_of[name]) if p.name == name) for name in names]
    say(f"round {r}: starting {len(plays_)} workloads (topics lab-*-{tag}); onsets "
        f"{min(onset_of.values()) - began:.0f}-{max(onset_of.values()) - began:.0f} s in")
    lives = start(plays_, bootstrap, tag, onset_of)
    director = Director(lives, began)
    director.start()
    groups = {live.group for live in lives}
    sweeps: list[Sweep] = []
    errors: list[tuple[str, float]] = []
    end = max(onset_of.values()) + AFTER_ONSET_S
    try:
        n = 0
        while time.time() < end:
            t = time.time()
            sweep = run_sweep(n, tag, groups)
            sweeps.append(sweep)
            if sweep.samples and sweep.samples[0] >= warmup_end:
                errors += time_lag_errors(sweep, bootstrap)
            for live in lives:
                if (live.first_post is None and sweep.samples and sweep.samples[-1] >= live.onset
                        and sweep.messages.get(live.group)):
                    live.first_post = json.loads(sweep.messages[live.group][0]).get("text", "")
            got = ", ".join(f"{live.play.name}:{'/'.join(sorted({f['diagnosis'] + ('?' if not decided(f) else '') for f in sweep.findings.get(live.group, [])})) or '-'}"
                            for live in lives)
            say(f"  sweep {n} ({time.time() - t:.0f} s, {(sweep.samples[-1] - began) if sweep.samples else 0:.0f} s in): {got}")
            n += 1
            time.sleep(max(0.0, SWEEP_MIN_INTERVAL_S - (time.time() - t)))
    finally:
        from lagdoctor.lab.rates import rate_shortfall

        director.halt.set()
        for live in lives:
            for event in live.events:
                say(f"  event {live.play.name}: {event}")
            # a steady producer that fell short did not play its incident (shaped rates are not checked)
            line = None if live.play.rate_at else rate_shortfall(live.topic, live.producer.segments())
            if line:
                say(f"  NOT PLAYED AS DESIGNED: {live.play.name}: {line}")
                SHORTFALLS.append(f"round {r} {live.play.name}: {line}")
        stop(lives)
    return plays_, lives, sweeps, errors, warmup_end


SHORTFALLS: list[str] = []


def fmt(x: float | None, spec: str = ".0f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap", help="an existing cluster (default: the embedded Apache Kafka)")
    parser.add_argument("--workdir", default=str(ROOT / ".lab"))
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--json", help="write every score here too")
    parser.add_argument("--warmup-seconds", type=float, default=WARMUP_S)
    parser.add_argument("--after-onset-seconds", type=float, default=AFTER_ONSET_S)
    args = parser.parse_args(argv)
    globals().update(WARMUP_S=args.warmup_seconds, AFTER_ONSET_S=args.after_onset_seconds)
    logging.basicConfig(level=logging.ERROR)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        from lagdoctor.kafka.broker import EmbeddedBroker

        broker = EmbeddedBroker(log_path=workdir / "broker.log").start()
        bootstrap = broker.bootstrap
    os.environ["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps({"conn_type": "kafka",
                                                           "extra": {"bootstrap.servers": bootstrap}})
    os.environ.pop("AIRFLOW_CONN_SLACK_API_DEFAULT", None)  # the local outbox, never a real channel
    say(f"broker {bootstrap}; time compressed {COMPRESSION:g}x: samples {SAMPLES} x {SAMPLE_INTERVAL_S:g} s per "
        f"sweep, a sweep every >= {SWEEP_MIN_INTERVAL_S:g} s, window {WINDOW_MINUTES:g} min, thresholds "
        + ", ".join(f"{k} {SCALED[k]:g} -> {v:g}" for k, v in THRESHOLDS.items())
        + " (the 10 s between a sweep's own samples is not scaled)")
    results: dict[str, list[Score]] = {}
    stories: dict[str, Play] = {}
    first_posts: dict[str, list[str]] = {}
    errors: list[tuple[str, float]] = []
    try:
        for r in range(1, args.rounds + 1):
            plays_, lives, sweeps, errs, warmup_end = run_round(r, bootstrap, workdir, args.seed * 100 + r)
            errors += errs
            for live in lives:
                stories[live.play.name] = live.play
                if live.first_post:
                    first_posts.setdefault(live.play.name, []).append(live.first_post.splitlines()[0])
                results.setdefault(live.play.name, []).append(
                    score(sweeps, live.group, live.play.expect, live.play.expect_partitions, live.onset,
                          warmup_end, min_snapshots=(live.play.need or PATTERN_NEED)[0],
                          min_seconds=(live.play.need or PATTERN_NEED)[1]))
    finally:
        if broker is not None:
            broker.stop()
    print()
    print(render_table(results, stories))
    print()
    print(render_time_lag(errors))
    print("\nworkloads not played as designed: " + ("; ".join(SHORTFALLS) or "none"))
    print("\nfirst Slack message after onset (first line), per round:")
    for name, posts in first_posts.items():
        for post in posts:
            print(f"  {name:<10} {post}")
    if args.json:
        Path(args.json).write_text(json.dumps({k: [vars(s) for s in v] for k, v in results.items()}, indent=1))
    return 0


def render_table(results: dict[str, list[Score]], stories: dict[str, Play]) -> str:
    head = ("| workload | expected | runs | first sweep after onset | first sweep with enough samples right "
            "| median onset -> right Slack (sweeps) | flips | wrong posts | provisional sweeps | critical / warning |")
    lines = [head, "|" + "---|" * 10]
    for name, scores in results.items():
        play = stories[name]
        judged = [s for s in scores if s.first_sweep_right is not None]
        right = sum(bool(s.first_sweep_right) for s in judged)
        times = [s.onset_to_slack_s for s in scores if s.onset_to_slack_s is not None]
        interval = statistics.median([s.sweep_interval_s for s in scores])
        med = statistics.median(times) if times else None
        missing = len(scores) - len(times)
        first = f"{right}/{len(judged)}" + (f" ({', '.join(s.first_sweep_verdict for s in judged if not s.first_sweep_right)})"
                                            if right < len(judged) else "")
        counts: dict[str, int] = {}
        for sc in scores:
            counts[sc.first_after_onset_verdict or "-"] = counts.get(sc.first_after_onset_verdict or "-", 0) + 1
        after = ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
        if play.negative:
            first, slack = "-", "-"
        else:
            slack = f"{fmt(med)} s ({fmt(med / interval if med else None, '.1f')})" + (
                f", {missing} never" if missing else "")
        lines.append(f"| {name}: {play.story} | {play.expect} | {len(scores)} | {after} | {first} | {slack} | "
                     f"{sum(s.flips for s in scores)} | {sum(s.wrong_posts for s in scores)} | "
                     f"{sum(s.provisional_sweeps for s in scores)} | "
                     f"{sum(s.critical for s in scores)} / {sum(s.warning for s in scores)} |")
    all_intervals = [s.sweep_interval_s for v in results.values() for s in v]
    lines.append(f"\nsweep interval: median {fmt(statistics.median(all_intervals))} s")
    return "\n".join(lines)


def render_time_lag(errors: list[tuple[str, float | None]]) -> str:
    if not errors:
        return "time lag: no lagging partition to check"
    out = ["| time lag source | lagging partitions | checked | max abs error (s) | median abs error (s) |",
           "|---|---|---|---|---|"]
    for source in sorted({s for s, _ in errors}):
        errs = [abs(e) for s, e in errors if s == source and e is not None]
        total = sum(1 for s, _ in errors if s == source)
        out.append(f"| {source} | {total} | {len(errs)} | {fmt(max(errs) if errs else None, '.3f')} | "
                   f"{fmt(statistics.median(errs) if errs else None, '.3f')} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
