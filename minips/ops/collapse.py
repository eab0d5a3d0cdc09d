"""Has the model collapsed? The signs of a run that diverged or stopped learning.

A model that diverges in minips ends one of two ways (docs/results.md): its gradients
overflow, so its workers' pushes are refused as non-finite; or its units die and it gives
the same output whatever the input, so the loss sits at ln(C) (C classes: the loss of a
uniform guess) and the test accuracy at chance, 1/C, to the end of the run. A
`CollapseWatch` is told what the server sees (pushes applied or refused, the training
loss workers report with their pushes) or what an evaluator sees (test accuracy and
loss), and returns a `Collapse` the first time one of these signs holds:

    nonfinite  pushes refused as non-finite from min(NONFINITE_WORKERS, workers)
               different workers within NONFINITE_WINDOW applied updates (a diverging
               model overflows again within a few; a worker refused may stop at once, while
               another's finite pushes still apply)
    loss       the mean of the last LOSS_WINDOW training losses above GROWN * ln(C) (far
               worse than a guess: diverging); or, once WARMUP_UPDATES updates were
               applied, every one of them at or above (1 - AT_LN_C) * ln(C): no better
               than a uniform guess on any of LOSS_WINDOW batches (a dead model gives
               one output whatever the input; one still learning, however slowly, beats
               the guess on most batches by then)
    accuracy   CHANCE_EVALS evaluations in a row, each after WARMUP_UPDATES updates, at a
               test accuracy <= CHANCE / C with a test loss >= (1 - AT_LN_C) * ln(C)

The warm-up keeps a fresh model, at chance too, from being taken for a dead one (a model
that learns nothing in WARMUP_UPDATES updates, its learning rate far too small, is
called collapsed as well, and told so). The caller says it in one line (`Collapse.line`):
the server logs it and shows it in `stats` (`collapse`, docs/protocol.md 7.1), the
evaluator logs it and writes it to its metrics, and `minips run` stops the run and exits
with status 3.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from minips.rules import DEFAULT_RULE

NONFINITE_WORKERS = 2
NONFINITE_WINDOW = 20
LOSS_WINDOW = 20
GROWN = 10.0
AT_LN_C = 0.01
WARMUP_UPDATES = 100
CHANCE_EVALS = 3
CHANCE = 1.2
TINY_LR = 0.001  # below it, a model that learned nothing may simply be too slow


@dataclass(frozen=True)
class Collapse:
    """What collapsed and when: `sign` is "nonfinite", "loss" or "accuracy"; `what` says
    what was seen, `advice` what to try; `updates` the updates applied by then."""

    sign: str
    what: str
    advice: str
    updates: int

    def line(self) -> str:
        """The one line a run shows: "collapsed: <what>; <advice>"."""
        return f"collapsed: {self.what}; {self.advice}"

    def record(self) -> dict[str, Any]:
        """As summary.json, `stats` and the metrics log keep it."""
        return {**asdict(self), "line": self.line()}


def output_classes(params: Mapping[str, np.ndarray]) -> int:
    """C: the number of the model's outputs, the last dimension of its last parameter (in
    model order, the output layer's bias or weight)."""
    return int(list(params.values())[-1].shape[-1])


class CollapseWatch:
    """Watches one run for the signs of a collapse (module docstring); pure bookkeeping.

    classes: C, the model's number of outputs. workers: the run's number of workers (None:
    not fixed). lr and rule: the run's, named in the advice. say(line): told the one line
    when a collapse is found (the server logs it). Each `on_*` method returns the Collapse
    the first time a sign holds, then None; `collapse` keeps it.
    """

    def __init__(
        self,
        classes: int,
        workers: int | None = None,
        lr: float | None = None,
        rule: str | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.ln_c = math.log(classes)
        self._guess = (1 - AT_LN_C) * self.ln_c  # a loss this high: no better than a guess
        self.classes = classes
        self.nonfinite_needed = min(NONFINITE_WORKERS, workers or NONFINITE_WORKERS)
        self.lr, self.rule, self.say = lr, rule, say
        self.updates = 0
        self.collapse: Collapse | None = None
        self._refused: dict[str, int] = {}  # worker -> the updates applied at its last refusal
        self._losses: deque[float] = deque(maxlen=LOSS_WINDOW)
        self._chance_evals = 0

    # --------------------------------------------------------------- what the server sees

    def on_applied(self) -> None:
        """An update was applied."""
        self.updates += 1

    def on_nonfinite(self, worker: str) -> Collapse | None:
        """A push of `worker` was refused as non-finite."""
        self._refused[worker] = self.updates
        oldest = self.updates - NONFINITE_WINDOW
        self._refused = {w: at for w, at in self._refused.items() if at >= oldest}
        if len(self._refused) < self.nonfinite_needed:
            return None
        count = len(self._refused)
        what = f"pushes from {count} worker{'s' * (count > 1)} refused as non-finite"
        return self._found("nonfinite", what + " (the gradients overflowed)")

    def on_train_loss(self, loss: float) -> Collapse | None:
        """A worker reported the training loss of the batch behind its push."""
        if not math.isfinite(loss):
            return None  # its gradients are non-finite too: on_nonfinite sees the push
        self._losses.append(loss)
        if len(self._losses) < LOSS_WINDOW:
            return None
        mean = sum(self._losses) / LOSS_WINDOW
        if mean > GROWN * self.ln_c:
            what = f"training loss {mean:.3g}, above {GROWN:g} x ln {self.classes} (diverging)"
            return self._found("loss", what)
        if self.updates >= WARMUP_UPDATES and min(self._losses) >= self._guess:
            what = (
                f"training loss {mean:.4f}, no better than a guess (ln {self.classes} = "
                f"{self.ln_c:.4f}) on any of {LOSS_WINDOW} batches after {self.updates} updates"
            )
            return self._found("loss", what, learning=False)
        return None

    # ------------------------------------------------------------ what an evaluator sees

    def on_evaluation(self, accuracy: float, loss: float, updates: int) -> Collapse | None:
        """One evaluation of the model after `updates` updates: test accuracy and loss."""
        self.updates = max(self.updates, updates)
        at_chance = accuracy <= CHANCE / self.classes and not loss < self._guess
        if updates < WARMUP_UPDATES or not at_chance:
            self._chance_evals = 0
            return None
        self._chance_evals += 1
        if self._chance_evals < CHANCE_EVALS:
            return None
        what = (
            f"test accuracy {accuracy:.3f} (chance: {1 / self.classes:.3f}) and loss "
            f"{loss:.3g} for {CHANCE_EVALS} evaluations after {updates} updates"
        )
        return self._found("accuracy", what, learning=False)

    # -------------------------------------------------------------------------------------

    def _found(self, sign: str, what: str, learning: bool = True) -> Collapse | None:
        """Record the first collapse; `learning` False: the sign cannot tell a dead model
        from one that never learned (a tiny learning rate)."""
        if self.collapse is not None:
            return None
        self.collapse = Collapse(sign, what, self._advice(learning), self.updates)
        if self.say is not None:
            self.say(self.collapse.line())
        return self.collapse

    def _advice(self, learning: bool) -> str:
        if not learning and self.lr is not None and self.lr < TINY_LR:
            return f"--lr {self.lr:g} may be too small to learn at all: try {10 * TINY_LR:g}"
        advice = "try a smaller --lr"
        if self.lr is not None:
            advice += f" than {self.lr:g} (e.g. {self.lr / 10:g})"
        if self.rule is not None and self.rule != DEFAULT_RULE:
            advice += f", or the default --rule {DEFAULT_RULE} (docs/algorithms.md)"
        return advice
