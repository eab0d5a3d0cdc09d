"""What the server measures: one record per update (or dropped push), running counters, and
the `stats` map built from them.

Nothing here changes the model or sends a message; `stats` and the run log read it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minips.protocol.wire import Message, WirePart
    from minips.rules import Rule, Update
    from minips.server.stop import Stop
    from minips.state.registry import Push, WorkerRegistry, WorkerState
    from minips.state.store import ParameterStore

log = logging.getLogger("minips.server")


@dataclass
class UpdateRecord:
    """Telemetry of one applied update (what `on_update` receives, as a dict).

    Also of a push a rule dropped (`dropped` True): nothing changed, t did not advance.
    """

    version: int  # global version t after the update
    rule: str
    workers: list[int]  # ranks whose gradients went into it
    staleness: list[int]  # clock staleness tau = t - base of each push, same order
    scale: float | dict[str, float]  # factor on lr: one number, or one per parameter
    params: list[str]  # parameters it changed
    time: float = field(default_factory=time.time)  # wall clock, seconds since the epoch
    # VSGD: value staleness d_l of each layer in the update ({layer: d_l}), else None.
    value_staleness: dict[str, float] | None = None
    # A push the rule refused to apply (DASGD cutoff): version unchanged, params [], scale 0.
    dropped: bool = False

    @classmethod
    def applied(cls, update: Update, version: int, rule: str) -> UpdateRecord:
        """The record of an applied update (its scale one number when all steps share it)."""
        scales = {name: float(scale) for name, _, scale in update.steps}
        distinct = set(scales.values())
        return cls(version, rule, [p.worker.rank for p in update.pushes],
                   [p.staleness for p in update.pushes],
                   distinct.pop() if len(distinct) == 1 else scales,
                   [name for name, _, _ in update.steps],
                   value_staleness=update.value_staleness)  # fmt: skip

    @classmethod
    def drop(cls, push: Push, version: int, rule: str) -> UpdateRecord:
        """The record of a push the rule dropped (t did not advance)."""
        return cls(version, rule, [push.worker.rank], [push.staleness], 0.0, [], dropped=True)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Counters:
    """Server-wide traffic and update counters for `stats`."""

    messages_in: int = 0
    samples: int = 0  # training examples reported by accepted pushes
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    updates: int = 0
    dropped: int = 0  # pushes a rule dropped (not updates)
    grad_bytes_in: int = 0  # bytes of accepted pushes' gradient arrays
    extra_bytes_in: int = 0  # bytes of accepted pushes' extra arrays (VSGD: ~rho of the above)
    worker_steps: int = 0  # accepted `last` pushes: the workers' steps, all together
    # per parameter: array bytes of accepted pushes (up) and of workers' pull replies (down)
    param_bytes_in: dict[str, int] = field(default_factory=dict)
    param_bytes_out: dict[str, int] = field(default_factory=dict)
    staleness_sum: int = 0
    staleness_count: int = 0
    staleness_max: int = 0
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        mean = self.staleness_sum / self.staleness_count if self.staleness_count else 0.0
        return {
            "updates": self.updates,
            "dropped": self.dropped,
            "samples": self.samples,
            "messages_in": self.messages_in,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "grad_bytes_in": self.grad_bytes_in,
            "extra_bytes_in": self.extra_bytes_in,
            "worker_steps": self.worker_steps,
            "bytes_by_param": {
                name: {
                    "up": self.param_bytes_in.get(name, 0),
                    "down": self.param_bytes_out.get(name, 0),
                }  # noqa: E501
                for name in {**self.param_bytes_in, **self.param_bytes_out}
            },
            "staleness_mean": mean,
            "staleness_max": self.staleness_max,
            "uptime": time.monotonic() - self.started,
        }


class Telemetry:
    """Counters plus the `on_update(record_dict)` callback (a run log, a test's list)."""

    def __init__(self, on_update: Callable[[dict[str, Any]], None] | None) -> None:
        self.counters = Counters()
        self.on_update = on_update

    def count_push(self, push: Push, message: Message) -> None:
        """Count an accepted push's array bytes as sent (gradients and extras apart), and
        its step if it ends one: bytes and steps together make the per-step figures."""
        self.counters.worker_steps += push.last
        for name in message.codecs:
            nbytes = sum(frame.nbytes for frame in message.frames_of(name))
            if name in push.extra:
                self.counters.extra_bytes_in += nbytes
            else:
                self.counters.grad_bytes_in += nbytes
                by_param = self.counters.param_bytes_in
                by_param[name] = by_param.get(name, 0) + nbytes

    def count_pull(self, parts: list[WirePart]) -> None:
        """Count a worker's pull reply's array bytes per parameter (observers' are not)."""
        by_param = self.counters.param_bytes_out
        for part in parts:
            by_param[part.name] = by_param.get(part.name, 0) + part.array.nbytes

    def update(self, record: UpdateRecord) -> None:
        """Count an applied update (or a dropped push) and report it."""
        counters = self.counters
        if record.dropped:
            counters.dropped += 1
        else:
            counters.updates += 1
            counters.staleness_sum += sum(record.staleness)
            counters.staleness_count += len(record.staleness)
            counters.staleness_max = max([counters.staleness_max, *record.staleness])
        if self.on_update is not None:
            try:
                self.on_update(record.as_dict())
            except Exception:  # telemetry must never take the server down
                log.exception("on_update callback failed")

    def stats(
        self, store: ParameterStore, registry: WorkerRegistry, rule: Rule, stopping: bool
    ) -> dict[str, Any]:
        """The `stats` reply: versions, the rule, the counters and the worker table."""
        now = time.monotonic()
        return {
            "version": store.version,
            "param_versions": dict(store.param_versions),
            "rule": rule.describe(),
            "world_size": registry.current_world_size(),
            "live_workers": len(registry.live()),
            "stopping": stopping,
            **self.counters.summary(),
            "workers": [worker_row(w, now) for w in registry.by_id.values()],
        }


def stop_record(stop: Stop) -> dict[str, Any]:
    """`stats`' stop fields: why the server stops (None while serving), and whether that is
    the run's own end (docs/protocol.md 5.5)."""
    return {"stop_why": stop.why if stop.stopping else None,
            "stop_planned": stop.stopping and stop.planned}  # fmt: skip


def worker_row(worker: WorkerState, now: float) -> dict[str, Any]:
    """A worker's line in the `stats` reply (docs/protocol.md 5.5)."""
    return {
        "worker": worker.worker_id,
        "rank": worker.rank,
        "alive": worker.alive,
        "finished": worker.finished,
        "observer": worker.observer,
        "clock": worker.clock,
        "steps": worker.steps,
        "pushes": worker.pushes,
        "samples": worker.samples,
        "dropped": worker.dropped,
        "extra_bytes_in": worker.extra_bytes_in,
        "pulls": worker.pulls,
        "last_seen_ago": now - worker.last_seen,
        "bytes_in": worker.bytes_in,
        "bytes_out": worker.bytes_out,
        "info": worker.info,
        **({"refused": worker.refused} if worker.refused is not None else {}),
    }
