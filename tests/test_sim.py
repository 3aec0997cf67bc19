"""The scenario simulator, and the classifier's accuracy on a seed it was not tuned on.

The classifier's thresholds were tuned on bench/accuracy_bench.py's
TUNING_SEEDS (101-103, every condition). ACCURACY_SEED below is one of its
HOLDOUT_SEEDS, never looked at while tuning.
"""

from __future__ import annotations

import collections
from datetime import timedelta

import pytest

ACCURACY_SEED = 9001
GROUPS_PER_CASE = 1


def test_every_diagnosis_pattern_and_trap_is_simulated():
    from lagdoctor.contracts import COLLECTING_HISTORY, DIAGNOSES, PATTERNS
    from lagdoctor.lab.sim import SCENARIOS, scenario_table

    table, labels = scenario_table(seed=3, n_groups_per_scenario=2)
    # every cause and "healthy"; collecting_history is no state of a group, only too short a window
    assert {d for lab in labels for d in lab["diagnoses"]} == set(DIAGNOSES) - {COLLECTING_HISTORY}
    assert {lab["pattern"] for lab in labels} - {None} == set(PATTERNS)
    assert {lab["scenario"] for lab in labels if lab["pattern"] is None} == {
        "mixed_stalled_rebalance_loop", "mixed_imbalance_rebalance_loop"}  # two shapes overlaid: not scored
    traps = {s.name for s in SCENARIOS.values() if s.trap}
    assert {"healthy_batch_committer", "healthy_absorbed_burst", "healthy_idle_empty",
            "healthy_commit_above_end"} <= traps
    assert {lab["scenario"] for lab in labels} == set(SCENARIOS)
    assert len({lab["group_id"] for lab in labels}) == len(labels)


def test_histories_are_contract_1_with_noise_gaps_and_jitter():
    import pyarrow.compute as pc

    from lagdoctor.contracts import snapshot_arrow_schema
    from lagdoctor.lab.sim import scenario_table

    table, labels = scenario_table(seed=4, n_groups_per_scenario=4)
    assert table.schema.equals(snapshot_arrow_schema())
    counts = {lab["partition_count"] for lab in labels}
    assert min(counts) == 1 and max(counts) >= 24 and all(1 <= c <= 32 for c in counts)
    assert len({lab["members"] for lab in labels}) >= 4
    # snapshot spacing: irregular (jitter) and sometimes several intervals long (gaps)
    rows = table.filter(pc.equal(table["partition"], 0)).select(["group_id", "snapshot_ts"]).to_pylist()
    by_group = collections.defaultdict(list)
    for r in rows:
        by_group[r["group_id"]].append(r["snapshot_ts"])
    ratios = []
    for stamps in by_group.values():
        steps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
        typical = sorted(steps)[len(steps) // 2]
        ratios += [s / typical for s in steps]
    assert min(ratios) < 0.85 and max(ratios) > 2.5
    # commits briefly above the end offset are there (lag reported 0)
    above = pc.greater(table["committed_offset"], table["log_end_offset"])
    assert pc.sum(above.cast("int64")).as_py() > 0
    assert pc.min(table["lag"]).as_py() == 0


def test_same_seed_same_history():
    from lagdoctor.lab.sim import scenario_table

    a, la = scenario_table(seed=9, n_groups_per_scenario=1, scenarios=["slow_consumer", "rebalance_loop_staircase"])
    b, lb = scenario_table(seed=9, n_groups_per_scenario=1, scenarios=["slow_consumer", "rebalance_loop_staircase"])
    c, _ = scenario_table(seed=10, n_groups_per_scenario=1, scenarios=["slow_consumer", "rebalance_loop_staircase"])
    assert a.equals(b) and la == lb and not a.equals(c)


def test_write_scenarios_layout(tmp_path):
    from lagdoctor.lab.sim import LABELS_FILE, read_labels, write_scenarios

    labels = write_scenarios(str(tmp_path), seed=5, n_groups_per_scenario=1, scenarios=["healthy_steady"])
    assert read_labels(str(tmp_path)) == labels
    assert (tmp_path / LABELS_FILE).exists()
    assert list(tmp_path.glob("cluster=sim/date=*/*.parquet"))


def test_benchmark_history_hits_the_row_target(tmp_path):
    import pyarrow.parquet as pq

    from lagdoctor.lab.sim import write_benchmark_history

    n = write_benchmark_history(str(tmp_path), rows=20_002, partitions_per_group=4, snapshots_per_group=500)
    files = list(tmp_path.glob("cluster=bench/date=*/*.parquet"))
    assert n == 20_000 == sum(pq.ParquetFile(f).metadata.num_rows for f in files)  # whole snapshots


def _by_group_topic(table, *columns):
    rows = table.select(["group_id", "topic", "partition", "snapshot_ts", *columns]).to_pylist()
    out = collections.defaultdict(list)
    for r in rows:
        out[(r["group_id"], r["topic"])].append(r)
    return out


def test_the_five_minute_sweep_is_bursts_of_three_samples():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=21, conditions=["sweep_cadence"], n_groups_per_case=1)
    for rows in _by_group_topic(table).values():
        stamps = sorted({r["snapshot_ts"] for r in rows})
        steps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
        assert all(8 <= s <= 12 or 270 <= s <= 610 for s in steps)  # 10 s apart, or the next sweep (or the one after)
        assert stamps[-1] - stamps[0] >= timedelta(minutes=25)
        bursts = [i for i, s in enumerate(steps) if s > 100]
        assert [b - a for a, b in zip([-1] + bursts, bursts + [len(steps)])] == [3] * (len(bursts) + 1)


def test_the_one_minute_sweep_is_the_dags_own_sampling_one_read_a_minute():
    from lagdoctor.lab.sim import condition_table
    from lagdoctor.stages.params import SWEEP_SAMPLES

    assert SWEEP_SAMPLES == 1
    table, labels = condition_table(seed=21, conditions=["sweep_1min"], n_groups_per_case=1)
    assert {lab["scenario"] for lab in labels} >= {"producer_surge_late", "stalled_consumer_staircase"}
    for rows in _by_group_topic(table).values():
        stamps = sorted({r["snapshot_ts"] for r in rows})
        steps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
        assert all(55 <= s <= 65 or 115 <= s <= 245 for s in steps)  # the next minute's run (or a missed one)
        assert stamps[-1] - stamps[0] >= timedelta(minutes=28) and 25 <= len(stamps) <= 31


@pytest.mark.spark
def test_one_minute_sweeps_name_each_cause_and_no_problem_on_healthy_groups(spark, tmp_path):
    """The sweep's default sampling (one read a minute, a 30-minute window) on a seed never
    tuned on: every simulated cause named exactly but one at most, nothing named that is not there."""
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.lab.sim import score, score_text, write_conditions

    labels = write_conditions(str(tmp_path), seed=9011, n_groups_per_case=2, conditions=["sweep_1min"])
    df = read_snapshots(spark, str(tmp_path))
    pf = partition_features(df)
    found = [r.asDict() for r in findings(pf, group_features(group_series(df, pf))).collect()]
    result = score(labels, found)
    report = score_text(result)
    # one miss in 40 allowed: since arrivals average the scenario's rate (mean-1 noise) this seed's draw
    # has one partition_imbalance read healthy; the tuning seeds' 1,800 such units get 0.997
    assert len(result["wrong"]) <= 1, report
    assert sum(n for d, n in result["false_alarms"].items() if d != "healthy") == 0, report
    assert {d for lab in labels for d in lab["diagnoses"]} >= {
        "partition_imbalance", "producer_surge", "slow_consumer", "stalled_consumer", "crashed_consumer",
        "rebalance_loop"}
    patterns = sum(result["pattern_hits"].values()) / sum(result["pattern_totals"].values())
    assert patterns >= 0.85, report


def _sweeps_after_onset(scenario, seed, every=60.0, after=900.0, window=1800.0, warmup=1800.0):
    """One simulated group (its own generator, `seed`) under the one-minute sweep, its cause starting at a
    random phase of a sweep `warmup` s in (30 minutes; 120: a fresh deployment); the history cut at the end of every sweep from one before the onset
    to `after` s after it, each cut a cluster of its own (that sweep's window): [(cluster, s after onset)]
    and the table of all cuts."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from lagdoctor.lab.sim import DEFAULT_START, simulate_group

    rng = np.random.default_rng(seed)
    onset = warmup + float(rng.uniform(0, every))
    table, _ = simulate_group(rng, scenario, "sim", f"{scenario}-{seed}", "events", DEFAULT_START, cadence="sweep",
                              sweep=(every, 1, 10.0), window_seconds=onset + after, onset=onset,
                              optional_columns=True, fractional_capacity=True)
    t = pc.cast(table["snapshot_ts"], pa.int64()).to_numpy() / 1e6 - DEFAULT_START.timestamp()
    cuts, parts = [], []
    for j, end in enumerate(sorted({float(x) for x in t if onset - every <= x <= onset + after})):
        cluster = f"{scenario}-{seed}-{j}"
        part = table.filter(pa.array((t <= end) & (t >= end - window)))
        parts.append(part.set_column(part.schema.get_field_index("cluster"), "cluster",
                                     pa.array([cluster] * part.num_rows, pa.string())))
        cuts.append((cluster, end - onset))
    return cuts, pa.concat_tables(parts)


@pytest.mark.spark
@pytest.mark.parametrize("warmup", [1800.0, 120.0], ids=["30-minutes-of-history", "fresh-deployment"])
def test_one_minute_sweeps_after_an_onset_name_no_wrong_cause_first_and_nothing_on_absorbed_bursts(spark, tmp_path,
                                                                                                   warmup):
    """Issue 29 (rule cases 29-32), sweep by sweep as bench/accuracy_bench.py --latency measures it, on groups
    whose own generators gave wrong sweeps before: absorbed bursts read as a producer_surge or a
    partition_imbalance while they drained (seeds 1 and 10), surges first named slow_consumer (seeds 11, 12),
    loops named slow_consumer until their third rebalance (seeds 1-5). A loop's group reads healthy before the
    loop begins: its consumers match the load (seed 4 read slow_consumer from before the onset until rule 2
    held while the simulator's arrivals ran 3% above the rate its consumers were built to match).
    Rule case 36: a burst at the onset (seeds 1-4, 10) rose like a surge's start and was named a surge a sweep
    later, and on a fresh deployment a slow consumer; what Slack hears is counted: a young rise held until
    decided (threads rule 12) says nothing."""
    import pyarrow.compute as pc

    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.lab.sim import write_table
    from lagdoctor.lab.scoring import heard

    units = {**{("healthy_absorbed_burst", seed): "healthy" for seed in (1, 2, 3, 4, 10)},
             ("producer_surge", 11): "producer_surge", ("producer_surge", 12): "producer_surge",
             **{("rebalance_loop_staircase", seed): "rebalance_loop" for seed in range(1, 6)}}
    if warmup < 1800.0:  # rule 36's units (a loop's staircase on a fresh deployment: not yet, see the README)
        units = {unit: truth for unit, truth in units.items() if unit[0] != "rebalance_loop_staircase"}
    cuts = {}
    for unit in units:
        cuts[unit], table = _sweeps_after_onset(*unit, warmup=warmup)
        for cluster, _ in cuts[unit]:
            write_table(table.filter(pc.equal(table["cluster"], cluster)), str(tmp_path), cluster)
    df = read_snapshots(spark, str(tmp_path))
    pf = partition_features(df)
    by_cut = collections.defaultdict(list)
    for r in findings(pf, group_features(group_series(df, pf))).select(
            "cluster", "diagnosis", "provisional", "deciding_between").collect():
        by_cut[r["cluster"]].append(r.asDict())
    said = {cluster: heard(by_cut[cluster]) for unit_cuts in cuts.values() for cluster, _ in unit_cuts}
    wrong = collections.Counter()
    for (scenario, seed), truth in units.items():
        seen = [(after, said[cluster]) for cluster, after in cuts[(scenario, seed)]]
        story = ", ".join(f"{after:.0f}s {'+'.join(sorted(s))}" for after, s in seen)
        if truth == "healthy":
            assert all(s == {"healthy"} for _, s in seen), story
            continue
        before = set().union(*(s for after, s in seen if after < 0))
        assert before <= {"healthy"}, story  # no cause named before the onset
        right = [after for after, s in seen if after >= 0 and s == {truth}]
        assert right and right[0] <= 480, story  # named within 8 sweeps
        firsts = [s for after, s in seen if 0 <= after < right[0]]
        assert all(s <= {"healthy"} | before for s in firsts), story  # nothing but what it already was
        wrong[scenario] += sum(1 for s in firsts if s - {"healthy"} - before)
    assert wrong["producer_surge"] == 0 and wrong["rebalance_loop_staircase"] == 0, wrong


def test_multi_topic_groups_are_labelled_per_topic_with_one_sick_topic():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=22, conditions=["multi_topic"], n_groups_per_case=2)
    by_group = collections.defaultdict(list)
    for lab in labels:
        by_group[lab["group_id"]].append(lab)
    rows = _by_group_topic(table, "member_id")
    for group, labs in by_group.items():
        assert len(labs) >= 2 and len({lab["topic"] for lab in labs}) == len(labs)
        assert sum(lab["diagnoses"] != ["healthy"] for lab in labs) == 1
        # one group: the same snapshot times and members on every topic
        stamps = [{r["snapshot_ts"] for r in rows[(group, lab["topic"])]} for lab in labs]
        assert all(s == stamps[0] for s in stamps)
        members = [{r["member_id"] for r in rows[(group, lab["topic"])]} - {None} for lab in labs]
        assert set.union(*members) <= set.union(*[m for m in members if len(m) == max(map(len, members))])


def test_hot_key_rises_on_a_few_partitions_and_producer_surge_on_most():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=23, conditions=["hot_key"], n_groups_per_case=3)
    rows = _by_group_topic(table, "log_end_offset")
    for lab in labels:
        series = collections.defaultdict(list)
        for r in rows[(lab["group_id"], lab["topic"])]:
            series[r["partition"]].append((r["snapshot_ts"].timestamp(), r["log_end_offset"]))

        def rate(points):  # msg/s over the points
            return (points[-1][1] - points[0][1]) / max(points[-1][0] - points[0][0], 1)

        risen = set()
        for p, pts in series.items():
            third = len(pts) // 3
            if rate(pts[-third:]) > 2 * rate(pts[:third]):
                risen.add(p)
        if lab["scenario"] == "partition_imbalance_hot_key":
            assert lab["diagnoses"] == ["partition_imbalance"]
            assert risen == set(lab["partitions"]) and len(risen) <= max(1, lab["partition_count"] // 5)
        else:
            assert len(risen) > lab["partition_count"] / 2


def test_conditions_cover_rates_partitions_cadences_diurnal_and_mixed_causes():
    import pyarrow.compute as pc

    from lagdoctor.contracts import snapshot_arrow_schema
    from lagdoctor.lab.sim import CONDITIONS, condition_table

    table, labels = condition_table(seed=24, n_groups_per_case=1)
    assert table.schema.equals(snapshot_arrow_schema(include_optional=True))
    assert {lab["condition"] for lab in labels} == set(CONDITIONS)
    counts = {lab["partition_count"] for lab in labels}
    assert 1 in counts and max(counts) >= 96 and max(counts) <= 128
    rates = {lab["condition"]: set() for lab in labels}
    for lab in labels:
        rates[lab["condition"]].add(lab["produce_rate"])
    assert rates["rate_1_msg_s"] == {1.0} and rates["rate_50k_msg_s"] == {50_000.0}
    mixed = [set(lab["diagnoses"]) for lab in labels if lab["condition"] == "mixed_causes"]
    assert {"stalled_consumer", "rebalance_loop"} in mixed and {"partition_imbalance", "rebalance_loop"} in mixed
    # the 15 s to 5 min cadences: typical steps span that range
    steps = []
    for (group, _), rows in _by_group_topic(table.filter(pc.equal(table["partition"], 0))).items():
        if group.startswith("cadence_15s_5min"):
            stamps = sorted(r["snapshot_ts"] for r in rows)
            gaps = sorted((b - a).total_seconds() for a, b in zip(stamps, stamps[1:]))
            steps.append(gaps[len(gaps) // 2])  # the median step (missed sweeps can leave a group 2 snapshots)
    assert min(steps) < 20 and max(steps) > 220
    # diurnal: the topic's produce rate swings about 3x within the window
    rows = _by_group_topic(table, "log_end_offset")
    for lab in labels:
        if lab["condition"] == "diurnal":
            totals = collections.defaultdict(int)
            for r in rows[(lab["group_id"], lab["topic"])]:
                totals[r["snapshot_ts"].timestamp()] += r["log_end_offset"]
            pts = sorted(totals.items())
            k = max(1, len(pts) // 12)
            rates_over = [(pts[i + k][1] - pts[i][1]) / (pts[i + k][0] - pts[i][0]) for i in range(0, len(pts) - k, k)]
            assert max(rates_over) / min(rates_over) > 2.2


def test_true_time_lag_is_window_end_minus_the_committed_records_production_time():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=25, conditions=["baseline"], n_groups_per_case=2, record_ts_share=1.0)
    rows = _by_group_topic(table, "lag", "committed_record_ts")
    checked = beyond = 0
    for lab in labels:
        group_rows = rows[(lab["group_id"], lab["topic"])]
        start = min(r["snapshot_ts"] for r in group_rows)
        end = max(r["snapshot_ts"] for r in group_rows)
        for r in group_rows:
            if r["snapshot_ts"] != end:
                continue
            truth = lab["true_time_lag_seconds"][str(r["partition"])]
            if r["lag"] == 0:
                assert truth == 0
            elif r["committed_record_ts"] is not None:
                assert truth == pytest.approx((end - r["committed_record_ts"]).total_seconds(), abs=0.01)
                assert lab["beyond_window"][str(r["partition"])] == (r["committed_record_ts"] < start)
                checked += 1
                beyond += r["committed_record_ts"] < start
    assert checked > 20 and beyond > 0


def test_production_clock_by_hand():
    import numpy as np

    from lagdoctor.lab.sim import DEFAULT_START, _Group

    g = _Group(np.random.default_rng(0), "healthy_steady", "c", "g", "t", DEFAULT_START, n_partitions=1, rate=10.0)
    # end offsets 100 before the window, 150 after the tick at t=0, 200 at t=5, 250 at t=10
    clock = g._production_clock(np.array([0.0, 5.0, 10.0]), np.array([[100], [150], [200], [250]]),
                                np.array([1.0, 1.0, 1.0]), np.ones(1))
    assert clock(np.array([175]))[0] == pytest.approx(2.5)  # half way through the tick that ended at t=5
    assert clock(np.array([150]))[0] == pytest.approx(0.0)
    assert clock(np.array([90]))[0] == pytest.approx(-5 - 10 / g.base[0])  # before the window, at the first rate
    assert np.isnan(clock(np.array([250]))[0])  # not written yet


def test_arrivals_average_the_rate_a_scenario_says():
    """Over many groups (the drift's phase averages out) arrivals come at the label's produce_rate: the
    bursty noise on them has mean 1. At mean e^(0.25^2/2) they ran 3% above it, so a loop's consumers
    at 0.99-1.04 x the rate fell behind while settled and read slow_consumer before the loop began."""
    import numpy as np

    from lagdoctor.lab.sim import simulate_group

    rng = np.random.default_rng(31)
    ratios = []
    for k in range(40):
        table, lab = simulate_group(rng, "rebalance_loop_staircase", group_id=f"g{k}", rate=500.0, n_partitions=4,
                                    window_seconds=3600.0, interval=60.0, gap_rate=0.0)
        rows = sorted(table.select(["snapshot_ts", "log_end_offset"]).to_pylist(), key=lambda r: r["snapshot_ts"])
        first, last = rows[:4], rows[-4:]  # 4 partitions a snapshot
        seconds = (last[0]["snapshot_ts"] - first[0]["snapshot_ts"]).total_seconds()
        produced = sum(r["log_end_offset"] for r in last) - sum(r["log_end_offset"] for r in first)
        ratios.append(produced / seconds / lab["produce_rate"])
    assert abs(float(np.mean(ratios)) - 1.0) < 0.01, np.mean(ratios)


def test_same_seed_same_conditions():
    from lagdoctor.lab.sim import condition_table

    a, la = condition_table(seed=26, conditions=["diurnal", "mixed_causes"])
    b, lb = condition_table(seed=26, conditions=["diurnal", "mixed_causes"])
    assert a.equals(b) and la == lb


@pytest.mark.spark
def test_classifier_accuracy_on_an_unseen_seed(spark, tmp_path):
    from lagdoctor.diagnosis.classify import findings
    from lagdoctor.diagnosis.features import group_features, group_series, partition_features
    from lagdoctor.diagnosis.snapshots import read_snapshots
    from lagdoctor.lab.sim import score, score_text, write_conditions

    labels = write_conditions(str(tmp_path), seed=ACCURACY_SEED, n_groups_per_case=GROUPS_PER_CASE)
    df = read_snapshots(spark, str(tmp_path))
    pf = partition_features(df)
    found = [r.asDict() for r in findings(pf, group_features(group_series(df, pf))).collect()]
    result = score(labels, found, [r.asDict() for r in pf.select("cluster", "group_id", "topic", "partition",
                                                                  "time_lag_seconds").collect()])
    report = score_text(result)
    print(report)
    causes = sum(c["right"] for c in result["by_condition"].values()) / result["units"]
    patterns = sum(result["pattern_hits"].values()) / sum(result["pattern_totals"].values())
    assert causes >= 0.99, report
    assert patterns >= 0.9, report
    # the exact path: where the collector recorded the committed record's time, time lag is the truth
    assert max(result["time_lag_errors"][("in", "record")]) < 0.01, report


def _series(table, lab, column):
    """{partition: [(t, value), ...]} of one labelled group/topic, oldest first."""
    out = collections.defaultdict(list)
    for r in _by_group_topic(table, column)[(lab["group_id"], lab["topic"])]:
        out[r["partition"]].append((r["snapshot_ts"].timestamp(), r[column]))
    return {p: sorted(v) for p, v in out.items()}


def test_seeds_case_study_shape_one_owner_far_below_holds_most_of_a_lag_grown_from_zero():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=27, conditions=["seeds"], n_groups_per_case=4)
    cases = [lab for lab in labels if lab["scenario"] == "partition_imbalance_case_study"]
    assert len(cases) == 4
    for lab in cases:
        lag, leo = _series(table, lab, "lag"), _series(table, lab, "log_end_offset")
        committed = _series(table, lab, "committed_offset")
        (hot,) = lab["partitions"]
        ends = {p: s[-1][1] for p, s in lag.items()}
        assert ends[hot] >= 0.8 * sum(ends.values())
        for p, s in lag.items():  # lag grows from (about) zero, the others' a little or not at all
            assert s[0][1] <= 0.02 * ends[hot] and s[-1][1] <= ends[hot]
        assert lag[hot][-1][1] > 100 * max(lag[hot][0][1], 1)
        produced = leo[hot][-1][1] - leo[hot][0][1]
        consumed = committed[hot][-1][1] - committed[hot][0][1]
        assert consumed < 0.5 * produced


def test_seeds_surges_rise_3_to_10x_on_every_partition_past_consumers_that_had_kept_up():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=28, conditions=["seeds"], n_groups_per_case=4)
    surges = [lab for lab in labels if lab["scenario"] in ("producer_surge_early", "producer_surge_late")]
    assert {lab["scenario"] for lab in surges} == {"producer_surge_early", "producer_surge_late"}
    for lab in surges:
        leo, committed = _series(table, lab, "log_end_offset"), _series(table, lab, "committed_offset")
        lag = _series(table, lab, "lag")
        for p in leo:
            pts, com = leo[p], committed[p]
            rate = lambda s, a, b: (s[b][1] - s[a][1]) / max(s[b][0] - s[a][0], 1)  # noqa: E731
            n = len(pts)
            # the first points, before the onset (lag still small): consumers keep up
            first = 2 if lab["scenario"] == "producer_surge_early" else n // 3
            before = rate(pts, 0, first)
            assert lag[p][first][1] <= 0.05 * max(lag[p][-1][1], 1)
            assert rate(pts, n - n // 4 - 1, n - 1) >= 2.0 * before  # the load rose several times
            # the consumers now top out above the old rate, below the new one
            assert before < rate(com, n - n // 4 - 1, n - 1) < rate(pts, n - n // 4 - 1, n - 1)


def test_seeds_staircase_partitions_stop_again_and_again_and_keep_each_steps_backlog():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=29, conditions=["seeds"], n_groups_per_case=3)
    stairs = [lab for lab in labels if lab["scenario"] == "stalled_consumer_staircase"]
    assert stairs
    for lab in stairs:
        committed, lag = _series(table, lab, "committed_offset"), _series(table, lab, "lag")
        for p in lab["partitions"]:
            runs, start = [], 0
            pts = committed[p]
            for i in range(1, len(pts) + 1):
                if i == len(pts) or pts[i][1] != pts[start][1]:
                    if pts[i - 1][0] - pts[start][0] >= 150:
                        runs.append((start, i - 1))
                    start = i
            assert len(runs) >= 2, (lab["group_id"], p)
            for a, b in runs[:-1]:  # after each step the backlog stays
                assert lag[p][b + 1][1] >= 0.5 * lag[p][b][1]


def test_roller_coaster_peaks_grow_and_batch_commits_peaks_stay_level():
    from lagdoctor.lab.sim import condition_table

    table, labels = condition_table(seed=30, conditions=["seeds"], n_groups_per_case=3)
    for lab in labels:
        if lab["scenario"] not in ("rebalance_loop_roller_coaster", "healthy_batch_committer"):
            continue
        total = collections.defaultdict(int)
        for series in _series(table, lab, "lag").values():
            for t, v in series:
                total[t] += v
        pts = sorted(total.items())
        third = (pts[-1][0] - pts[0][0]) / 3
        peaks = [max(v for t, v in pts if pts[0][0] + k * third <= t <= pts[0][0] + (k + 1) * third)
                 for k in range(3)]
        if lab["scenario"] == "rebalance_loop_roller_coaster":
            assert peaks[0] < peaks[1] < peaks[2] and peaks[0] <= 0.6 * peaks[2], peaks
        else:
            assert min(peaks) >= 0.6 * max(peaks), peaks
