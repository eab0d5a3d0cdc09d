"""What a worker is given rather than imports: the progress callback, the trace and the
conditions a run emulates, each a small interface the operations implement
(minips.results.trace writes a Chrome trace, minips.cli draws a progress bar,
minips.run.conditions.Emulated paces a --bandwidth link and slows steps by a schedule).

The trace's categories are the worker's words: the step, its compute, what it sends and
receives. `NullTrace` is tracing switched off, so the step traces unconditionally.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from minips.errors import ConfigError

ProgressFn = Callable[[int, int, dict[str, Any]], None]
"""progress(samples_done, samples_total, latest): called as training goes on (by the trainer
after every step, by the launcher about twice a second). `latest` holds the newest figures
known: `train_loss`, `accuracy`, `updates` (whichever the caller has)."""

STEP, COMPUTE, SEND, RECV = "step", "compute", "send", "recv"
COMM = (SEND, RECV)


class NullTrace:
    """Where a worker records its spans, switched off: the interface a trace implements
    (minips.results.trace.Trace), doing nothing. Times are time.perf_counter() seconds
    (`now`); `with trace.span("conv1", COMPUTE):` records the body as one span, and
    `complete(name, cat, start, end, tid=None, args=None)` one that ran from start to end
    on row `tid` (None: this thread's)."""

    enabled = False
    _NOTHING = nullcontext()

    now = staticmethod(time.perf_counter)

    def span(self, name: str, cat: str, tid: str | None = None, args: Any = None) -> Any:
        return self._NOTHING

    def complete(self, *args: Any, **kwargs: Any) -> None:
        pass

    def events(self) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass

    def __enter__(self) -> NullTrace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


class LinkLimit(Protocol):
    """A worker's link (minips.run.netlimit.Link): `up` paces its requests, `down` the
    replies; each direction's `wait(n)` returns once n bytes would have crossed it."""

    up: Any
    down: Any


class Speeds(Protocol):
    """How slow a worker is: `extra(step, compute)` seconds to sleep after step `step` (from
    0), whose compute took `compute` s."""

    def extra(self, step: int, compute: float) -> float: ...


class Conditions(Protocol):
    """The conditions a run emulates on a worker, read from hello's config: a slower
    machine (`speeds`: the schedule and factor of docs/model.md 4.5) and a slower link
    (`link`: a --bandwidth rate, None for none)."""

    def speeds(self, schedule: str, factor: float, seed: int, rank: int) -> Speeds: ...

    def link(self, rate: str | None) -> LinkLimit | None: ...


@dataclass(frozen=True)
class FixedSlowdown:
    """Every step lasts `factor` times its compute: the extra is slept."""

    factor: float = 1.0

    def extra(self, step: int, compute: float) -> float:
        return max(0.0, (self.factor - 1.0) * compute)


class AsItIs:
    """No emulation: this machine's own link, and a fixed slowdown at most. A config that
    asks for more (a changing schedule, a --bandwidth) is refused, not quietly ignored:
    give the worker minips.run.conditions.Emulated (what `minips worker` does)."""

    def speeds(self, schedule: str, factor: float, seed: int, rank: int) -> Speeds:
        if schedule != "fixed":
            raise ConfigError(f"hetero_schedule {schedule!r} needs the run's emulated conditions")
        return FixedSlowdown(factor)

    def link(self, rate: str | None) -> LinkLimit | None:
        if rate in (None, "", "unlimited"):
            return None
        raise ConfigError(f"bandwidth {rate!r} needs the run's emulated conditions")
