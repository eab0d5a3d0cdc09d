"""The classic rules beside asgd (in base.py): bounded staleness (ssp), synchronous (ssgd)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import ConfigError
from minips.rules.base import ASGD, Outcome, Push, Rule, RuleOption, Update, option_default

if TYPE_CHECKING:
    from collections.abc import Iterable

    from minips.state.registry import WorkerState


class SSP(ASGD):
    """Stale Synchronous Parallel (Ho et al., NIPS 2013): ASGD with bounded clock drift.

    A worker's clock c_w counts its completed steps (pushes with `last`). A pull by w is
    held while  c_w - min_{live v} c_v > s,  so no worker computes on parameters more than
    s clocks ahead of the slowest live worker. s = 0 is bulk-synchronous on the pull side.
    """

    name = "ssp"
    options = (
        RuleOption("staleness", "--staleness", int, 3,
                   "ssp: how many clocks a worker may run ahead of the slowest.", minimum=0),
    )  # fmt: skip

    def __init__(self, staleness: int | None = None) -> None:
        staleness = option_default(SSP, "staleness") if staleness is None else staleness
        if staleness < 0:
            raise ConfigError(f"ssp staleness bound must be >= 0, got {staleness}")
        self.staleness = staleness

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "staleness": self.staleness}

    def may_answer_pull(self, worker: WorkerState) -> bool:
        slowest = min((w.clock for w in self.registry.live()), default=worker.clock)
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

    def on_push(self, push: Push) -> Outcome:
        sums = self._sums.setdefault(push.worker.worker_id, {})
        for name, grad in push.grads.items():
            if name in sums:
                sums[name] += grad
            else:
                sums[name] = np.array(grad, dtype=np.float32)  # own copy: grad is a frame view
        if not push.last:
            return Outcome(answers=[(push, False)])  # queued for the round
        self._held[push.worker.worker_id] = push
        return self._try_complete()

    def on_worker_left(self, worker: WorkerState) -> Outcome:
        if worker.worker_id not in self._held:
            self._sums.pop(worker.worker_id, None)
        return self._try_complete()

    def on_tick(self, now: float) -> Outcome:
        return self._try_complete()  # the assembly period may have ended

    def on_stop(self) -> Outcome:
        answers = [(push, False) for push in self._held.values()]
        self._held.clear()
        self._sums.clear()
        return Outcome(answers=answers)

    def _in_rank_order(self, worker_ids: Iterable[str]) -> list[str]:
        """The round's workers by rank: float32 addition is not associative, so summing in
        arrival order would let the link's timing change the update's low bits; by rank a
        seed's run is the same on every link."""
        by_id = self.registry.by_id  # only the round's workers are looked up, not every id
        return sorted(worker_ids, key=lambda w: (by_id[w].rank if w in by_id else -1, w))

    def _try_complete(self) -> Outcome:
        """The round's update, once every live worker's `last` push is in."""
        live = self.registry.live()
        if not self._held or self.registry.assembling:
            return Outcome()
        if any(w.worker_id not in self._held for w in live):
            return Outcome()
        totals: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        # A sum that overflows is not written: the server's overflow check refuses the
        # round (minips.ops.overflow), so float32's warning says nothing here.
        with np.errstate(over="ignore", invalid="ignore"):
            for worker_id in self._in_rank_order(self._held):
                for name, grad_sum in self._sums.pop(worker_id, {}).items():
                    totals[name] = totals[name] + grad_sum if name in totals else grad_sum
                    counts[name] = counts.get(name, 0) + 1
        order = [name for name in self.store.params if name in totals]  # model order
        steps = [(name, totals[name] / np.float32(counts[name]), 1.0) for name in order]
        pushes = list(self._held.values())
        self._held.clear()
        return Outcome(updates=[Update(pushes, steps)], answers=[(p, True) for p in pushes])
