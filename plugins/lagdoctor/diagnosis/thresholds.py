"""Tunable thresholds of the classifier: one frozen object, passed as a parameter.

Plain Python (no pyspark) so the Airflow side and the job's argument parser
share it. Every field can be overridden on the job's command line as
`--<field-name-with-dashes> VALUE`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Thresholds:
    # Severity (the seeds' defaults): warning at 1,000 and growing, critical
    # at 10,000 or when lag at least doubled over the window.
    warning_lag: int = 1_000
    critical_lag: int = 10_000
    # Lag "grows" when the fitted increase over the window is at least this
    # share of the end lag (protects against noise around a constant level).
    growth_fraction: float = 0.2

    # partition_imbalance: the smallest set of partitions holding
    # `imbalance_share` of the lag must be at most this fraction of them.
    imbalance_share: float = 0.8
    imbalance_max_partition_fraction: float = 0.34
    # ... and a hot partition falls clearly behind: late consume below
    # (1 - imbalance_behind_slack) x late produce (a partition a rebalance loop's
    # pauses left behind drains at close to its load, one that cannot keep up does not).
    imbalance_behind_slack: float = 0.15
    # A hot partition whose owner consumes less than this share of what arrives there
    # is partition_imbalance whatever the other partitions do (the seeds' case study:
    # 800 of 12,000 msg/s while the rest fall behind slowly is one owner's problem).
    imbalance_far_below_ratio: float = 0.5

    # producer_surge: late-window produce rate over early-window rate, topic-wide;
    # and on at least `surge_partition_fraction` of the partitions with traffic
    # by at least `surge_partition_ratio` (fewer is a hot key: partition_imbalance).
    # Consumers kept up before it (early consume >= surge_keepup_ratio x early produce).
    surge_ratio: float = 1.5
    surge_partition_ratio: float = 1.5
    surge_partition_fraction: float = 0.5
    surge_keepup_ratio: float = 0.9
    # ... or they now consume at least this many times the baseline's produce rate
    # (a ceiling well above the old load: they could keep up with it).
    surge_ceiling_ratio: float = 1.2
    # A lag this share below its window maximum is draining: consumers absorb what rose (a burst
    # at the one-minute sweep), not a producer_surge (rule case 32).
    draining_share: float = 0.25
    # A rise this young (from the last snapshot before it) is a burst or a surge's start: a burst its
    # consumers absorb rises for a minute or two and then drains. At a cadence that sees it again
    # within this time (the one-minute sweep) the surge waits for it, provisional (rule case 36).
    surge_min_seconds: float = 150.0
    # ... and so is a rise seen over fewer intervals than surge_min_seconds takes at the sweep's
    # cadence (a missed sweep stretched one), or one whose last interval rose at under this share of
    # its fastest (a burst ending), up to twice surge_min_seconds.
    burst_slowing_ratio: float = 0.33
    # "Before" is the baseline: the time before a partition's lag first passed this
    # share of its window maximum, preferably the part spanning `baseline_min_seconds`
    # without its last interval; shorter ones still count (a surge that began early in
    # the window leaves only a sample or two before it); the first third only when the
    # lag rose from the window's start. A surge's onset can fall anywhere in the window.
    baseline_lag_share: float = 0.02
    baseline_min_seconds: float = 60.0
    # Provisional (surge or slow?): no partition has such a baseline and the window's first third
    # spans less than baseline_min_seconds (the fallback baseline): nothing says whether consumers
    # had kept up before the lag grew. Decided once the window spans this many baseline_min_seconds.
    provisional_baseline_thirds: int = 3

    # slow_consumer: share of partitions consuming below their produce rate,
    # and how far below counts (consume < (1 - slack) * produce).
    slow_partition_fraction: float = 0.5
    slow_rate_slack: float = 0.05
    # A climb is "steady" when a straight line explains it (R^2).
    steady_r2: float = 0.6

    # stalled_consumer: committed offset not advanced for this long and this
    # many snapshots, and for longer than `stall_gap_factor` times the longest
    # commit gap seen earlier in the window (so batch committers stay healthy).
    stall_min_seconds: float = 120.0
    stall_min_snapshots: int = 3
    stall_gap_factor: float = 2.0
    # "Near-frozen": still committing, but less than this share of what arrives (over the
    # last third, or, for a consumer that kept up before, over the last stall_min_seconds: 33).
    near_frozen_ratio: float = 0.05
    # ... or stuck again and again: at least this many commit runs, each as long as
    # the stall rule asks, after which the backlog stayed (a staircase of stuck records).
    stuck_episodes_min: int = 2
    # Provisional (stalled or imbalanced?): a hot partition's commit has stood still at the last
    # snapshots, with data waiting, for at least this share of stall_min_seconds (or after one stuck
    # episode already), too short to call it stuck. 0: as soon as two snapshots show it still: a
    # sweep's first samples after a consumer got stuck span 10-20 s, and a confident "imbalance"
    # there was the wrong first post the live lab saw; a slow owner's commit moves, and decides it.
    provisional_frozen_share: float = 0.0
    # Rule case 38: a window in which no commit moved on any partition says nothing of how often
    # the group commits (unknown, not zero): a batch committer between commits reads as stalled.
    # Its findings are provisional against healthy until a commit moves or the window spans this
    # long without one (or a partition's time lag already exceeds it: its position is older).
    commit_cadence_unknown_seconds: float = 600.0

    # History (rule case 28): a group with fewer snapshots than this in the window is
    # collecting_history, no verdict: a rate needs 2 snapshots and a climb's fit 3 (two always
    # fit a line: rule 26). Only crashed_consumer, which needs no rate, is called sooner.
    min_history_snapshots: int = 3
    # The least time between snapshots assumed to say when such a group decides: the sweep's
    # default cadence (a run a minute). A slower cadence measured over the window counts; a faster
    # one (a sweep's own samples, 10 s apart) does not: the next snapshot comes with the next sweep.
    history_interval_seconds: float = 60.0

    # rebalance_loop: rebalances (entering one from a settled assignment, or owner ids coming and going) in
    # the window.
    rebalance_loop_min: int = 3

    # A group with no members whose commits still advanced between this many
    # pairs of memberless snapshots is consumed outside the group protocol
    # (assign(): Flink, Spark, custom consumers), not crashed. One advance can
    # be a person resetting offsets.
    memberless_commit_min: int = 2

    # Pattern: below this lag, or below this many seconds of production, the
    # shape is noise and reads as flat (a busy topic's healthy lag is seconds
    # of production, however many messages that is).
    pattern_min_lag: int = 100
    pattern_min_seconds: float = 60.0

    # How many most recent snapshots per partition feed the Burrow evaluator,
    # and the lag it tolerates (Burrow's allowed_lag).
    status_window: int = 10
    status_allowed_lag: int = 0

    # Offset reset: a committed offset above the log end offset by more than
    # this, and by more than `reset_race_seconds` of the partition's
    # production, is not the race between the two reads (contract 1) but a
    # log that restarted below the group's position (topic recreated).
    reset_commit_slack: int = 1_000
    reset_race_seconds: float = 10.0

    # Forecasts (forecast.py, cases F1-F3). A partition's lag is real, not noise, above
    # forecast_noise_seconds of its own late produce rate and above forecast_min_lag: a group
    # that keeps up shows up to a commit interval of records (auto.commit.interval.ms is 5 s)
    # plus the read race, and a quiet topic a few in-flight records; lag 0-8 at 13 msg/s a
    # partition flipped data-loss and catch-up forecasts sweep to sweep (seen live).
    forecast_noise_seconds: float = 10.0
    forecast_min_lag: int = 10
    # Data loss is at risk only when it comes sooner than the topic's retention.ms and this
    # (Kafka's default retention): a forecast months out at current rates is no forecast.
    forecast_max_horizon_seconds: float = 7 * 86_400.0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_overrides(cls, overrides: dict[str, object]) -> "Thresholds":
        """Build from {field: value}, converting each value to the field's type."""
        base = cls()
        values = {}
        for f in fields(cls):
            if f.name in overrides and overrides[f.name] is not None:
                kind = type(getattr(base, f.name))
                values[f.name] = kind(overrides[f.name])
        return cls(**values)
