"""The diagnosis transforms on inline rows, on the shared Spark session.

Each test builds a few snapshot rows by hand, runs one pure transform and
compares with what an on-call engineer would expect to read.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def snap(t, partition, leo, committed, *, lag=None, state="STABLE", members=1, member="consumer-1-aaa",
         host="10.0.0.1", group="g", topic="t", cluster="c", log_start=0, record_ts=None, read_error=None, record=None,
         retention_ms=None, cleanup_policy=None):
    """One contract-1 row (with the optional columns) at T0 + t seconds."""
    if lag is None and committed is not None and leo is not None:
        lag = max(0, leo - committed)
    client = member.rsplit("-", 1)[0] if member else None
    from lagdoctor.diagnosis.snapshots import snapshot_schema_with_optional

    values = dict(snapshot_ts=T0 + timedelta(seconds=t), cluster=cluster, group_id=group, group_state=state,
                  topic=topic, partition=partition, log_start_offset=log_start, log_end_offset=leo,
                  committed_offset=committed, lag=lag, member_id=member, client_id=client,
                  host=host if member else None, group_members=members,
                  committed_record_ts=None if record_ts is None else T0 + timedelta(seconds=record_ts),
                  read_error=read_error, retention_ms=retention_ms, cleanup_policy=cleanup_policy)
    values.update(record or {})
    return tuple(values.get(f.name) for f in snapshot_schema_with_optional())


@pytest.fixture(scope="module")
def frame(spark):
    from lagdoctor.diagnosis.snapshots import snapshot_schema_with_optional

    from pyspark.sql import types as T

    # as read from files: every column nullable (a failed read leaves offsets null)
    schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in snapshot_schema_with_optional()])

    def build(rows):
        return spark.createDataFrame(rows, schema)

    return build


def run_findings(df, thresholds=None, with_status=False, carried=None):
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.status_job import partition_status
    from lagdoctor.diagnosis.thresholds import Thresholds

    th = thresholds or Thresholds()
    pf = partition_features(df, th)
    gf = group_features(group_series(df, pf), th)
    found = [r.asDict(recursive=True) for r in findings(pf, gf, th, carried=carried).collect()]
    if not with_status:
        return found
    end_ms = int(df.agg({"snapshot_ts": "max"}).first()[0].timestamp() * 1000)
    return found, [r.asDict() for r in partition_status(pf, gf, end_ms, th).collect()]


# -- scenarios: diagnosed together, in one job --------------------------------------------------
#
# Most tests below read the findings of their own rows under the default thresholds. Their rows
# are registered as scenarios and diagnosed together, each under a cluster of its own, the way a
# sweep diagnoses every cluster's groups in one job: a job costs about 10 s of CPU whatever its
# size, and one job per test was most of this file's time. A group's findings do not depend on
# the other groups of the run (test_a_groups_findings_are_the_same_alone_as_among_the_scenarios).

_SCENARIOS: dict[str, tuple] = {}


def scenario(build, *args, previous=None):
    """Registers build(*args)'s rows, with `previous` (the previous run's findings, as rows
    for carried_baselines), for the shared job. Returns `build`, so it decorates a builder."""
    _SCENARIOS[_scenario_key(build, args, previous)] = (build, args, previous)
    return build


def _scenario_key(build, args, previous):
    return f"{build.__name__}{args!r} previous={previous!r}"


_PREVIOUS_SCHEMA = ("cluster string, group_id string, topic string, diagnosis string, provisional boolean, "
                    "evidence struct<baseline_produce_rate: double, baseline_consume_rate: double, data_end: string>")


def _previous(diagnosis="producer_surge", data_end=T0 + timedelta(minutes=25), provisional=False):
    """The previous run's finding on group clicks (cluster c, topic t), as a row of its findings."""
    return {"cluster": "c", "group_id": "clicks", "topic": "t", "diagnosis": diagnosis, "provisional": provisional,
            "evidence": {"baseline_produce_rate": 40.0, "baseline_consume_rate": 40.0,
                         "data_end": data_end.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}


def _in_cluster(rows, cluster):
    from lagdoctor.diagnosis.snapshots import snapshot_schema_with_optional

    at = [f.name for f in snapshot_schema_with_optional()].index("cluster")
    return [row[:at] + (f"{cluster}/{row[at]}",) + row[at + 1:] for row in rows]


@pytest.fixture(scope="module")
def diagnosed(spark, frame):
    """diagnosed(build, *args, previous=None): a registered scenario's findings, as run_findings
    gives them for its rows alone, in (group, topic) order."""
    from lagdoctor.diagnosis.classify import carried_baselines

    keys = list(_SCENARIOS)
    rows, previous = [], []
    for i, key in enumerate(keys):
        build, args, prev = _SCENARIOS[key]
        rows += _in_cluster(build(*args), i)
        previous += [{**p, "cluster": f"{i}/{p['cluster']}"} for p in prev or ()]
    carried = carried_baselines(spark.createDataFrame(previous, _PREVIOUS_SCHEMA))
    by_key = {key: [] for key in keys}
    for f in sorted(run_findings(frame(rows), carried=carried), key=lambda f: (f["group_id"], f["topic"])):
        i, _, cluster = f["cluster"].partition("/")
        by_key[keys[int(i)]].append({**f, "cluster": cluster})

    def findings_of(build, *args, previous=None):
        key = _scenario_key(build, args, previous)
        if key not in by_key:
            raise LookupError(f"{key} is not a scenario: register it with scenario() beside its test")
        return by_key[key]

    return findings_of


# -- per-partition features -------------------------------------------------------


def test_partition_rates_lag_and_owner(spark, frame):
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.features import partition_features

    # 10 msg/s arrive, 5 msg/s are committed: lag climbs by 300 a minute
    rows = [snap(60 * k, 0, 600 * k, 300 * k) for k in range(5)]
    rows[-1] = snap(240, 0, 2400, 1200, member="consumer-2-bbb", host="10.0.0.2")  # owner at the end
    got = partition_features(frame(rows)).select(
        "partition", "produce_rate", "consume_rate", "lag_start", "lag_end", "member_id", "host", "slow", "stalled"
    )
    expected = spark.createDataFrame(
        [(0, 10.0, 5.0, 0, 1200, "consumer-2-bbb", "10.0.0.2", True, False)], got.schema
    )
    assertDataFrameEqual(got, expected)


def test_stalled_partitions_but_not_batch_committers(spark, frame):
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.features import partition_features

    rows = []
    for k in range(11):  # a snapshot a minute for ten minutes, 1,000 msg/s on every partition
        t, leo = 60 * k, 60_000 * k
        # 0: committed every minute until minute 4, then frozen for 6 minutes while data waits
        rows.append(snap(t, 0, leo, 60_000 * min(k, 4)))
        # 1: a batch committer: commits everything every 4 minutes; last commit 2 minutes ago
        rows.append(snap(t, 1, leo, 60_000 * (k // 4) * 4))
        # 2: still committing, one record at a time, while 60,000 arrive a minute (hung handler)
        rows.append(snap(t, 2, leo, k))
        # 3: keeps up
        rows.append(snap(t, 3, leo, leo))
    got = partition_features(frame(rows)).select("partition", "stalled", "frozen_seconds")
    expected = spark.createDataFrame(
        [(0, True, 360.0), (1, False, 120.0), (2, True, 0.0), (3, False, 0.0)], got.schema
    )
    assertDataFrameEqual(got, expected)


def test_the_lags_onset_is_its_last_snapshot_at_the_baseline_and_unknown_when_up_from_the_start(spark, frame):
    """What a rollout or a restart is set against ("rolled out 2 min before the lag began"): the last
    snapshot before the partition's lag grew; none when it was already up at the window's first
    snapshot (it began before the window) or never grew."""
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.features import partition_features

    rows = []
    for k in range(8):  # a snapshot a minute, 10 msg/s
        t, leo = 60 * k, 600 * k
        rows.append(snap(t, 0, leo, leo if k <= 3 else 1800 + 2 * (t - 180)))  # slows after minute 3
        rows.append(snap(t, 1, leo + 5000, leo))  # 5,000 behind from the first snapshot on
        rows.append(snap(t, 2, leo, leo))  # keeps up
    got = partition_features(frame(rows)).select("partition", "lag_onset_t")
    start = T0.timestamp()
    assertDataFrameEqual(got, spark.createDataFrame([(0, start + 180.0), (1, None), (2, None)], got.schema))


@scenario
def _stalled_between_five_minute_sweeps():
    rows = []
    for sweep in range(4):
        for i in range(3):
            t = 300 * sweep + 10 * i
            leo = 100 * t
            rows.append(snap(t, 0, leo, min(leo, 60_000) - 5))
            rows.append(snap(t, 1, leo, leo - 5))
    return rows


def test_a_stall_is_called_at_the_sweeps_cadence_not_after_twice_its_gap(diagnosed):
    """Sweeps every 5 minutes, each taking 3 samples 10 s apart (the DAG's defaults before issue 20,
    still what a 5-minute LAGDOCTOR_SWEEP_SCHEDULE with samples 3 gives): the
    commit advanced at every sample until minute 10, then stood still for 6 minutes on
    partition 0 while 100 msg/s arrive. The 4.7 minutes between sweeps are the sampling's
    gap, not the consumer's: it is stalled now, not once frozen for twice that."""
    found = [f for f in diagnosed(_stalled_between_five_minute_sweeps) if f["diagnosis"] != "healthy"]
    assert [(f["diagnosis"], f["partitions"]) for f in found] == [("stalled_consumer", [0])]
    assert found[0]["evidence"]["frozen_seconds"] == 320.0


@scenario
def _batch_committers_at_every_phase():
    rows = []
    for every in (330, 360):
        for phase in range(0, every, 15):
            group = f"batch-{every}-{phase}"
            for sweep in range(7):
                for i in range(3):
                    t = 300 * sweep + 10 * i
                    committed = 100 * (((t + phase) // every) * every - phase)
                    rows.append(snap(t, 0, 100 * t, max(0, committed), group=group))
    return rows


def test_a_batch_committer_that_slips_past_a_sweeps_samples_is_not_stalled(diagnosed):
    """The same sweep cadence; a committer that commits all it has every 330 s or 360 s (a
    Flink checkpoint, a Connect sink's file rotation) at several phases: now and then no
    commit falls between two bursts, and its commit is seen still for 5 minutes. Its
    earlier waits, seen standing across a burst's samples, say that is its way."""
    found = [(f["group_id"], f["diagnosis"]) for f in diagnosed(_batch_committers_at_every_phase)
             if f["diagnosis"] != "healthy"]
    assert not [g for g, d in found if d == "stalled_consumer"], found


@scenario
def _surge_after_two_samples_at_the_labs_cadence():
    rows = []
    for t in (0, 10, 70, 80, 140, 150, 210, 220, 280, 290):
        produced = 10 * min(t, 40) + 80 * max(0, t - 40)
        consumed = 10 * min(t, 40) + 29 * max(0, t - 40)
        for p in (0, 1):
            rows.append(snap(t, p, produced, consumed))
    return rows


def test_a_surge_stays_a_surge_when_only_two_samples_before_it_are_left_in_the_window(diagnosed):
    """Sweeps 70 s apart, 2 samples each (the lab's cadence): 10 msg/s per partition
    consumed as it arrives, then from t=40 s 80 msg/s while the consumer tops out at
    29. Only t=0 and t=10 precede the rise: 10 s of baseline, shorter than
    baseline_min_seconds, is still the load the consumers kept up with; the first
    third (which holds the surge) is not."""
    found = [f for f in diagnosed(_surge_after_two_samples_at_the_labs_cadence) if f["diagnosis"] != "healthy"]
    assert [f["diagnosis"] for f in found] == ["producer_surge"]
    assert found[0]["evidence"]["baseline_produce_rate"] == 20.0  # both partitions, as the summary says


@scenario
def _owner_slowed_at_minute_20():
    rows = []
    for k in range(31):  # a snapshot a minute
        t = 60 * k
        leo = 20 * t
        rows.append(snap(t, 0, leo, leo, member="c-1-aaa"))
        rows.append(snap(t, 1, leo, 20 * min(t, 1200) + 3 * max(0, t - 1200), member="c-2-bbb", host="10.0.0.2"))
    return rows


def test_an_owner_that_slowed_late_in_the_window_is_shown_at_its_rate_now(diagnosed):
    """Partition 1's owner kept up with 20 msg/s for 20 of 30 minutes, then handled 3:
    the message says 3 of 20 (what the rule judged), not the window's average 15."""
    (f,) = [f for f in diagnosed(_owner_slowed_at_minute_20) if f["diagnosis"] != "healthy"]
    assert f["diagnosis"] == "partition_imbalance" and f["partitions"] == [1]
    assert f["summary"].endswith("consumes 3.0 msg/s while 20 arrive"), f["summary"]
    ev = f["evidence"]
    assert (ev["partition_late_consume_rate"], ev["partition_late_produce_rate"]) == (3.0, 20.0)
    assert ev["partition_consume_rate"] < 15  # the window's average stays in the evidence
    assert ev["lag_onset"] == "2026-11-21T12:20:00.000000Z"  # it kept up until minute 20


@scenario
def _stalled_on_a_read_record():
    stuck = {"committed_record_ts": T0 - timedelta(minutes=30), "committed_record_offset": 240_000,
             "committed_record_key_sha256": "3fa9c2d1e0b4a7f6", "committed_record_size": 2048,
             "committed_record_headers": "traceparent,retry"}
    rows = []
    for k in range(11):  # partition 0 frozen at 240,000 from minute 4 while 1,000 msg/s arrive
        t, leo = 60 * k, 60_000 * k
        rows.append(snap(t, 0, leo, 60_000 * min(k, 4), record=stuck if k >= 4 else None))
        rows.append(snap(t, 1, leo, leo))
    return rows


def test_a_stalled_finding_names_the_stuck_record_never_its_payload(diagnosed):
    (f,) = diagnosed(_stalled_on_a_read_record)
    assert f["diagnosis"] == "stalled_consumer"
    ev = f["evidence"]  # the Slack message and the report render it (test_forecast_render.py)
    assert ev["committed_record"] == {"offset": 240_000, "timestamp": "2026-11-21T11:30:00.000Z",
                                      "key_sha256": "3fa9c2d1e0b4a7f6", "size": 2048,
                                      "headers": ["traceparent", "retry"], "error": None,
                                      "committed_offset": 240_000}
    # the record's own time: 30 minutes before the window began plus its 10 minutes, not capped at 10
    assert (ev["time_lag_seconds"], ev["time_lag_lower_bound"], ev["time_lag_source"]) == (2400.0, False, "record")


@scenario
def _stalled_on_an_unreadable_record():
    rows = []
    for k in range(11):
        t, leo = 60 * k, 60_000 * k
        failed = {"committed_record_error": "offset out of range: retention deleted it, or the log restarted"}
        rows.append(snap(t, 0, leo, 60_000 * min(k, 4), record=failed if k == 10 else None))
        rows.append(snap(t, 1, leo, leo))
    return rows


def test_a_stuck_record_that_could_not_be_read_says_why(diagnosed):
    (f,) = diagnosed(_stalled_on_an_unreadable_record)
    assert f["evidence"]["committed_record"]["error"] == (
        "offset out of range: retention deleted it, or the log restarted")
    assert f["evidence"]["committed_record"]["offset"] is None
    assert f["evidence"]["time_lag_source"] == "interpolated"


# -- forecasts (classify.py case 17, forecast.py) ----------------------------------------------


@scenario
def _draining_and_falling_behind():
    rows = []
    for k in range(11):
        t = 60 * k
        # draining: 100 msg/s arrive, 150 consumed: lag 30,000 -> 0 at 50 msg/s net
        rows.append(snap(t, 0, 6_000 * k + 60_000, 9_000 * k, group="draining"))
        # falling behind: 100 arrive, 50 consumed
        rows.append(snap(t, 0, 6_000 * k + 60_000, 3_000 * k, group="behind"))
    return rows


def test_catch_up_clears_at_the_net_rate_or_never(diagnosed):
    found = {f["group_id"]: f["evidence"] for f in diagnosed(_draining_and_falling_behind)}
    # lag 30,000 at the end (120,000 produced, 90,000 consumed), 50 msg/s net: 600 s
    assert found["draining"]["catch_up"] == {"state": "clearing", "seconds": pytest.approx(600, rel=0.01)}
    behind = found["behind"]["catch_up"]
    assert behind == {"state": "never", "seconds": None}


def _sweep_window(seed, late_deficit):
    """What the one-minute sweep saw live: a 3-partition topic at 40 msg/s (800 records a minute a
    partition), a snapshot a minute for 30 minutes, retention.ms 7 days. Three groups hold their lag
    (0, 32 and 5,000 a partition) with 0-8 records of jitter (`seed`); in the last third the
    groups consume `late_deficit` msg/s (topic-wide) less than is produced."""
    import random

    rng = random.Random(seed)
    rows = []
    for group, held in (("keeps-up", 0), ("lag-96", 32), ("held", 5_000)):
        for p in range(3):
            for k in range(31):
                leo = 1_000_000 + 800 * k
                behind = held + rng.randint(0, 8) + round(late_deficit / 3 * 60 * max(0, k - 20))
                rows.append(snap(60 * k, p, leo, leo - behind, group=group, retention_ms=604_800_000))
    return rows


scenario(_sweep_window, 1, 0.1)
scenario(_sweep_window, 2, 0.0)


def test_forecasts_do_not_flip_between_sweeps_on_noise(diagnosed):
    """forecast.py F1-F3: two sweeps of the same state, differing only by noise (lag jitter 0-8,
    consuming 39.9 vs 40.0 msg/s), give the same catch-up and data-loss forecasts, as a person
    reads them. Before: "never" and "at risk in ~900d" on one sweep, not the other."""
    from lagdoctor.notify.render import catch_up_text, data_loss_text

    def forecasts(*window):
        out = {}
        for f in diagnosed(_sweep_window, *window):
            ev = f["evidence"]
            out[f["group_id"]] = (ev["catch_up"]["state"], ev["data_loss"]["state"], ev["data_loss"]["partitions"],
                                  catch_up_text(ev), data_loss_text(ev))
        return out

    first, second = forecasts(1, 0.1), forecasts(2, 0.0)
    assert first == second
    # within noise (F1): 32 records at 13.3 msg/s a partition is 2.4 s of production
    for group in ("keeps-up", "lag-96"):
        assert first[group] == ("caught_up", "safe", [], "caught up", "none within 7d at current rates"), group
    # real lag, rates within the band (F2); a loss months out is no forecast (F3)
    assert first["held"] == ("steady", "safe", [], "lag holding steady at current rates",
                             "none within 7d at current rates")


@scenario
def _unread_for_a_month_and_behind():
    rows = []
    for k in range(11):
        t = 60 * k
        # nobody consumes; retention 30 days: the unread records go in ~30 days, past the 7-day horizon
        rows.append(snap(t, 0, 1_000 + 600 * k, 500, state="EMPTY", members=0, member=None, group="month",
                         retention_ms=30 * 86_400_000))
        # 10 msg/s arrive, 9 consumed (10% below): a real gap on a real lag, never
        rows.append(snap(t, 0, 20_000 + 600 * k, 10_000 + 540 * k, group="behind", retention_ms=30 * 86_400_000))
    return rows


def test_never_and_at_risk_need_real_lag_a_clear_gap_and_the_horizon(frame, diagnosed):
    from lagdoctor.diagnosis.thresholds import Thresholds

    found = {f["group_id"]: f["evidence"] for f in diagnosed(_unread_for_a_month_and_behind)}
    month = found["month"]["data_loss"]
    assert (month["state"], month["seconds"], month["partitions"], month["basis"], month["horizon_seconds"]) == (
        "safe", None, [], "beyond_horizon", 7 * 86_400.0)
    assert found["month"]["catch_up"]["state"] == "never"
    assert found["behind"]["catch_up"] == {"state": "never", "seconds": None}
    # the horizon is a named threshold: at 60 days the same group is at risk in ~30 days
    wide = {f["group_id"]: f["evidence"] for f in run_findings(
        frame(_unread_for_a_month_and_behind()), Thresholds(forecast_max_horizon_seconds=60 * 86_400.0))}
    assert wide["month"]["data_loss"]["state"] == "at_risk"
    assert wide["month"]["data_loss"]["seconds"] == pytest.approx(30 * 86_400, rel=0.01)


@scenario
def _log_start_outrunning_the_group():
    rows = []
    for k in range(11):
        t = 60 * k
        # the log start moves 0 -> 100,000 in 600 s (retention.bytes deleting segments), the group consumes
        # 100/s: at the end committed 120,000, log start 100,000: the 20,000 left go in 20,000 / 66.7 = 300 s,
        # inside the 10-minute window
        rows.append(snap(t, 0, 200_000 + 12_000 * k, 6_000 * k + 60_000, log_start=max(0, 12_000 * k - 20_000),
                         group="outrun", retention_ms=-1))
    return rows


def test_retention_outrunning_the_group_is_critical_before_any_data_is_lost(diagnosed):
    found = diagnosed(_log_start_outrunning_the_group)
    assert {f["severity"] for f in found} == {"critical"}
    loss = found[0]["evidence"]["data_loss"]
    assert loss["state"] == "at_risk" and loss["basis"] == "log_start" and loss["partitions"] == [0]
    assert loss["seconds"] == pytest.approx(20_000 / (100_000 / 600 - 100), rel=0.01)
    assert found[0]["evidence"]["retention_loss_partitions"] == []  # nothing lost yet


@scenario
def _unconsumed_under_three_retentions():
    rows = []
    for k in range(11):
        t = 60 * k
        # nobody consumes; the record at the committed offset is 55 minutes old at the end; retention 1 h
        rows.append(snap(t, 0, 1_000 + 600 * k, 500, state="EMPTY", members=0, member=None, group="old",
                         record_ts=600 - 3_300 if k == 10 else None, retention_ms=3_600_000))
        rows.append(snap(t, 0, 1_000 + 600 * k, 500, state="EMPTY", members=0, member=None, group="kept",
                         retention_ms=-1))
        rows.append(snap(t, 0, 1_000 + 600 * k, 500, state="EMPTY", members=0, member=None, group="unsaid"))
    return rows


def test_time_lag_meeting_retention_ms_is_at_risk_and_infinite_retention_is_safe(diagnosed):
    found = {f["group_id"]: f for f in diagnosed(_unconsumed_under_three_retentions)}
    old = found["old"]["evidence"]["data_loss"]
    assert (old["state"], old["basis"], old["retention_ms"]) == ("at_risk", "retention_ms", 3_600_000)
    assert old["seconds"] == pytest.approx(300, abs=1)  # the time lag grows 1 s per s with nobody consuming
    assert found["old"]["severity"] == "critical"
    assert found["kept"]["evidence"]["data_loss"]["state"] == "safe"
    # no retention known and a log start that never moved: cannot tell, and says so
    assert found["unsaid"]["evidence"]["data_loss"] == {"state": "unknown", "seconds": None, "partitions": [],
                                                        "retention_ms": None, "retention_bytes": None,
                                                        "basis": None, "cleanup_policy": None,
                                                        "horizon_seconds": 7 * 86_400.0}


@scenario
def _unconsumed_on_compacted_topics():
    rows = []
    for k in range(11):
        t = 60 * k
        # as "old" above (55 minutes behind a 1 h retention.ms), but on a compacted topic
        for group, policy in (("compacted", "compact"), ("both", "compact,delete")):
            rows.append(snap(t, 0, 1_000 + 600 * k, 500, state="EMPTY", members=0, member=None, group=group,
                             record_ts=600 - 3_300 if k == 10 else None, retention_ms=3_600_000,
                             cleanup_policy=policy))
    return rows


def test_a_compacted_topic_gets_no_data_loss_forecast_from_retention_ms(diagnosed):
    found = {f["group_id"]: f for f in diagnosed(_unconsumed_on_compacted_topics)}
    loss = found["compacted"]["evidence"]["data_loss"]
    assert loss == {"state": "not_applicable", "seconds": None, "partitions": [], "retention_ms": 3_600_000,
                    "retention_bytes": None,
                    "basis": "compacted topic: retention.ms does not delete unread records",
                    "cleanup_policy": "compact", "horizon_seconds": 3_600.0}
    # compact,delete: retention.ms still deletes, the forecast stands
    both = found["both"]["evidence"]["data_loss"]
    assert (both["state"], both["basis"]) == ("at_risk", "retention_ms")


def test_retention_loss_is_reported(spark, frame):
    from lagdoctor.diagnosis.features import partition_features

    rows = [snap(60 * k, 0, 1000 + 100 * k, 50, log_start=100 * k, state="EMPTY", members=0, member=None)
            for k in range(4)]
    (row,) = partition_features(frame(rows)).select("retention_loss").collect()
    assert row["retention_loss"] is True  # committed 50 < log start 300: unread data deleted


# -- time lag -------------------------------------------------------------------------


def test_time_lag_interpolates_caps_and_uses_record_time(spark, frame):
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.timelag import time_lag_by_partition

    rows = []
    for k in range(4):
        t, leo = 60 * k, 1000 + 600 * k  # end offsets 1000, 1600, 2200, 2800 at 0, 60, 120, 180 s
        last = k == 3
        # 0: committed 1900 at the end: the log reached 1900 at 60 + 300/600 * 60 = 90 s -> 90 s behind
        rows.append(snap(t, 0, leo, 1900 if last else 1000))
        # 1: committed 500, older than the window's first end offset: capped at the span, a lower bound
        rows.append(snap(t, 1, leo, 500))
        # 2: the collector fetched the committed record's timestamp: exact, 42 s
        rows.append(snap(t, 2, leo, 1900 if last else 1000, record_ts=180 - 42 if last else None))
        # 3: commit read a moment after the end offset, a little above it: lag 0, time lag 0
        rows.append(snap(t, 3, leo, leo + 7, lag=0))
        # 4: as 1, but the record's timestamp is known: exact an hour beyond the window, not capped
        rows.append(snap(t, 4, leo, 500, record_ts=-3600 if last else None))
    got = time_lag_by_partition(frame(rows)).select("partition", "time_lag_seconds", "time_lag_lower_bound",
                                                    "time_lag_source")
    expected = spark.createDataFrame(
        [(0, 90.0, False, "interpolated"), (1, 180.0, True, "lower_bound"), (2, 42.0, False, "record"),
         (3, 0.0, False, "caught_up"), (4, 3780.0, False, "record")], got.schema
    )
    assertDataFrameEqual(got, expected)


# -- group features -----------------------------------------------------------------


def test_rebalances_count_state_changes_and_member_churn(spark, frame):
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.features import group_features, group_series

    states = ["STABLE", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "STABLE",
              "PREPARING_REBALANCE", "STABLE", "STABLE", "STABLE"]
    # owner ids: a crash-looping member comes back under a new id, once without the
    # snapshot catching the rebalancing state (index 7)
    owners = ["c-1-a", "c-1-a", "c-1-a", "c-1-b", "c-1-b", "c-1-b", "c-1-c", "c-1-d", "c-1-d"]
    rows = []
    for k, (st, owner) in enumerate(zip(states, owners)):
        member = None if st != "STABLE" else owner  # unassigned while rebalancing
        rows.append(snap(30 * k, 0, 100 * k, 100 * k, state=st, member=member, group="loop"))
        # a quiet group: one scale-out (z joins and takes partition 1), seen as one rebalance
        for p in range(2):
            rows.append(snap(30 * k, p, 100 * k, 100 * k, group="calm",
                             member="c-2-z" if p == 1 and k >= 4 else "c-1-a", state="STABLE"))
    got = group_features(group_series(frame(rows))).select(
        "group_id", "rebalance_entries", "owner_changes", "rebalances"
    )
    # each new id is a member that left and one that joined (rule case 29): a -> b -> c -> d is six
    expected = spark.createDataFrame([("calm", 0, 1, 1), ("loop", 2, 6, 6)], got.schema)
    assertDataFrameEqual(got, expected)


def test_group_series_totals_equal_one_aggregation_over_every_row(frame):
    """The group series folds rows in two levels (by group state first, so Spark hashes instead
    of sorting); its totals equal one aggregation over every row, also where the rows of one
    snapshot disagree on the state, some reads failed, a commit or an owner is missing."""
    import random

    from pyspark.sql import functions as F

    from lagdoctor.diagnosis.features import GROUP_KEY, _with_read_error, group_series

    rng = random.Random(31)
    rows = []
    for g in range(12):
        for k in range(8):
            for p in range(rng.randint(1, 5)):
                failed = rng.random() < 0.1
                leo = None if failed else 1000 * k + p
                committed = None if failed or rng.random() < 0.1 else max(0, (leo or 0) - rng.randint(0, 500))
                rows.append(snap(60 * k, p, leo, committed, group=f"g{g}",
                                 state=rng.choice(["STABLE", "STABLE", "PREPARING_REBALANCE", None]),
                                 members=rng.choice([0, 1, 2, None]),
                                 member=rng.choice([None, "c-1-a", "c-2-b", "c-3-c"]),
                                 read_error="timed out" if failed else None))
    df = frame(rows)
    got = group_series(df)
    one = _with_read_error(df)
    owned = F.col("member_id").isNotNull()
    h = F.xxhash64("member_id")
    want = one.groupBy(*GROUP_KEY, "snapshot_ts").agg(
        F.when(F.count(F.when(F.col("lag").isNull() & F.col("read_error").isNotNull(), 1)) == 0,
               F.sum(F.coalesce(F.col("lag"), F.lit(0)))).alias("total_lag"),
        F.when(F.count("log_end_offset") == F.count(F.lit(1)), F.sum("log_end_offset")).alias("total_leo"),
        F.when(F.count("committed_offset") == F.count(F.lit(1)), F.sum("committed_offset")).alias("total_committed"),
        F.max("group_state").alias("group_state"),
        F.max("group_members").alias("group_members"),
        F.when(F.count(F.when(owned, 1)) > 0, F.xxhash64(
            F.min(F.when(owned, h)), F.max(F.when(owned, h)),
            F.bit_or(F.when(owned, F.expr("shiftleft(1L, cast(pmod(xxhash64(member_id), 64) as int))"))))
        ).alias("member_set"),
        F.count(F.when(~owned, 1)).alias("unowned_partitions"),
    )
    cols = [*GROUP_KEY, "snapshot_ts", "total_lag", "total_leo", "total_committed", "group_state", "group_members",
            "member_set", "unowned_partitions"]
    order = [*GROUP_KEY, "snapshot_ts"]
    got_rows = [r.asDict() for r in got.select(*cols).orderBy(*order).collect()]
    want_rows = [r.asDict() for r in want.select(*cols).orderBy(*order).collect()]
    assert len(got_rows) == 12 * 8 and got_rows == want_rows
    # the histories hold what the two levels must get right
    assert any(r["total_lag"] is None for r in got_rows) and any(r["total_committed"] is None for r in got_rows)
    assert any(r["member_set"] is None for r in got_rows)


def test_an_incremental_rebalance_counts_once(spark, frame):
    """Rule case 20: a group with live members and a partition nobody owns is still in the
    rebalance it entered, and an UNKNOWN state (a failed read) neither starts nor ends one."""
    from pyspark.testing import assertDataFrameEqual

    from lagdoctor.diagnosis.features import group_features, group_series

    # (state, members, owner of p0, owner of p1) per snapshot, 30 s apart
    courses = {
        # cooperative-sticky 1 -> 2: the revoke round, a STABLE generation with p1 unowned, the assign round
        "cooperative": [("STABLE", 1, "a", "a"), ("PREPARING_REBALANCE", 2, "a", "a"), ("STABLE", 2, "a", None),
                        ("PREPARING_REBALANCE", 2, "a", None), ("STABLE", 2, "a", "b"), ("STABLE", 2, "a", "b")],
        # the same, the snapshots catching no rebalancing state at all
        "cooperative_unseen": [("STABLE", 1, "a", "a"), ("STABLE", 2, "a", None), ("STABLE", 2, "a", "b")],
        # a KIP-848 member leaving, as an older collector wrote it: Assigning read as UNKNOWN
        "kip848": [("STABLE", 2, "a", "b"), ("UNKNOWN", 1, "a", None), ("RECONCILING", 1, "a", None),
                   ("STABLE", 1, "a", "a")],
        # a failed read (no member list) inside one eager rebalance
        "read_failed": [("STABLE", 2, "a", "b"), ("PREPARING_REBALANCE", 2, None, None), ("UNKNOWN", None, None, None),
                        ("COMPLETING_REBALANCE", 2, None, None), ("STABLE", 2, "a", "b")],
        # a member that joins and leaves twice: four rebalances, the last one seen only by its owners
        "loop": [("STABLE", 1, "a", "a"), ("STABLE", 2, "a", None), ("STABLE", 2, "a", "b"),
                 ("PREPARING_REBALANCE", 1, "a", None), ("STABLE", 1, "a", "a"), ("PREPARING_REBALANCE", 2, "a", "a"),
                 ("STABLE", 2, "a", None), ("PREPARING_REBALANCE", 2, "a", None), ("STABLE", 2, "a", "d"),
                 ("STABLE", 1, "a", "a")],
        # nobody consumes this topic any more (stale commits): never settled, nothing counted
        "abandoned": [("STABLE", 2, None, None), ("PREPARING_REBALANCE", 2, None, None), ("STABLE", 2, None, None)],
    }
    rows = [snap(30 * k, p, 100 * k, 100 * k, state=state, members=members, member=owner and f"c-{owner}",
                 group=group)
            for group, course in courses.items()
            for k, (state, members, *owners) in enumerate(course) for p, owner in enumerate(owners)]
    got = group_features(group_series(frame(rows))).select("group_id", "rebalance_entries", "owner_changes",
                                                            "rebalances")
    expected = spark.createDataFrame([("cooperative", 1, 1, 1), ("cooperative_unseen", 1, 1, 1), ("kip848", 1, 1, 1),
                                      ("read_failed", 1, 0, 1), ("loop", 3, 4, 4), ("abandoned", 0, 0, 0)],
                                     got.schema)
    assertDataFrameEqual(got, expected)


# -- classification: the traps stay healthy, real problems do not ----------------------


def _steady(group, **kw):
    return [snap(60 * k, p, 6_000 * k + 5_000, 6_000 * k + 5_000 - 20, group=group, **kw)
            for k in range(12) for p in range(2)]


@scenario
def _idle_empty():
    # idle EMPTY group, nothing produced, nothing to read: not a crash
    return [snap(60 * k, p, 5_000, 5_000, state="EMPTY", members=0, member=None, group="idle")
            for k in range(12) for p in range(2)]


@scenario
def _unknown_membership():
    # STABLE with no member list, as some Kafka-compatible brokers answer: null is not zero members
    return _steady("unknown", members=None, member=None)


@scenario
def _commit_read_above_the_end():
    # the collector read the commit a moment after the end offset: commit above the end, lag 0
    return [snap(60 * k, p, 6_000 * k + 5_000, 6_000 * k + 5_000 + (3 if k % 2 else 0), lag=0, group="race")
            for k in range(12) for p in range(2)]


@scenario
def _consumers_gone():
    # the same consumers, gone: EMPTY with 0 members while lag grows
    return [snap(60 * k, p, 6_000 * k + 5_000, 5_000, state="EMPTY", members=0, member=None, group="gone")
            for k in range(12) for p in range(2)]


@pytest.mark.parametrize(
    "build, expected",
    [(_idle_empty, {"healthy"}), (_unknown_membership, {"healthy"}), (_commit_read_above_the_end, {"healthy"}),
     (_consumers_gone, {"crashed_consumer"})],
    ids=["idle-empty", "unknown-membership", "commit-above-end", "crashed"],
)
def test_traps_stay_healthy_and_a_crash_does_not(diagnosed, build, expected):
    found = diagnosed(build)
    assert {f["diagnosis"] for f in found} == expected
    for f in found:
        assert (f["severity"] == "ok") == (f["diagnosis"] == "healthy")


@scenario
def _hot_partition_while_rebalancing():
    # one hot partition falling behind while the group keeps rebalancing
    rows = []
    states = ["STABLE", "PREPARING_REBALANCE", "STABLE", "STABLE"] * 4
    for k, st in enumerate(states):
        for p in range(4):
            leo = (50_000 if p == 0 else 2_000) * k
            committed = (10_000 * k) if p == 0 else leo
            rows.append(snap(60 * k, p, leo, committed, state=st,
                             member=None if st != "STABLE" else f"consumer-1-{k // 4}", group="busy"))
    return rows


def test_several_diagnoses_at_once(diagnosed):
    diagnoses = {f["diagnosis"]: f for f in diagnosed(_hot_partition_while_rebalancing)}
    assert set(diagnoses) == {"partition_imbalance", "rebalance_loop"}
    assert diagnoses["partition_imbalance"]["partitions"] == [0]
    assert diagnoses["rebalance_loop"]["evidence"]["rebalances"] >= 3



@scenario
def _surge_at_minute_4():
    rows = []
    for k in range(13):  # a snapshot a minute; the surge starts at minute 4 (the end of the first third)
        t, after = 60 * k, max(0, 60 * k - 240)
        for p in range(2):
            rows.append(snap(t, p, 20 * (t - after) + 100 * after, 20 * (t - after) + 30 * after, group="clicks"))
    return rows


def test_a_producer_surge_says_the_consumers_fall_behind_the_new_rate(diagnosed):
    """Consumers that kept up at 20 msg/s a partition, producers jumping to 100 while they top
    out at 30: the summary gives the consumers' rate before and after, never "keep up" with lag growing."""
    import re

    (f,) = diagnosed(_surge_at_minute_4)
    assert (f["diagnosis"], f["severity"]) == ("producer_surge", "critical")
    assert f["summary"] == ("produce rate rose 5.0x (40 -> 200 msg/s) while consumers went from 40 to 60 msg/s; "
                            "lag went from 0 to 67,200")
    # Whatever the wording: the late consume rate it states is below the late produce rate, which is why lag grew.
    number = r"([\d,.]+)"
    produced = re.search(rf"-> {number} msg/s", f["summary"]).group(1)
    consumed = re.search(rf"consumers went from {number} to {number} msg/s", f["summary"]).group(2)
    assert float(consumed.replace(",", "")) < float(produced.replace(",", ""))
    assert "keep up" not in f["summary"]


@scenario
def _surge_at_minute_1():
    rows = []
    for k in range(25):  # every 30 s
        t, after = 30 * k, max(0, 30 * k - 60)
        for p in range(3):
            rows.append(snap(t, p, 20 * (t - after) + 100 * after, 20 * (t - after) + 30 * after, group="clicks"))
    return rows


def test_a_surge_early_in_the_window_is_a_surge_not_a_slow_consumer(diagnosed):
    """Consumers that kept up at 20 msg/s a partition; at minute 1 of 12, inside the first third, producers
    jump to 100 on every partition and the consumers top out at 30, above the old rate: the baseline is the
    minute before the lag began to grow, not the first third (which already holds the surge)."""
    (f,) = diagnosed(_surge_at_minute_1)
    assert (f["diagnosis"], f["pattern"]) == ("producer_surge", "steady_climb")
    assert f["summary"].startswith("produce rate rose 5.0x (60 -> 300 msg/s) while consumers went from 60 to 90 msg/s")


@scenario
def _stuck_twice_on_partition_1():
    stuck = [(120, 360), (720, 960)]

    def consumed(t):  # 100 msg/s except while stuck
        return 100 * (t - sum(max(0, min(t, b) - a) for a, b in stuck))

    rows = []
    for k in range(49):  # every 30 s for 24 minutes
        t = 30 * k
        rows.append(snap(t, 0, 100 * t + 5_000, 100 * t + 4_980, member="consumer-1-aaa", group="orders"))
        rows.append(snap(t, 1, 100 * t + 5_000, consumed(t) + 5_000, member="consumer-2-bbb", host="10.0.0.2",
                         group="orders"))
    return rows


def test_a_staircase_of_stuck_records_is_a_stalled_consumer(diagnosed):
    """The seeds' staircase (0 -> 1000 -> 1000 -> 2000): partition 1's consumer is stuck on a record for 4 minutes,
    gets past it and keeps up at its load (the backlog stays), then sticks again. It moves at the window's end,
    so no single freeze shows: the repeated steps are a stalled consumer, not a slow one or an imbalance."""
    (f,) = diagnosed(_stuck_twice_on_partition_1)
    assert (f["diagnosis"], f["partitions"], f["pattern"]) == ("stalled_consumer", [1], "staircase")
    assert f["evidence"]["stuck_episodes"] == 2
    assert f["summary"] == ("partition 1 stopped committing 2 times in the window, each time leaving its backlog behind "
                            "(a stuck record, then the next): lag 48,000; owner consumer-2-bbb on 10.0.0.2")


# -- the seeds' incident --------------------------------------------------------------------


@pytest.fixture(scope="module")
def seeds_snapshots(spark, tmp_path_factory):
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.lab.sim import write_seeds_incident

    root = tmp_path_factory.mktemp("seeds")
    write_seeds_incident(str(root))
    return read_snapshots(spark, str(root))


def test_seeds_incident_is_a_partition_imbalance_naming_the_owner(seeds_snapshots):
    found = run_findings(seeds_snapshots)
    assert [f["diagnosis"] for f in found] == ["partition_imbalance"]
    f = found[0]
    assert (f["cluster"], f["group_id"], f["topic"], f["partitions"]) == ("prod", "orders-processor", "orders", [1])
    assert f["severity"] == "critical"
    assert f["summary"] == (
        "partition 1 holds 87% of the lag (4,442,768); owner consumer-2-def456 on 10.0.1.15 "
        "consumes 800 msg/s while 12,000 arrive"
    )
    ev = f["evidence"]
    assert ev["owner_member_id"] == "consumer-2-def456" and ev["owner_host"] == "10.0.1.15"
    assert ev["lag"] == 488_333 + 4_442_768 + 164_432
    assert ev["partition_lag"] == 4_442_768 and ev["lag_share"] == pytest.approx(0.8719, abs=1e-4)
    assert ev["partition_produce_rate"] == pytest.approx(12_000) and ev["partition_consume_rate"] == pytest.approx(800)
    # 4.4M behind at 12,000 msg/s is more than the 5 minutes of history: a capped lower bound
    assert ev["time_lag_seconds"] == 300.0 and ev["time_lag_lower_bound"] is True


def test_thresholds_are_parameters(seeds_snapshots):
    from lagdoctor.diagnosis.thresholds import Thresholds

    found = run_findings(seeds_snapshots, Thresholds(warning_lag=10_000_000, critical_lag=20_000_000))
    assert [f["diagnosis"] for f in found] == ["healthy"]  # 5.1M is below this team's warning level


def test_seeds_partition_status(seeds_snapshots):
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.status_job import partition_status

    pf = partition_features(seeds_snapshots)
    gf = group_features(group_series(seeds_snapshots))
    now_ms = int(datetime(2026, 11, 21, 14, 30, tzinfo=timezone.utc).timestamp() * 1000)
    rows = {r["partition"]: r.asDict() for r in partition_status(pf, gf, now_ms).collect()}
    assert {p: r["lag"] for p, r in rows.items()} == {0: 488_333, 1: 4_442_768, 2: 164_432}
    # lag never decreases while commits move: Burrow's WARN on every partition
    assert {r["status"] for r in rows.values()} == {"WARN"}
    assert rows[1]["produce_rate"] == pytest.approx(12_000) and rows[1]["consume_rate"] == pytest.approx(800)


# The case study in ../shared/seeds/001_*, replayed from its own final numbers: `kafka-consumer-groups.sh
# --describe` at the peak (partition, current offset, log end offset, owner, host), partition 1 consuming
# 800 msg/s while 12,000 arrive, and every partition's lag growing from zero.
CASE_STUDY = (
    (0, 8_412_901, 8_901_234, "consumer-1-abc123", "10.0.1.14"),
    (1, 8_100_442, 12_543_210, "consumer-2-def456", "10.0.1.15"),
    (2, 9_023_011, 9_187_443, "consumer-3-ghi789", "10.0.1.16"),
)


def _case_study_rows(others_arrive, steps=13):
    """Lag rises linearly from 0 on all three partitions to the case study's final lags. Partition 1 nets
    11,200 msg/s, so the climb takes 4,442,768 / 11,200 = 397 s; the other two fall behind at the rate that
    brings them to their final lag in that time while `others_arrive` msg/s arrive on each."""
    rise = (12_543_210 - 8_100_442) / (12_000 - 800)
    rows = []
    for k in range(steps + 1):
        t, back = rise * k / steps, rise * (steps - k) / steps
        for p, committed, leo, member, host in CASE_STUDY:
            produce = 12_000 if p == 1 else others_arrive
            end = round(leo - produce * back)
            lag = round((leo - committed) * k / steps)
            rows.append(snap(t, p, end, end - lag, member=member, host=host, members=3, group="user-events-consumer",
                             topic="user-events", cluster="prod"))
    return rows


scenario(_case_study_rows, 12_000)
scenario(_case_study_rows, 4_000)


@pytest.mark.parametrize("others_arrive", [12_000, 4_000], ids=["same-load-everywhere", "quieter-partitions"])
def test_the_seed_case_study_is_one_slow_owner_whatever_the_others_do(diagnosed, others_arrive):
    """The seed's lesson: one partition with most of the lag and its owner far below its arrival rate is
    a partition imbalance (one consumer's problem), not overall throughput, even while the other two fall
    behind a little too."""
    found = diagnosed(_case_study_rows, others_arrive)
    assert [(f["diagnosis"], f["partitions"]) for f in found] == [("partition_imbalance", [1])]
    (f,) = found
    assert (f["severity"], f["pattern"]) == ("critical", "steady_climb")
    assert f["summary"] == ("partition 1 holds 87% of the lag (4,442,768); owner consumer-2-def456 on 10.0.1.15 "
                            "consumes 800 msg/s while 12,000 arrive")
    ev = f["evidence"]
    assert (ev["owner_member_id"], ev["owner_host"]) == ("consumer-2-def456", "10.0.1.15")
    assert ev["lag_start"] == 0 and ev["lag"] == 488_333 + 4_442_768 + 164_432
    assert ev["lag_share"] == pytest.approx(0.8719, abs=1e-4)


# -- patterns --------------------------------------------------------------------------------


def _shape(name, n=60):
    """Lag at snapshot k of n for each named shape (1,000 msg/s arrive throughout)."""
    top = 2_000_000
    out = []
    for k in range(n):
        x = k / (n - 1)
        if name == "flat":
            lag = 20_000 + (k % 3) * 500
        elif name == "steady_climb":
            lag = top * x + (k % 2) * 4_000
        elif name == "sawtooth":
            lag = top * ((k % 12) / 11)
        elif name == "staircase":
            lag = top * (k // 12 + (1 if k % 12 >= 11 else 0)) / 5
        elif name == "plateau":
            lag = top * min(1.0, x / 0.5)
        elif name == "explosion":
            lag = top * max(0.0, (x - 0.55) / 0.45) ** 1.5
        elif name == "spiky":
            lag = top if k % 15 in (7, 8) else 1_000
        elif name == "roller_coaster":  # the seeds' 0 -> 5000 -> 0 -> 8000 -> 0 -> 12000: each wave higher
            lag = top * (0.3 + 0.7 * x) * math.sin(math.pi * (k % 20) / 20)
        elif name == "level_waves":  # waves whose peaks stay level: a sawtooth by the seeds, not a roller coaster
            lag = top * (0.6 + 0.4 * math.sin(2 * math.pi * x * 3))
        out.append(int(lag))
    return out


@pytest.mark.parametrize("pattern", ["flat", "steady_climb", "sawtooth", "staircase", "plateau", "explosion",
                                     "spiky", "roller_coaster"])
def test_pattern_from_lag_shape(frame, pattern):
    from lagdoctor.diagnosis.features import group_features, group_series
    from lagdoctor.diagnosis.patterns import lag_pattern

    rows = [snap(30 * k, 0, 30_000 * k + 5_000_000, 30_000 * k + 5_000_000 - lag) for k, lag in
            enumerate(_shape(pattern))]
    (row,) = lag_pattern(group_features(group_series(frame(rows)))).select("pattern").collect()
    assert row["pattern"] == pattern


@pytest.mark.parametrize("shape, pattern", [("level_waves", "sawtooth"), ("roller_coaster", "roller_coaster")])
def test_a_roller_coaster_has_growing_peaks_and_level_waves_are_a_sawtooth(frame, shape, pattern):
    from lagdoctor.diagnosis.features import group_features, group_series
    from lagdoctor.diagnosis.patterns import lag_pattern

    rows = [snap(30 * k, 0, 30_000 * k + 5_000_000, 30_000 * k + 5_000_000 - lag) for k, lag in
            enumerate(_shape(shape))]
    (row,) = lag_pattern(group_features(group_series(frame(rows)))).select("pattern").collect()
    assert row["pattern"] == pattern


# -- unknown is never zero, offset resets (classify.py cases 7-10) -----------------------------


def _keeping_up(group, k_max=6, partitions=2, fail_at_end=None, **kw):
    """A group that keeps up (lag 20 per partition); `fail_at_end` = (partition, read_error)."""
    rows = []
    for k in range(k_max):
        for p in range(partitions):
            if fail_at_end and k == k_max - 1 and p == fail_at_end[0]:
                rows.append(snap(60 * k, p, 6_000 * k + 5_000, None, lag=None, group=group,
                                 read_error=fail_at_end[1], **kw))
            else:
                rows.append(snap(60 * k, p, 6_000 * k + 5_000, 6_000 * k + 4_980, group=group, **kw))
    return rows


def test_a_failed_read_at_the_end_is_incomplete_not_healthy_ok(frame):
    rows = _keeping_up("fine") + _keeping_up("failed", fail_at_end=(1, "committed offsets: timed out"))
    found, status = run_findings(frame(rows), with_status=True)
    by_group = {f["group_id"]: f for f in found}
    assert len(found) == 2
    fine, failed = by_group["fine"], by_group["failed"]
    assert (fine["diagnosis"], fine["severity"], fine["evidence"]["data_complete"]) == ("healthy", "ok", True)
    # healthy by what is known, but never "ok": a failed read must not close an incident
    assert (failed["diagnosis"], failed["severity"]) == ("healthy", "warning")
    ev = failed["evidence"]
    assert (ev["data_complete"], ev["read_errors"], ev["read_error_count"], ev["lag_unknown_partitions"]) == (
        False, ["partition 1: committed offsets: timed out"], 1, [1])
    assert ev["lag"] == 40  # the last known lag of partition 1 (20), not 0
    assert failed["summary"] == ("Incomplete data: 1 read failed (partition 1: committed offsets: timed out); "
                                 "consumers keep up: lag 40 across 2 partitions, 200 msg/s consumed of 200 produced")
    rows_by = {(s["group_id"], s["partition"]): s for s in status}
    # contract 2's int lag: the last known value, flagged unknown
    failed_row, fine_row = rows_by[("failed", 1)], rows_by[("fine", 1)]
    assert (failed_row["lag"], failed_row["lag_unknown"], failed_row["read_error"]) == (
        20, True, "committed offsets: timed out")
    assert (fine_row["lag"], fine_row["lag_unknown"], fine_row["read_error"]) == (20, False, None)


@scenario
def _log_end_read_failed_at_the_end():
    rows = _keeping_up("g", fail_at_end=(0, "log end offset: timed out"))
    rows[-2] = snap(300, 0, None, 29_980, lag=None, group="g", read_error="log end offset: timed out")
    return rows


def test_a_log_offset_failure_keeps_the_row_and_the_known_lag(diagnosed):
    (f,) = diagnosed(_log_end_read_failed_at_the_end)
    assert (f["severity"], f["evidence"]["data_complete"], f["evidence"]["read_errors"]) == (
        "warning", False, ["partition 0: log end offset: timed out"])
    assert f["evidence"]["produce_rate"] == pytest.approx(200.0)  # from the known end offsets only: 100 + 100


def test_group_level_read_failures(frame):
    marker = dict(topic="", member=None, members=None, state="UNKNOWN")
    rows = [snap(60 * k, -1, None, None, group="lost", read_error="committed offsets: COORDINATOR_LOAD_IN_PROGRESS",
                 **marker) for k in range(3)]
    # topics known earlier, the whole group unreadable at the last snapshot
    rows += [r for r in _keeping_up("gone-dark", k_max=3)]
    rows.append(snap(180, -1, None, None, group="gone-dark", read_error="group description: timed out", **marker))
    # a failure in the middle of the window, readable since: history, not a finding
    rows += [r for r in _keeping_up("recovered", k_max=4) if r[0] != T0 + timedelta(seconds=60)]
    rows.append(snap(60, -1, None, None, group="recovered", read_error="committed offsets: timed out", **marker))
    found, status = run_findings(frame(rows), with_status=True)
    got = {(f["group_id"], f["topic"]): f for f in found}
    assert set(got) == {("lost", ""), ("gone-dark", "t"), ("recovered", "t")}
    lost = got[("lost", "")]
    assert (lost["diagnosis"], lost["severity"], lost["partitions"]) == ("healthy", "warning", [])
    assert lost["summary"] == ("Incomplete data: 1 read failed (group: committed offsets: "
                               "COORDINATOR_LOAD_IN_PROGRESS); the group's offsets could not be read; "
                               "nothing is known of its lag")
    dark = got[("gone-dark", "t")]
    assert (dark["severity"], dark["evidence"]["data_complete"], dark["evidence"]["read_errors"]) == (
        "warning", False, ["group: group description: timed out"])
    recovered = got[("recovered", "t")]
    assert (recovered["severity"], recovered["evidence"]["data_complete"]) == ("ok", True)
    assert all(s["partition"] >= 0 for s in status)  # the group-level row is no partition


@scenario
def _group_listing_failed():
    marker = dict(topic="", member=None, members=None, state="UNKNOWN")
    rows = [snap(0, -1, None, None, group="", read_error="group listing: Broker: Coordinator load in progress "
                 "(COORDINATOR_LOAD_IN_PROGRESS)", **marker)]
    return rows + _keeping_up("g", k_max=3)


def test_a_failed_group_listing_makes_the_run_incomplete(diagnosed):
    got = {(f["group_id"], f["topic"]): f for f in diagnosed(_group_listing_failed)}
    listing = got[("", "")]
    assert (listing["severity"], listing["evidence"]["data_complete"]) == ("warning", False)
    assert listing["summary"] == ("Incomplete data: 1 read failed (group: group listing: Broker: Coordinator load "
                                  "in progress (COORDINATOR_LOAD_IN_PROGRESS)); the cluster's group listing failed: "
                                  "groups may be missing from this run")
    assert got[("g", "t")]["evidence"]["data_complete"]  # the groups that were read stand


def test_log_end_offset_going_backwards_is_a_warning_not_lag_0(frame):
    rows = []
    for k in range(8):
        # partition 0: the topic is recreated after minute 3; the group's old commit (3,256) stays put
        leo0 = 3_000 + 64 * k if k < 4 else 40 + 20 * (k - 4)
        rows.append(snap(60 * k, 0, leo0, min(3_000 + 64 * k, 3_192), lag=max(0, leo0 - 3_192) if k < 4 else 0))
        rows.append(snap(60 * k, 1, 6_000 * k + 5_000, 6_000 * k + 4_980))
    found, status = run_findings(frame(rows), with_status=True)
    (f,) = found
    assert f["severity"] == "warning" and f["evidence"]["offset_reset_partitions"] == [0]
    assert f["evidence"]["log_end_fell_partitions"] == [0]
    assert "log end offset went backwards on partition 0 (topic recreated or truncated?)" in f["summary"]
    by_p = {s["partition"]: s for s in status}
    assert by_p[0]["status"] == "REWIND" and by_p[1]["status"] == "WARN"  # p1: Burrow's constant non-zero lag
    assert by_p[0]["produce_rate"] == pytest.approx(20 / 60, abs=1e-3)  # after the reset only


@scenario
def _commit_above_a_standing_log_end():
    rows = []
    for k in range(4):
        rows.append(snap(60 * k, 0, 100, 10_000, lag=0))
        rows.append(snap(60 * k, 1, 6_000 * k + 5_000, 6_000 * k + 4_980))
    return rows


def test_a_commit_above_a_log_end_that_never_moved_says_so_not_went_backwards(diagnosed):
    """Case 10, seen on data it never saw: commit 10,000 on a topic of 100 records, the log end
    standing at 100 all window, a live member; partition 1 keeps up. Before: "log end offset went
    backwards ... consumers keep up", neither of which was true."""
    (f,) = diagnosed(_commit_above_a_standing_log_end)
    assert (f["diagnosis"], f["severity"]) == ("healthy", "warning")
    assert f["summary"].startswith(
        "committed offset 10,000 is above the log end 100 on partition 0 (topic recreated, or offsets set by "
        "hand): the group will reset per auto.offset.reset or read nothing; lag ")
    assert "went backwards" not in f["summary"] and "keep up" not in f["summary"]
    ev = f["evidence"]
    assert (ev["offset_reset_partitions"], ev["commit_above_partitions"], ev["log_end_fell_partitions"]) == (
        [0], [0], [])
    assert ev["catch_up"]["state"] == "unknown"  # it reads nothing until it resets: not "caught up"


def _committed_above_the_log_end(above):
    return [snap(60 * k, 0, 40 + 20 * k, 40 + 20 * k + above, lag=0) for k in range(5)]


scenario(_committed_above_the_log_end, 3)
scenario(_committed_above_the_log_end, 3_216)


@pytest.mark.parametrize("above, expected", [(3, []), (3_216, [0])], ids=["read-race", "recreated-before-window"])
def test_commit_far_above_the_log_end_is_a_reset(diagnosed, above, expected):
    (f,) = diagnosed(_committed_above_the_log_end, above)
    assert f["evidence"]["offset_reset_partitions"] == expected
    assert f["severity"] == ("warning" if expected else "ok")


def test_scoped_run_keeps_only_the_asked_groups_and_topic(frame):
    import re2

    from lagdoctor.diagnosis.snapshots import scope_snapshots

    marker = snap(0, -1, None, None, group="orders-eu", topic="", member=None, read_error="committed offsets: x")
    listing = snap(0, -1, None, None, group="", topic="", member=None, read_error="group listing: x")
    rows = [snap(0, 0, 10, 10, group=g, topic=t) for g in ("orders-eu", "orders-us", "legacy-orders-eu")
            for t in ("a", "b")] + [marker, listing]
    got = scope_snapshots(frame(rows), re2.compile("orders-.*"), "a").select("group_id", "topic").collect()
    # full match; the group's failure row stays, and the failed listing's (the asked groups may be missing)
    assert sorted((r["group_id"], r["topic"]) for r in got) == [
        ("", ""), ("orders-eu", ""), ("orders-eu", "a"), ("orders-us", "a")]


# -- the Burrow evaluator in Spark SQL equals the Python reference ------------------------


def _random_partition(rng):
    """A status window as the features carry it, with the faults the evaluator must judge:
    repeats, rewinds, null reads, commits past the log end, retention loss, rows after now."""
    ts = 1_700_000_000_000_000 + rng.randrange(0, 10**9)
    committed, leo, rows = rng.randrange(0, 1000), rng.randrange(1000, 5000), []
    for _ in range(rng.randrange(0, 14)):
        ts += rng.choice((1, 10, 30, 60, 600)) * 1_000_000 + rng.randrange(0, 999_999)
        move = rng.random()
        if move < 0.4:
            committed += rng.randrange(1, 400)
        elif move < 0.5:
            committed -= rng.randrange(1, 800)  # a rewind
        leo += rng.choice((0, 0, rng.randrange(1, 500)))
        c = None if rng.random() < 0.12 else committed
        e = None if rng.random() < 0.08 else leo
        lag = rng.choice((None, 0, max(0, e - c) if e is not None and c is not None else None,
                          rng.randrange(0, 3000)))
        lso = rng.choice((None, 0, rng.randrange(0, 1200)))
        rows.append({"snapshot_ts_us": ts, "committed_offset": c, "log_end_offset": e,
                     "log_start_offset": lso, "lag": lag})
    rng.shuffle(rows)  # collect_list gives no order
    now_ms = (rows[rng.randrange(len(rows))]["snapshot_ts_us"] // 1000 + rng.choice((0, 1, 60_000, 3_600_000))
              if rows else 1_700_000_000_000)
    return {"status_window": rows, "now_ms": now_ms, "allowed_lag": rng.choice((0, 0, 100)),
            "window_len": rng.choice((1, 2, 3, 10)), "group_members": rng.choice((None, 0, 3)),
            "group_state": rng.choice(("STABLE", "EMPTY", "DEAD", "UNKNOWN", None)),
            "offset_reset": rng.random() < 0.03}


def _python_status(p):
    from lagdoctor.status import REWIND, evaluate_partition

    if p["offset_reset"]:
        return REWIND
    rows = [{**r, "snapshot_ts_ms": r["snapshot_ts_us"] // 1000} for r in p["status_window"]]
    if not rows:
        return "OK"
    members, state = p["group_members"], p["group_state"]
    has_members = members > 0 if members is not None else (True if state == "STABLE" else None)
    return evaluate_partition(rows, p["now_ms"], allowed_lag=p["allowed_lag"], window_len=p["window_len"],
                              group_has_members=has_members)


def test_sql_evaluator_equals_the_python_reference_on_random_windows(spark):
    """2,000 random windows (seeded): the job's Spark SQL status is evaluate_partition's, every time."""
    import random

    from pyspark.sql import types as T

    from lagdoctor.diagnosis.status_job import evaluate_status

    rng = random.Random(20261123)
    cases = [_random_partition(rng) for _ in range(2_000)]
    row_type = T.StructType([T.StructField(n, T.LongType()) for n in
                             ("snapshot_ts_us", "committed_offset", "log_end_offset", "log_start_offset", "lag")])
    schema = T.StructType([
        T.StructField("case", T.IntegerType()), T.StructField("status_window", T.ArrayType(row_type)),
        T.StructField("group_members", T.IntegerType()), T.StructField("group_state", T.StringType()),
        T.StructField("offset_reset", T.BooleanType())])
    # the evaluator takes now/allowed/window as constants: one frame per combination
    mismatches, checked = [], 0
    by_combo: dict = {}
    for i, c in enumerate(cases):
        by_combo.setdefault((c["allowed_lag"], c["window_len"]), []).append(i)
    for (allowed, window_len), idx in by_combo.items():
        # now varies per case: shift every case's times so that its own now maps to one shared now
        shared_now = 1_800_000_000_000
        rows = []
        for i in idx:
            c = cases[i]
            shift = (shared_now - c["now_ms"]) * 1000
            window = [{**r, "snapshot_ts_us": r["snapshot_ts_us"] + shift} for r in c["status_window"]]
            rows.append((i, window, c["group_members"], c["group_state"], c["offset_reset"]))
        df = spark.createDataFrame(rows, schema)
        got = {r["case"]: r["status"] for r in
               evaluate_status(df, shared_now, allowed, window_len).select("case", "status").collect()}
        for i in idx:
            checked += 1
            expected = _python_status(cases[i])
            if got[i] != expected:
                mismatches.append((i, expected, got[i], cases[i]))
    assert checked == len(cases)
    assert not mismatches, f"{len(mismatches)} differ, e.g. {mismatches[:2]}"
    assert {_python_status(c) for c in cases} >= {"OK", "WARN", "ERR", "STOP", "STALL", "REWIND"}


def _txn_rows(stable_at, committed_at, minutes=11):
    """One partition of a transactional topic, 1,000 msg/s: the stable offset and the
    group's commit at each minute come from the given functions of the minute."""
    return [snap(60 * k, 0, 60_000 * k, committed_at(k), record={"last_stable_offset": stable_at(k)})
            for k in range(minutes)]


@scenario
def _behind_a_transaction_open_since_minute_2():
    # a transaction opened at minute 2 never ends; the group read everything before it
    return _txn_rows(lambda k: min(k, 2) * 60_000, lambda k: min(k, 2) * 60_000)


@scenario
def _following_a_transaction_committed_every_4_minutes():
    # Flink's exactly-once sink commits its transaction at each checkpoint (here every
    # 4 minutes): the stable offset jumps, stands, jumps; the group follows it. At the
    # end it has stood 3 minutes, longer than the stall rule's 2, shorter than 2 holds.
    def stable(k):
        return (k // 4) * 4 * 60_000

    return _txn_rows(stable, stable, minutes=12)


@scenario
def _stalled_without_a_stable_offset():
    # an older writer's rows (no last_stable_offset): a stalled consumer stays a stalled consumer
    return [snap(60 * k, 0, 60_000 * k, 60_000 * min(k, 2)) for k in range(11)]


def test_a_read_committed_group_at_a_stable_offset_frozen_for_minutes_waits_on_a_hanging_transaction(diagnosed):
    (f,) = diagnosed(_behind_a_transaction_open_since_minute_2)
    assert f["diagnosis"] == "stalled_consumer" and "waits behind an open transaction" in f["summary"]
    ev = f["evidence"]
    assert ev["transaction_blocked_partitions"] == [0] and ev["hanging_transaction_partitions"] == [0]
    assert (ev["last_stable_offset"], ev["transaction_open_seconds"]) == (120_000, 480.0)


def test_a_producer_committing_every_few_minutes_is_not_a_hanging_transaction(diagnosed):
    (f,) = diagnosed(_following_a_transaction_committed_every_4_minutes)
    assert f["evidence"]["last_stable_offset"] == 480_000 and f["evidence"]["transaction_open_seconds"] == 180.0
    assert f["diagnosis"] == "healthy", f["summary"]
    assert f["evidence"]["hanging_transaction_partitions"] == []


def test_without_a_stable_offset_no_transaction_is_inferred(diagnosed):
    (f,) = diagnosed(_stalled_without_a_stable_offset)
    assert f["diagnosis"] == "stalled_consumer" and "stopped committing" in f["summary"]
    assert f["evidence"]["hanging_transaction_partitions"] == [] and f["evidence"]["last_stable_offset"] is None


def test_a_window_whose_data_ends_early_says_so(spark, frame):
    """Issue 17: a replayed group's data ended 16 minutes before the window did, and nothing said so.
    The group's snapshots stop at 14 min of a 30-min window; another group's run to the end."""
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features

    rows = [snap(60 * k, 0, 100 * k, 100 * k, group="replayed") for k in range(15)]
    rows += [snap(60 * k, 0, 100 * k, 100 * k, group="live") for k in range(31)]
    df = frame(rows)
    pf = partition_features(df)
    gf = group_features(group_series(df, pf))
    found = {r["group_id"]: r.asDict(recursive=True)
             for r in findings(pf, gf, window_start=T0, window_end=T0 + timedelta(minutes=30)).collect()}
    replayed, live = found["replayed"], found["live"]
    assert replayed["summary"].startswith("data ends 16m00s before the window end (last snapshot 2026-11-21 12:14:00 UTC); ")
    assert replayed["evidence"]["data_end"] == "2026-11-21T12:14:00.000000Z"
    assert replayed["evidence"]["data_end_gap_seconds"] == 960.0
    assert "data ends" not in live["summary"] and live["evidence"]["data_end_gap_seconds"] == 0.0


# -- provisional findings (issue 18: the first post is right, or says it is provisional) --------------


def _hot_partition_frozen_since_60(until):
    """3 partitions at a 30 s cadence; partition 1 gets 50 msg/s and its commit stands still from t=60."""
    rows = []
    for t in range(0, until + 1, 30):
        for p in (0, 2):
            rows.append(snap(t, p, 10 * t, 10 * t))
        rows.append(snap(t, 1, 50 * t, 50 * min(t, 60)))
    return rows


scenario(_hot_partition_frozen_since_60, 120)
scenario(_hot_partition_frozen_since_60, 180)


def test_a_commit_standing_still_briefly_is_provisional_between_stalled_and_imbalance(diagnosed):
    # 60 s still of the 120 s rule 3 asks: a stuck record or a slow owner, not yet known
    found = diagnosed(_hot_partition_frozen_since_60, 120)
    assert [f["diagnosis"] for f in found] == ["partition_imbalance"]
    f = found[0]
    assert f["provisional"] is True
    assert f["deciding_between"] == ["partition_imbalance", "stalled_consumer"]
    # still since 12:01:00; 120 s later, at the 30 s cadence two more snapshots
    assert f["decided_by"] == "2026-11-21T12:03:00Z"
    assert f["samples_needed"] == 2
    assert "partition 1" in f["undecided_because"] and "1m00s" in f["undecided_because"]


@scenario
def _stuck_at_120_s_at_the_labs_cadence():
    rows = []
    for t in (0, 10, 70, 80, 140, 150):
        for p in (0, 2):
            rows.append(snap(t, p, 100 * t, 100 * t - 5))
        rows.append(snap(t, 1, 100 * t, 100 * min(t, 120) - 5))
    return rows


def test_the_first_sweep_after_a_consumer_got_stuck_is_provisional_not_imbalance(diagnosed):
    """Sweeps 70 s apart, 2 samples 10 s apart (the lab's cadence): partition 1's consumer got
    stuck at t=120 while 100 msg/s arrive. The first sweep after sees its commit still at both
    samples (10 s): a stuck record or a slow owner, not yet known; never a confident imbalance,
    the first post the live lab saw go wrong."""
    found = [f for f in diagnosed(_stuck_at_120_s_at_the_labs_cadence) if f["diagnosis"] != "healthy"]
    assert [(f["diagnosis"], f["provisional"], f["partitions"]) for f in found] == [
        ("partition_imbalance", True, [1])]
    assert found[0]["deciding_between"] == ["partition_imbalance", "stalled_consumer"]


def test_the_same_partition_with_more_samples_is_decided_stalled(diagnosed):
    found = diagnosed(_hot_partition_frozen_since_60, 180)
    assert [(f["diagnosis"], f["provisional"]) for f in found] == [("stalled_consumer", False)]
    assert found[0]["deciding_between"] == [] and found[0]["decided_by"] is None


@scenario
def _slow_owner_committing_as_it_goes():
    rows = []
    for t in range(0, 121, 30):
        for p in (0, 2):
            rows.append(snap(t, p, 10 * t, 10 * t))
        rows.append(snap(t, 1, 50 * t, 5 * t))
    return rows


def test_a_slow_owner_that_commits_as_it_goes_is_decided_imbalance(diagnosed):
    found = diagnosed(_slow_owner_committing_as_it_goes)
    assert [(f["diagnosis"], f["provisional"]) for f in found] == [("partition_imbalance", False)]


@scenario
def _behind_from_the_first_snapshot():
    # 100 msg/s arrive, 60 consumed, from the first snapshot on: was it always so, or did the load rise?
    return [snap(t, p, 100 * t, 60 * t) for t in range(0, 91, 10) for p in (0, 1)]


def test_lag_growing_from_the_first_snapshot_of_a_short_window_is_provisional_surge_or_slow(diagnosed):
    found = diagnosed(_behind_from_the_first_snapshot)
    assert len(found) == 1
    f = found[0]
    assert f["diagnosis"] in ("slow_consumer", "producer_surge")
    assert f["provisional"] is True
    assert sorted(f["deciding_between"]) == ["producer_surge", "slow_consumer"]
    assert f["deciding_between"][0] == f["diagnosis"]
    # the first third must span baseline_min_seconds (60 s): a 180 s window, 9 more 10 s samples
    assert f["decided_by"] == "2026-11-21T12:03:00Z"
    assert f["samples_needed"] == 9
    assert "kept up" in f["undecided_because"]


def _surge_after_a_two_minute_baseline(until=300):
    rows = []
    for t in range(0, until + 1, 10):
        for p in (0, 1):
            if t <= 120:
                rows.append(snap(t, p, 20 * t, 20 * t))  # kept up with 20 msg/s
            else:
                rows.append(snap(t, p, 2400 + 100 * (t - 120), 2400 + 60 * (t - 120)))
    return rows


scenario(_surge_after_a_two_minute_baseline, 240)
scenario(_surge_after_a_two_minute_baseline, 300)


def test_a_surge_after_a_baseline_is_decided_producer_surge(diagnosed):
    # rule case 36: 2 minutes into the rise it may still be a burst the consumers absorb
    (young,) = diagnosed(_surge_after_a_two_minute_baseline, 240)
    assert (young["diagnosis"], young["provisional"], young["deciding_between"]) == (
        "producer_surge", True, ["producer_surge", "healthy"])
    assert young["decided_by"] == "2026-11-21T12:04:30Z" and young["samples_needed"] == 3
    assert "risen at every snapshot for 2m00s" in young["undecided_because"]
    # 3 minutes in, still rising: decided
    found = diagnosed(_surge_after_a_two_minute_baseline, 300)
    assert [(f["diagnosis"], f["provisional"]) for f in found] == [("producer_surge", False)]


def _one_stuck_episode_then_still_again(until):
    """Partition 1 (50 msg/s) stood still 150 s at offset 50 (one stuck episode), got past it at
    t=180 leaving its backlog, and stands still at 1000 since; partitions 0 and 2 keep up."""
    rows = []
    for t in range(0, until + 1, 30):
        for p in (0, 2):
            rows.append(snap(t, p, 100 + 10 * t, 100 + 10 * t))
        rows.append(snap(t, 1, 100 + 50 * t, 50 if t <= 150 else 1000))
    return rows


scenario(_one_stuck_episode_then_still_again, 210)
scenario(_one_stuck_episode_then_still_again, 300)


def test_a_single_stuck_episode_in_a_short_window_is_provisional(diagnosed):
    found = diagnosed(_one_stuck_episode_then_still_again, 210)
    assert [(f["diagnosis"], f["provisional"]) for f in found] == [("partition_imbalance", True)]
    f = found[0]
    assert f["deciding_between"] == ["partition_imbalance", "stalled_consumer"]
    assert f["evidence"]["stuck_episodes"] == 1
    # a second episode needs the run since 12:03:00 to last 120 s: 12:05:00, three more 30 s samples
    assert (f["decided_by"], f["samples_needed"]) == ("2026-11-21T12:05:00Z", 3)


def test_a_second_stuck_episode_decides_stalled(diagnosed):
    found = diagnosed(_one_stuck_episode_then_still_again, 300)
    assert [(f["diagnosis"], f["provisional"]) for f in found] == [("stalled_consumer", False)]
    assert found[0]["evidence"]["stuck_episodes"] == 2


def _slowed_at(minute, until=30, produce=200, consume=120):
    """Two partitions at `produce` msg/s, consumed at that rate until `minute`, then at `consume`."""
    rows = []
    for k in range(until + 1):
        t, after = 60 * k, max(0, 60 * (k - minute))
        for p in range(2):
            rows.append(snap(t, p, produce * t, produce * (t - after) + consume * after, group="orders"))
    return rows


scenario(_slowed_at, 27)


def test_a_consumer_that_slowed_three_minutes_ago_is_called_slow_at_the_next_sweep(diagnosed):
    """A consumer drops from 200 to 120 msg/s a partition at minute 27 of a 30-minute window: its window
    averages (192 of 200) still look like keeping up and the window's line hardly fits a hockey stick, but
    since the lag began to rise it has fallen 80 msg/s behind on each partition, steadily: slow_consumer now,
    not healthy until a third of the window follows the onset."""
    (f,) = diagnosed(_slowed_at, 27)
    assert (f["diagnosis"], f["severity"]) == ("slow_consumer", "critical")
    assert f["partitions"] == [0, 1]
    assert f["evidence"]["lag"] == 2 * 80 * 180


@scenario
def _slowed_for_three_minutes_then_caught_up():
    rows = []
    for k in range(31):
        t = 60 * k
        slow = max(0, min(t, 60 * 27) - 60 * 24)  # seconds at 120 msg/s (minutes 24-27)
        fast = max(0, t - 60 * 27)  # seconds at 300 msg/s after
        for p in range(2):
            rows.append(snap(t, p, 200 * t, min(200 * t, 200 * (t - slow - fast) + 120 * slow + 300 * fast),
                             group="orders"))
    return rows


def test_a_consumer_that_slowed_and_caught_up_again_is_not_slow(diagnosed):
    """The same drop for three minutes, then back above its load: the lag rose and is draining, no slow consumer."""
    (f,) = diagnosed(_slowed_for_three_minutes_then_caught_up)
    assert f["diagnosis"] == "healthy"


def _surge_older_than_the_window():
    """30 minutes of a surge that began before the window: 100 msg/s a partition arrive, consumers top out at
    30, the lag is deep from the first snapshot (nothing in the window shows the load before it)."""
    rows = []
    for k in range(31):
        t = 60 * k
        for p in range(2):
            rows.append(snap(t, p, 900_000 + 100 * t, 500_000 + 30 * t, group="clicks"))
    return rows


# previous runs: a decided surge, and three that carry nothing
NOT_CARRIED = {"gap-before-the-window": {"data_end": T0 - timedelta(minutes=20)},  # the lag may have cleared between
               "provisional": {"provisional": True},  # it never said surge
               "not-a-surge": {"diagnosis": "slow_consumer"}}
scenario(_surge_older_than_the_window)
scenario(_surge_older_than_the_window, previous=[_previous()])
for _previous_run in NOT_CARRIED.values():
    scenario(_surge_older_than_the_window, previous=[_previous(**_previous_run)])


def test_a_surge_older_than_the_window_stays_a_surge_with_the_baseline_the_previous_run_measured(diagnosed):
    """Rule case 27: alone, this window reads as consumers too slow for a steady load; the previous run saw
    the surge begin (40 msg/s that the consumers kept up with): it is still that surge, not a flip to slow."""
    alone = {f["diagnosis"] for f in diagnosed(_surge_older_than_the_window)}
    assert alone == {"slow_consumer"}
    (f,) = diagnosed(_surge_older_than_the_window, previous=[_previous()])
    assert f["diagnosis"] == "producer_surge"
    assert f["evidence"]["baseline_source"] == "previous run"
    assert f["summary"].startswith("produce rate rose 5.0x (40 -> 200 msg/s) while consumers went from 40 to 60")


@pytest.mark.parametrize("previous", NOT_CARRIED.values(), ids=NOT_CARRIED.keys())
def test_nothing_is_carried_across_a_gap_or_from_a_run_that_did_not_decide_surge(diagnosed, previous):
    found = diagnosed(_surge_older_than_the_window, previous=[_previous(**previous)])
    assert {f["diagnosis"] for f in found} == {"slow_consumer"}
    assert {f["evidence"]["baseline_source"] for f in found} == {"first third"}



def _surge_then_draining(surge_minutes=25, drain_consume=60):
    """A surge that began before the window (100 msg/s a partition arrive, consumers top out at 30) ends
    `surge_minutes` in: arrivals fall back to 20 and the consumers, no longer starved of CPU, read
    `drain_consume`, so the lag falls."""
    rows = []
    end = 60 * surge_minutes
    for k in range(31):
        t = 60 * k
        produced = 100 * min(t, end) + 20 * max(0, t - end)
        consumed = 30 * min(t, end) + drain_consume * max(0, t - end)
        for p in range(2):
            rows.append(snap(t, p, 900_000 + produced, min(900_000 + produced, 850_000 + consumed), group="clicks"))
    return rows


scenario(_surge_then_draining)
scenario(_surge_then_draining, previous=[_previous()])
scenario(_surge_then_draining, previous=[_previous(**NOT_CARRIED["gap-before-the-window"])])
scenario(_surge_then_draining, 10, 400, previous=[_previous()])


def test_a_surges_backlog_draining_is_still_the_surge_not_a_slow_consumer(diagnosed):
    """Rule case 35, seen live: four minutes after a surge ended, its thread read "Cause changed: producer surge
    -> slow consumer" (the window's rates are a window of surge), then "Recovered" at lag 243,421. The previous
    run named the surge and the lag now falls: the surge is still the cause, said as draining."""
    alone = {f["diagnosis"] for f in diagnosed(_surge_then_draining)}
    assert "producer_surge" not in alone
    (f,) = diagnosed(_surge_then_draining, previous=[_previous()])
    assert f["diagnosis"] == "producer_surge" and f["severity"] != "ok"
    assert f["summary"] == ("the surge's backlog is draining: lag 286,000, down from 310,000 at its peak "
                            "(40 msg/s arrived before the surge)"), f["summary"]
    # not across a gap: the lag may have cleared and risen again in the runs between
    gap = diagnosed(_surge_then_draining, previous=[_previous(**NOT_CARRIED["gap-before-the-window"])])
    assert "producer_surge" not in {f["diagnosis"] for f in gap}


def test_once_a_surges_backlog_has_drained_the_group_is_healthy(diagnosed):
    (f,) = diagnosed(_surge_then_draining, 10, 400, previous=[_previous()])
    assert f["diagnosis"] == "healthy", f["summary"]

# A batch consumer of the live lab (drains everything and commits every 75 s), as a sweep sampled it: two
# snapshots 10 s apart about every minute, a window of 6 minutes; (seconds, log end offset, committed) on
# each of its two partitions (time compressed 5x: warning_lag 200).
LAB_BATCH = [(0.0, 26, 25), (10.0, 125, 35), (80.2, 828, 811), (90.2, 927, 811), (150.2, 1528, 811),
             (160.2, 1627, 1593), (217.3, 2198, 1593), (227.3, 2298, 1593), (289.4, 2920, 2376), (299.4, 3018, 2376)]


def test_a_batch_consumer_sampled_every_minute_is_not_a_slow_consumer(frame):
    """Seen live in the lab: the 75 s rhythm, sampled every minute, aliases into lag that reads as a climb
    (68, 1,410, 1,284 at three sweeps) and window rates short of what arrives: it was posted as a critical
    slow_consumer. Its commit stands still between snapshots and then passes all that waited, a backlog as big
    as today's: a batch rhythm, healthy. (A consumer that commits as it goes, too slowly, stays slow: above.)"""
    from lagdoctor.diagnosis.thresholds import Thresholds

    rows = [snap(t, p, leo, committed, group="batch") for t, leo, committed in LAB_BATCH for p in range(2)]
    lab = Thresholds(warning_lag=200, critical_lag=2000, pattern_min_lag=20, pattern_min_seconds=12.0,
                     baseline_min_seconds=12.0, stall_min_seconds=24.0)
    assert {f["diagnosis"] for f in run_findings(frame(rows), lab)} == {"healthy"}


# -- issue 29: the one-minute sweep (rule cases 29-34) ------------------------------------------------------


def _flow(seconds, produce, capacity, every=60):
    """[(t, log end offset, committed)] every `every` s of one partition: produce(s) msg/s arrive and the
    consumer reads up to capacity(s) msg/s of what waits, second by second, committing as it goes."""
    leo = committed = 0.0
    out = []
    for s in range(seconds + 1):
        if s % every == 0:
            out.append((s, int(leo), int(committed)))
        leo += produce(s)
        committed = min(leo, committed + capacity(s))
    return out


def _minute_window(flow, end, group, partitions=2, minutes=30, **kw):
    """The one-minute sweep's window ending at second `end`: the last `minutes` of `flow`, one sample a
    minute, on `partitions` alike partitions."""
    return [snap(t - end + 60 * minutes, p, leo, committed, group=group, **kw)
            for t, leo, committed in flow if end - 60 * minutes <= t <= end for p in range(partitions)]


@scenario
def _sweeps_after_a_minute_long_burst():
    flow = _flow(2400, lambda s: 150.0 if 1440 <= s < 1500 else 10.0, lambda s: 30.0)
    return [r for end in range(1500, 2401, 60) for r in _minute_window(flow, end, f"burst-{end // 60}", 4)]


def test_a_burst_absorbed_between_one_minute_sweeps_raises_no_alarm(diagnosed):
    """Rule case 32: 10 msg/s a partition, a minute of 150 at minute 24, consumers that read 30: the lag jumps
    to 7,200 a partition and drains in six minutes. Every sweep from the burst on is healthy: the one-minute
    sweep called such a burst a producer_surge while it drained (7 of 85 sweeps in the simulator)."""
    found = diagnosed(_sweeps_after_a_minute_long_burst)
    got = {f["group_id"]: (f["diagnosis"], f["deciding_between"]) for f in found}
    # rule case 36: the sweep right after it cannot tell it from a surge's start (provisional against
    # healthy, which Slack does not hear: threads rule 12); never a decided surge or slow consumer
    assert got == {"burst-25": ("producer_surge", ["producer_surge", "healthy"]),
                   **{f"burst-{m}": ("healthy", []) for m in range(26, 41)}}, got


@scenario
def _sweeps_after_a_surge_at_minute_30():
    flow = _flow(2400, lambda s: 60.0 if s >= 1830 else 20.0, lambda s: 40.0)
    return [r for end in (1860, 1920, 1980, 2040) for r in _minute_window(flow, end, f"clicks-{end // 60}")]


def test_a_surge_is_found_at_the_second_sweep_after_its_onset_never_slow_consumer_first(diagnosed):
    """Rule case 31: 20 msg/s a partition that consumers reading 40 kept up with; at minute 30.5 producers
    go to 60. The sweep at minute 31 cannot know yet (a lag one interval old could be a burst); the one at
    32 finds producer_surge from the rates since the lag rose (provisional: rule 36), the one at 33 decides it. Judged on the last third's rates alone, a
    surge 90 s old moved them from 20 to 26 msg/s, no surge, while the rise read as consumers gone slow:
    slow_consumer first (3 such sweeps in the simulator before issue 29)."""
    found = diagnosed(_sweeps_after_a_surge_at_minute_30)
    got = {f["group_id"]: (f["diagnosis"], f["provisional"]) for f in found}
    # rule case 36: at 32 the lag has risen for 90 s, a burst's rise as much as a surge's (provisional against
    # healthy); at 33 it still rises: decided
    assert got == {"clicks-31": ("healthy", False), "clicks-32": ("producer_surge", True),
                   "clicks-33": ("producer_surge", False), "clicks-34": ("producer_surge", False)}, got
    # it says the rates it judged: since the lag rose (the interval of the onset in it), not the last third's
    (first,) = [f for f in found if f["group_id"] == "clicks-32"]
    assert first["summary"] == ("produce rate rose 2.5x (40 -> 100 msg/s) while consumers went from 40 to 70 "
                                "msg/s; lag went from 0 to 3,600")


@scenario
def _a_burst_ending_and_a_surge_with_a_missed_sweep():
    burst = _flow(2400, lambda s: 150.0 if 1400 <= s < 1510 else 10.0, lambda s: 30.0)
    surge = _flow(2400, lambda s: 60.0 if s >= 1830 else 20.0, lambda s: 40.0)
    rows = [r for end in (1560, 1620) for r in _minute_window(burst, end, f"burst-{end // 60}", 4)]
    rows += [r for end in (1980, 2040) for r in _minute_window(surge, end, f"clicks-{end // 60}")
             if r[0] != T0 + timedelta(seconds=1920 - end + 1800)]  # the sweep at 32 missed
    return rows


def test_a_burst_ending_and_a_rise_a_missed_sweep_stretched_are_still_young(diagnosed):
    """Rule case 36, from the latency bench: a burst (150 msg/s a partition for 110 s where 10 arrive, consumers
    that read up to 30) rises over three one-minute intervals, 180 s, past surge_min_seconds, and was named a
    surge a sweep before it drained. Its last interval rose at 3% of the one before: a burst ending, still
    provisional against healthy; drained the next sweep. A surge whose sweep at minute 32 was missed has
    risen for 180 s over two intervals: provisional, decided at the next sweep, as without the miss."""
    found = diagnosed(_a_burst_ending_and_a_surge_with_a_missed_sweep)
    got = {f["group_id"]: (f["diagnosis"], f["deciding_between"]) for f in found}
    assert got == {"burst-26": ("producer_surge", ["producer_surge", "healthy"]), "burst-27": ("healthy", []),
                   "clicks-33": ("producer_surge", ["producer_surge", "healthy"]), "clicks-34": ("producer_surge", [])}, got
    (ending,) = [f for f in found if f["group_id"] == "burst-26"]
    assert ending["undecided_because"].startswith("the lag has risen for 3m00s, over its last interval at 3% of its "
                                                  "fastest rise: a burst ending"), ending["undecided_because"]
    (stretched,) = [f for f in found if f["group_id"] == "clicks-33"]
    assert stretched["samples_needed"] == 1, stretched


def _churning(group, owners_of_p1, states=None, stall_at=(), minutes=30, produce=100, capacity=100):
    """Two partitions at `produce` msg/s read at `capacity`, one snapshot a minute; consumer-1 owns partition 0
    and partition 1's owner at minute k is owners_of_p1(k) (None: nobody); commits stop on both partitions in
    the minutes of `stall_at` (an eager rebalance stops every member)."""
    rows, committed = [], 0
    for k in range(minutes + 1):
        if k and k - 1 not in stall_at:
            committed = min(produce * 60 * k, committed + capacity * 60)
        state = (states or {}).get(k, "STABLE")
        owner = owners_of_p1(k)
        rows.append(snap(60 * k, 0, produce * 60 * k, committed, state=state, members=2,
                         member=None if state != "STABLE" else "consumer-1-aaa", group=group))
        rows.append(snap(60 * k, 1, produce * 60 * k, committed, state=state, members=2,
                         member=None if state != "STABLE" else owner, host="10.0.0.2", group=group))
    return rows


@scenario
def _rejoining_under_new_ids_between_sweeps():
    ids = lambda k: "consumer-2-" + ("aaa" if k < 12 else "bbb" if k < 22 else "ccc")  # noqa: E731
    return _churning("inventory", ids, stall_at=(11, 21))


def test_a_loop_seen_only_as_owner_ids_changing_between_one_minute_sweeps_is_a_rebalance_loop(diagnosed):
    """Rule case 29: consumer-2 is evicted and rejoins under a new member id twice (minutes 12 and 22), each
    time between two sweeps: no rebalancing state is ever captured, only its ids (aaa, bbb, ccc), and commits
    stand still across each rejoin (the lag's steps). Each id that went and each that came is a membership
    change: four rebalances, a loop. Counting changes of the owner set saw two, and the steps read as a slow
    consumer."""
    found = diagnosed(_rejoining_under_new_ids_between_sweeps)
    assert [f["diagnosis"] for f in found] == ["rebalance_loop"], [f["summary"] for f in found]
    (f,) = found
    assert (f["evidence"]["rebalance_entries"], f["evidence"]["owner_changes"], f["evidence"]["rebalances"]) == (0, 4, 4)
    assert f["summary"].startswith("4 rebalances in 30m00s (group left STABLE 0 times, owner ids came or went 4 times)")


@scenario
def _churn_young_and_settled():
    churn = {0: "consumer-2-aaa", 1: "consumer-1-aaa"}
    loop = lambda k: churn.get(k, "consumer-2-bbb") if k < 3 else "consumer-1-aaa"  # noqa: E731
    restart = lambda k: churn.get(k, "consumer-2-bbb")  # noqa: E731
    deploy = lambda k: "consumer-2-aaa" if k < 2 else "consumer-2-bbb"  # noqa: E731
    return (_churning("young", loop, minutes=2) + _churning("deploy", deploy, minutes=2)
            + _churning("looping", loop, minutes=3) + _churning("restarted", restart, minutes=3))


def test_churn_at_every_interval_too_young_for_a_loop_is_provisional_and_a_quiet_interval_decides_it(diagnosed):
    """Rule case 37, from the noise lab's loop at its first verdict: consumer-2 is evicted (consumer-1 takes
    partition 1) and rejoins under a new id a minute later: two changes in two intervals, where rule 2 asks for
    three. It read "consumers keep up". It is a loop's start or one member restarting across a sweep: deciding
    between the two, until the next snapshot. One deploy (both changes in one interval) stays healthy."""
    found = diagnosed(_churn_young_and_settled)
    got = {f["group_id"]: (f["diagnosis"], f["provisional"], f["deciding_between"]) for f in found}
    assert got == {"young": ("rebalance_loop", True, ["rebalance_loop", "healthy"]),
                   "deploy": ("healthy", False, []),
                   "looping": ("rebalance_loop", False, []),
                   "restarted": ("healthy", False, [])}, got
    (young,) = [f for f in found if f["group_id"] == "young"]
    assert young["summary"].startswith("2 rebalances in 2m00s (group left STABLE 0 times, owner ids came or went 2 "
                                       "times)"), young["summary"]
    assert young["samples_needed"] == 1 and young["decided_by"] == "2026-11-21T12:03:00Z", young
    assert young["undecided_because"].startswith("owner ids came or went in 2 of the window's 2 intervals")
    from lagdoctor.notify.threads import held_until_decided

    assert held_until_decided(young)  # Slack hears it once decided (threads rule 12)


@scenario
def _groups_without_a_commit_yet():
    def group(name, minutes, commit_at=(), record_age=None):
        rows, committed = [], 0
        for k in range(minutes + 1):
            if k in commit_at:
                committed = 50 * 60 * k  # everything that arrived
            for p in (0, 1):
                rows.append(snap(60 * k, p, 50 * 60 * k, committed, group=name,
                                 record_ts=None if record_age is None else 60 * k - record_age))
        return rows

    return (group("batch-early", 4) + group("batch-committed", 7, commit_at=(6,))
            + group("stuck-long", 10) + group("stuck-old", 4, record_age=1200))


def test_a_window_without_any_commit_is_provisional_until_a_commit_or_ten_minutes_decide(diagnosed):
    """Rule case 38: a new group (or a fresh deployment) whose commits have not moved yet: a batch committer
    between commits (every 6 minutes) reads as stalled at minute 4, its lag climbing. How often it commits is
    unknown, not zero: stalled against healthy, said once decided. Its commit at minute 6 decides it healthy;
    ten minutes without one, or a committed record already 20 minutes old, decide a stall."""
    found = diagnosed(_groups_without_a_commit_yet)
    got = {f["group_id"]: (f["diagnosis"], f["provisional"], f["deciding_between"]) for f in found}
    assert got == {"batch-early": ("stalled_consumer", True, ["stalled_consumer", "healthy"]),
                   "batch-committed": ("healthy", False, []),
                   "stuck-long": ("stalled_consumer", False, []),
                   "stuck-old": ("stalled_consumer", False, [])}, got
    (early,) = [f for f in found if f["group_id"] == "batch-early"]
    assert early["decided_by"] == "2026-11-21T12:10:00Z" and early["samples_needed"] == 6, early
    assert early["undecided_because"].startswith("no commit has moved on any partition in the window's 4m00s")
    from lagdoctor.notify.threads import held_until_decided

    assert held_until_decided(early)  # Slack hears it once decided (threads rule 12)


@scenario
def _two_rebalances_keeping_up_and_falling_behind():
    states = {12: "PREPARING_REBALANCE", 22: "PREPARING_REBALANCE"}
    ids = lambda k: "consumer-2-" + ("aaa" if k < 12 else "bbb")  # noqa: E731
    steps = _churning("steps", ids, states=states, stall_at=(11, 21))
    slow = _churning("slow", ids, states=states, stall_at=(11, 21), capacity=90)
    return steps + slow


def test_a_loops_steps_are_not_a_slow_consumer_but_falling_behind_between_rebalances_is(diagnosed):
    """Rule case 30: two rebalances so far (rule 2 wants three), each stopping commits for a minute; between
    them consumers read what arrives. The lag climbs in two steps, which read as slow_consumer: it is the
    rebalances' doing, healthy until rule 2 holds. A consumer that also falls behind while settled (90 of 100
    msg/s) is slow whatever the rebalances add."""
    found = {f["group_id"]: f for f in diagnosed(_two_rebalances_keeping_up_and_falling_behind)}
    assert {g: f["diagnosis"] for g, f in found.items()} == {"steps": "healthy", "slow": "slow_consumer"}
    assert found["steps"]["evidence"]["rebalances"] == 2


DIURNAL_ENDS = range(2160, 3001, 120)  # minutes 36 to 50: a day and a half of phases


@scenario
def _slow_under_a_swinging_load():
    flow = _flow(3000, lambda s: 20.0 + 15.0 * math.sin(2 * math.pi * s / 1200), lambda s: 16.0)
    return [r for end in DIURNAL_ENDS for r in _minute_window(flow, end, f"diurnal-{end // 60}")]


def test_a_slow_consumer_under_a_swinging_load_is_slow_at_every_phase_of_it(diagnosed):
    """Rule case 34: 20 msg/s a partition on average, swinging 5 to 35 over a 20-minute 'day', consumers that
    read 16: the backlog grows day over day in waves, never clearing. No straight line fits 30 minutes of it
    (R^2 0.44-0.59), so the climb did not count and most sweeps read healthy; it grew and its backlog never
    cleared: slow_consumer as the load rises and as it falls. (The window ending at minute 40 holds more
    night than day: 16.8 msg/s arrived on average, within slow_rate_slack of 16, and it stays healthy.)"""
    got = {f["group_id"]: f["diagnosis"] for f in diagnosed(_slow_under_a_swinging_load)}
    assert got == {f"diurnal-{end // 60}": "healthy" if end == 2400 else "slow_consumer" for end in DIURNAL_ENDS}, got


def _trickling_since_minute_25(until):
    rows = []
    for k in range(until + 1):
        t = 60 * k
        rows.append(snap(t, 0, 100 * t, 100 * t, group="payments"))
        rows.append(snap(t, 1, 100 * t, 100 * min(t, 1500) + max(0, t - 1500), member="consumer-2-bbb",
                         host="10.0.0.2", group="payments"))
    return rows


scenario(_trickling_since_minute_25, 28)
scenario(_trickling_since_minute_25, 30)


def test_a_consumer_that_kept_up_and_now_trickles_is_stalled_once_it_trickled_for_the_stall_time(diagnosed):
    """Rule case 33: a consumer that kept up at 100 msg/s a partition drops to 1 msg/s on partition 1 at minute
    25 (a hung handler retrying), still committing. Over its last stall_min_seconds it read 1% of what
    arrived: stalled_consumer by minute 28, not once the last third holds mostly the trickle (slow_consumer
    or partition_imbalance until minute 33 or so)."""
    for got in (diagnosed(_trickling_since_minute_25, 28), diagnosed(_trickling_since_minute_25, 30)):
        assert [(f["diagnosis"], f["partitions"], f["provisional"]) for f in got] == [("stalled_consumer", [1], False)]


@scenario
def _lag_of_two_a_partition():
    return [snap(t, p, 20 * t + 2, 20 * t) for t in range(0, 181, 60) for p in (0, 1)]


def test_a_small_lag_is_said_as_a_count_never_with_a_decimal(diagnosed):
    """The noise lab's loop read "lag 4.0" and "lag 0.0": a lag is a count of messages."""
    (found,) = diagnosed(_lag_of_two_a_partition)
    assert found["diagnosis"] == "healthy" and found["summary"].startswith("consumers keep up: lag 4 across 2 partitions")


# -- the scenarios' shared job -----------------------------------------------------------------------------


def test_a_groups_findings_are_the_same_alone_as_among_the_scenarios(spark, frame, diagnosed):
    """Every scenario above is read from one job over all of them (as a sweep reads every cluster's groups at
    once). Eleven of them name the same cluster, group and topic (c, clicks, t), seven with a previous run's
    finding: alone, the one whose verdict the carried surge decides gets every field of its findings as among
    the others. (Each of the 54, alone, was compared so once, when they were first put together.)"""
    from lagdoctor.diagnosis.classify import carried_baselines

    carried = carried_baselines(spark.createDataFrame([_previous()], _PREVIOUS_SCHEMA))
    alone = run_findings(frame(_surge_older_than_the_window()), carried=carried)
    assert [f["diagnosis"] for f in alone] == ["producer_surge"]
    assert alone == diagnosed(_surge_older_than_the_window, previous=[_previous()])
