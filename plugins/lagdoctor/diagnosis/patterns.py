"""Lag pattern: the shape of a group's total lag over the window.

Read from the normalized series y = lag / scale in [0, 1] over x = time in
[0, 1] (see features.group_features); "early", "middle", "late" are the
thirds of the window and y_early etc. their mean. The rules, first match wins:

 #  pattern         rule                                                     why
 1  flat            max lag below the noise floor (pattern_min_seconds of    small or steady lag has no shape
                    production, at least pattern_min_lag), or y moves < 0.25
 2  roller_coaster  falls >= 0.5 in total and the peaks grow: each third's    the seeds' 0 -> 5000 -> 0 -> 8000
                    highest lag >= 1.15x the third's before, the last third's  -> 0 -> 12000: waves, each one higher
                    >= 1/0.6 of the first's                                    (a rebalance storm getting worse)
 3  sawtooth        >= 2 sharp drops (> 0.3 in one step), rises spread out    batch commits: slow build, instant reset
 4  spiky           lag low (y < 0.25) >= 60% of the time, falls >= 0.5       bursts that come and go
 5  sawtooth        falls >= 0.5 in total otherwise                          waves whose peaks stay level (the
                                                                             seeds' 0 -> 1000 -> 0 -> 1000)
 6  explosion       net rise >= 0.3, late-third rise > 2.5x early-third rise  accelerating growth
 7  plateau         net rise, the late third is flat (range < 0.15, rise       climbed, then stopped growing
                    < 1/2 of the early rise) near the top (>= 0.8)
 8  staircase       net rise, the fastest-rising quarter of the window's     lag added in steps, flat between
                    time carries >= 58% of the rise (a ramp: ~30%; steps      (time, not a count of diffs, so
                    sampled every 5 minutes blur into a ramp)                 bursts of samples do not skew it)
 9  steady_climb    net rise >= 0.3 otherwise                                 a ramp
10  flat            anything else                                            moves without direction
"""

from __future__ import annotations

from lagdoctor.diagnosis.thresholds import Thresholds


def pattern_column(thresholds: Thresholds = Thresholds()):
    """A Column computing the pattern from group_features' shape columns."""
    from pyspark.sql import functions as F

    c = F.col
    rise = c("y_end") - c("y_start")
    amplitude = c("y_max") - c("y_min")
    early_rise = c("y_middle") - c("y_early")
    late_rise = c("y_late") - c("y_middle")
    rising = rise >= 0.3
    peaks_grow = (
        (c("y_peak_middle") >= 1.15 * c("y_peak_early"))
        & (c("y_peak_late") >= 1.15 * c("y_peak_middle"))
        & (c("y_peak_early") <= 0.6 * c("y_peak_late"))
    )
    return (
        F.when(c("below_noise_floor") | (amplitude < 0.25), F.lit("flat"))
        .when((c("down") >= 0.5) & F.coalesce(peaks_grow, F.lit(False)), F.lit("roller_coaster"))
        .when((c("sharp_drops") >= 2) & (c("up_spread") >= 0.15), F.lit("sawtooth"))
        .when((c("low_fraction") >= 0.6) & (c("down") >= 0.5), F.lit("spiky"))
        .when(c("down") >= 0.5, F.lit("sawtooth"))
        .when(rising & (late_rise > 2.5 * F.greatest(early_rise, F.lit(0.02))), F.lit("explosion"))
        .when(
            rising & (c("y_late_range") < 0.15) & (late_rise < 0.5 * early_rise) & (c("y_late") >= 0.8),
            F.lit("plateau"),
        )
        .when(rising & (c("top_quarter_rise_share") >= 0.58), F.lit("staircase"))
        .when(rising, F.lit("steady_climb"))
        .otherwise(F.lit("flat"))
    )


def lag_pattern(group_feats, thresholds: Thresholds = Thresholds()):
    """group_features -> the same rows with a `pattern` column."""
    return group_feats.withColumn("pattern", pattern_column(thresholds))
