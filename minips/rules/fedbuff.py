"""FedBuff (Nguyen et al., AISTATS 2022): buffer K pushes, then apply their mean."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from minips.errors import DataError
from minips.rules.base import Outcome, Push, Rule, RuleOption, Update, _option, option_default

if TYPE_CHECKING:
    from minips.rules.base import StateReader, StateWriter


class FedBuff(Rule):
    """Buffered asynchronous aggregation (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek,
    Huba, "Federated Learning with Buffered Asynchronous Aggregation", AISTATS 2022,
    arXiv 2106.06639, Algorithm 1, with the staleness scaling 1/sqrt(1 + tau) of its
    experiments; docs/algorithms.md says what of the paper could be checked).

    Every push is answered at once and its gradient, weighted by its staleness, added to
    a buffer; when the buffer holds K pushes their mean is ONE update:

        D   <- D + s(tau_i) * g_i        per parameter, for each push i as it arrives
        w   <- w - lr * D / K            once K pushes are in; then D <- 0
        s(tau) = 1 / sqrt(1 + tau)       (`weighting` "sqrt"; "none": s = 1)

    tau_i = t - base_i when push i arrives (t only moves at a flush, so it is also its
    delay when applied). A parameter missing from a push adds nothing to D (a parameter
    pushed every k steps arrives as the sum of its k gradients: divided by K, it counts
    as k pushes would). K: `buffer_size`. The K-th push is answered `applied: true`, the
    others `applied: false` when they arrive (kept, not yet applied): a worker never
    waits for the buffer, as the paper's clients do not. What one update is, with one
    local step per push, is a minibatch of K gradients; the paper's clients run several
    local steps and send the difference, which `lr` then stands for.
    """

    name = "fedbuff"
    WEIGHTINGS: ClassVar[tuple[str, ...]] = ("sqrt", "none")
    options = (
        RuleOption("buffer_size", "--fedbuff-k", int, 4,
                   "fedbuff: pushes buffered per update (K).", minimum=1),
        RuleOption("weighting", "--fedbuff-weighting", str, "sqrt",
                   "fedbuff: each push weighted by 1/sqrt(1+tau), or none.",
                   choices=WEIGHTINGS),
    )  # fmt: skip

    def __init__(self, buffer_size: int | None = None, weighting: str | None = None) -> None:
        size = option_default(FedBuff, "buffer_size") if buffer_size is None else buffer_size
        weighting = option_default(FedBuff, "weighting") if weighting is None else weighting
        _option("fedbuff", "buffer_size", size, isinstance(size, int) and size >= 1,
                "an integer >= 1")  # fmt: skip
        _option("fedbuff", "weighting", weighting, weighting in self.WEIGHTINGS,
                " or ".join(self.WEIGHTINGS))  # fmt: skip
        self.buffer_size, self.weighting = size, weighting
        self._sum: dict[str, np.ndarray] = {}  # D: name -> float32, the parameter's shape
        self._pushes: list[Push] = []  # the buffered pushes, without their gradients
        self._count = 0  # pushes in the buffer (not all of them in _pushes after a resume)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "buffer_size": self.buffer_size, "weighting": self.weighting}

    def weight(self, tau: int) -> float:
        """s(tau) (class docstring)."""
        return 1.0 / math.sqrt(1.0 + tau) if self.weighting == "sqrt" else 1.0

    def on_push(self, push: Push) -> Outcome:
        weight = np.float32(self.weight(push.staleness))
        # A sum that overflows is not written: the server's overflow check refuses the
        # update (minips.ops.overflow), so float32's warning says nothing here.
        with np.errstate(over="ignore", invalid="ignore"):
            for name, grad in push.grads.items():
                weighted = np.multiply(grad, weight)  # own array: grad is a frame view
                if name in self._sum:
                    self._sum[name] += weighted
                else:
                    self._sum[name] = weighted
        self._count += 1
        if self._count < self.buffer_size:
            self._pushes.append(replace(push, grads={}, extra={}))  # its record, not its arrays
            return Outcome(answers=[(push, False)])  # kept; answered now, not held
        return self._flush(push)

    def _flush(self, last: Push) -> Outcome:
        """The buffer's mean as one update (model order); the buffer emptied."""
        count = np.float32(self._count)
        order = [name for name in self.store.params if name in self._sum]
        with np.errstate(over="ignore", invalid="ignore"):
            steps = [(name, self._sum[name] / count, 1.0) for name in order]
        pushes = [*self._pushes, last]
        self._sum, self._pushes, self._count = {}, [], 0
        return Outcome(updates=[Update(pushes, steps)], answers=[(last, True)])

    def write_state(self, writer: StateWriter) -> None:
        """D and the number of pushes in it (a checkpoint: minips/ops/rule_state.py)."""
        if self._count:
            writer.shared("buffer", self._sum)
            writer.count("buffered", self._count)

    def read_state(self, reader: StateReader) -> None:
        # The buffered pushes' records are not kept: the update that flushes the buffer
        # lists the pushes since the resume only (its mean is over all K).
        buffered, count = reader.shared_arrays("buffer"), reader.count("buffered")
        if buffered and not count:  # gradients of no push
            raise DataError("checkpoint rule/buffer and rule/buffered do not agree")
        self._sum, self._pushes, self._count = buffered, [], count
