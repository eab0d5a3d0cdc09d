"""How slow a worker is at each step: heterogeneity as it really is (docs/model.md 4.5).

A worker measures each step's compute time c and then sleeps `extra(step, c)` seconds, so
that the step lasts as long as it would on a slower or interrupted machine. The schedule
is `config.hetero_schedule`, one of:

    fixed                every step lasts F_r c: F_r = hetero[r] (1 without one)
    fluctuate:N:MAX      every N steps the slowdown is drawn again, F_r (1 + (MAX - 1) u_k),
                         k = step // N: a machine whose load comes and goes
    pareto:ALPHA:P       at each step, with probability P, a heavy-tailed pause: the step
                         lasts F_r X c with X = min(u^(-1 / ALPHA), 100), Pareto(ALPHA) of
                         scale 1 (infinite mean for ALPHA <= 1, hence the cap); else F_r c
    away:R:AFTER:SECONDS the worker of rank R, after its step number AFTER (from 0),
                         stops for SECONDS, then goes on (a laptop closed and opened);
                         every step lasts F_r c

Draws are portable: u_i = (key_s(i) >> 11) / 2^53, uniform in [0, 1), from SplitMix64
(minips.data.shuffle) with the worker's stream s = (seed * 1000 + rank) XOR SPEED_SALT, so
a browser worker (minips/classroom/web/static/speeds.js) draws the same numbers.
Deterministic from the run's seed; each step's extra seconds go in the worker's report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minips.data.shuffle import MASK64

SPEED_SALT = 0x5350454544  # "SPEED": the speed draws never reuse the batch order's stream
PARETO_CAP = 100.0  # the longest heavy-tailed step, in compute times
KINDS = ("fixed", "fluctuate", "pareto", "away")


class ScheduleError(ValueError):
    """A `hetero_schedule` that is not one of the forms above."""


def uniform(stream: int, index: int) -> float:
    """u_index of `stream`: (key_stream(index) >> 11) / 2^53, exact in a double, in [0, 1).
    key is SplitMix64's output `index` (minips.data.shuffle), in Python integers."""
    z = (stream + (index + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return ((z ^ (z >> 31)) >> 11) / 2.0**53


def speed_stream(seed: int, rank: int) -> int:
    """The stream of rank `rank`'s speed draws in a run of seed `seed`."""
    return ((seed * 1000 + rank) & MASK64) ^ SPEED_SALT


@dataclass(frozen=True)
class SpeedSchedule:
    """One worker's slowdown at each step (module docstring). factor: F_r."""

    kind: str = "fixed"
    args: tuple[float, ...] = ()
    factor: float = 1.0
    stream: int = 0
    rank: int = 0

    @classmethod
    def parse(cls, text: str) -> tuple[str, tuple[float, ...]]:
        """("pareto", (1.5, 0.1)) from "pareto:1.5:0.1"; ScheduleError when malformed."""
        kind, *fields = text.split(":")
        counts = {"fixed": 0, "fluctuate": 2, "pareto": 2, "away": 3}
        if kind not in counts or len(fields) != counts[kind]:
            raise ScheduleError(
                f"{text!r}: expected fixed, fluctuate:N:MAX, "
                "pareto:ALPHA:P or away:RANK:AFTER:SECONDS"
            )
        try:
            args = tuple(float(field) for field in fields)
        except ValueError:
            raise ScheduleError(f"{text!r}: its fields must be numbers") from None
        _check_args(text, kind, args)
        return kind, args

    @classmethod
    def for_worker(cls, text: str, factor: float, seed: int, rank: int) -> SpeedSchedule:
        kind, args = cls.parse(text)
        return cls(kind, args, factor, speed_stream(seed, rank), rank)

    def extra(self, step: int, compute: float) -> float:
        """Seconds to sleep after step `step` (from 0), whose compute took `compute` s."""
        slowdown = self.factor
        if self.kind == "fluctuate":
            every, most = self.args
            slowdown *= 1.0 + (most - 1.0) * uniform(self.stream, step // int(every))
        elif self.kind == "pareto":
            alpha, chance = self.args
            if uniform(self.stream, 2 * step) < chance:
                size = 1.0 - uniform(self.stream, 2 * step + 1)  # in (0, 1]: no division by 0
                slowdown *= min(size ** (-1.0 / alpha), PARETO_CAP)
        pause = 0.0
        if self.kind == "away" and int(self.args[0]) == self.rank and step == int(self.args[1]):
            pause = self.args[2]
        return max(0.0, (slowdown - 1.0) * compute) + pause


def _check_args(text: str, kind: str, args: tuple[float, ...]) -> None:
    """ScheduleError unless each field is in its range."""
    if not all(math.isfinite(a) for a in args):
        raise ScheduleError(f"{text!r}: its fields must be finite")
    bad = {
        "fluctuate": lambda n, most: n < 1 or n != int(n) or most < 1,
        "pareto": lambda alpha, p: alpha <= 0 or not 0 <= p <= 1,
        "away": lambda rank, after, seconds: (
            rank < 0 or rank != int(rank) or after < 0 or after != int(after) or seconds < 0
        ),
    }.get(kind)
    if bad is not None and bad(*args):
        raise ScheduleError(
            f"{text!r}: fluctuate needs N >= 1 (whole) and MAX >= 1, pareto "
            "ALPHA > 0 and 0 <= P <= 1, away a rank, a step (whole) and SECONDS >= 0"
        )
