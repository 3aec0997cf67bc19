"""Lag pattern: the shape of a group's total lag over the window.

Read from the normalized series y = lag / scale in [0, 1] over x = time in
[0, 1] (see features.group_features). The rules, first match wins:

 #  pattern         rule                                                   why
 1  flat            max lag below the noise floor, or y moves < 0.25       small or steady lag has no shape
 2  sawtooth        >= 2 sharp drops (> 0.3 in one step), rises spread     batch commits: slow build, instant reset
 3  spiky           lag low (< 0.25) most of the time, falls >= 0.5        bursts that come and go
 4  roller_coaster  falls >= 0.5 in total, otherwise                       big waves down and up again
 5  staircase       net rise, rises carried by few jumps (up_spread < .25)  lag added in steps, flat between
 6  plateau         net rise, last third flat (range < .15) near the top   climbed, then stopped growing
 7  explosion       net rise, the late third rose > 2.5x the early third    accelerating growth
 8  steady_climb    net rise >= 0.3 otherwise                               a ramp
 9  flat            anything else (moves without direction)
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
    return (
        F.when(c("below_noise_floor") | (amplitude < 0.25), F.lit("flat"))
        .when((c("sharp_drops") >= 2) & (c("up_spread") >= 0.15), F.lit("sawtooth"))
        .when((c("low_fraction") >= 0.5) & (c("down") >= 0.5), F.lit("spiky"))
        .when(c("down") >= 0.5, F.lit("roller_coaster"))
        .when((rise >= 0.3) & (c("up_spread") < 0.25), F.lit("staircase"))
        .when((rise >= 0.3) & (c("y_late_range") < 0.15) & (c("y_late") >= 0.8), F.lit("plateau"))
        .when((rise >= 0.3) & (late_rise > 2.5 * F.greatest(early_rise, F.lit(0.02))), F.lit("explosion"))
        .when(rise >= 0.3, F.lit("steady_climb"))
        .otherwise(F.lit("flat"))
    )


def lag_pattern(group_feats, thresholds: Thresholds = Thresholds()):
    """group_features -> the same rows with a `pattern` column."""
    return group_feats.withColumn("pattern", pattern_column(thresholds))
