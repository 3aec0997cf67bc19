"""Diagnoses: features -> findings (contract 2), as Spark SQL expressions.

The rule table ("the correctness proof"), evaluated per (cluster, group, topic);
every rule that holds yields a finding, none -> one `healthy` finding:

 #  diagnosis            holds when                                              why
 1  crashed_consumer     state at the end is EMPTY/DEAD or group_members == 0,    nobody consumes; null members
                         and lag > 0                                              (unknown membership) never counts
 2  rebalance_loop       not 1; rebalances (entering a rebalance from a settled   one rebalance is a deploy,
                         assignment (20), or owner ids coming and going, each     several are a loop
                         id one (29), the larger of the two)
                         >= rebalance_loop_min
 3  stalled_consumer     not 1; some partition has lag > 0 and its committed       a stuck message or hung handler;
                         offset has not advanced for stall_min_seconds and        the gap rule keeps batch
                         stall_min_snapshots and > stall_gap_factor x its         committers healthy
                         longest earlier commit gap, or advances at less than
                         near_frozen_ratio of what arrives (in the last third,
                         or, having kept up before, in the last
                         stall_min_seconds: 33), or it stood still                a staircase of stuck records (the
                         that long >= stuck_episodes_min times while owned,       seeds' 0 -> 1000 -> 1000 -> 2000):
                         settled and with data waiting, each time leaving at      a batch commit clears its backlog,
                         least half its backlog when it moved on (22)             getting past a stuck record does not
 4  partition_imbalance  not 1; >= 2 partitions; the smallest set holding         hot key or one slow owner;
                         imbalance_share of the lag is at most                    stalled partitions belong to 3;
                         imbalance_max_partition_fraction of them and has a       a draining one is recovering
                         partition that is not stalled and still falls behind     (an absorbed burst); one owner far
                         (late consume < (1 - imbalance_behind_slack) x late      below its load is one consumer's
                         produce; not draining, 32); not 13, unless such a hot    problem whatever the others do (the
                         partition's owner consumes < imbalance_far_below_ratio   seeds' case study: 800 of 12,000
                         x what arrives there; lag >= warning_lag                 msg/s, 87% of the lag)
 5  producer_surge       not 1, 2; late produce rate (or the rate since the lag   consumers that kept up, outpaced by
                         rose, 31) >= surge_ratio x the baseline (the rate        new load (the onset can be anywhere
                         before the lag began to grow, 23); lag growing (26)      in the window)
                         over two intervals at least, not draining (32) and
                         >= warning_lag; neither 11 nor 12
 6  slow_consumer        not 1, 2, 4, 5; produce steady; most non-stalled         capacity below a steady load
                         partitions consume below produce (26) and, since their
                         lag rose, below the window's average produce (32);
                         with rebalances in the window, behind while settled
                         too (30); lag climbs steadily (growing, R^2 >=
                         steady_r2, 26; or growing with its backlog never
                         cleared, 34) and >= warning_lag

Cases that change what the rules above may conclude (the data, not the lag,
is the problem):

 #  case                 holds when                                              so
 7  incomplete data      a row of the topic at its last snapshot (or the group's  the finding keeps the diagnosis the
                         topic-less row at the group's last snapshot) carries     known data supports, with
                         read_error, or a partition's lag at the end is unknown   data_complete false, severity at
                                                                                  least warning and a summary that
                                                                                  starts "Incomplete data:" with the
                                                                                  count of failed reads: a failed
                                                                                  read never reads as "lag 0,
                                                                                  healthy" (no false recovery)
 8  unknown lag           a partition's last lag is null because its read failed  its lag is the last known one; the
                                                                                  rules never take it for caught up
                                                                                  (null is not 0)
 9  group unreadable      the group is known only by its topic-less row           one finding, topic "", saying its
                         (topic "", partition -1: the group-level read failed)    offsets could not be read; when
                                                                                  the group has topics, the row
                                                                                  makes their findings incomplete
                                                                                  (7) and gets none of its own; with
                                                                                  group_id "" the group listing failed:
                                                                                  the finding says groups may be missing
10  offset reset          a partition's log end offset fell within the window     rates and lag count from the last
                         (topic recreated or truncated), or its commit is above   fall; offset_reset_partitions
                         the log end by more than the read race explains          names both, log_end_fell_ and
                         (reset_commit_slack, reset_race_seconds)                 commit_above_partitions each; at
                                                                                  least warning; the summary says
                                                                                  which: "went backwards" only for a
                                                                                  fall; "committed offset N is above
                                                                                  the log end M" for the other (topic
                                                                                  recreated before the window, offsets
                                                                                  set by hand: the log end need not
                                                                                  move), lag 0 by contract 1 but not
                                                                                  health: no "consumers keep up"

Cases that sharpen the causes (issue 10; each measured by bench/accuracy_bench.py):

 #  case                 holds when                                              so
11  hot key              the produce rate rose (late >= surge_partition_ratio x  a rise on a few partitions is
                         baseline) on at most surge_partition_fraction of the    partition_imbalance (4), never
                         partitions with traffic                                 producer_surge: scaling consumers
                                                                                 does not help a hot key
12  diurnal traffic      consumers fell behind already in the baseline           a rate swinging 3x in the window
                         (its consume < surge_keepup_ratio x its produce) and    is not a surge: a slow consumer
                         do not now consume surge_ceiling_ratio x its produce,
                         or they keep up in the last third (late consume >=      stays 6, a group that keeps up
                         (1 - slow_rate_slack) x late produce)                   stays healthy (5 needs neither)
13  uneven slow          the partitions outside the hot set are mostly slow      lag unevenly spread over slow
                         too (slow >= slow_partition_fraction of them) and no    partitions is 6, not 4; a partition
                         hot owner is far below its load (4), or the hot         a loop's pauses left behind drains
                         partition consumes >= (1 - imbalance_behind_slack) x    near its load: 2 only, not 4
                         its late produce
14  sweep cadence        one sample a minute (the sweep's default, issue 20), or  2 still holds: owner ids change
                         3 samples 10 s apart every 5 minutes (a slower          between sweeps; at 5 minutes the
                         schedule): rebalances show as owner-id changes          pattern of steps blurs into
                         between sweeps, rarely as a state                       steady_climb
15  early third unknown  no two snapshots in the first third (5-minute cadence   early rates are null, not 0: no
                         with a missed sweep)                                    surge from "0 -> N msg/s"
16  mixed causes         rules hold independently (stalled partitions and a      one finding per rule that holds
                         rebalance loop; a slow owner and a loop)                (the truth is a set)

Cases from the seeds (issue 18; ../shared/seeds: the seven patterns, the case study):

 #  case                 holds when                                              so
22  stuck staircase      see 3: commit runs of stall length that leave their     3, not 4 or 6: the lag a stuck
                         backlog, again and again; a run during a rebalance      partition piles up step by step is
                         (unowned or rebalancing) or with lag 0 is not one       a stuck record's, not a slow owner's
23  baseline             a partition's rows before its lag first passed          "before" for 5, 11 and 12 is when the
                         baseline_lag_share of its window maximum, when they     consumers still kept up, wherever
                         span baseline_min_seconds (shorter ones still count     the rise starts; a surge older than
                         when there are any; else the first third)               most of the window is still one
26  since the rise       the rates and the climb are also judged over the rows   a consumer that slowed a minute ago
                         since the lag began to rise (23's "risen", with the     is called at the next sweep, not
                         row before it; 3 rows at least for the fit): consume    once a third of the window follows
                         below produce there, or a fitted rise since then        the onset; a lag that rose from the
                         >= growth_fraction of the lag with R^2 >= steady_r2,    window's start is judged as before
                         counts as the window's does
27  surge older than     5 holds in the previous run (decided), this window has  5 still holds: a surge that outlasts
    the window           no baseline of its own (no partition's lag was below    the window left no rows from before
                         23's share in it) and the previous run's data reaches   it, and the rates alone would read
                         into this window: its baseline is carried (evidence     as a slow consumer (a flip)
                         baseline_source "previous run"); the rise is taken as
                         topic-wide, as it was when it was seen

Cases from the one-minute sweep (issue 29; bench/accuracy_bench.py --latency, one sample a minute):

 #  case                 holds when                                              so
29  owner ids between    owner ids came or went between two snapshots: each id   a member that rejoined under a new id
    sweeps               that came and each that went is one membership change   between two one-minute sweeps is a
                         (20), counted from the owner set's 64-bit signature      leave and a join: counting changes
                         (ids sharing a bit count once; a changed set, one at     of the set saw half the rebalances
                         least); static instance ids as in 19                     (a loop named a rebalance later)
30  a loop's steps       rebalances in the window (fewer than 2 needs): the       not 6 unless the group also falls
                         intervals in which one ran (20) or owner ids changed     behind while settled (the window or
                         (29) are unsettled, commits stall during each; 6 then    since the lag rose): the lag a loop's
                         also needs consume < (1 - slow_rate_slack) x produce     pauses added, read as a climb, was
                         summed over the settled intervals                        named slow_consumer until rule 2 held
31  surge since the rise the rates since each partition's lag began to rise      5 at the sweep after the onset: a
                         (26's rows; the last third where it never rose) sum     surge a minute old hardly moves the
                         to >= surge_ratio x a baseline from before the rise      last third's rates, and the rise
                         (23; carried, 27) and outpace the consumers; a           read as slow_consumer first; the
                         partition rose when they are >= surge_partition_ratio    summary gives the rates it judged;
                         x its baseline (11)                                      a lag that rose from the window's
                                                                                  start has no such baseline (12)
32  absorbed burst       the lag at the end is below (1 - draining_share) x its  not 5 (and a surge's lag rose over
                         window maximum or fell over the last interval (5; a      two intervals at least): consumers
                         hot partition's own, 4); a partition consumes, since     absorb what rose; not 4 on the
                         its lag rose, >= (1 - slow_rate_slack) x the window's    partitions slowest to drain; not 6:
                         average produce (6)                                      its lag came from arrivals above
                                                                                  the average, not a consumer below
                                                                                  it (a burst named a surge, slow or
                                                                                  imbalance in 11 of 250 sweeps)
33  trickle since        a partition that kept up before its lag rose (baseline  3 at the sweep stall_min_seconds
    recently             consume >= surge_keepup_ratio x produce) advanced, and   after it began to trickle, not once
                         by less than near_frozen_ratio of what arrived, over     the last third holds mostly the
                         its last stall_min_seconds and stall_min_snapshots       trickle (it read slow_consumer or
                         intervals, none unsettled (rebalancing, unowned)         partition_imbalance till then)
34  climb in waves       the lag grew over the window (growing) and never fell   6's climb: under a swinging load a
                         below growth_fraction of its end value (the backlog     slow consumer's lag rises in waves
                         never cleared)                                           no straight line fits (R^2 0.44-0.59
                                                                                  on a 20-minute 'day' at 16 of 20
                                                                                  msg/s: healthy at 11 of 16 sweeps);
                                                                                  a burst or a batch sawtooth clears
35  surge's backlog      the previous run decided 5 (its findings carried, no    5 still: the surge built the lag it
    draining             gap: 27's carried_t_end reaches this window) and the    drains; not 6 (a window of surge
                         lag is draining (32's test) at >= warning_lag, not 1    reads as consumers below the load)
                         or 2                                                    and not healthy while the backlog
                                                                                 stands (the live lab: "Cause
                                                                                 changed: producer surge -> slow
                                                                                 consumer" 4 minutes after the surge
                                                                                 ended, then "Recovered" at lag
                                                                                 243,421); the summary says the
                                                                                 backlog drains, the lag against
                                                                                 its peak (no rates: the window's
                                                                                 still hold the surge)
36  young rise           5 holds but the lag has risen at every snapshot for     5, provisional against healthy
                         less than surge_min_seconds (climb_span), or the load    (deciding_between [producer_surge,
                         rose >= surge_ceiling_ratio x the baseline, consumers   healthy]); never 6: a burst its
                         kept up before it and now fall behind, not draining,    consumers absorb rises as a surge
                         with the lag growing and >= warning_lag (a surge that   starts and drains within minutes
                         began mid-interval: its first sweep's rates are half    (at the onset: named a surge at 15
                         before it); and not 6 while the lag falls and the        of 171 one-minute sweeps, a slow
                         consumers take >= surge_ceiling_ratio x the load        consumer on a fresh deployment);
                         before the rise (a burst absorbed)                      Slack hears it only once decided
                                                                                 (notify.threads rule 12). Only at
                                                                                 a cadence whose next sweep comes
                                                                                 soon (mean interval <= 75 s, or
                                                                                 <= 4 snapshots): at 5 minutes
                                                                                 waiting costs a sweep. Young too:
                                                                                 a rise over fewer intervals than
                                                                                 surge_min_seconds takes at the
                                                                                 sweep's cadence (a missed sweep
                                                                                 stretched it), or one whose last
                                                                                 interval rose at under
                                                                                 burst_slowing_ratio of its fastest
                                                                                 (a burst ending; up to 2 x
                                                                                 surge_min_seconds)

37  young loop           owner ids came or went (or a rebalance began) in two     2, provisional against healthy
                         intervals or more, the last among them, fewer times     (deciding_between [rebalance_loop,
                         than rebalance_loop_min, and no other rule holds        healthy]): a loop's first minutes
                                                                                 read "consumers keep up" (the noise
                                                                                 lab's loop at its first verdict: 2
                                                                                 changes in 2 intervals); a member
                                                                                 restarting across a sweep looks the
                                                                                 same until a quiet interval; one
                                                                                 deploy (one interval) stays healthy;
                                                                                 Slack hears it only once decided

38  commit cadence      no commit moved on any partition in the window, which    3, 4, 5 or 6 provisional against
    unknown              spans less than commit_cadence_unknown_seconds (600 s),  healthy: how often the group
                         and no partition's time lag reaches it; not 1 or 18      commits is unknown, not zero: a
                                                                                 batch committer between commits
                                                                                 reads as stalled (a fresh
                                                                                 deployment or a new group: Slack
                                                                                 heard a cause at 28 of 259 of
                                                                                 the latency bench's sweeps with
                                                                                 2 minutes of history, tuning
                                                                                 seeds); its next commit decides,
                                                                                 or the window's length without
                                                                                 one; Slack hears it once decided

Cases the evidence cannot decide yet (issue 18): the finding keeps the leading diagnosis
with provisional true, deciding_between [it, the other], decided_by and samples_needed (the
first expected snapshot at which the rule's time and snapshot counts are met, from the
window's mean sampling interval) and undecided_because:

 #  case                 holds when                                              so
24  stalled or slow      4 holds on a hot partition whose commit stands still     4, deciding against 3: by then the
    owner                at the end with data waiting, for                        commit stood long enough (3) or
                         provisional_frozen_share x stall_min_seconds or after    moved (a slow owner: 4)
                         one stuck episode, and 3 does not hold yet
25  surge or slow        5 or 6 holds, no partition has baseline_min_seconds of   5 or 6, deciding against the other:
                         rows before its lag grew (23), and the window is         nothing says whether consumers had
                         shorter than provisional_baseline_thirds x               kept up before the lag grew
                         baseline_min_seconds (its first third is the fallback)

A forecast that changes severity (forecast.py):

 #  case                 holds when                                              so
17 data loss ahead      retention will delete records the group has not read     critical: waiting for the lag to
                         within the window's length (forecast.py: the log start   clear loses data; the estimate is
                         outruns consumption, or the time lag meets retention.ms) in evidence.data_loss, with
                                                                                  evidence.catch_up beside it; only
                                                                                  real lag and a horizon within
                                                                                  retention count (forecast.py F1-F3)

Real client behaviour (issue 16; each a live test on Apache Kafka):

 #  case                 holds when                                              so
18  assign() consumer    the group had no members at two snapshots in a row and  not 1: a consumer that assign()s its
                         its commits advanced between them, at least             partitions commits without joining
                         memberless_commit_min times in the window               (Flink, Spark, custom): EMPTY is its
                                                                                 normal state, no member list can
                                                                                 exist; it keeps up -> healthy, it
                                                                                 stops -> 3 (stalled), saying so
19  static membership    owners carry a group.instance.id                        owner churn counts instance ids, not
                                                                                 member ids: a static member that
                                                                                 restarts gets a new member id and no
                                                                                 rebalance, so a rolling restart is
                                                                                 not 2
20  incremental          a snapshot in a known state (not UNKNOWN) whose state   one membership change is one
    rebalance            is rebalancing, or whose group has live members and a   rebalance: cooperative-sticky's
                         partition nobody owns, is inside a rebalance; one is    revoke and assign rounds have a
                         counted where such a snapshot follows a settled one     STABLE generation between them
                         (every partition owned, not rebalancing); UNKNOWN (a    with the moved partitions unowned
                         failed read) neither starts nor ends one                (seen live), a KIP-848 group is
                                                                                 ASSIGNING then RECONCILING; a
                                                                                 topic nobody owns never settles
21  hanging transaction  a partition's last stable offset stood below its high   3 says so: the group read all a
                         watermark for stall_min_seconds and stall_min_snapshots  read_committed consumer may read;
                         and > stall_gap_factor x its longest earlier hold, and   the summary names the transaction,
                         the group's commit is at it                              not a stuck record (a skip or a
                                                                                 restart cannot help); other groups
                                                                                 list it in
                                                                                 hanging_transaction_partitions

Too little history (issue 29; `collecting_history_findings` below):

 #  case                 holds when                                              so
28  collecting history   the group's topic has fewer than min_history_snapshots  one finding, collecting_history,
                         snapshots in the window (not the group-level row, 9)    severity ok (warning under 7 or
                                                                                 10): "collecting history (1 of 3
                                                                                 snapshots; decides at 03:17 UTC)",
                                                                                 never healthy: a rate needs 2
                                                                                 snapshots, a climb's fit 3 (a
                                                                                 fresh deployment's first sweep read
                                                                                 "0.0 msg/s consumed of 0.0
                                                                                 produced, healthy" at lag 5,811);
                                                                                 evidence snapshots_seen,
                                                                                 snapshots_needed, decides_at (the
                                                                                 window's mean sampling interval, at
                                                                                 least history_interval_seconds);
                                                                                 with one snapshot every rate in the
                                                                                 evidence is null, never 0.0
    ... and 1 holds      1 needs no rate: still holds, its rate said as          provisional, deciding between
                         unknown, unless a commit moved between memberless       crashed_consumer and healthy until
                         snapshots (then 28)                                     decides_at: an assign() consumer
                                                                                 (18) has no members either and its
                                                                                 commits show only across snapshots
                                                                                 (the live lab's first sweep called
                                                                                 one crashed, "recovered" a minute
                                                                                 later)

"Growing": the fitted rise of lag over the window is positive and at least
growth_fraction of the end lag. Severity: critical at critical_lag or when a
growing lag >= warning_lag at least doubled; warning at warning_lag and
growing; else ok. A non-healthy finding is at least warning; healthy is ok
unless 7 or 10 holds (then warning).
"""

from __future__ import annotations

import math

from datetime import datetime

from lagdoctor.contracts import COLLECTING_HISTORY, INACTIVE_GROUP_STATES, LISTING_ROW_GROUP
from lagdoctor.diagnosis import forecast
from lagdoctor.diagnosis.features import GROUP_KEY
from lagdoctor.diagnosis.patterns import pattern_column
from lagdoctor.diagnosis.snapshots import GROUP_MARKER_PARTITION, GROUP_MARKER_TOPIC
from lagdoctor.diagnosis.thresholds import Thresholds

# Case 18: what a finding says of the owner of a partition consumed outside the group protocol.
OUTSIDE_OWNER = "a consumer outside the group protocol (it commits without joining: assign(); no member list can exist)"

# At most this many read errors are listed in a finding's evidence (all are counted).
MAX_READ_ERRORS = 10

_FOCUS_FIELDS = (
    "partition",
    "lag_end",
    "member_id",
    "client_id",
    "host",
    "consume_rate",
    "produce_rate",
    "late_consume_rate",
    "late_produce_rate",
    "time_lag_seconds",
    "time_lag_lower_bound",
    "time_lag_source",
    "frozen_seconds",
    "lag_onset_t",
    "committed_record",
    "log_end_offset_end",
    "last_stable_offset_end",
    "transaction_open_seconds",
    "blocked_by_transaction",
    "stuck_episodes",
)


# Rule case 27: what a run keeps of the previous run's surges.
CARRIED_COLUMNS = ("carried_produce", "carried_consume", "carried_t_end")


def carried_baselines(previous_findings):
    """The previous run's findings (contract 2 rows) -> per (cluster, group_id, topic) the
    baseline of its decided producer_surge findings and the end of the data it saw."""
    from pyspark.sql import functions as F

    e = F.col("evidence")
    surges = previous_findings.where(
        (F.col("diagnosis") == "producer_surge") & ~F.coalesce(F.col("provisional"), F.lit(False)))
    return surges.groupBy(*GROUP_KEY).agg(
        F.max(e["baseline_produce_rate"].cast("double")).alias("carried_produce"),
        F.max(e["baseline_consume_rate"].cast("double")).alias("carried_consume"),
        F.max(F.unix_micros(F.to_timestamp(e["data_end"])) / 1e6).alias("carried_t_end"),
    )


def partition_rollup(partition_feats, thresholds: Thresholds = Thresholds()):
    """Partition features -> one row per group: counts, the hot set, the worst partitions."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    th = thresholds
    by_lag = Window.partitionBy(*GROUP_KEY).orderBy(F.col("lag_end").desc(), F.col("partition").asc())
    before = by_lag.rowsBetween(Window.unboundedPreceding, -1)
    whole = Window.partitionBy(*GROUP_KEY)
    p = partition_feats.withColumns(
        {
            "group_lag": F.sum("lag_end").over(whole),
            "lag_before": F.coalesce(F.sum("lag_end").over(before), F.lit(0)),
        }
    )
    p = p.withColumns(
        {
            "lag_share": F.coalesce(F.try_divide(F.col("lag_end"), F.col("group_lag")), F.lit(0.0)),
            "in_hot": (F.col("group_lag") > 0) & (F.col("lag_before") < th.imbalance_share * F.col("group_lag")),
        }
    )
    # a hot partition that is draining (late consume above late produce, or its lag well below its
    # window maximum: 32) is recovering, not a problem
    draining = F.coalesce(F.col("lag_end") < (1.0 - th.draining_share) * F.col("lag_peak"), F.lit(False))
    behind = ~F.col("stalled") & ~draining & (
        F.col("late_consume_rate") < (1.0 - th.imbalance_behind_slack) * F.col("late_produce_rate")
    )
    focus = F.struct(*[F.col(c) for c in _FOCUS_FIELDS], F.col("lag_share"))
    # this partition's own load rose (rule 5: a surge is topic-wide, a few is a hot key)
    # (against its baseline: the load before its lag began to grow, wherever the rise starts)
    # (its rates since its lag began to rise, else the last third's: 31)
    recent_produce = F.coalesce(F.col("rise_produce_rate"), F.col("late_produce_rate"))
    recent_consume = F.coalesce(F.col("rise_consume_rate"), F.col("late_consume_rate"))
    rose = F.when(
        F.col("baseline_produce_rate") > 0,
        (F.col("late_produce_rate") >= th.surge_partition_ratio * F.col("baseline_produce_rate"))
        | (recent_produce >= th.surge_partition_ratio * F.col("baseline_produce_rate")),
    ).when(F.col("baseline_produce_rate") == 0, F.col("late_produce_rate") > 0)
    # the owner consumes a small share of what arrives: imbalance whatever the others do (rule 4)
    far_below = behind & (F.col("late_consume_rate") < th.imbalance_far_below_ratio * F.col("late_produce_rate"))
    # max_by over (lag, -partition): the worst partition, ties to the lowest number
    order = F.struct(F.col("lag_end"), -F.col("partition"))
    return p.groupBy(*GROUP_KEY).agg(
        F.count(F.lit(1)).alias("partition_count"),
        F.sum("lag_end").alias("partition_lag_sum"),
        F.sum("produce_rate").alias("produce_rate"),
        F.sum("consume_rate").alias("consume_rate"),
        F.sum("early_produce_rate").alias("early_produce_sum"),
        F.sum("early_consume_rate").alias("early_consume_sum"),
        F.sum("late_produce_rate").alias("late_produce_sum"),
        F.sum("late_consume_rate").alias("late_consume_sum"),
        F.sum(recent_produce).alias("rise_produce_sum"),
        F.sum(recent_consume).alias("rise_consume_sum"),
        F.sum("baseline_produce_rate").alias("baseline_produce_sum"),
        F.sum("baseline_consume_rate").alias("baseline_consume_sum"),
        F.count(F.when(F.col("in_hot") & far_below, 1)).alias("far_hot_count"),
        F.count(F.when((F.col("early_produce_rate") > 0) | (F.col("late_produce_rate") > 0), 1)).alias(
            "busy_count"
        ),
        F.count(F.when(F.col("slow") & ~F.col("in_hot"), 1)).alias("slow_outside_hot"),
        F.count(F.when(rose, 1)).alias("surging_count"),
        F.max("time_lag_seconds").alias("max_time_lag_seconds"),
        F.count(F.when(F.col("stalled"), 1)).alias("stalled_count"),
        F.array_sort(F.collect_list(F.when(F.col("stalled"), F.col("partition")))).alias("stalled_partitions"),
        F.count(F.when(F.col("slow"), 1)).alias("slow_count"),
        F.array_sort(F.collect_list(F.when(F.col("slow"), F.col("partition")))).alias("slow_partitions"),
        F.count(F.when(F.col("in_hot"), 1)).alias("hot_count"),
        F.sum(F.when(F.col("in_hot"), F.col("lag_end"))).alias("hot_lag"),
        F.array_sort(F.collect_list(F.when(F.col("in_hot") & behind, F.col("partition")))).alias("hot_partitions"),
        F.array_sort(F.collect_list(F.when(F.col("retention_loss"), F.col("partition")))).alias(
            "retention_loss_partitions"
        ),
        # hot partitions that may be stalled rather than slow: not decided yet (provisional)
        F.array_sort(F.collect_list(F.when(F.col("in_hot") & behind & F.col("stall_pending"), F.col("partition")))
                     ).alias("stall_pending_partitions"),
        F.max(F.when(F.col("in_hot") & behind & F.col("stall_pending"), F.col("stall_decided_t"))).alias(
            "stall_decided_t"),
        F.max(F.when(F.col("in_hot") & behind & F.col("stall_pending"), F.col("stall_samples_needed"))).alias(
            "stall_samples_needed"),
        F.max_by(F.col("frozen_seconds"), F.when(F.col("in_hot") & behind & F.col("stall_pending"), order)).alias(
            "pending_frozen_seconds"),
        F.count(F.when(((F.col("early_produce_rate") > 0) | (F.col("late_produce_rate") > 0))
                       & F.col("baseline_known"), 1)).alias("baseline_known_count"),
        F.max_by(focus, order).alias("worst"),
        F.max_by(focus, F.when(F.col("stalled"), order)).alias("worst_stalled"),
        F.max_by(focus, F.when(F.col("in_hot") & behind, order)).alias("worst_hot"),
        F.max("t_last").alias("topic_t_last"),
        F.count(F.when(F.col("read_error").isNotNull(), 1)).alias("partition_read_error_count"),
        F.array_sort(F.collect_list(F.when(F.col("read_error").isNotNull(), F.struct("partition", "read_error")))).alias(
            "partition_read_errors"
        ),
        F.array_sort(F.collect_list(F.when(F.col("lag_end_unknown"), F.col("partition")))).alias(
            "lag_unknown_partitions"
        ),
        F.array_sort(F.collect_list(F.when(F.col("offset_reset"), F.col("partition")))).alias(
            "offset_reset_partitions"
        ),
        # case 10's two halves, said apart: a log end that fell, a commit above the log end
        F.array_sort(F.collect_list(F.when(F.col("offset_reset_t").isNotNull(), F.col("partition")))).alias(
            "log_end_fell_partitions"
        ),
        F.array_sort(F.collect_list(F.when(F.col("commit_above"), F.col("partition")))).alias(
            "commit_above_partitions"
        ),
        F.max_by(F.struct("partition", "committed_end", "log_end_offset_end"),
                 F.when(F.col("commit_above"), F.col("committed_end") - F.col("log_end_offset_end"))).alias(
            "commit_above_worst"
        ),
        F.array_sort(F.collect_list(F.when(F.col("hanging_transaction"), F.col("partition")))).alias(
            "hanging_transaction_partitions"
        ),
        F.array_sort(F.collect_list(F.when(F.col("blocked_by_transaction"), F.col("partition")))).alias(
            "transaction_blocked_partitions"
        ),
        *forecast.rollup_columns(),
    )


def _is_group_marker(topic, partition):
    from pyspark.sql import functions as F

    return (topic == F.lit(GROUP_MARKER_TOPIC)) & (partition == F.lit(GROUP_MARKER_PARTITION))


def group_read_state(partition_feats):
    """One row per (cluster, group_id): has_topics (rows for real topics), and
    group_read_error: the group-level failure row's error when that row is at
    the group's last snapshot (a failure earlier in the window is history)."""
    from pyspark.sql import functions as F

    marker = _is_group_marker(F.col("topic"), F.col("partition"))
    return partition_feats.groupBy("cluster", "group_id").agg(
        F.max(~marker).alias("has_topics"),
        F.max("t_last").alias("group_t_last"),
        F.max_by(F.when(marker, F.col("read_error")), F.when(marker, F.col("t_last"))).alias("marker_error"),
        F.max(F.when(marker, F.col("t_last"))).alias("marker_t_last"),
    ).select(
        "cluster",
        "group_id",
        "has_topics",
        F.when(F.col("marker_t_last") >= F.col("group_t_last"), F.col("marker_error")).alias("group_read_error"),
    )


def _num(col, digits_small: int = 1):
    """12,000 / 800 / 2.5: thousands separators, a decimal only below 10."""
    from pyspark.sql import functions as F

    return F.when(F.abs(col) < 10, F.format_number(col, digits_small)).otherwise(F.format_number(col, 0))


def _count(col):
    """A count of messages: 4, 12,000; never "4.0" (a partial sum of lags is a double)."""
    from pyspark.sql import functions as F

    return F.format_number(col, 0)


def _duration(seconds):
    """90 -> 1m30s, 4000 -> 1h06m, 12 -> 12s."""
    from pyspark.sql import functions as F

    s = F.round(seconds).cast("long")
    return (
        F.when(s < 60, F.format_string("%ds", s))
        .when(s < 3600, F.format_string("%dm%02ds", F.floor(s / 60).cast("long"), (s % 60)))
        .otherwise(F.format_string("%dh%02dm", F.floor(s / 3600).cast("long"), F.floor((s % 3600) / 60).cast("long")))
    )


def _partitions_text(arr):
    from pyspark.sql import functions as F

    return F.when(F.size(arr) == 1, F.concat(F.lit("partition "), F.array_join(arr, ", "))).otherwise(
        F.concat(F.lit("partitions "), F.array_join(arr, ", "))
    )


def _owner_text(focus):
    """`consumer-2 on 10.0.1.15`; when no member is named, say whether the
    partition is unassigned or the broker just did not list the members."""
    from pyspark.sql import functions as F

    unknown = F.col("group_members").isNull()
    member = F.coalesce(
        focus["member_id"],
        F.when(F.col("is_outside"), F.lit(OUTSIDE_OWNER))
        .when(unknown, F.lit("unknown (the broker lists no members)"))
        .otherwise(F.lit("nobody (unassigned)")),
    )
    return F.when(focus["host"].isNotNull(), F.concat(member, F.lit(" on "), focus["host"])).otherwise(member)


def findings(
    partition_feats,
    group_feats,
    thresholds: Thresholds = Thresholds(),
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    carried=None,
):
    """(partition features, group features) -> findings rows (contract 2 fields).

    `evidence` is a struct with the same fields in every finding; `partitions`
    lists the partitions the finding is about (empty for whole-topic findings).
    window_start/window_end default to each group's first/last snapshot; a Column of epoch
    microseconds gives each row its own (a backtest's sweeps, lagdoctor.diagnosis.replay).
    `carried`: the previous run's surges (``carried_baselines``), rule case 27.
    """
    from pyspark.sql import functions as F

    th = thresholds
    c = F.col
    g = group_feats.join(partition_rollup(partition_feats, th), list(GROUP_KEY), "left")
    g = g.join(F.broadcast(group_read_state(partition_feats)), ["cluster", "group_id"], "left")
    # 27: a surge older than the window keeps the baseline the run that saw it begin measured
    if carried is not None:
        g = g.join(F.broadcast(carried), list(GROUP_KEY), "left")
    else:
        g = g.withColumns({name: F.lit(None).cast("double") for name in CARRIED_COLUMNS})
    use_carry = (c("carried_produce") > 0) & (F.coalesce(c("baseline_known_count"), F.lit(0)) == 0) & (
        c("carried_t_end") >= c("t_first"))
    g = g.withColumn("baseline_carried", F.coalesce(use_carry, F.lit(False)))
    g = g.withColumns({
        "baseline_produce_sum": F.when(c("baseline_carried"), c("carried_produce")).otherwise(c("baseline_produce_sum")),
        "baseline_consume_sum": F.when(c("baseline_carried"), c("carried_consume")).otherwise(c("baseline_consume_sum")),
    })
    is_marker = c("topic") == GROUP_MARKER_TOPIC  # the group-level failure row's own key
    # the group-level row is a finding of its own only when nothing else is known of the group
    g = g.where(~is_marker | ~F.coalesce(c("has_topics"), F.lit(False)))
    group_error = F.when(~is_marker, c("group_read_error"))
    error_lines = F.transform(
        c("partition_read_errors"),
        lambda e: F.when(e["partition"] == GROUP_MARKER_PARTITION, F.concat(F.lit("group: "), e["read_error"]))
        .otherwise(F.format_string("partition %d: %s", e["partition"], e["read_error"])),
    )
    g = g.withColumns(
        {
            "read_error_count": F.coalesce(c("partition_read_error_count"), F.lit(0))
            + F.when(group_error.isNotNull(), 1).otherwise(0),
            "read_error_lines": F.concat(
                F.when(group_error.isNotNull(), F.array(F.concat(F.lit("group: "), group_error))).otherwise(
                    F.array().cast("array<string>")
                ),
                F.coalesce(error_lines, F.array().cast("array<string>")),
            ),
        }
    )
    g = g.withColumn(
        "data_complete",
        (c("read_error_count") == 0) & (F.size(F.coalesce(c("lag_unknown_partitions"), F.array())) == 0),
    )
    g = g.withColumn("pattern", pattern_column(th))

    # Incomplete: the partitions' last known lags, not a total that left the unknown ones out.
    lag = F.when(c("data_complete"), c("lag_end")).otherwise(F.coalesce(c("partition_lag_sum"), c("lag_end")))
    growing = (c("lag_growth") > 0) & (c("lag_growth") >= th.growth_fraction * lag)
    # a steady climb over the window, or since the lag began to rise (3 rows at least: two
    # always fit a line), so a consumer that slowed a minute ago is called at the next sweep
    rising = (c("rise_snapshots") >= 3) & (c("rise_growth") > 0) & (c("rise_growth") >= th.growth_fraction * lag)
    climbing = (growing & (c("lag_r2") >= th.steady_r2)) | (rising & (c("rise_r2") >= th.steady_r2))
    # 34: or it grew and its backlog never cleared (it stayed above growth_fraction of the end lag): under a
    # swinging load a slow consumer's lag climbs in waves that no straight line fits
    climbing = climbing | (growing & (c("lag_min") >= th.growth_fraction * lag))
    inactive = c("group_state").isin(list(INACTIVE_GROUP_STATES)) | (F.coalesce(c("group_members"), F.lit(-1)) == 0)
    # a rise over the baseline (the load before the lag began to grow), not over the first third:
    # a surge that starts early in the window leaves no first third without it
    surge_ratio = F.try_divide(c("late_produce_sum"), c("baseline_produce_sum"))
    surging = F.when(c("baseline_produce_sum") > 0, surge_ratio >= th.surge_ratio).otherwise(
        c("late_produce_sum") > 0
    )
    # 31: the same since the lag began to rise: a surge a minute old hardly moves the last third's rates
    rise_surge_ratio = F.try_divide(c("rise_produce_sum"), c("baseline_produce_sum"))
    # (against a baseline from before the rise: a lag that rose from the window's start has none, and its
    # first third is part of the rise, 12's diurnal swing among them)
    surging_since = F.coalesce((rise_surge_ratio >= th.surge_ratio)
                               & ((c("baseline_known_count") > 0) | c("baseline_carried")), F.lit(False))
    # 32: the lag fell well below its window maximum: consumers are absorbing what rose (a burst)
    # (or it fell over the last interval); and a surge persists: the lag rose over two intervals at least
    draining = F.coalesce((c("lag_end") < (1.0 - th.draining_share) * c("lag_max")) | (c("lag_last_change") < 0),
                          F.lit(False))
    persists = c("rise_snapshots") >= 3
    # 30: with rebalances in the window, a slow consumer also falls behind while the group is settled (over
    # the window or since the lag rose); a lag gained only in the rebalances is a loop's steps
    behind_settled = F.coalesce(
        (c("settled_consumed") < (1.0 - th.slow_rate_slack) * c("settled_produced"))
        | (c("rise_settled_consumed") < (1.0 - th.slow_rate_slack) * c("rise_settled_produced")), F.lit(False))
    max_hot = F.greatest(F.lit(1), F.floor(c("partition_count") * th.imbalance_max_partition_fraction))
    nonstalled = c("partition_count") - c("stalled_count")

    # 18: commits that advance without members come from a consumer outside the group protocol.
    outside = F.coalesce(c("memberless_commit_advances"), F.lit(0)) >= th.memberless_commit_min
    crashed = inactive & (lag > 0) & ~outside
    loop = ~crashed & (c("rebalances") >= th.rebalance_loop_min)
    stalled = ~crashed & (c("stalled_count") >= 1)
    imbalance = (
        ~crashed
        & (c("partition_count") >= 2)
        & (c("hot_count") <= max_hot)
        & (F.size("hot_partitions") >= 1)
        # the others keep up: most of them are not slow (else it is 6, with uneven lag), unless a hot
        # partition's owner consumes far below what arrives there: then it is this whatever the others do
        & ((c("slow_outside_hot") < th.slow_partition_fraction * (c("partition_count") - c("hot_count")))
           | (c("far_hot_count") >= 1))
        & (lag >= th.warning_lag)
    )
    # (a carried baseline is a group sum: the run that carried it saw the rise topic-wide)
    widespread = (c("surging_count") > th.surge_partition_fraction * c("busy_count")) | c("baseline_carried")
    # kept up in the baseline, or they now consume well above its rate (so they could have)
    kept_up_before = (c("baseline_consume_sum") >= th.surge_keepup_ratio * c("baseline_produce_sum")) | (
        c("late_consume_sum") >= th.surge_ceiling_ratio * c("baseline_produce_sum")) | (
        c("rise_consume_sum") >= th.surge_ceiling_ratio * c("baseline_produce_sum"))
    outpaced = c("late_consume_sum") < (1.0 - th.slow_rate_slack) * c("late_produce_sum")
    outpaced_since = c("rise_consume_sum") < (1.0 - th.slow_rate_slack) * c("rise_produce_sum")
    surge_signs = (
        ~crashed & ~loop & widespread & kept_up_before
        & ((surging & outpaced) | (surging_since & outpaced_since)) & (growing | rising)
        & ~draining & (lag >= th.warning_lag)
    )
    # 36: a rise younger than surge_min_seconds may be a burst its consumers absorb: the surge waits
    # (provisional, against healthy) and is no slow consumer either, where the next sweep comes soon: at
    # the one-minute cadence (a mean interval of 75 s at most; a window of 4 snapshots or fewer, a fresh
    # deployment's, says little of its cadence), not at 5 minutes, where waiting costs a whole sweep
    interval = F.try_divide(c("window_seconds"), c("snapshots") - 1)
    frequent = (interval <= th.surge_min_seconds / 2) | (c("snapshots") <= 4)
    # (or seen over fewer intervals than that takes at the sweep's cadence: a missed sweep stretched it; or
    # its last interval rose at under burst_slowing_ratio of its fastest, a burst ending, up to twice as long)
    climb_intervals_min = math.ceil(th.surge_min_seconds / th.history_interval_seconds)
    slowing = F.coalesce((c("lag_last_rate") < th.burst_slowing_ratio * c("climb_peak_rate"))
                         & (c("climb_span") < 2 * th.surge_min_seconds), F.lit(False))
    young = F.coalesce(((c("climb_span") < th.surge_min_seconds) | (c("climb_intervals") < climb_intervals_min)
                        | slowing) & frequent, F.lit(False))
    # a rise on under surge_partition_fraction of the partitions is a hot key (11; one of two is either)
    hot_key = (F.coalesce(c("surging_count"), F.lit(0)) >= 1) & (
        c("surging_count") < th.surge_partition_fraction * c("busy_count"))
    # the load rose less than surge_ratio so far: a surge that began mid-interval, its first sweep's
    # rates half before it; not "produce steady", so not 6 yet either
    rising_load = (
        ~crashed & ~loop & ~hot_key & kept_up_before
        & (c("late_produce_sum") >= th.surge_ceiling_ratio * c("baseline_produce_sum"))
        & outpaced & (growing | rising) & ~draining & (lag >= th.warning_lag)
    )
    young_surge = F.coalesce((surge_signs | rising_load) & young, F.lit(False))
    surge = (surge_signs & persists) | young_surge
    # 35: the backlog of a surge the previous run named, draining: the surge is still its cause
    named_before = F.coalesce((c("carried_produce") > 0) & (c("carried_t_end") >= c("t_first")), F.lit(False))
    surge_draining = ~crashed & ~loop & named_before & draining & (lag >= th.warning_lag)
    surge = F.coalesce(surge, F.lit(False)) | F.coalesce(surge_draining, F.lit(False))
    # the summary gives the rates the rule judged: since the rise when only they show the surge
    by_rise = F.coalesce(surging_since & outpaced_since & ~F.coalesce(surging & outpaced, F.lit(False)), F.lit(False))
    # 36: a lag that falls while consumers take well above the load before it rose absorbs a burst
    absorbing = draining & ((c("baseline_known_count") > 0) | c("baseline_carried")) & (
        c("rise_consume_sum") >= th.surge_ceiling_ratio * c("baseline_produce_sum"))
    slow = (
        ~crashed
        & ~loop
        & ~imbalance
        & ~surge
        & ~F.coalesce(absorbing, F.lit(False))
        & (nonstalled > 0)
        & (c("slow_count") >= th.slow_partition_fraction * nonstalled)
        & climbing
        & ((c("rebalances") == 0) | behind_settled)
        & (lag >= th.warning_lag)
    )
    # Provisional (issue 18): the evidence cannot yet tell two causes apart.
    # Stalled or imbalanced: a hot partition's commit stands still, not yet as long as rule 3 asks.
    stall_pending = imbalance & (F.size(F.coalesce(c("stall_pending_partitions"), F.array())) >= 1)
    # Surge or slow: no partition has rows from before the lag grew, and the first third (the
    # fallback baseline) is too short to tell a risen load from one that was always too much.
    base_need = th.provisional_baseline_thirds * th.baseline_min_seconds
    base_more = F.greatest(F.lit(1), F.ceil(F.try_divide(c("t_first") + base_need - c("t_last"), interval))).cast("int")
    young_more = F.greatest(F.lit(1), F.ceil(F.try_divide(th.surge_min_seconds - c("climb_span"), interval)),
                            F.lit(climb_intervals_min) - c("climb_intervals")).cast("int")
    base_pending = (
        ~crashed & ~loop
        & (F.coalesce(c("baseline_known_count"), F.lit(0)) == 0)
        & ~c("baseline_carried")
        & (c("window_seconds") < base_need)
        & (interval > 0)
    )
    g = g.withColumns(
        {
            "stall_pending": F.coalesce(stall_pending, F.lit(False)),
            "base_pending": F.coalesce(base_pending, F.lit(False)),
            "base_samples_needed": base_more,
            "base_decided_t": c("t_last") + base_more * interval,
            "young_surge": young_surge,
            "young_slowing": slowing & (c("climb_span") >= th.surge_min_seconds)
            & (c("climb_intervals") >= climb_intervals_min),
            "young_samples_needed": young_more,
            "young_decided_t": c("t_last") + young_more * interval,
        }
    )
    g = g.withColumns(
        {
            "is_crashed": F.coalesce(crashed, F.lit(False)),
            "is_outside": F.coalesce(outside, F.lit(False)),
            "is_loop": F.coalesce(loop, F.lit(False)),
            "is_stalled": F.coalesce(stalled, F.lit(False)),
            "is_imbalance": F.coalesce(imbalance, F.lit(False)),
            "is_surge": F.coalesce(surge, F.lit(False)),
            "is_surge_draining": F.coalesce(surge_draining, F.lit(False)),
            "is_slow": F.coalesce(slow, F.lit(False)),
            "is_growing": F.coalesce(growing, F.lit(False)),
            "surge_ratio": F.when(by_rise, rise_surge_ratio).otherwise(surge_ratio),
            "surge_produce_sum": F.when(by_rise, c("rise_produce_sum")).otherwise(c("late_produce_sum")),
            "surge_consume_sum": F.when(by_rise, c("rise_consume_sum")).otherwise(c("late_consume_sum")),
        }
    )
    # 37: owner ids came or went in two intervals or more, the last among them, fewer times than rule 2
    # asks, and nothing else holds: a loop's start, or one member restarting across a sweep (it left, then
    # rejoined a minute later). Healthy it is not yet: a quiet interval decides it, a loop's next change too.
    young_loop = (
        ~c("is_crashed") & ~c("is_loop") & ~c("is_stalled") & ~c("is_imbalance") & ~c("is_surge") & ~c("is_slow")
        & (F.coalesce(c("churn_intervals"), F.lit(0)) >= 2) & F.coalesce(c("churn_last"), F.lit(False))
    )
    loop_more = F.greatest(F.lit(1), F.lit(th.rebalance_loop_min) - c("rebalances")).cast("int")
    # 38: no commit moved in the window: how often the group commits is unknown, not zero. A batch
    # committer between two commits reads as stalled (its lag climbing, as a slow consumer's would) on
    # a fresh deployment or a new group; a commit decides it, and so does a window of
    # commit_cadence_unknown_seconds without one, or a time lag already longer (a position that old).
    unmoved = (
        ~c("is_crashed") & ~c("is_outside")
        & (F.coalesce(c("commit_advances"), F.lit(0)) == 0)
        & (c("window_seconds") < th.commit_cadence_unknown_seconds)
        & ~F.coalesce(c("max_time_lag_seconds") >= th.commit_cadence_unknown_seconds, F.lit(False))
        & (interval > 0)
    )
    unmoved_more = F.greatest(F.lit(1), F.ceil(F.try_divide(
        th.commit_cadence_unknown_seconds - c("window_seconds"), interval))).cast("int")
    g = g.withColumns({
        "is_young_loop": young_loop,
        "loop_samples_needed": loop_more,
        "loop_decided_t": c("t_last") + loop_more * interval,
        "is_unmoved": F.coalesce(unmoved, F.lit(False)),
        "unmoved_samples_needed": unmoved_more,
        "unmoved_decided_t": c("t_first") + F.lit(th.commit_cadence_unknown_seconds),
    })

    window = F.when(
        c("window_seconds") > 0,
        F.format_string(" in %s", _duration(c("window_seconds"))),
    ).otherwise(F.lit(""))
    trend = F.when(c("is_growing"), F.lit(" and growing")).otherwise(F.lit(""))
    w, ws, wh = c("worst"), c("worst_stalled"), c("worst_hot")
    empty = F.array().cast("array<int>")

    def undecided(when, between, decided_t, samples, because):
        return F.when(when, F.struct(
            F.array(*[F.lit(d) for d in between]).alias("deciding_between"),
            decided_t.cast("double").alias("decided_t"),
            samples.cast("int").alias("samples_needed"),
            because.alias("because"),
        ))

    no_undecided = undecided(F.lit(False), ["healthy"], F.lit(None), F.lit(None), F.lit(None).cast("string"))
    stall_undecided = undecided(
        c("stall_pending"), ["partition_imbalance", "stalled_consumer"], c("stall_decided_t"),
        c("stall_samples_needed"),
        F.format_string(
            "the commit on %s has stood still for %s with data waiting; rule 3 calls it stalled after %s "
            "and %d snapshots, a slow owner moves it before",
            _partitions_text(c("stall_pending_partitions")),
            _duration(F.coalesce(c("pending_frozen_seconds"), F.lit(0.0))),
            _duration(F.lit(th.stall_min_seconds)),
            F.lit(th.stall_min_snapshots),
        ),
    )

    def base_undecided(leading, other):
        return undecided(
            c("base_pending"), [leading, other], c("base_decided_t"), c("base_samples_needed"),
            F.format_string(
                "the lag grew from the window's first snapshot and the window spans %s: no rates from before "
                "it grew say whether consumers had kept up (surge) or were always too slow (needs %s)",
                _duration(c("window_seconds")),
                _duration(F.lit(base_need)),
            ),
        )

    loop_undecided = undecided(
        c("is_young_loop"), ["rebalance_loop", "healthy"], c("loop_decided_t"), c("loop_samples_needed"),
        F.format_string(
            "owner ids came or went in %d of the window's %d intervals, the last among them: a loop starting, or "
            "one member restarting across a sweep; a quiet interval leaves it healthy, rule 2 names a loop at %d "
            "rebalances",
            c("churn_intervals"), c("snapshots") - 1, F.lit(th.rebalance_loop_min)),
    )

    def unmoved_undecided(leading):
        return undecided(
            c("is_unmoved"), [leading, "healthy"], c("unmoved_decided_t"), c("unmoved_samples_needed"),
            F.format_string(
                "no commit has moved on any partition in the window's %s: a consumer that commits in batches "
                "looks stalled between its commits; its next commit decides it, or %s without one",
                _duration(c("window_seconds")), _duration(F.lit(th.commit_cadence_unknown_seconds))),
        )

    young_undecided = undecided(
        c("young_surge"), ["producer_surge", "healthy"], c("young_decided_t"), c("young_samples_needed"),
        F.when(c("young_slowing"), F.format_string(
            "the lag has risen for %s, over its last interval at %d%% of its fastest rise: a burst ending, which "
            "drains by the next sweeps, or a surge the consumers begin to meet",
            _duration(c("climb_span")),
            F.round(F.try_divide(c("lag_last_rate"), c("climb_peak_rate")) * 100).cast("int"),
        )).otherwise(F.format_string(
            "the lag has risen at every snapshot for %s: a burst its consumers absorb rises as a surge starts, "
            "and drains within minutes; a surge keeps it rising past %s",
            _duration(c("climb_span")), _duration(F.lit(th.surge_min_seconds)))),
    )

    def finding(name, partitions, focus, summary, pending=no_undecided):
        return F.struct(
            F.lit(name).alias("diagnosis"),
            partitions.cast("array<int>").alias("partitions"),
            focus.alias("focus"),
            summary.alias("summary"),
            pending.alias("undecided"),
        )

    # 28: too little history. A crash needs no rate, but a consumer outside the group protocol (18)
    # has no members either and shows its commits only across snapshots: provisional until then.
    g = with_history_columns(g, th)
    crash_undecided = undecided(
        c("history_short"), ["crashed_consumer", "healthy"], c("history_decides_t"), c("history_samples_needed"),
        F.format_string(
            "%d snapshot%s cannot tell a crashed group from a consumer outside the group protocol (assign(): it "
            "commits without members), whose commits show across %d snapshots",
            c("snapshots"), F.when(c("snapshots") == 1, F.lit("")).otherwise(F.lit("s")),
            F.lit(th.min_history_snapshots)),
    )

    candidates = F.array(
        F.when(
            c("is_crashed"),
            finding(
                "crashed_consumer",
                empty,
                w,
                F.format_string(
                    "group is %s with %s live members; lag %s%s, %s, nobody consuming",
                    c("group_state"),
                    F.coalesce(c("group_members").cast("string"), F.lit("no")),
                    _count(lag),
                    trend,
                    _arriving_text(),
                ),
                crash_undecided,
            ),
        ),
        F.when(
            c("is_loop") | c("is_young_loop"),
            finding(
                "rebalance_loop",
                empty,
                w,
                F.format_string(
                    "%d rebalance%s%s (group left STABLE %d times, owner ids came or went %d times); lag %s%s",
                    c("rebalances"),
                    F.when(c("rebalances") == 1, F.lit("")).otherwise(F.lit("s")),
                    window,
                    c("rebalance_entries"),
                    c("owner_changes"),
                    _count(lag),
                    trend,
                ),
                loop_undecided,
            ),
        ),
        F.when(
            c("is_stalled"),
            finding(
                "stalled_consumer",
                c("stalled_partitions"),
                ws,
                F.when(
                    ws["blocked_by_transaction"],
                    # 21: the consumer is not stuck on a record; a producer's transaction holds it.
                    F.format_string(
                        "%s waits behind an open transaction: the last stable offset has stood at %s for %s with "
                        "%s records after it, which a read_committed consumer cannot read until the transaction "
                        "commits or aborts (a hanging transaction: kafka-transactions.sh find-hanging); owner %s",
                        _partitions_text(c("transaction_blocked_partitions")),
                        _num(ws["last_stable_offset_end"]),
                        _duration(ws["transaction_open_seconds"]),
                        _num(ws["log_end_offset_end"] - ws["last_stable_offset_end"]),
                        _owner_text(ws),
                    ),
                ).when(
                    # a staircase: stuck again and again, moving on in between
                    (ws["stuck_episodes"] >= th.stuck_episodes_min) & (ws["frozen_seconds"] < th.stall_min_seconds),
                    F.format_string(
                        "%s stopped committing %d times in the window, each time leaving its backlog behind "
                        "(a stuck record, then the next): lag %s; owner %s",
                        _partitions_text(c("stalled_partitions")),
                        ws["stuck_episodes"],
                        _count(ws["lag_end"]),
                        _owner_text(ws),
                    ),
                ).otherwise(
                    F.format_string(
                        "%s stopped committing: no progress for %s while lag grew to %s; owner %s",
                        _partitions_text(c("stalled_partitions")),
                        _duration(ws["frozen_seconds"]),
                        _count(ws["lag_end"]),
                        _owner_text(ws),
                    )
                ),
                unmoved_undecided("stalled_consumer"),
            ),
        ),
        F.when(
            c("is_imbalance"),
            finding(
                "partition_imbalance",
                c("hot_partitions"),
                wh,
                F.format_string(
                    "%s %s %d%% of the lag (%s); owner %s consumes %s msg/s while %s arrive",
                    _partitions_text(c("hot_partitions")),
                    F.when(F.size("hot_partitions") == 1, F.lit("holds")).otherwise(F.lit("hold")),
                    F.round(F.try_divide(c("hot_lag"), c("partition_lag_sum")) * 100).cast("int"),
                    _count(F.when(F.size("hot_partitions") == 1, wh["lag_end"]).otherwise(c("hot_lag"))),
                    _owner_text(wh),
                    # now (the last third, which the rule judged), not the window's average:
                    # an owner that slowed at minute 20 of 30 would read as nearly keeping up
                    _num(F.when(wh["late_produce_rate"] > 0, wh["late_consume_rate"]).otherwise(wh["consume_rate"])),
                    _num(F.when(wh["late_produce_rate"] > 0, wh["late_produce_rate"]).otherwise(wh["produce_rate"])),
                ),
                F.coalesce(unmoved_undecided("partition_imbalance"), stall_undecided),
            ),
        ),
        F.when(
            c("is_surge"),
            finding(
                "producer_surge",
                empty,
                w,
                # The consumers' rates before and now (the last third, or since the lag rose: 31),
                # the ones rule 5 compares: the window's average rate ("keep up at N msg/s") hid
                # that they fall behind the new load.
                # (no rates: the window's and its last third's still hold the surge)
                F.when(c("is_surge_draining"), F.format_string(
                    "the surge's backlog is draining: lag %s, down from %s at its peak (%s msg/s arrived before "
                    "the surge)",
                    _count(lag),
                    _count(c("lag_max")),
                    _num(F.coalesce(c("carried_produce"), c("baseline_produce_sum"))),
                )).otherwise(F.format_string(
                    "produce rate rose %sx (%s -> %s msg/s) while consumers went from %s to %s msg/s; "
                    "lag went from %s to %s",
                    _num(F.coalesce(c("surge_ratio"), F.lit(0.0))),
                    _num(c("baseline_produce_sum")),
                    _num(c("surge_produce_sum")),
                    _num(c("baseline_consume_sum")),
                    _num(c("surge_consume_sum")),
                    _count(c("lag_start")),
                    _count(lag),
                )),
                F.coalesce(unmoved_undecided("producer_surge"), young_undecided,
                           base_undecided("producer_surge", "slow_consumer")),
            ),
        ),
        F.when(
            c("is_slow"),
            finding(
                "slow_consumer",
                c("slow_partitions"),
                w,
                F.format_string(
                    "consumers fall behind on %d of %d partitions: %s msg/s consumed while %s arrive; lag %s and climbing",
                    c("slow_count"),
                    c("partition_count"),
                    _num(c("consume_rate")),
                    _num(c("produce_rate")),
                    _count(lag),
                ),
                F.coalesce(unmoved_undecided("slow_consumer"), base_undecided("slow_consumer", "producer_surge")),
            ),
        ),
    )
    healthy = finding(
        "healthy",
        empty,
        w,
        F.when(is_marker & (c("group_id") == LISTING_ROW_GROUP),
               F.lit("the cluster's group listing failed: groups may be missing from this run"))
        .when(is_marker, F.lit("the group's offsets could not be read; nothing is known of its lag")).otherwise(
            F.format_string(
                "consumers keep up: lag %s across %d partitions, %s msg/s consumed of %s produced",
                _count(F.coalesce(lag, F.lit(0))),
                F.coalesce(c("partition_count"), F.lit(0)),
                _num(F.coalesce(c("consume_rate"), F.lit(0.0))),
                _num(F.coalesce(c("produce_rate"), F.lit(0.0))),
            )
        ),
    )
    present = F.filter(candidates, lambda x: x.isNotNull())
    # 28: too little history for any rule but 1 (and for 1 once a memberless commit moved): one
    # finding that says so
    collecting = finding(COLLECTING_HISTORY, empty, w, collecting_summary(lag, th))
    moved = F.coalesce(c("memberless_commit_advances"), F.lit(0)) >= 1
    present = F.when(c("history_short") & (~c("is_crashed") | moved), F.array(collecting)).otherwise(present)
    g = g.withColumn("finding", F.explode(F.when(F.size(present) > 0, present).otherwise(F.array(healthy))))

    level = (
        F.when(
            (lag >= th.critical_lag) | (c("is_growing") & (lag >= th.warning_lag) & (lag >= 2 * c("lag_start"))),
            F.lit(2),
        )
        .when(c("is_growing") & (lag >= th.warning_lag), F.lit(1))
        .otherwise(F.lit(0))
    )
    reset_parts = F.coalesce(c("offset_reset_partitions"), F.array().cast("array<int>"))
    fell_parts = F.coalesce(c("log_end_fell_partitions"), F.array().cast("array<int>"))
    above_parts = F.coalesce(c("commit_above_partitions"), F.array().cast("array<int>"))
    doubtful = ~c("data_complete") | (F.size(reset_parts) > 0)  # rules 7 and 10
    level = F.when((c("finding.diagnosis") == "healthy") & ~doubtful, F.lit(0)).otherwise(F.greatest(level, F.lit(1)))
    # unread data deleted within the window's length: critical, whatever the cause (case 17)
    level = F.when(forecast.loses_data_within(c("window_seconds")), F.lit(2)).otherwise(level)
    catch_up, data_loss = forecast.evidence_columns()
    severity = F.element_at(F.array(F.lit("ok"), F.lit("warning"), F.lit("critical")), level + 1)

    # The group's data on this topic stops before the window does (collection stopped, a
    # replayed or partial store): its numbers are as of its last snapshot, said in the summary.
    end_seconds, end_text = _window_edge(window_end, "t_last")
    start_text = _window_edge(window_start, "t_first")[1]
    data_end_gap = (end_seconds - c("topic_t_last")) if end_seconds is not None else F.lit(None).cast("double")
    early_end_note = F.when(
        data_end_gap > DATA_END_GAP_SECONDS,
        F.format_string("data ends %s before the window end (last snapshot %s UTC)", _duration(data_end_gap),
                        F.date_format(F.timestamp_seconds(c("topic_t_last")), "yyyy-MM-dd HH:mm:ss")),
    )
    f = c("finding.focus")
    evidence = F.struct(
        lag.alias("lag"),
        c("lag_start").alias("lag_start"),
        F.round(c("lag_growth")).cast("long").alias("lag_growth"),
        F.round(c("lag_r2"), 3).alias("lag_trend_r2"),
        c("partition_count").alias("partition_count"),
        f["partition"].alias("partition"),
        f["lag_end"].alias("partition_lag"),
        F.round(f["lag_share"], 4).alias("lag_share"),
        f["member_id"].alias("owner_member_id"),
        f["client_id"].alias("owner_client_id"),
        f["host"].alias("owner_host"),
        F.round(c("produce_rate"), 3).alias("produce_rate"),
        F.round(c("consume_rate"), 3).alias("consume_rate"),
        F.round(f["produce_rate"], 3).alias("partition_produce_rate"),
        F.round(f["consume_rate"], 3).alias("partition_consume_rate"),
        F.round(f["late_produce_rate"], 3).alias("partition_late_produce_rate"),
        F.round(f["late_consume_rate"], 3).alias("partition_late_consume_rate"),
        F.round(c("early_produce_rate"), 3).alias("early_produce_rate"),
        F.round(c("late_produce_rate"), 3).alias("late_produce_rate"),
        F.round(c("surge_ratio"), 3).alias("surge_ratio"),
        F.round(c("baseline_produce_sum"), 3).alias("baseline_produce_rate"),
        F.round(c("baseline_consume_sum"), 3).alias("baseline_consume_rate"),
        # where the baseline came from: the rows before the lag rose, the first third (the lag
        # rose from the window's start), or the previous run's surge (27)
        F.when(c("baseline_carried"), F.lit("previous run"))
        .when(F.coalesce(c("baseline_known_count"), F.lit(0)) > 0, F.lit("before the rise"))
        .otherwise(F.lit("first third")).alias("baseline_source"),
        f["stuck_episodes"].alias("stuck_episodes"),
        F.round(f["time_lag_seconds"], 3).alias("time_lag_seconds"),
        f["time_lag_lower_bound"].alias("time_lag_lower_bound"),
        f["time_lag_source"].alias("time_lag_source"),
        F.round(c("max_time_lag_seconds"), 3).alias("max_time_lag_seconds"),
        F.round(f["frozen_seconds"], 3).alias("frozen_seconds"),
        # when the focus partition's lag began to grow: its last snapshot at the baseline (null: before the window)
        F.date_format(F.timestamp_seconds(f["lag_onset_t"]), _ISO).alias("lag_onset"),
        c("stalled_partitions").alias("stalled_partitions"),
        c("slow_partitions").alias("slow_partitions"),
        c("rebalances").alias("rebalances"),
        c("rebalance_entries").alias("rebalance_entries"),
        c("owner_changes").alias("owner_changes"),
        c("state_changes").alias("state_changes"),
        c("group_state").alias("group_state"),
        c("group_members").alias("group_members"),
        # case 18: "group" (members own the partitions) or "outside" (assign(): commits without members)
        F.when(c("is_outside"), F.lit("outside")).otherwise(F.lit("group")).alias("membership"),
        c("memberless_commit_advances").alias("memberless_commit_advances"),
        c("retention_loss_partitions").alias("retention_loss_partitions"),
        c("snapshots").alias("snapshots"),
        c("data_complete").alias("data_complete"),
        F.slice(c("read_error_lines"), 1, MAX_READ_ERRORS).alias("read_errors"),
        c("read_error_count").alias("read_error_count"),
        F.coalesce(c("lag_unknown_partitions"), F.array().cast("array<int>")).alias("lag_unknown_partitions"),
        reset_parts.alias("offset_reset_partitions"),
        fell_parts.alias("log_end_fell_partitions"),
        above_parts.alias("commit_above_partitions"),
        f["committed_record"].alias("committed_record"),
        f["last_stable_offset_end"].alias("last_stable_offset"),
        F.round(f["transaction_open_seconds"], 3).alias("transaction_open_seconds"),
        F.coalesce(c("hanging_transaction_partitions"), F.array().cast("array<int>")).alias(
            "hanging_transaction_partitions"),
        F.coalesce(c("transaction_blocked_partitions"), F.array().cast("array<int>")).alias(
            "transaction_blocked_partitions"),
        catch_up.alias("catch_up"),
        data_loss.alias("data_loss"),
        F.date_format(F.timestamp_seconds(c("topic_t_last")), _ISO).alias("data_end"),
        F.round(data_end_gap, 3).alias("data_end_gap_seconds"),
    )
    incomplete_note = F.when(
        ~c("data_complete"),
        F.format_string(
            "Incomplete data: %s (%s)",
            F.when(c("read_error_count") == 1, F.lit("1 read failed")).otherwise(
                F.format_string("%d reads failed", c("read_error_count"))
            ),
            F.coalesce(F.element_at(c("read_error_lines"), 1), F.lit("lag unknown at the end")),
        ),
    )
    above = c("commit_above_worst")
    reset_note = F.when(
        F.size(fell_parts) > 0,
        F.format_string(
            "log end offset went backwards on %s (topic recreated or truncated?); rates and lag count from the reset",
            _partitions_text(fell_parts),
        ),
    )
    # case 10, the commit above the log end: lag 0 by contract 1, but nothing is read (the log end need not move)
    above_note = F.when(
        F.size(above_parts) > 0,
        F.format_string(
            "committed offset %s is above the log end %s on %s (topic recreated, or offsets set by hand): "
            "the group will reset per auto.offset.reset or read nothing",
            F.format_number(above["committed_end"], 0),
            F.format_number(above["log_end_offset_end"], 0),
            F.when(F.size(above_parts) == 1, _partitions_text(above_parts)).otherwise(
                F.format_string("partition %d (and %s likewise)", above["partition"],
                                _partitions_text(F.filter(above_parts, lambda x: x != above["partition"])))),
        ),
    )
    # a healthy finding beside it does not say "consumers keep up": they read nothing there
    own_summary = F.when(
        (c("finding.diagnosis") == "healthy") & (F.size(above_parts) > 0),
        F.regexp_replace(c("finding.summary"), "^consumers keep up: ", ""),
    ).otherwise(c("finding.summary"))
    summary = F.concat_ws("; ", incomplete_note, reset_note, above_note, early_end_note, own_summary)
    start, end = start_text, end_text
    out = g.select(
        *GROUP_KEY,
        c("finding.partitions").alias("partitions"),
        c("finding.diagnosis").alias("diagnosis"),
        c("pattern"),
        severity.alias("severity"),
        summary.alias("summary"),
        evidence.alias("evidence"),
        start.alias("window_start"),
        end.alias("window_end"),
        # issue 18: a finding whose evidence cannot yet tell two causes apart says so
        c("finding.undecided").isNotNull().alias("provisional"),
        F.coalesce(c("finding.undecided.deciding_between"), F.array().cast("array<string>")).alias(
            "deciding_between"),
        F.date_format(F.timestamp_seconds(F.round(c("finding.undecided.decided_t"))), _ISO_SECONDS).alias(
            "decided_by"),
        c("finding.undecided.samples_needed").alias("samples_needed"),
        c("finding.undecided.because").alias("undecided_because"),
        *_history_passthrough(),
    )
    return collecting_history_findings(out, th)


_ISO = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"
_ISO_SECONDS = "yyyy-MM-dd'T'HH:mm:ss'Z'"
# A sweep's last sample lands seconds before its window ends; more than this is data that stopped early.
DATA_END_GAP_SECONDS = 120


def _window_edge(value, fallback: str):
    """(epoch seconds, ISO text) of a window edge: a datetime (one run's window), a Column of epoch
    microseconds (lagdoctor.diagnosis.replay: each replayed sweep's own window), or None: the
    group's own `fallback` snapshot time, and no seconds."""
    from pyspark.sql import functions as F

    if value is None:
        return None, F.date_format(F.timestamp_seconds(F.col(fallback)), _ISO)
    if isinstance(value, datetime):
        return F.lit(value.timestamp()), F.lit(_iso(value))
    return value / 1e6, F.date_format(F.timestamp_micros(value), _ISO)


def _iso(value: datetime) -> str:
    from datetime import timezone

    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- rule case 28: too little history (issue 29) ---------------------------------------------

# Every rate of a finding's evidence: null when the group was seen once (a rate needs two snapshots).
EVIDENCE_RATES = (
    "produce_rate", "consume_rate", "partition_produce_rate", "partition_consume_rate",
    "partition_late_produce_rate", "partition_late_consume_rate", "early_produce_rate", "late_produce_rate",
    "surge_ratio", "baseline_produce_rate", "baseline_consume_rate",
)


def with_history_columns(g, th: Thresholds):
    """history_short: the topic has fewer than min_history_snapshots snapshots (never the
    group-level failure row: rule 9 says what is known of it); history_samples_needed: how many
    more; history_decides_t (epoch s): when the last of them is due, at the window's mean sampling
    interval but never sooner than history_interval_seconds apart (a sweep's samples come in bursts
    10 s apart, its next sweep a minute later)."""
    from pyspark.sql import functions as F

    c = F.col
    measured = F.try_divide(c("t_last") - c("t_first"), c("snapshots") - 1)
    interval = F.greatest(F.coalesce(measured, F.lit(0.0)), F.lit(float(th.history_interval_seconds)))
    short = F.coalesce((c("snapshots") < th.min_history_snapshots) & (c("topic") != GROUP_MARKER_TOPIC),
                       F.lit(False))
    more = F.lit(th.min_history_snapshots) - c("snapshots")
    return g.withColumns({
        "history_short": short,
        "history_samples_needed": F.when(short, more),
        "history_decides_t": F.when(short, c("t_last") + more * interval),
    })


def _decides_at_text():
    """03:17: the minute nearest the due snapshot (the sweep that takes it decides)."""
    from pyspark.sql import functions as F

    return F.date_format(F.timestamp_seconds((F.round(F.col("history_decides_t") / 60) * 60).cast("long")), "HH:mm")


def collecting_summary(lag, th: Thresholds):
    """"collecting history (1 of 3 snapshots; decides at 03:17 UTC): lag 5,811 across 8 partitions;
    group STABLE, 4 live members": the facts one snapshot holds, no rate."""
    from pyspark.sql import functions as F

    c = F.col
    members = c("group_members")
    return F.format_string(
        "collecting history (%d of %d snapshots; decides at %s UTC): lag %s across %d partition%s; group %s, %s",
        c("snapshots"),
        F.lit(th.min_history_snapshots),
        _decides_at_text(),
        F.coalesce(F.format_number(lag, 0), F.lit("unknown")),
        F.coalesce(c("partition_count"), F.lit(0)),
        F.when(c("partition_count") == 1, F.lit("")).otherwise(F.lit("s")),
        F.coalesce(c("group_state"), F.lit("UNKNOWN")),
        F.when(members.isNull(), F.lit("members unknown"))
        .otherwise(F.format_string("%d live member%s", members, F.when(members == 1, F.lit("")).otherwise(F.lit("s")))),
    )


def _arriving_text():
    """What a crashed group's summary says of its load: the produce rate, or that one snapshot has none."""
    from pyspark.sql import functions as F

    return F.when(F.col("snapshots") < 2, F.lit("rate unknown: 1 snapshot")).otherwise(
        F.format_string("%s msg/s arriving", _num(F.col("produce_rate"))))


def _history_passthrough():
    """Columns collecting_history_findings reads and drops (not outputs)."""
    from pyspark.sql import functions as F

    return [F.col("history_decides_t").alias("_history_decides_t")]


def collecting_history_findings(found, th: Thresholds):
    """Rule case 28 on the findings rows: every evidence gets snapshots_seen, snapshots_needed and
    decides_at (null once decided); seen once, its rates are null (unknown, not 0.0) and a forecast
    of loss from them is unknown (a crashed group's stands: nobody consumes, whatever the rate); a
    collecting_history finding is ok, or warning when 7 or 10 also holds."""
    from pyspark.sql import functions as F

    e = F.col("evidence")
    once = e["snapshots"] < 2
    collecting = F.col("diagnosis") == COLLECTING_HISTORY
    ev = e
    for name in EVIDENCE_RATES:
        ev = ev.withField(name, F.when(~once, e[name]))
    loss = e["data_loss"]
    guessed = once & (F.col("diagnosis") != "crashed_consumer") & (loss["state"] == "at_risk")
    ev = ev.withField("data_loss", F.when(guessed, loss.withField("state", F.lit("unknown"))
                                          .withField("seconds", F.lit(None).cast("double"))
                                          .withField("basis", F.lit(None).cast("string"))).otherwise(loss))
    ev = ev.withField("snapshots_seen", e["snapshots"])
    ev = ev.withField("snapshots_needed", F.lit(th.min_history_snapshots))
    ev = ev.withField("decides_at", F.date_format(
        F.timestamp_seconds(F.round(F.col("_history_decides_t")).cast("long")), _ISO_SECONDS))
    doubtful = ~F.coalesce(e["data_complete"], F.lit(True)) | (F.size(e["offset_reset_partitions"]) > 0)
    severity = F.when(collecting, F.when(doubtful, F.lit("warning")).otherwise(F.lit("ok"))).otherwise(
        F.col("severity"))
    return found.withColumns({"evidence": ev, "severity": severity}).drop("_history_decides_t")
