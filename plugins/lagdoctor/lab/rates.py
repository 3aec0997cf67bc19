"""Did the demo's workloads produce the traffic they were designed for?

A workload's producer on a slow machine falls short of its rate (11 of a
designed 150 msg/s was seen): the surge or hot partition it should tell never
happens, and a "healthy" finding then says nothing about the incident. The
demo writes each shortfall to `<data root>/lab/workload_shortfalls.json`; the
lag page reads it (lagdoctor.web.data.read_shortfalls) and says it beside the
verdicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from lagdoctor.web.data import SHORTFALLS_FILE  # the page reads what the demo writes here


@dataclass(frozen=True)
class RateSegment:
    """A stretch at one designed rate: `designed` msg/s per partition, run for `seconds`, `sent` per partition."""

    designed: float
    seconds: float
    sent: int

    @property
    def achieved(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


MIN_MEASURED_S = 5.0  # shorter stretches say too little (one tick late is 2 % of a second's records)
SHORTFALL_RATIO = 0.8  # below 80 % of the design, the incident the workload tells did not happen


def rate_shortfall(topic: str, segments: list[RateSegment], *, min_seconds: float = MIN_MEASURED_S,
                   ratio: float = SHORTFALL_RATIO) -> str | None:
    """"machine too slow: clicks reached 11 of 150 msg/s per partition" for the worst stretch
    that fell below `ratio` of its design; None when every measured stretch reached it.
    Pure: the segments carry the durations."""
    short = [s for s in segments if s.seconds >= min_seconds and s.designed > 0 and s.achieved < ratio * s.designed]
    if not short:
        return None
    worst = min(short, key=lambda s: s.achieved / s.designed)
    return (f"machine too slow: {topic} reached {worst.achieved:.0f} of {worst.designed:g} msg/s per partition "
            f"(over {worst.seconds:.0f} s)")


def write_shortfalls(data_root: str, shortfalls: dict[str, str]) -> None:
    """{group: line} of the workloads that fell short (an empty dict clears it); written whole, then renamed."""
    import os
    from pathlib import Path

    path = Path(data_root) / SHORTFALLS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(shortfalls, sort_keys=True))
    os.replace(tmp, path)
