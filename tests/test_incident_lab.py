"""The live incident lab's scoring (bench/incident_lab.py): what counts as right at the
first sweep, a flip, a wrong post, and the time to the right Slack message."""

from __future__ import annotations

from lagdoctor.lab.scoring import Sweep, score, verdict

ONSET = 1_000.0
GROUP = "orders-processor"


def finding(diagnosis: str, partitions=(1,), severity="critical", **extra):
    return {"diagnosis": diagnosis, "partitions": list(partitions), "severity": severity, **extra}


def sweep(n: int, samples: list[float], findings: list[dict], *, posted: bool = True) -> Sweep:
    return Sweep(n=n, started=samples[0] - 1, samples=samples, posted=samples[-1] + 40,
                 findings={GROUP: findings}, statuses=[],
                 messages={GROUP: [f"CRITICAL: {', '.join(f['diagnosis'] for f in findings)}"] if posted else []},
                 last_sample={})


def scored(sweeps, expect="partition_imbalance", partitions=(1,)):
    return score(sweeps, GROUP, expect, partitions, ONSET, warmup_end=ONSET - 30, min_snapshots=3, min_seconds=24)


def test_the_first_sweep_with_enough_samples_after_onset_is_the_one_judged():
    sweeps = [
        sweep(0, [940, 950], [finding("healthy", ())]),  # before onset: not judged
        sweep(1, [1_005, 1_015], [finding("partition_imbalance")]),  # 2 samples after onset: too few
        sweep(2, [1_065, 1_075], [finding("slow_consumer")]),  # enough: this one is judged, and it is wrong
        sweep(3, [1_125, 1_135], [finding("partition_imbalance")]),
    ]
    s = scored(sweeps)
    assert (s.first_sweep_right, s.first_sweep_verdict) == (False, "wrong")
    assert s.first_after_onset_verdict == "right"  # sweep 1: right already, but on too little to judge
    # right at sweep 1 already: the time to the right message counts from there
    assert s.onset_to_slack_s == 1_015 + 40 - ONSET
    # right, then wrong, then right again: one flip
    assert s.flips == 1


def test_a_provisional_first_post_is_not_wrong_and_its_decision_is_not_a_flip():
    sweeps = [
        sweep(1, [1_005, 1_015], [finding("stalled_consumer", (0,), provisional=True,
                                          deciding_between=["stalled_consumer", "partition_imbalance"])]),
        sweep(2, [1_065, 1_075], [finding("partition_imbalance")]),
        sweep(3, [1_125, 1_135], [finding("partition_imbalance")]),
    ]
    s = scored(sweeps)
    assert (s.first_sweep_right, s.flips, s.wrong_posts, s.provisional_sweeps) == (True, 0, 0, 1)
    assert s.onset_to_slack_s == 1_075 + 40 - ONSET


def test_a_confident_wrong_post_before_the_right_answer_is_counted():
    sweeps = [sweep(1, [1_005, 1_015], [finding("partition_imbalance", (0,))], posted=True),
              sweep(2, [1_065, 1_075], [finding("stalled_consumer", (0,))])]
    s = scored(sweeps, expect="stalled_consumer", partitions=(0,))
    assert (s.wrong_posts, s.first_sweep_right) == (1, True)


def test_the_right_cause_on_the_wrong_partition_is_wrong():
    assert verdict([finding("partition_imbalance", (2,))], "partition_imbalance", (1,)) == "wrong"
    assert verdict([finding("partition_imbalance", (1, 2))], "partition_imbalance", (1,)) == "right"
    assert verdict([finding("healthy", (), severity="ok")], "partition_imbalance", (1,)) == "none"


def test_the_right_message_is_timed_from_the_sweep_that_posted_it():
    sweeps = [sweep(1, [1_005, 1_015], [finding("partition_imbalance")], posted=False),
              sweep(2, [1_065, 1_075], [finding("partition_imbalance")], posted=True)]
    assert scored(sweeps).onset_to_slack_s == 1_075 + 40 - ONSET


def test_negatives_count_problem_findings_only_after_the_warm_up():
    sweeps = [sweep(0, [900, 910], [finding("crashed_consumer")]),  # during the warm-up: a start-up blip
              sweep(1, [1_005, 1_015], [finding("healthy", (), severity="ok")]),
              sweep(2, [1_065, 1_075], [finding("stalled_consumer", severity="warning")]),
              sweep(3, [1_125, 1_135], [finding("stalled_consumer")])]
    s = scored(sweeps, expect="healthy", partitions=())
    assert (s.critical, s.warning, s.wrong_posts) == (1, 1, 2)


def test_still_deciding_between_causes_that_are_not_the_truth_is_wrong():
    unsure = finding("partition_imbalance", provisional=True, deciding_between=["partition_imbalance", "stalled_consumer"])
    assert verdict([unsure], "slow_consumer") == "wrong"
    assert verdict([unsure], "stalled_consumer", (1,)) == "provisional"
    # on a negative, a provisional post pages someone all the same
    s = scored([sweep(1, [1_005, 1_015], [unsure]), sweep(2, [1_065, 1_075], [finding("healthy", (), severity="ok")])],
               expect="healthy", partitions=())
    assert s.wrong_posts == 1


def held_rise():
    return finding("producer_surge", (), provisional=True, deciding_between=["producer_surge", "healthy"])


def test_a_young_rise_held_until_decided_is_no_wrong_post():
    """Threads rule 12: Slack hears nothing of a young rise, so beside a hot partition it is not a wrong cause."""
    assert verdict([held_rise()], "partition_imbalance") == "none"
    assert verdict([held_rise(), finding("partition_imbalance")], "partition_imbalance") == "right"
    assert verdict([held_rise()], "producer_surge") == "provisional"
    assert verdict([finding("slow_consumer", (), provisional=True,
                            deciding_between=["slow_consumer", "producer_surge"])], "partition_imbalance") == "wrong"


def test_what_slack_hears_of_a_sweep_leaves_out_held_rises_and_collecting_history():
    from lagdoctor.lab.scoring import heard

    assert heard([held_rise()]) == {"healthy"}
    assert heard([finding("collecting_history", ())]) == {"healthy"}
    assert heard([held_rise(), finding("partition_imbalance")]) == {"partition_imbalance"}
    assert heard([finding("stalled_consumer", provisional=True)]) == {"stalled_consumer?"}
    assert heard([]) == {"healthy"}
