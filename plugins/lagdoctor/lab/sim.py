"""Scenario simulator: labelled offset-snapshot histories (contract 1).

Each scenario is a consumer group on one topic whose true cause is known: the
simulator runs producers and consumers on a 5-second tick (Poisson arrivals
with bursty rate noise, consumers with a capacity, a commit policy, group
membership and rebalances) and samples it the way the collector does, at
jittered intervals with occasional gaps. The labels are what the engine
should say (contract 2 diagnoses and pattern).

    from lagdoctor.lab.sim import write_scenarios, write_seeds_incident, write_benchmark_history

    labels = write_scenarios("/tmp/snapshots", seed=7, n_groups_per_scenario=3)
    write_seeds_incident("/tmp/seeds")                 # the seeds' partition_imbalance incident
    write_benchmark_history("/tmp/bench", rows=1_000_000, seed=1)

Files land under `<path>/cluster=<c>/date=<YYYY-MM-DD>/`; labels go to
`<path>/_labels.jsonl` (a leading underscore: Spark and pyarrow skip it).
numpy and pyarrow are imported when a function runs, not at import.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

LABELS_FILE = "_labels.jsonl"
TICK_SECONDS = 5.0
ARRIVAL_NOISE_SIGMA = 0.25  # per-tick burstiness of arrivals (lognormal, mean 1)
DEFAULT_START = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Scenario:
    name: str
    diagnoses: tuple[str, ...]  # non-healthy diagnoses expected; () means healthy
    pattern: str | None  # None: no single true shape
    trap: bool = False  # looks alarming, must stay healthy


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("healthy_steady", (), "flat"),
        Scenario("healthy_batch_committer", (), "sawtooth", trap=True),
        Scenario("healthy_absorbed_burst", (), "spiky", trap=True),
        Scenario("healthy_idle_empty", (), "flat", trap=True),
        Scenario("healthy_commit_above_end", (), "flat", trap=True),
        Scenario("healthy_unknown_membership", (), "flat", trap=True),
        Scenario("healthy_single_rebalance", (), "flat", trap=True),
        Scenario("partition_imbalance", ("partition_imbalance",), "steady_climb"),
        Scenario("producer_surge", ("producer_surge",), "explosion"),
        Scenario("slow_consumer", ("slow_consumer",), "steady_climb"),
        Scenario("stalled_consumer", ("stalled_consumer",), "steady_climb"),
        Scenario("crashed_consumer", ("crashed_consumer",), "steady_climb"),
        Scenario("crashed_consumer_mid_window", ("crashed_consumer",), "explosion"),
        Scenario("crashed_consumer_producer_stopped", ("crashed_consumer",), "plateau"),
        Scenario("rebalance_loop_staircase", ("rebalance_loop",), "staircase"),
        Scenario("rebalance_loop_roller_coaster", ("rebalance_loop",), "roller_coaster"),
        # issue 10: sharper causes
        Scenario("partition_imbalance_hot_key", ("partition_imbalance",), "explosion"),
        Scenario("slow_consumer_diurnal", ("slow_consumer",), "steady_climb"),
        Scenario("healthy_diurnal", (), "flat", trap=True),
        # two shapes overlaid: no one true pattern (not scored)
        Scenario("mixed_stalled_rebalance_loop", ("rebalance_loop", "stalled_consumer"), None),
        Scenario("mixed_imbalance_rebalance_loop", ("partition_imbalance", "rebalance_loop"), None),
        # issue 18: shapes from the seeds (../shared/seeds) the scenarios above did not cover
        Scenario("partition_imbalance_case_study", ("partition_imbalance",), "steady_climb"),
        Scenario("producer_surge_early", ("producer_surge",), "steady_climb"),
        Scenario("producer_surge_late", ("producer_surge",), "explosion"),
        Scenario("stalled_consumer_staircase", ("stalled_consumer",), "staircase"),
    )
}
# The scenarios before issue 10: the benchmark history cycles through these
# only, so its data (and the figures measured on it) stay as they were.
CLASSIC_SCENARIOS: tuple[str, ...] = tuple(SCENARIOS)[:16]
# Causes local to one topic: in a multi-topic group the other topics stay healthy.
TOPIC_LOCAL_SCENARIOS = ("partition_imbalance", "partition_imbalance_hot_key", "slow_consumer",
                         "stalled_consumer", "producer_surge")


def expected_diagnoses(scenario: str) -> tuple[str, ...]:
    """The diagnoses a scenario's group should get (("healthy",) when none)."""
    return SCENARIOS[scenario].diagnoses or ("healthy",)


# -- one group ------------------------------------------------------------------


class _Group:
    """Mutable state of one simulated group; `run` returns its snapshot columns."""

    def __init__(self, rng, scenario: str, cluster: str, group_id: str, topic: str, start: datetime,
                 n_partitions: int | None = None, window_seconds: float | None = None,
                 interval: float | None = None, members: int | None = None, rate: float | None = None,
                 cadence: str | None = None, gap_rate: float = 0.03, snap_times: list[float] | None = None,
                 hexes: list[str] | None = None, record_ts: bool = False, optional_columns: bool = False,
                 fractional_capacity: bool = False, sweep: tuple[float, int, float] | None = None,
                 onset: float | None = None):
        import numpy as np

        self.np = np
        self.rng = rng
        self.sc = scenario
        self.cluster, self.group_id, self.topic, self.start = cluster, group_id, topic, start
        problem = bool(SCENARIOS[scenario].diagnoses)
        self.n = n_partitions or int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32]))
        if scenario in ("partition_imbalance", "partition_imbalance_hot_key", "mixed_imbalance_rebalance_loop"):
            self.n = max(self.n, 2)
        if scenario == "partition_imbalance_case_study" and n_partitions is None:
            self.n = int(rng.choice([2, 3, 4, 6]))  # one partition can hold most of the lag of a few
        self.interval = interval or float(rng.uniform(15, 60))
        self.window = window_seconds or float(rng.uniform(20, 45) * 60)
        if scenario == "healthy_batch_committer":
            self.commit_every = float(rng.uniform(90, 300))
            self.interval = min(self.interval, self.commit_every / 4)
            self.window = max(self.window, 4.5 * self.commit_every)
        # total produce rate (msg/s): problems need enough traffic to matter
        lo = 40.0 if problem else 2.0
        self.rate = rate or float(math.exp(rng.uniform(math.log(lo), math.log(20000))))
        weights = rng.uniform(0.6, 1.4, self.n)
        self.base = self.rate * weights / weights.sum()
        self.cap = self.base * rng.uniform(1.4, 3.0, self.n)  # healthy headroom
        m = members or int(rng.integers(1, min(self.n, 8) + 1))
        self.members = m
        self.hexes = list(hexes) if hexes else [f"{rng.integers(0, 16**6):06x}" for _ in range(m)]
        self.owner = np.arange(self.n) % m  # round-robin assignment
        self.lag0 = self.base * rng.uniform(0.0, 2.0, self.n)  # a second or two behind
        self.labels_partitions: list[int] = []
        # "sweep": a sweep DAG's cadence, `sweep` = (every s, samples, s apart); default the
        # 5-minute one (3 samples 10 s apart) the classic condition was built with
        self.cadence, self.gap_rate, self.snap_times = cadence, gap_rate, snap_times
        self.sweep = sweep or (300.0, 3, 10.0)
        # when the cause begins (s from the start), for the scenarios that have one: None draws it
        self.onset = onset
        self.record_ts, self.optional_columns = record_ts, optional_columns or record_ts
        self.pramp = None  # (ticks, n) produce multiplier over time per partition (a hot key's rise)
        self.freeze = None  # (ticks, n) True where a partition's consumer is stuck (a staircase's steps)
        if scenario == "stalled_consumer_staircase" and window_seconds is None:
            self.window = max(self.window, 2100.0)  # room for two steps and more
        # carry a tick's unused fraction of a message over (the classic scenarios round it away,
        # which starves partitions under ~0.1 msg/s: kept for them so their data stays as it was)
        self.fractional_capacity = fractional_capacity

    # member naming as the Java client does: <client.id>-<uuid>
    def member_id(self, i: int) -> str:
        return f"consumer-{i + 1}-{self.hexes[i]}"

    def run(self) -> tuple[Any, dict[str, Any]]:
        np, rng, sc, n = self.np, self.rng, self.sc, self.n
        ticks = int(self.window // TICK_SECONDS) + 1
        times = np.arange(ticks) * TICK_SECONDS
        # produce-rate multiplier over time (all partitions): a slow drift of up
        # to +-25% over the window, as daily traffic does
        steps = sc.startswith("rebalance_loop") or sc == "stalled_consumer_staircase"
        drift = rng.uniform(-0.25, 0.25) * (0.2 if steps else 1.0)  # keep step shapes
        mult = 1.0 + drift * np.sin(np.pi * times / max(times[-1], 1.0) + rng.uniform(0, np.pi))
        pmult = np.ones(n)  # per-partition multiplier
        cap = self.cap.copy()
        active = np.ones(ticks, dtype=bool)  # consumers consuming
        state = np.array(["STABLE"] * ticks, dtype=object)
        stable_members = np.full(ticks, self.members, dtype=float)
        frozen_from = np.full(n, np.inf)  # tick time at which a partition's commits stop
        trickle = np.zeros(n)  # near-frozen: share of capacity still consumed
        commit_every = None
        churn_at: list[float] = []  # times the crash-looping member gets a new id
        lag0 = self.lag0.copy()
        members_known = True
        race = 0.05  # share of snapshots whose end offset is read before the commit
        retention = math.inf

        if sc == "healthy_batch_committer":
            commit_every = self.commit_every
            cap = self.base * rng.uniform(2.0, 4.0, n)
        elif sc == "healthy_absorbed_burst":
            cap = self.base * rng.uniform(2.0, 3.5, n)
            for b in range(int(rng.integers(1, 3))):  # one or two bursts, apart
                b0 = rng.uniform(0.1 + 0.3 * b, 0.3 + 0.3 * b) * self.window
                if self.onset is not None:  # the first at the onset, a second up to 10 minutes on
                    b0 = self.onset + b * rng.uniform(180, 600)
                mult[(times >= b0) & (times < b0 + rng.uniform(30, 90))] = rng.uniform(8, 16)
        elif sc == "healthy_idle_empty":
            mult[:] = 0.0
            lag0[:] = 0
            active[:] = False
            state[:] = "EMPTY"
            stable_members[:] = 0
        elif sc == "healthy_commit_above_end":
            race = 0.5
        elif sc == "healthy_unknown_membership":
            members_known = False
        elif sc == "healthy_single_rebalance":
            r0 = rng.uniform(0.2, 0.8) * self.window
            self._rebalance(times, r0, rng.uniform(5, 15), active, state)
            stable_members[times >= r0] = self.members + 1
            churn_at.append(r0)
        elif sc == "partition_imbalance":
            k = int(rng.integers(1, max(1, int(0.2 * n)) + 1))
            hot = rng.choice(n, size=k, replace=False)
            self.labels_partitions = sorted(int(p) for p in hot)
            if rng.random() < 0.5:  # hot key: the partition gets far more traffic
                pmult[hot] = rng.uniform(4, 15, k)
                cap[hot] = self.base[hot] * pmult[hot] * rng.uniform(0.1, 0.8, k)
            else:  # one slow owner
                cap[hot] = self.base[hot] * rng.uniform(0.1, 0.75, k)
            lag0[hot] += self.base[hot] * pmult[hot] * rng.uniform(0, 300, k)
        elif sc == "producer_surge":
            s0 = rng.uniform(0.4, 0.6) * self.window
            s0 = s0 if self.onset is None else self.onset
            factor = rng.uniform(2.5, 8.0)
            cap = self.base * rng.uniform(1.5, min(3.0, factor / 1.4), n)
            ramp = np.clip((times - s0) / 60.0, 0, 1)  # load ramps up over a minute
            mult *= 1 + (factor - 1) * ramp
        elif sc == "slow_consumer":
            slow = rng.random(n) < rng.uniform(0.75, 1.0)
            slow[rng.integers(0, n)] = True
            share = rng.uniform(0.4, 0.92, int(slow.sum()))
            # slow alike (one capacity problem): a spread wide enough for one owner far below
            # its load to hold most of the lag is an imbalance by the seeds' case study (rule 4)
            cap[slow] = self.base[slow] * (share.mean() + 0.3 * (share - share.mean()))
            lag0[slow] += self.base[slow] * rng.uniform(0, 120, int(slow.sum()))
            cap[self._most(slow)] = self.base[self._most(slow)] * 0.8
        elif sc == "stalled_consumer":
            if rng.random() < 0.2:
                stuck = np.arange(n)  # the only consumer hangs
            else:
                stuck = rng.choice(n, size=int(rng.integers(1, max(1, n // 3) + 1)), replace=False)
            self.labels_partitions = sorted(int(p) for p in stuck)
            frozen_from[stuck] = -rng.uniform(0, 0.5) * self.window  # stuck before the window
            lag0[stuck] += self.base[stuck] * rng.uniform(30, 600, len(stuck))
            if self.onset is not None:  # kept up until it got stuck
                frozen_from[stuck], lag0[stuck] = self.onset, self.base[stuck] * rng.uniform(0, 2, len(stuck))
            trickle[stuck] = np.where(rng.random(len(stuck)) < 0.3, rng.uniform(0.002, 0.01, len(stuck)), 0.0)
        elif sc.startswith("crashed_consumer"):
            c0 = -1.0
            if sc == "crashed_consumer_mid_window":
                c0 = rng.uniform(0.4, 0.55) * self.window if self.onset is None else self.onset
            lag0 += self.base * (rng.uniform(0, 600) if c0 < 0 else 0)
            after = times >= c0
            active[after] = False
            state[after] = "DEAD" if rng.random() < 0.2 else "EMPTY"
            stable_members[after] = 0
            if sc == "crashed_consumer_producer_stopped":
                mult[times >= rng.uniform(0.45, 0.6) * self.window] = 0.0
            if rng.random() < 0.3:  # retention overtakes the dead group's position
                retention = float(self.rate * self.window / n * 0.5)
        elif sc.startswith("rebalance_loop"):
            roller = sc.endswith("roller_coaster")
            # staircase: capacity just matches the load, so each pause adds a step
            # that never drains; roller coaster: some headroom, so each pause's
            # backlog drains over minutes, just about until the next one
            # backlog drains over minutes, just about until the next one; the roller coaster's
            # peaks grow (the seeds' 0 -> 5000 -> 0 -> 8000 -> 0 -> 12000): each pause longer
            cap = self.base * (rng.uniform(1.5, 1.8, n) if roller else rng.uniform(0.99, 1.04, n))
            t = rng.uniform(0.02, 0.08 if roller else 0.12) * self.window
            t = t if self.onset is None else self.onset
            if roller:
                pause, growth = rng.uniform(35, 50), rng.uniform(1.45, 1.7)
            while t < self.window * 0.97:
                if roller:
                    drain = pause / (float(cap.sum() / self.base.sum()) - 1.0)
                    self._rebalance(times, t, pause, active, state)
                    churn_at.append(t)
                    # not closer than the classic loop's (5-minute sweeps must still tell them apart)
                    t += max(pause + 1.15 * drain + rng.uniform(20, 60), rng.uniform(330, 450))
                    pause *= growth
                    continue
                pause = rng.uniform(45, 90)
                self._rebalance(times, t, pause, active, state)
                churn_at.append(t)
                t += pause + rng.uniform(150, 300)
        elif sc == "partition_imbalance_hot_key":
            # a hot key: the produce rate rises on a few partitions only; their
            # owners kept up before and cannot after, the rest of the topic is fine
            k = int(rng.integers(1, max(1, int(0.2 * n)) + 1))
            hot = rng.choice(n, size=k, replace=False)
            self.labels_partitions = sorted(int(p) for p in hot)
            s0 = rng.uniform(0.35, 0.6) * self.window if self.onset is None else self.onset
            factor = rng.uniform(4, 15)
            cap[hot] = self.base[hot] * np.maximum(1.2, factor * rng.uniform(0.25, 0.6, k))
            self.pramp = np.ones((ticks, n))
            self.pramp[:, hot] = 1 + (factor - 1) * np.clip((times - s0) / 60.0, 0, 1)[:, None]
        elif sc in ("slow_consumer_diurnal", "healthy_diurnal"):
            # strongly diurnal traffic: the rate swings 3x (trough to peak) within the window
            period = rng.uniform(1.0, 2.0) * self.window
            wave = np.sin(2 * np.pi * times / period + rng.uniform(0, 2 * np.pi))
            wave = np.exp(math.log(3.0) * (wave - wave.min()) / max(wave.max() - wave.min(), 1e-9))
            mult = wave / wave.mean()
            trough = float(mult.min())
            if sc == "healthy_diurnal":
                cap = self.base * 3 * trough * rng.uniform(1.4, 2.5, n)  # headroom above the peak
            else:  # slow: below even the trough, so lag climbs all day
                slow = rng.random(n) < rng.uniform(0.75, 1.0)
                slow[rng.integers(0, n)] = True
                cap[slow] = self.base[slow] * trough * rng.uniform(0.4, 0.8, int(slow.sum()))
                cap[~slow] = self.base[~slow] * 3 * trough * rng.uniform(1.4, 2.5, int((~slow).sum()))
                lag0[slow] += self.base[slow] * rng.uniform(0, 120, int(slow.sum()))
                cap[self._most(slow)] = self.base[self._most(slow)] * trough * 0.7
        elif sc == "partition_imbalance_case_study":
            # the seeds' case study: lag grows from zero on every partition, one owner consumes a
            # small share of its load (800 of 12,000 msg/s) and holds most of the lag, the others
            # fall behind slowly
            hot = int(rng.integers(0, n))
            self.labels_partitions = [hot]
            cap[hot] = self.base[hot] * rng.uniform(0.06, 0.3)  # below 5% is near-frozen: stalled (rule 3)
            # at about their peak load: bursts they cannot absorb leave a little lag each time
            others = np.arange(n) != hot
            cap[others] = self.base[others] * float(mult.max()) * rng.uniform(0.97, 1.01, n - 1)
        elif sc in ("producer_surge_early", "producer_surge_late"):
            # every partition's load rises 3-10x at an onset anywhere in the window; the consumers
            # kept up before and top out well above the old rate, below the new one
            s0 = (rng.uniform(0.08, 0.28) if sc.endswith("early") else rng.uniform(0.45, 0.8)) * self.window
            s0 = s0 if self.onset is None else self.onset
            factor = rng.uniform(3.0, 10.0)
            cap = self.base * rng.uniform(1.3, max(1.4, 0.7 * factor), n)
            mult *= 1 + (factor - 1) * np.clip((times - s0) / rng.uniform(10, 60), 0, 1)
        elif sc == "stalled_consumer_staircase":
            # the seeds' staircase (0 -> 1000 -> 1000 -> 2000): a consumer stuck on a record for
            # minutes, then past it at about its load, so every step's backlog stays
            stuck = rng.choice(n, size=int(rng.integers(1, max(1, n // 4) + 1)), replace=False)
            self.labels_partitions = sorted(int(p) for p in stuck)
            cap[stuck] = self.base[stuck] * rng.uniform(1.0, 1.06, len(stuck))
            self.freeze = np.zeros((ticks, n), dtype=bool)
            t = rng.uniform(0.03, 0.1) * self.window
            while t < self.window * 0.9:
                step = rng.uniform(260, 400) + 3 * self.interval  # long enough to show at the cadence
                self.freeze[np.ix_(np.flatnonzero((times >= t) & (times < t + step)), stuck)] = True
                t += step + rng.uniform(500, 800)
        elif sc.startswith("mixed_"):
            # two causes at once: a rebalance loop with headroom (each pause's backlog
            # drains within a few minutes) on top of stalled or slow-owner partitions
            cap = self.base * rng.uniform(1.6, 2.2, n)
            if sc == "mixed_stalled_rebalance_loop":
                sick = rng.choice(n, size=int(rng.integers(1, max(1, n // 3) + 1)), replace=False)
                frozen_from[sick] = -rng.uniform(0, 0.5) * self.window
                lag0[sick] += self.base[sick] * rng.uniform(60, 600, len(sick))
            else:
                sick = rng.choice(n, size=int(rng.integers(1, max(1, int(0.2 * n)) + 1)), replace=False)
                cap[sick] = self.base[sick] * rng.uniform(0.1, 0.6, len(sick))
                lag0[sick] += self.base[sick] * rng.uniform(0, 300, len(sick))
            self.labels_partitions = sorted(int(p) for p in sick)
            t = rng.uniform(0.02, 0.1) * self.window
            while t < self.window * 0.85:  # the last pause's backlog has drained by the end
                pause = rng.uniform(20, 45)
                self._rebalance(times, t, pause, active, state)
                churn_at.append(t)
                t += pause + rng.uniform(150, 300)
        return self._simulate(times, mult, pmult, cap, active, state, stable_members, frozen_from, trickle,
                              commit_every, churn_at, lag0, members_known, race, retention)

    def _most(self, slow):
        """Partitions to make slow too so that most are (a slow consumer is slow on
        most partitions, one slow of two is an imbalance): the lowest fast ones.
        No random draw, so the rest of the simulation is unchanged."""
        np = self.np
        fast = np.flatnonzero(~slow)
        need = max(0, self.n // 2 + 1 - int(slow.sum()))
        return fast[:need]

    @staticmethod
    def _rebalance(times, t0, pause, active, state):
        during = (times >= t0) & (times < t0 + pause)
        active[during] = False
        state[during & (times < t0 + 0.7 * pause)] = "PREPARING_REBALANCE"
        state[during & (times >= t0 + 0.7 * pause)] = "COMPLETING_REBALANCE"

    def _simulate(self, times, mult, pmult, cap, active, state, stable_members, frozen_from, trickle,
                  commit_every, churn_at, lag0, members_known, race, retention):
        np, rng, n = self.np, self.rng, self.n
        dt = TICK_SECONDS
        leo = np.round(self.base * rng.uniform(1e4, 1e6, n)).astype(np.int64) + np.round(lag0).astype(np.int64)
        pos = leo - np.round(lag0).astype(np.int64)  # consumed position
        committed = pos.copy()
        last_commit = 0.0
        carry = np.zeros(n) if self.fractional_capacity else None
        snap_times = self._snapshot_times()
        snaps: list[tuple] = []  # per snapshot: (ts, state, members, assigned, hexes, leo, committed, log_start)
        si = 0
        hexes = list(self.hexes)
        churn = sorted(churn_at)
        # the log end offset after each tick, to place every record in time (truth of time lag)
        leo_hist = np.empty((len(times) + 1, n), dtype=np.int64)
        leo_hist[0] = leo
        snap_ticks: list[int] = []
        true_lag_max = 0
        for i, t in enumerate(times):
            # a crash-looping member rejoins under a new id at each rebalance
            while churn and churn[0] <= t:
                churn.pop(0)
                victim = int(rng.integers(0, self.members))
                hexes[victim] = f"{rng.integers(0, 16**6):06x}"
            # bursty arrivals, shared by partitions; mean 1 (a lognormal's mean is e^(mu + sigma^2/2)),
            # so arrivals average the scenario's rate: at mu 0 they ran 3% above it
            noise = rng.lognormal(-ARRIVAL_NOISE_SIGMA**2 / 2, ARRIVAL_NOISE_SIGMA)
            lam = np.maximum(self.base * pmult * mult[i] * noise * dt, 0.0)
            if self.pramp is not None:
                lam = lam * self.pramp[i]
            produced = rng.poisson(lam)
            leo = leo + produced
            leo_hist[i + 1] = leo
            if active[i]:
                # a poll loop (mean 1): some ticks fetch little (processing, GC), others catch up
                can = cap * dt * rng.choice([0.4, 1.0, 1.1, 1.5], n) * rng.uniform(0.85, 1.15, n)
                stuck = t >= frozen_from
                if self.freeze is not None:
                    stuck = stuck | self.freeze[i]
                can = np.where(stuck, cap * trickle * dt, can)
                if carry is None:
                    pos = np.minimum(leo, pos + np.round(can).astype(np.int64))
                else:
                    carry = np.minimum(carry + can, 2 * cap * dt + 1)
                    step = np.minimum(np.floor(carry).astype(np.int64), leo - pos)
                    pos, carry = pos + step, carry - step
                if commit_every is None:
                    committed = np.where(stuck & (trickle == 0), committed, pos)
                elif t - last_commit >= commit_every:
                    committed = pos.copy()
                    last_commit = t
            true_lag_max = max(true_lag_max, int((leo - committed).clip(0).sum()))
            while si < len(snap_times) and snap_times[si] < t + dt:
                ts = snap_times[si]
                si += 1
                # the collector reads end offsets just before commits: a caught-up
                # partition can show a commit above its end offset (lag 0)
                early = rng.random(n) < race
                leo_seen = np.where(early, leo - np.round(produced * rng.uniform(0, 1, n)).astype(np.int64), leo)
                leo_seen = np.maximum(leo_seen, 0)
                log_start = np.zeros(n, dtype=np.int64) if math.isinf(retention) else np.maximum(
                    0, leo_seen - int(retention))
                st = state[i]
                nmem = int(stable_members[i])
                assigned = members_known and nmem > 0 and st not in ("PREPARING_REBALANCE", "COMPLETING_REBALANCE")
                snaps.append((ts, st, nmem, assigned, tuple(hexes), leo_seen, committed.copy(), log_start))
                snap_ticks.append(i)
        produced_at = self._production_clock(times, leo_hist, mult, pmult)
        record_ts = None
        if self.record_ts and snaps:
            # the collector fetches the record at the committed offset: none when
            # nothing was written there yet, or retention deleted it
            record_ts = []
            for (_, _, _, _, _, _, com, log_start), i in zip(snaps, snap_ticks):
                exists = (com < leo_hist[i + 1]) & (com >= log_start)
                record_ts.append(np.where(exists, produced_at(com), np.nan))
        table = self._table(snaps, members_known, record_ts)
        label = {
            "cluster": self.cluster,
            "group_id": self.group_id,
            "topic": self.topic,
            "scenario": self.sc,
            "diagnoses": list(expected_diagnoses(self.sc)),
            "pattern": SCENARIOS[self.sc].pattern,
            "partitions": self.labels_partitions,
            "partition_count": n,
            "members": self.members,
            "snapshots": len(snaps),
            "produce_rate": round(self.rate, 3),
            "record_ts": bool(self.record_ts),
            **self._time_lag_truth(snaps, produced_at),
            # partitions whose last snapshot carries committed_record_ts (the job's exact path)
            "record_ts_at_end": {str(p): bool(record_ts is not None and not np.isnan(record_ts[-1][p]))
                                 for p in range(n)},
        }
        if true_lag_max < 100:  # below the documented noise floor a lag has no shape (patterns rule 1)
            label["pattern"] = "flat" if label["pattern"] else None
        return table, label

    def _production_clock(self, times, leo_hist, mult, pmult):
        """offsets (n,) -> when each partition's record at that offset was produced
        (s from the start): linear within the tick that wrote it; before the
        window, at the rate of the first tick."""
        np, n = self.np, self.n
        clock = np.concatenate([[times[0] - TICK_SECONDS], times])
        pre_rate = np.maximum(self.base * pmult * mult[0] * (1.0 if self.pramp is None else self.pramp[0]), 1e-6)

        def produced_at(offsets):
            out = np.empty(n)
            for p in range(n):
                col, o = leo_hist[:, p], offsets[p]
                k = int(np.searchsorted(col, o, side="right"))  # first tick whose end offset passed o
                if k == 0:
                    out[p] = clock[0] - (col[0] - o) / pre_rate[p]
                elif k >= len(col):
                    out[p] = np.nan  # not produced yet
                else:
                    frac = (o - col[k - 1]) / max(col[k] - col[k - 1], 1)
                    out[p] = clock[k - 1] + frac * (clock[k] - clock[k - 1])
            return out

        return produced_at

    def _time_lag_truth(self, snaps, produced_at) -> dict[str, Any]:
        """Per partition at the window's end (its last snapshot): the window end
        minus the production time of the record at the committed offset (0 when
        lag is 0), and whether that record is older than the window's start."""
        if not snaps:
            return {"true_time_lag_seconds": {}, "beyond_window": {}}
        np = self.np
        t_first, t_last = snaps[0][0], snaps[-1][0]
        leo, com = snaps[-1][5], snaps[-1][6]
        born = produced_at(com)
        lagging = (leo - com) > 0
        seconds = np.where(lagging, t_last - born, 0.0)
        beyond = lagging & (born < t_first)
        return {
            "true_time_lag_seconds": {str(p): round(float(seconds[p]), 3) for p in range(self.n)},
            "beyond_window": {str(p): bool(beyond[p]) for p in range(self.n)},
        }

    def _table(self, snaps, members_known: bool, record_ts=None):
        """Snapshot rows as a contract-1 pyarrow Table, built column-wise; with
        the optional columns when asked (committed_record_ts from `record_ts`)."""
        import pyarrow as pa

        from lagdoctor.contracts import snapshot_arrow_schema

        np, n = self.np, self.n
        schema = snapshot_arrow_schema(include_optional=self.optional_columns)
        s = len(snaps)
        if s == 0:
            return schema.empty_table()
        start_us = int(self.start.timestamp() * 1_000_000)
        ts = np.repeat(np.array([start_us + int(round(x[0] * 1e6)) for x in snaps], dtype=np.int64), n)
        leo = np.concatenate([x[5] for x in snaps])
        committed = np.concatenate([x[6] for x in snaps])
        owner = [int(o) % max(self.members, 1) for o in self.owner]
        members, clients, hosts, states, nmems = [], [], [], [], []
        for _, st, nmem, assigned, hexes, *_ in snaps:
            if assigned:
                members.extend(f"consumer-{o + 1}-{hexes[o]}" for o in owner)
                clients.extend(f"consumer-{o + 1}" for o in owner)
                hosts.extend(f"10.0.{o // 250 + 1}.{o % 250 + 14}" for o in owner)
            else:
                members.extend([None] * n)
                clients.extend([None] * n)
                hosts.extend([None] * n)
            states.extend([st] * n)
            nmems.extend([nmem] * n)
        group_members = pa.array(nmems, type=pa.int32()) if members_known else pa.nulls(s * n, pa.int32())
        columns = {
            "snapshot_ts": pa.array(ts, type=pa.timestamp("us", tz="UTC")),
            "cluster": pa.array([self.cluster] * (s * n), type=pa.string()),
            "group_id": pa.array([self.group_id] * (s * n), type=pa.string()),
            "group_state": pa.array(states, type=pa.string()),
            "topic": pa.array([self.topic] * (s * n), type=pa.string()),
            "partition": pa.array(np.tile(np.arange(n, dtype=np.int32), s)),
            "log_start_offset": pa.array(np.concatenate([x[7] for x in snaps]).astype(np.int64)),
            "log_end_offset": pa.array(leo.astype(np.int64)),
            "committed_offset": pa.array(committed.astype(np.int64)),
            "lag": pa.array(np.maximum(0, leo - committed).astype(np.int64)),
            "member_id": pa.array(members, type=pa.string()),
            "client_id": pa.array(clients, type=pa.string()),
            "host": pa.array(hosts, type=pa.string()),
            "group_members": group_members,
        }
        if self.optional_columns:
            if record_ts is not None:
                start_s = self.start.timestamp()
                us = np.round((start_s + np.concatenate(record_ts)) * 1e6)
                valid = ~np.isnan(us)
                columns["committed_record_ts"] = pa.array(np.where(valid, us, 0).astype(np.int64),
                                                          type=pa.timestamp("us", tz="UTC"), mask=~valid)
            for field in schema:
                if field.name not in columns:
                    columns[field.name] = pa.nulls(s * n, field.type)
        return pa.table(columns, schema=schema)

    def _snapshot_times(self) -> list[float]:
        rng = self.rng
        if self.snap_times is not None:
            return list(self.snap_times)
        if self.cadence == "sweep":
            every, samples, spacing = self.sweep
            return sweep_times(rng, self.window, self.gap_rate, every=every, samples=samples, spacing=spacing)
        return jittered_times(rng, self.window, self.interval, self.gap_rate)


def jittered_times(rng, window: float, interval: float, gap_rate: float = 0.03) -> list[float]:
    """Snapshot times (s from the start) every `interval` +-25%, with a gap of
    2 to 6 intervals (missed runs) at a share `gap_rate` of the steps."""
    out, t = [], 0.0
    while t <= window:
        out.append(t)
        step = interval * rng.uniform(0.75, 1.25)  # jitter
        if rng.random() < gap_rate:  # a gap: the collector missed a few runs
            step += interval * rng.uniform(2, 6)
        t += step
    return out


def sweep_times(rng, window: float, missed_rate: float = 0.03, every: float = 300.0, samples: int = 3,
                spacing: float = 10.0) -> list[float]:
    """Snapshot times (s from the start) of the sweep DAG: `samples` reads
    `spacing` s apart every `every` s (the schedule starts a few seconds late),
    a sweep missed now and then (never the first)."""
    out, k = [], 0
    while k * every <= window:
        if k == 0 or rng.random() >= missed_rate:
            t0 = k * every + rng.uniform(0, 4)
            out += [t0 + j * spacing + rng.uniform(-0.5, 0.5) for j in range(samples)]
        k += 1
    return [t for t in out if t <= window]


# -- many groups ----------------------------------------------------------------


def simulate_group(rng, scenario: str, cluster: str = "sim", group_id: str = "g", topic: str = "t",
                   start: datetime = DEFAULT_START, **shape) -> tuple[Any, dict[str, Any]]:
    """(pyarrow Table in contract 1, label) of one simulated group."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    return _Group(rng, scenario, cluster, group_id, topic, start, **shape).run()


def scenario_table(seed: int, n_groups_per_scenario: int = 3, scenarios: Iterable[str] | None = None,
                   cluster: str = "sim", start: datetime = DEFAULT_START):
    """(pyarrow Table in contract 1, labels) for every scenario x n groups."""
    import numpy as np
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    rng = np.random.default_rng(seed)
    names = list(scenarios or SCENARIOS)
    schema = snapshot_arrow_schema()
    tables, labels = [], []
    for name in names:
        for k in range(n_groups_per_scenario):
            table, label = simulate_group(rng, name, cluster, f"{name}-{k}", f"events-{name}-{k}", start)
            tables.append(table)
            labels.append(label)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return table, labels


def write_table(table, path: str, cluster: str, name: str = "part-0.parquet") -> list[str]:
    """Write a contract-1 table under path/cluster=<c>/date=<d>/, one file per day."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    written = []
    if table.num_rows == 0:
        return written
    days = pc.strftime(table["snapshot_ts"], format="%Y-%m-%d")
    for day in sorted(set(days.to_pylist())):
        part = table.filter(pc.equal(days, day))
        directory = os.path.join(path, f"cluster={cluster}", f"date={day}")
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, name)
        pq.write_table(part, target + ".tmp", compression="zstd")
        os.replace(target + ".tmp", target)
        written.append(target)
    return written


def write_labels(labels: list[dict], path: str) -> str:
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, LABELS_FILE)
    with open(target, "w", encoding="utf-8") as fh:
        for label in labels:
            fh.write(json.dumps(label, sort_keys=True) + "\n")
    return target


def read_labels(path: str) -> list[dict]:
    with open(os.path.join(path, LABELS_FILE), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_scenarios(path: str, seed: int = 0, n_groups_per_scenario: int = 3,
                    scenarios: Iterable[str] | None = None, cluster: str = "sim",
                    start: datetime = DEFAULT_START) -> list[dict]:
    """Simulate every scenario (or those named) and write snapshots + labels under `path`."""
    table, labels = scenario_table(seed, n_groups_per_scenario, scenarios, cluster, start)
    write_table(table, path, cluster)
    write_labels(labels, path)
    return labels


# -- conditions (issue 10): the scenarios under harder circumstances ---------------

# Causes without a lag threshold: the only ones a 1 msg/s topic can show in a window.
LOW_RATE_SCENARIOS = ("healthy_steady", "healthy_batch_committer", "healthy_commit_above_end",
                      "healthy_unknown_membership", "healthy_single_rebalance", "stalled_consumer",
                      "crashed_consumer", "crashed_consumer_mid_window", "crashed_consumer_producer_stopped",
                      "rebalance_loop_staircase", "rebalance_loop_roller_coaster")
SWEEP_WINDOW_SECONDS = 1830.0  # 30 minutes of sweeps and the last sweep's samples
# The sweep DAG's defaults (lagdoctor.stages.params): a run every SWEEP_EVERY_S, each taking
# SWEEP_SAMPLES samples SWEEP_SAMPLE_INTERVAL_S apart.
SWEEP_EVERY_S = 60.0


def _sweep_shape() -> tuple[float, int, float]:
    from lagdoctor.stages.params import SWEEP_SAMPLE_INTERVAL_S, SWEEP_SAMPLES

    return SWEEP_EVERY_S, SWEEP_SAMPLES, SWEEP_SAMPLE_INTERVAL_S
# The seeds' case study, surges with the onset anywhere, a staircase of stuck records, and their
# look-alikes: a slow consumer, a hot partition, growing and level waves.
SEEDS_SCENARIOS = ("partition_imbalance_case_study", "partition_imbalance", "slow_consumer", "producer_surge_early",
                   "producer_surge_late", "stalled_consumer_staircase", "stalled_consumer",
                   "rebalance_loop_roller_coaster", "healthy_batch_committer")


def _cadence_shape(rng) -> dict[str, Any]:
    interval = float(rng.choice([15.0, 30.0, 60.0, 120.0, 300.0]))
    return {"interval": interval, "gap_rate": 0.1,
            "window_seconds": max(float(rng.uniform(30, 45) * 60), 10 * interval)}


# condition -> (scenarios, shape of each group: rng -> simulate_group keyword arguments)
CONDITIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "baseline": (CLASSIC_SCENARIOS, lambda rng: {}),
    "hot_key": (("partition_imbalance_hot_key", "producer_surge"),
                lambda rng: {"n_partitions": int(rng.choice([2, 3, 4, 6, 8, 12, 16, 24, 32, 64]))}),
    "sweep_cadence": (CLASSIC_SCENARIOS, lambda rng: {"cadence": "sweep", "window_seconds": SWEEP_WINDOW_SECONDS}),
    "diurnal": (("slow_consumer_diurnal", "healthy_diurnal"), lambda rng: {}),
    "multi_topic": (TOPIC_LOCAL_SCENARIOS, None),  # built by _multi_topic_group
    "partitions_1_128": (CLASSIC_SCENARIOS, lambda rng: {"n_partitions": int(rng.choice([1, 2, 48, 64, 96, 128]))}),
    "rate_1_msg_s": (LOW_RATE_SCENARIOS, lambda rng: {"rate": 1.0}),
    "rate_50k_msg_s": (CLASSIC_SCENARIOS, lambda rng: {"rate": 50_000.0}),
    "cadence_15s_5min": (CLASSIC_SCENARIOS, _cadence_shape),
    "mixed_causes": (("mixed_stalled_rebalance_loop", "mixed_imbalance_rebalance_loop"), lambda rng: {}),
    # issue 18: the seeds' shapes beside the ones they must not be confused with
    "seeds": (SEEDS_SCENARIOS, lambda rng: {}),
    # issue 20: the sweep DAG's own default cadence, every minute (sweep_cadence is the 5-minute one)
    "sweep_1min": (CLASSIC_SCENARIOS + SEEDS_SCENARIOS[:1] + SEEDS_SCENARIOS[3:6],
                   lambda rng: {"cadence": "sweep", "sweep": _sweep_shape(), "window_seconds": SWEEP_WINDOW_SECONDS}),
}


def _multi_topic_group(rng, sick: str, cluster: str, group_id: str, start: datetime, record_ts: bool):
    """One group reading 2 or 3 topics, `sick` on one of them, the others healthy:
    the same members and the same snapshot times on every topic."""
    n_topics = int(rng.integers(2, 4))
    sick_at = int(rng.integers(0, n_topics))
    members = int(rng.integers(1, 9))
    hexes = [f"{rng.integers(0, 16**6):06x}" for _ in range(members)]
    window, interval = float(rng.uniform(20, 45) * 60), float(rng.uniform(15, 60))
    times = jittered_times(rng, window, interval)
    out = []
    for j in range(n_topics):
        scenario = sick if j == sick_at else "healthy_steady"
        n = max(int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32])), members)
        out.append(simulate_group(rng, scenario, cluster, group_id, f"{group_id}-topic-{j}", start, n_partitions=n,
                                  window_seconds=window, interval=interval, members=members, snap_times=times,
                                  hexes=hexes, record_ts=record_ts, optional_columns=True, fractional_capacity=True))
    return out


def condition_table(seed: int, n_groups_per_case: int = 2, conditions: Iterable[str] | None = None,
                    cluster: str = "sim", start: datetime = DEFAULT_START, record_ts_share: float = 0.3):
    """(pyarrow Table in contract 1 with its optional columns, labels) for every
    condition x its scenarios x n groups. A label is per (group_id, topic) and
    names its condition; a share `record_ts_share` of the groups carry
    committed_record_ts (the job's exact time-lag path), the rest leave it null."""
    import numpy as np
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    rng = np.random.default_rng(seed)
    tables, labels = [], []
    for condition in conditions or CONDITIONS:
        scenarios, shape = CONDITIONS[condition]
        for name in scenarios:
            for k in range(n_groups_per_case):
                group_id = f"{condition}-{name}-{k}"
                record_ts = bool(rng.random() < record_ts_share)
                if shape is None:
                    made = _multi_topic_group(rng, name, cluster, group_id, start, record_ts)
                else:
                    made = [simulate_group(rng, name, cluster, group_id, f"events-{k}", start, record_ts=record_ts,
                                           optional_columns=True, fractional_capacity=True, **shape(rng))]
                for table, label in made:
                    tables.append(table)
                    labels.append({**label, "condition": condition})
    table = pa.concat_tables(tables) if tables else snapshot_arrow_schema(include_optional=True).empty_table()
    return table, labels


def write_conditions(path: str, seed: int = 0, n_groups_per_case: int = 2, conditions: Iterable[str] | None = None,
                     cluster: str = "sim", start: datetime = DEFAULT_START, record_ts_share: float = 0.3) -> list[dict]:
    """Simulate every condition (or those named) and write snapshots + labels under `path`."""
    table, labels = condition_table(seed, n_groups_per_case, conditions, cluster, start, record_ts_share)
    write_table(table, path, cluster)
    write_labels(labels, path)
    return labels


# -- the seeds' incident ----------------------------------------------------------

SEEDS_END = datetime(2026, 11, 21, 14, 30, tzinfo=timezone.utc)
SEEDS_PARTITIONS = (
    # partition, committed, end offset, owner, host, produce msg/s, consume msg/s
    (0, 8_412_901, 8_901_234, "consumer-1-abc123", "10.0.1.14", 2_100.0, 2_050.0),
    (1, 8_100_442, 12_543_210, "consumer-2-def456", "10.0.1.15", 12_000.0, 800.0),
    (2, 9_023_011, 9_187_443, "consumer-3-ghi789", "10.0.1.16", 1_600.0, 1_590.0),
)


def seeds_incident_table(minutes: float = 5.0, interval_seconds: float = 30.0, end: datetime = SEEDS_END,
                         cluster: str = "prod", group_id: str = "orders-processor", topic: str = "orders"):
    """The seeds' incident: three partitions ending at lag 488,333 / 4,442,768 / 164,432,
    partition 1 owned by consumer-2-def456 on 10.0.1.15 falling behind, with
    `minutes` of history before (snapshots every `interval_seconds`)."""
    import pyarrow as pa

    from lagdoctor.contracts import snapshot_arrow_schema

    schema = snapshot_arrow_schema()
    cols: dict[str, list] = {name: [] for name in schema.names}
    steps = int(minutes * 60 // interval_seconds)
    for k in range(steps + 1):
        back = (steps - k) * interval_seconds
        ts = end - timedelta(seconds=back)
        for p, committed, leo, member, host, produce, consume in SEEDS_PARTITIONS:
            end_offset = int(leo - produce * back)
            commit = int(committed - consume * back)
            row = (ts, cluster, group_id, "STABLE", topic, p, 0, end_offset, commit, max(0, end_offset - commit),
                   member, member.rsplit("-", 1)[0], host, 3)
            for name, value in zip(schema.names, row):
                cols[name].append(value)
    return pa.table(cols, schema=schema)


def write_seeds_incident(path: str, **kwargs) -> list[str]:
    table = seeds_incident_table(**kwargs)
    return write_table(table, path, table["cluster"][0].as_py())


# -- benchmark history ----------------------------------------------------------------


def write_benchmark_history(path: str, rows: int, seed: int = 1, partitions_per_group: int = 16,
                            snapshots_per_group: int = 1_500, interval_seconds: float = 20.0,
                            cluster: str = "bench", start: datetime = DEFAULT_START,
                            rows_per_file: int = 2_000_000) -> int:
    """`rows` snapshot rows (less than one snapshot short at most): groups of
    `partitions_per_group` partitions with about `snapshots_per_group`
    snapshots each (jitter and gaps vary it), cycling through the scenarios,
    in files of about `rows_per_file` rows. Returns the rows written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lagdoctor.contracts import snapshot_arrow_schema

    rng = np.random.default_rng(seed)
    schema = snapshot_arrow_schema()
    names = list(CLASSIC_SCENARIOS)
    directory = os.path.join(path, f"cluster={cluster}", f"date={start:%Y-%m-%d}")
    os.makedirs(directory, exist_ok=True)
    written, file_no, writer, writer_rows, g = 0, 0, None, 0, 0
    window = snapshots_per_group * interval_seconds
    try:
        while written < rows - partitions_per_group + 1:
            if writer is None or writer_rows >= rows_per_file:
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(os.path.join(directory, f"part-{file_no:04d}.parquet"), schema,
                                          compression="zstd")
                file_no += 1
                writer_rows = 0
            name = names[g % len(names)]
            table, _ = simulate_group(rng, name, cluster, f"{name}-{g}", f"events-{g % 50}", start,
                                      n_partitions=partitions_per_group, window_seconds=window,
                                      interval=interval_seconds)
            g += 1
            room = (rows - written) // partitions_per_group * partitions_per_group  # whole snapshots only
            if table.num_rows > room:
                table = table.slice(0, room)
            writer.write_table(table)
            writer_rows += table.num_rows
            written += table.num_rows
    finally:
        if writer is not None:
            writer.close()
    return written


# -- scoring: the engine's answers against the labels ------------------------------


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def score(labels: list[dict], findings: Iterable[dict], partitions: Iterable[dict] = ()) -> dict[str, Any]:
    """Compare findings (cluster, group_id, topic, diagnosis, pattern) and
    partition features (cluster, group_id, topic, partition, time_lag_seconds)
    with the labels. A (group, topic) is right when its set of diagnoses equals
    the true set exactly (a miss and an extra both count as wrong)."""
    import collections

    key = lambda r: (r["cluster"], r["group_id"], r["topic"])  # noqa: E731
    got, pattern = collections.defaultdict(set), {}
    for f in findings:
        got[key(f)].add(f["diagnosis"])
        pattern[key(f)] = f["pattern"]
    time_lag = {(*key(p), str(p["partition"])): p["time_lag_seconds"] for p in partitions}
    hits, totals, false_alarms = collections.Counter(), collections.Counter(), collections.Counter()
    p_hits, p_totals = collections.Counter(), collections.Counter()
    by_condition: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    wrong, errors = [], collections.defaultdict(list)
    confusion: collections.Counter = collections.Counter()  # (true pattern, engine's) when they differ
    for lab in labels:
        k, truth = key(lab), set(lab["diagnoses"])
        right = got[k] == truth
        cond = by_condition[lab.get("condition", "baseline")]
        cond["units"] += 1
        cond["right"] += right
        for d in truth:
            totals[d] += 1
            hits[d] += right
        for d in got[k] - truth:
            false_alarms[d] += 1
        if not right:
            wrong.append((lab.get("condition"), lab["scenario"], k, sorted(truth), sorted(got[k])))
        if lab["pattern"] is not None:
            ok = pattern.get(k) == lab["pattern"]
            if not ok:
                confusion[(lab["pattern"], pattern.get(k))] += 1
            p_totals[lab["pattern"]] += 1
            p_hits[lab["pattern"]] += ok
            cond["patterns"] += 1
            cond["pattern_right"] += ok
        for p, truth_s in lab.get("true_time_lag_seconds", {}).items():
            seen = time_lag.get((*k, p))
            if truth_s <= 0 or seen is None:
                continue
            where = "beyond" if lab["beyond_window"][p] else "in"
            how = "record" if lab.get("record_ts_at_end", {}).get(p) else "interpolated"
            errors[(where, how)].append(abs(seen - truth_s))
            cond["tl_" + where] += 1
    return {"hits": hits, "totals": totals, "false_alarms": false_alarms, "pattern_hits": p_hits,
            "pattern_totals": p_totals, "by_condition": dict(by_condition), "wrong": wrong,
            "time_lag_errors": dict(errors), "units": len(labels), "pattern_confusion": confusion}


def score_text(result: dict[str, Any]) -> str:
    """The score as the plain-text tables the bench prints."""
    from lagdoctor.contracts import DIAGNOSES

    hits, totals = result["hits"], result["totals"]
    right = sum(c["right"] for c in result["by_condition"].values())
    lines = [f"causes: {right}/{result['units']} (group, topic) units with exactly the true set = "
             f"{right / max(result['units'], 1):.4f}",
             f"  {'diagnosis':20s} {'right':>11s} {'accuracy':>8s}  false alarms"]
    for d in DIAGNOSES:
        if totals[d]:
            lines.append(f"  {d:20s} {hits[d]:5d}/{totals[d]:5d} {hits[d] / totals[d]:8.4f}  {result['false_alarms'][d]}")
    ph, pt = result["pattern_hits"], result["pattern_totals"]
    lines.append(f"patterns: {sum(ph.values())}/{sum(pt.values())} = {sum(ph.values()) / max(sum(pt.values()), 1):.4f}")
    for p in sorted(pt):
        lines.append(f"  {p:20s} {ph[p]:5d}/{pt[p]:5d} {ph[p] / pt[p]:8.4f}")
    lines.append(f"  {'condition':18s} {'units':>5s} {'causes':>7s} {'patterns':>8s}")
    for name, c in result["by_condition"].items():
        pat = f"{c['pattern_right'] / c['patterns']:8.4f}" if c["patterns"] else f"{'-':>8s}"
        lines.append(f"  {name:18s} {c['units']:5d} {c['right'] / c['units']:7.4f} {pat}")
    lines.append("time-lag error |job - truth| (s), lagging partitions:")
    for (where, how), errs in sorted(result["time_lag_errors"].items()):
        lines.append(f"  {where + ' window':14s} {how:12s} n={len(errs):5d}  median {_quantile(errs, 0.5):9.2f}"
                     f"  p90 {_quantile(errs, 0.9):9.2f}")
    return "\n".join(lines)
