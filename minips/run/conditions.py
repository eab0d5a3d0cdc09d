"""The conditions `minips worker` emulates, from hello's config: a slower machine by a
schedule (speeds.py) and a worker's own slower link (netlimit.py). A Worker takes them as
its `conditions` (minips/worker/hooks.py: Conditions); without them it runs as it is."""

from __future__ import annotations

from minips.run.netlimit import Link
from minips.run.speeds import SpeedSchedule


class Emulated:
    """SpeedSchedule for the step's slowdown, a token-bucket Link for the rate."""

    def speeds(self, schedule: str, factor: float, seed: int, rank: int) -> SpeedSchedule:
        return SpeedSchedule.for_worker(schedule, factor, seed, rank)

    def link(self, rate: str | None) -> Link | None:
        return Link.from_option(rate)
