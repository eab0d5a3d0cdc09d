"""DANA (Hakimi, Barkai, Gabel, Schuster, arXiv 1907.11612): gradients at the look-ahead.

With momentum, a gradient that arrives tau updates late was computed on parameters that
the momentum has since carried further. DANA sends each worker, instead of the current
parameters, an estimate of where they will be when its gradient arrives, so the gradient
is computed (nearly) where it will be applied. DANA-GA adds Gap-Aware's penalty for what
the estimate missed (the GA paper evaluates this combination).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import DataError
from minips.protocol.wire import ProtocolError
from minips.rules.base import (
    SQUARE_SAFE_MOVE,
    Outcome,
    Push,
    RuleOption,
    Update,
    _is_number,
    _option,
    option_default,
)
from minips.rules.classic import ASGD
from minips.rules.gap import GapAware, GapPenalty, PulledValues

if TYPE_CHECKING:
    from minips.rules.base import StateReader, StateWriter
    from minips.state.registry import WorkerRegistry, WorkerState
    from minips.state.store import ParameterStore


class DANA(ASGD):
    """DANA-Zero (Hakimi et al., arXiv 1907.11612, the master-side variant): one momentum
    vector per worker on the server, and each worker sent the look-ahead.

    On a push of g by worker i (gamma: --dana-momentum, eta: the server's lr):

        v_i   <- gamma * v_i + g                       (v_i = 0 before i's first push)
        w     <- w - eta * v_i
        pull reply to worker i:  w_hat = w - eta * gamma * sum_j v_j      (all live workers)

    Each worker's next update will add gamma * v_j on top of its new gradient, so w_hat is
    where w will be once every worker has pushed once more: about when i's gradient lands.
    The worker computes its gradient at w_hat as it would at any pulled values (nothing
    extra on the wire; docs/protocol.md §6.5); an observer's pull (the evaluator) gets w.

    The momentum is the rule's, per worker, so the server's own SGD must have none: the
    rule sets it to 0 (`server_momentum`; another --momentum given is a ConfigError);
    weight decay, if any, is added by the
    server's SGD outside the momentum. Costs: one model-sized velocity per worker plus their
    running sum on the server; one look-ahead computed per pull (no shared snapshot). A
    worker that leaves takes its momentum out of the sum.
    """

    name = "dana"
    options = (
        RuleOption("momentum", "--dana-momentum", float, 0.9,
                   "dana: momentum gamma, one buffer per worker (the server's is then 0).",
                   minimum=0, maximum=1, max_open=True),
    )  # fmt: skip
    server_momentum = 0.0

    def __init__(self, momentum: float | None = None) -> None:
        momentum = option_default(DANA, "momentum") if momentum is None else momentum
        _option("dana", "momentum", momentum, _is_number(momentum) and 0 <= momentum < 1,
                "in [0, 1)")  # fmt: skip
        self.momentum = float(momentum)
        self._velocity: dict[str, dict[str, np.ndarray]] = {}  # worker -> name -> v_i
        self._sum: dict[str, np.ndarray] = {}  # name -> sum_j v_j
        # the push check_push just passed, its gradients, and what it computed (`_next`)
        self._checked: tuple[Push, dict, tuple[Any, Any, dict[str, np.ndarray]]] | None = None

    def attach(self, store: ParameterStore, registry: WorkerRegistry) -> None:
        self.check_server_momentum(store.optimizer.momentum)
        super().attach(store, registry)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "momentum": self.momentum}

    def gradient(self, push: Push) -> tuple[dict[str, np.ndarray], dict[str, float] | None]:
        """The gradient that enters v_i (DANA: as pushed), and per-layer telemetry."""
        return push.grads, None

    def check_push(self, push: Push) -> None:
        """`nonfinite` when the push would make v_i, sum_j v_j, or the update w - eta v_i
        non-finite (asked of `finite`): the server's own check sees only g. The new
        velocities are kept for `on_push` of the same push with the same gradients (computed
        once); a step sent in several pushes reaches `on_push` as its last push carrying
        the whole step's gradients (WorkerState.assemble_step), which are computed afresh."""
        step = self._next(push)
        velocity = self._velocity.get(push.worker.worker_id, {})
        for name, new in step[2].items():
            old, total = velocity.get(name), self._sum.get(name)
            if self.finite is not None and not self.finite.velocity_finite(name, new, old, total):
                raise ProtocolError(
                    f"gradient {name!r} would make the worker's momentum or the parameter "
                    "non-finite",
                    "nonfinite",
                )
        self._checked = (push, push.grads, step)

    def on_push(self, push: Push) -> Outcome:
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is push and checked[1] is push.grads:
            grads, telemetry, fresh = checked[2]
        else:  # a step assembled from several pushes
            grads, telemetry, fresh = self._next(push)
        velocity = self._velocity.setdefault(push.worker.worker_id, {})
        for name, new in fresh.items():
            old, velocity[name] = velocity.get(name), new
            total = self._sum.get(name)
            if old is None:  # i's first push of this parameter: v_i = g
                self._sum[name] = new.copy() if total is None else total + new
            else:  # sum_j v_j, kept as it changes: sum + (new - old), in place (old is done)
                self._sum[name] += np.subtract(new, old, out=old)
        steps = [(name, velocity[name], 1.0) for name in grads]  # the server's SGD: w -= lr v_i
        return Outcome(
            updates=[Update([push], steps, value_staleness=telemetry)], answers=[(push, True)]
        )

    def _next(
        self, push: Push
    ) -> tuple[dict[str, np.ndarray], dict[str, float] | None, dict[str, np.ndarray]]:
        """The gradient that enters v_i, its telemetry, and each new v_i = gamma v_i + g as
        a new array (v_i = g on i's first push of a parameter); nothing is changed."""
        grads, telemetry = self.gradient(push)
        velocity = self._velocity.get(push.worker.worker_id, {})
        gamma = np.float32(self.momentum)
        fresh = {}
        with np.errstate(over="ignore", invalid="ignore"):  # refused by check_push
            for name, grad in grads.items():
                old = velocity.get(name)
                if old is None:
                    fresh[name] = grad.copy()  # own copy: grad may be a frame view
                else:
                    fresh[name] = new = np.multiply(old, gamma)
                    new += grad
        return grads, telemetry, fresh

    def pull_values(self, worker: WorkerState, names: list[str]) -> dict[str, np.ndarray]:
        """w_hat = w - float32(eta * gamma) * sum_j v_j for each name (fresh arrays)."""
        ahead = np.float32(self.store.optimizer.lr * self.momentum)
        params = self.store.params
        values = {}
        for name in names:
            if name not in self._sum:
                values[name] = self.store.snapshot(name)
                continue
            values[name] = ahead_values = np.multiply(self._sum[name], ahead)
            np.subtract(params[name], ahead_values, out=ahead_values)  # w - ahead * S
        return values

    def on_worker_left(self, worker: WorkerState) -> Outcome:
        self.forget(worker.worker_id)
        return Outcome()

    def forget(self, worker_id: str) -> None:
        for name, velocity in self._velocity.pop(worker_id, {}).items():
            self._sum[name] = self._sum[name] - velocity  # it will not be applied again

    def on_tick(self, now: float) -> Outcome:
        for worker_id in self.forget_absent(now):  # resumed, and did not come back
            self.forget(worker_id)
        return Outcome()

    def write_state(self, writer: StateWriter) -> None:
        """Each worker's v_i and their running sum (a checkpoint: minips/ops/rule_state.py)."""
        for worker_id, velocity in self._velocity.items():
            writer.worker_arrays("velocity", worker_id, velocity)
        writer.shared("velocity_sum", self._sum)

    def read_state(self, reader: StateReader) -> None:
        velocity, total = reader.worker_arrays("velocity"), reader.shared_arrays("velocity_sum")
        if {name for v in velocity.values() for name in v} - set(total):
            raise DataError("checkpoint rule/velocity names a parameter rule/velocity_sum lacks")
        self._velocity, self._sum = velocity, total


class DANAGap(DANA):
    """DANA-GA: DANA-Zero with Gap-Aware's penalty (Barkai, Hakimi, Schuster, ICLR 2020, §6).

    As DANA, but each gradient is divided by its Gap before it enters v_i:

        G  = 1 + |w - w_hat_then| / C                (elementwise; GapPenalty has C)
        v_i <- gamma * v_i + g / G;   w <- w - eta * v_i

    w_hat_then is the look-ahead the worker was sent (and computed at), kept by reference
    per worker, so the gap is what the look-ahead missed, not the clock delay. Options:
    momentum (DANA's) and decay (Gap-Aware's), with --rule-option KEY=VALUE (the flags
    --dana-momentum and --gap-decay belong to dana and gap).
    """

    name = "dana-gap"
    max_move = SQUARE_SAFE_MOVE  # A_p keeps the square of each move (GapPenalty)
    options = ()  # each CLI flag has one owner rule; see the docstring

    def __init__(self, momentum: float | None = None, decay: float | None = None) -> None:
        super().__init__(momentum)
        decay = option_default(GapAware, "decay") if decay is None else decay
        _option("dana-gap", "decay", decay, _is_number(decay) and 0 <= decay < 1, "in [0, 1)")
        self.decay = float(decay)
        self.penalty = GapPenalty(self.decay)
        self.pulled = PulledValues()
        self._before: dict[str, np.ndarray] = {}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "momentum": self.momentum, "decay": self.decay}

    def pull_values(self, worker: WorkerState, names: list[str]) -> dict[str, np.ndarray]:
        values = super().pull_values(worker, names)
        self.pulled.record(worker.worker_id, self.store.version, values)
        return values

    def gradient(self, push: Push) -> tuple[dict[str, np.ndarray], dict[str, float] | None]:
        params = self.store.params
        self._before = {name: params[name] for name in push.grads}  # by reference, as gap's
        then = self.pulled.at(push.worker.worker_id, push.base)
        if then is None:
            return push.grads, None  # no reference point: plain DANA
        return self.penalty.penalize(push.grads, self._before, then)

    def after_update(self, update: Update) -> None:
        for name, before in self._before.items():
            self.penalty.record_move(name, self.store.params[name] - before)

    def forget(self, worker_id: str) -> None:
        self.pulled.forget(worker_id)
        super().forget(worker_id)

    def write_state(self, writer: StateWriter) -> None:
        super().write_state(writer)
        self.penalty.write_state(writer)
        self.pulled.write_state(writer)

    def read_state(self, reader: StateReader) -> None:
        super().read_state(reader)
        self.penalty.read_state(reader)
        self.pulled.read_state(reader)
