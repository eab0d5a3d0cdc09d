"""Gap-Aware (Barkai, Hakimi, Schuster, ICLR 2020): penalize a stale gradient by its gap.

The gap of a gradient is how far, in value, each coordinate of the parameters has moved
between the values the gradient was computed at and the current ones, counted in typical
steps of that coordinate. The two pieces are reused by DANA-GA (minips/rules/dana.py):
`PulledValues` (what each worker computes at) and `GapPenalty` (the step size and penalty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import DataError
from minips.rules.base import (
    SQUARE_SAFE_MOVE,
    Outcome,
    Push,
    RuleOption,
    Update,
    _is_number,
    _option,
    layer_of,
    option_default,
)
from minips.rules.classic import ASGD

if TYPE_CHECKING:
    from minips.rules.base import StateReader, StateWriter
    from minips.state.registry import WorkerState


class PulledValues:
    """Per worker: the version of its last pull and the values it now computes at.

    A pull sends only what changed since the worker's previous one, so the values a worker
    holds are the latest sent value of each parameter. They are kept by reference: the
    arrays sent in pull replies are read-only copies never changed afterwards (the store's
    snapshots, or DANA's fresh look-ahead arrays), so keeping them costs memory only once
    the server's parameter moves on: at most one model copy per worker, no copying per pull.
    """

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, dict[str, np.ndarray]]] = {}  # worker -> (t, values)

    def record(self, worker_id: str, version: int, sent: dict[str, np.ndarray]) -> None:
        """A pull reply at `version` sent `sent` (name -> read-only array) to the worker."""
        _, values = self._held.get(worker_id, (0, {}))
        values.update(sent)
        self._held[worker_id] = (version, values)

    def at(self, worker_id: str, base: int) -> dict[str, np.ndarray] | None:
        """The values a push with `base` was computed at; None if the worker's last pull is
        not that version (it never pulled, or pulled again): no reference point."""
        version, values = self._held.get(worker_id, (-1, {}))
        return values if version == base else None

    def forget(self, worker_id: str) -> None:
        self._held.pop(worker_id, None)

    def write_state(self, writer: StateWriter) -> None:
        """Each worker's pull version and values (a checkpoint: minips/ops/rule_state.py)."""
        for worker_id, (version, values) in self._held.items():
            writer.worker_number("pulled_version", worker_id, version)
            writer.worker_arrays("pulled", worker_id, values)

    def read_state(self, reader: StateReader) -> None:
        versions, values = reader.worker_numbers("pulled_version"), reader.worker_arrays("pulled")
        self._held = {w: (version, values.get(w, {})) for w, version in versions.items()}


class GapPenalty:
    """Gap-Aware's per-coordinate penalty, measured in a running average of the step size.

    For every coordinate j of parameter p (all elementwise):

        C_p   = sqrt( A_p / (1 - decay^k_p) )    the typical step: a bias-corrected running
                                                 RMS of how far one update moved w_p,
                A_p <- decay*A_p + (1-decay)*(Delta w_p)^2   after each of the k_p updates of p
        G_p   = 1 + |w_p - w_then_p| / C_p       (G = 1 where C_p = 0: nothing has moved)
        g'_p  = g_p / G_p

    w_then: the values the gradient was computed at. This is the paper's Gap
    G(Delta) = 1 + |Delta| / C with C "the average step size" per parameter; C as the
    bias-corrected RMS of the step follows the authors' group's public implementation
    (decay 0.999 there, of lr * momentum buffer: the same as the move, with server SGD).
    """

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self._mean_sq: dict[str, np.ndarray] = {}  # A_p, float32, p's shape
        self._count: dict[str, int] = {}  # k_p

    def step_size(self, name: str) -> np.ndarray | None:
        """C_p (float32, p's shape); None before p's first update."""
        count = self._count.get(name, 0)
        if not count:
            return None
        size = self._mean_sq[name] / np.float32(1.0 - self.decay**count)
        return np.sqrt(size, out=size)

    def penalize(
        self,
        grads: dict[str, np.ndarray],
        current: dict[str, np.ndarray],
        then: dict[str, np.ndarray],
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """(g / G per parameter, the mean gap |w - w_then| / C per layer, for telemetry).

        A parameter missing from `then` (no pull since the worker registered sent it: a
        first pull with `since` at the current version sends nothing) has no reference
        point and is not penalized, as one that never moved."""
        penalized: dict[str, np.ndarray] = {}
        gap_sum: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for name, grad in grads.items():
            size = self.step_size(name)
            if size is None or name not in then:  # no move yet, or no w_then: no gap
                penalized[name], steps_behind = grad, np.zeros(grad.shape, np.float32)
            else:  # in place where it can be: this runs on every push, over the model
                size[size == 0] = np.inf  # a coordinate that never moved has no gap
                steps_behind = np.subtract(current[name], then[name])
                np.abs(steps_behind, out=steps_behind)
                steps_behind /= size
                penalized[name] = divisor = steps_behind + np.float32(1)
                np.divide(grad, divisor, out=divisor)
            layer = layer_of(name)
            gap_sum[layer] = gap_sum.get(layer, 0.0) + float(steps_behind.sum(dtype=np.float64))
            sizes[layer] = sizes.get(layer, 0) + grad.size
        return penalized, {layer: gap_sum[layer] / sizes[layer] for layer in gap_sum}

    def record_move(self, name: str, move: np.ndarray) -> None:
        """One update moved w_name by `move` (float32, a fresh array this overwrites):
        fold it into A_p."""
        square = np.multiply(move, move, out=move)
        square *= np.float32(1.0 - self.decay)
        old = self._mean_sq.get(name)
        if old is None:
            self._mean_sq[name] = square
        else:  # decay * A + square, in place
            old *= np.float32(self.decay)
            old += square
        self._count[name] = self._count.get(name, 0) + 1

    def write_state(self, writer: StateWriter) -> None:
        """A_p and k_p of every parameter (a checkpoint: minips/ops/rule_state.py)."""
        writer.shared("mean_sq", self._mean_sq)
        writer.shared("moves", self._count)

    def read_state(self, reader: StateReader) -> None:
        mean_sq = reader.shared_arrays("mean_sq")
        count = {name: int(k) for name, k in reader.shared_numbers("moves").items()}
        if set(count) != set(mean_sq):
            raise DataError("checkpoint rule/moves and rule/mean_sq name other parameters")
        self._mean_sq, self._count = mean_sq, count


class GapAware(ASGD):
    """Gap-Aware ASGD (Barkai, Hakimi, Schuster, ICLR 2020, arXiv 1909.10802, Algorithm 1).

    Every push is applied at once, each coordinate of its gradient divided by its Gap:

        G = 1 + |w - w_then| / C          elementwise (GapPenalty has C)
        w <- w - lr * (g / G)             (through the server's SGD, momentum included)

    w_then, the values the worker computed its gradient at, is kept on the server: a
    reference to what each worker's last pull was sent (PulledValues; at most one model copy
    per worker, nothing extra on the wire). A push whose `base` is not that pull's version
    has no reference point and is applied unpenalized, like ASGD. The penalty is linear in
    the gap and per parameter: a coordinate that did not move is not penalized however old
    the gradient's clock, one that moved by ten typical steps gets an 11th of its gradient.
    VSGD (delay.py) is the sampled, per-layer cousin: gap_l / step_l on rho of the values.
    """

    name = "gap"
    max_move = SQUARE_SAFE_MOVE  # A_p keeps the square of each move (GapPenalty)
    options = (
        RuleOption("decay", "--gap-decay", float, 0.999,
                   "gap: decay of the running mean square of one update's move.",
                   minimum=0, maximum=1, max_open=True),
    )  # fmt: skip

    def __init__(self, decay: float | None = None) -> None:
        decay = option_default(GapAware, "decay") if decay is None else decay
        _option("gap", "decay", decay, _is_number(decay) and 0 <= decay < 1, "in [0, 1)")
        self.decay = float(decay)
        self.penalty = GapPenalty(self.decay)
        self.pulled = PulledValues()
        self._before: dict[str, np.ndarray] = {}  # values before the pending update
        self._versions: dict[str, dict[str, int]] = {}  # worker -> name -> version it holds

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "decay": self.decay}

    def on_pulled(self, worker: WorkerState) -> None:
        """Remember the snapshots the pull just sent (the ones changed since it last held)."""
        store, held = self.store, self._versions.setdefault(worker.worker_id, {})
        sent = {}
        for name, version in store.param_versions.items():
            if held.get(name) != version:
                sent[name], held[name] = store.snapshot(name), version
        self.pulled.record(worker.worker_id, store.version, sent)

    def on_worker_left(self, worker: WorkerState) -> Outcome:
        self.forget(worker.worker_id)  # a returning worker pulls afresh
        return Outcome()

    def forget(self, worker_id: str) -> None:
        self.pulled.forget(worker_id)
        self._versions.pop(worker_id, None)

    def on_tick(self, now: float) -> Outcome:
        for worker_id in self.forget_absent(now):  # resumed, and did not come back
            self.forget(worker_id)
        return Outcome()

    def write_state(self, writer: StateWriter) -> None:
        self.penalty.write_state(writer)
        self.pulled.write_state(writer)

    def read_state(self, reader: StateReader) -> None:
        # What each worker holds is the latest value sent of each parameter: the next pull
        # records every snapshot again (on_pulled), so _versions need not be kept.
        self.penalty.read_state(reader)
        self.pulled.read_state(reader)

    def on_push(self, push: Push) -> Outcome:
        params = self.store.params
        # The values before the update, by reference: the store never writes an array it
        # holds (each update replaces them with new ones), so these stay as they are.
        self._before = {name: params[name] for name in push.grads}
        then = self.pulled.at(push.worker.worker_id, push.base)
        if then is None:
            return Outcome.update_now(push)  # no reference point: plain ASGD
        grads, gaps = self.penalty.penalize(push.grads, self._before, then)
        steps = [(name, grad, 1.0) for name, grad in grads.items()]
        return Outcome(
            updates=[Update([push], steps, value_staleness=gaps)], answers=[(push, True)]
        )

    def after_update(self, update: Update) -> None:
        for name, before in self._before.items():
            self.penalty.record_move(name, self.store.params[name] - before)
