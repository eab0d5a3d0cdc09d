"""Update rules: when a pushed gradient becomes an update, and with what scale.

A rule is one small class. The server (its `host`) owns sockets, workers and the parameter
store; it calls the rule's hooks on events and offers the rule three actions:

    host.apply_update(pushes, steps) -> UpdateRecord   # steps: [(name, grad, scale)], t += 1
    host.answer_push(push, applied)                    # send the push's reply (once)
    host.live_workers() -> list[WorkerState]           # .worker_id, .rank, .clock, ...
    host.assembling() -> bool                          # still waiting for world_size hellos
    host.store                                         # .params, .version, .param_versions

Hooks (all optional except `on_push`):

    on_hello(worker)           a worker (re)registered
    validate_push(push)        raise ProtocolError(..., "rule") to refuse a push untouched
    on_push(push)              decide: apply now, or hold the reply and apply later
    scale(push, name, grad)    -> (grad', factor): the per-gradient hook of `apply_now`
    may_answer_pull(worker)    False holds the pull; re-asked after every push / departure
    on_pulled(worker)          a pull reply was sent (DC-ASGD keeps w_bak here)
    on_worker_left(worker)     bye or declared dead: leave any barrier
    on_stop()                  the server stops: answer everything held
    on_tick(now)               called on every turn of the server loop (timers)

Adding a rule is usually one `scale` method: DASGD returns (grad, f(tau)), VSGD
(grad, 1/max(1, d_l)) from `push.extra`, DC-ASGD (g + lam*g*g*(w - w_bak), 1.0).
Register it in RULES.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from minips.errors import ConfigError

if TYPE_CHECKING:
    from minips.store import ParameterStore, UpdateRecord
    from minips.workers import WorkerState


@dataclass(eq=False)
class Push:
    """One accepted push: float32 gradients by parameter name, plus rule-specific extras.

    `staleness` is tau = t - base: set on arrival, and refreshed when the push goes into
    an applied update (t = the global version just before it), so `scale` can use it.
    """

    worker: WorkerState
    seq: int
    base: int
    last: bool  # ends the worker's step (clock)
    grads: dict[str, np.ndarray]  # name -> float32, parameter's shape
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # "extra/<key>" -> array
    staleness: int = 0
    reply_to: Any = None  # the server's routing envelope; replaced when a retry arrives


class RuleHost(Protocol):
    """What a rule may use of the server (see the module docstring)."""

    store: ParameterStore

    def live_workers(self) -> list[WorkerState]: ...

    def apply_update(
        self, pushes: list[Push], steps: list[tuple[str, np.ndarray, float]]
    ) -> UpdateRecord: ...

    def answer_push(self, push: Push, applied: bool) -> None: ...

    def assembling(self) -> bool: ...


class Rule:
    """Base class: the default hooks do nothing and allow everything."""

    name: ClassVar[str] = ""
    host: RuleHost

    def attach(self, host: RuleHost) -> None:
        self.host = host

    def describe(self) -> dict[str, Any]:
        """The rule and its settings, as sent to workers in `hello` (config["rule"])."""
        return {"name": self.name}

    def on_hello(self, worker: WorkerState) -> None:
        pass

    def validate_push(self, push: Push) -> None:
        pass

    def on_push(self, push: Push) -> None:
        raise NotImplementedError

    def scale(self, push: Push, name: str, grad: np.ndarray) -> tuple[np.ndarray, float]:
        return grad, 1.0

    def may_answer_pull(self, worker: WorkerState) -> bool:
        return True

    def on_pulled(self, worker: WorkerState) -> None:
        pass

    def on_worker_left(self, worker: WorkerState) -> None:
        pass

    def on_stop(self) -> None:
        pass

    def on_tick(self, now: float) -> None:
        pass

    def apply_now(self, push: Push) -> UpdateRecord:
        """Apply one push as one update through `scale`, then answer it."""
        steps = [(name, *self.scale(push, name, grad)) for name, grad in push.grads.items()]
        record = self.host.apply_update([push], steps)
        self.host.answer_push(push, applied=True)
        return record


class ASGD(Rule):
    """Asynchronous SGD (Hogwild-style PS): every push is applied at once.

    w <- w - lr * g(w_base)        with tau = t - base unbounded
    """

    name = "asgd"

    def on_push(self, push: Push) -> None:
        self.apply_now(push)


class SSP(ASGD):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013): ASGD with bounded clock drift.

    A worker's clock c_w counts its completed steps (pushes with `last`). A pull by w is
    held while  c_w - min_{live v} c_v > s,  so no worker computes on parameters more than
    s clocks ahead of the slowest live worker. s = 0 is bulk-synchronous on the pull side.
    """

    name = "ssp"

    def __init__(self, staleness: int = 3) -> None:
        if staleness < 0:
            raise ConfigError(f"ssp staleness bound must be >= 0, got {staleness}")
        self.staleness = staleness

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "staleness": self.staleness}

    def may_answer_pull(self, worker: WorkerState) -> bool:
        slowest = min((w.clock for w in self.host.live_workers()), default=worker.clock)
        return worker.clock - slowest <= self.staleness


class SSGD(Rule):
    """Synchronous SGD with a barrier per step over the live workers.

    Round k ends when every live worker has sent its `last` push of the round; then

        w <- w - lr * (1/|K_p|) * sum_{w in K_p} g_w[p]      for every parameter p

    is applied as ONE update (K_p: the workers that sent a gradient for p this round) and
    all held pushes are answered. A worker that leaves or dies drops out of the round: its
    unfinished step is discarded and the barrier completes without it. While the cluster
    is still assembling (fewer than world_size workers have said hello, for at most a
    heartbeat timeout) no round completes, so early workers do not train alone.
    """

    name = "ssgd"

    def __init__(self) -> None:
        self._sums: dict[str, dict[str, np.ndarray]] = {}  # worker_id -> name -> sum of grads
        self._held: dict[str, Push] = {}  # worker_id -> its `last` push of this round

    def on_push(self, push: Push) -> None:
        sums = self._sums.setdefault(push.worker.worker_id, {})
        for name, grad in push.grads.items():
            if name in sums:
                sums[name] += grad
            else:
                sums[name] = np.array(grad, dtype=np.float32)  # own copy: grad is a frame view
        if not push.last:
            self.host.answer_push(push, applied=False)  # queued for the round
            return
        self._held[push.worker.worker_id] = push
        self._try_complete()

    def on_worker_left(self, worker: WorkerState) -> None:
        if worker.worker_id not in self._held:
            self._sums.pop(worker.worker_id, None)
        self._try_complete()

    def on_tick(self, now: float) -> None:
        self._try_complete()  # the assembly period may have ended

    def on_stop(self) -> None:
        for push in self._held.values():
            self.host.answer_push(push, applied=False)
        self._held.clear()
        self._sums.clear()

    def _try_complete(self) -> None:
        if not self._held:
            return
        if any(w.worker_id not in self._held for w in self.host.live_workers()):
            return
        if self.host.assembling():
            return
        totals: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        for worker_id in self._held:
            for name, grad_sum in self._sums.pop(worker_id, {}).items():
                totals[name] = totals[name] + grad_sum if name in totals else grad_sum
                counts[name] = counts.get(name, 0) + 1
        order = [name for name in self.host.store.params if name in totals]  # model order
        steps = [(name, totals[name] / np.float32(counts[name]), 1.0) for name in order]
        pushes = list(self._held.values())
        self._held.clear()
        self.host.apply_update(pushes, steps)
        for push in pushes:
            self.host.answer_push(push, applied=True)


RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (ASGD, SSGD, SSP)}


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by name: make_rule("ssp", staleness=2). ConfigError on unknown names."""
    if name not in RULES:
        raise ConfigError(f"unknown update rule {name!r} (known: {', '.join(RULES)})")
    try:
        return RULES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for rule {name!r}: {exc}") from None
