"""Delay-adaptive step sizes (Mishchenko, Bach, Even, Woodworth, NeurIPS 2022): the full
step while a push's delay is within a few times the number of workers, 1/(4 L tau) past."""

from __future__ import annotations

from typing import Any

from minips.rules.base import Outcome, Push, RuleOption, _is_number, _option, option_default
from minips.rules.classic import ASGD


class DelayAdaptive(ASGD):
    """Asynchronous SGD with the delay-adaptive step size of Mishchenko, Bach, Even,
    Woodworth ("Asynchronous SGD Beats Minibatch SGD Under Arbitrary Delays", NeurIPS 2022,
    arXiv 2206.07638, the delay-adaptive step sizes of its nonconvex analysis):

        eta_t = lr                           if tau_t <= c * n
        eta_t = min(lr, 1 / (4 L tau_t))     otherwise            (tau_t = t - base)
        w <- w - eta_t * g(w_base),   so the scale is s = eta_t / lr

    n: the number of workers of the run; c: `threshold` (2: the paper's 2n, as recalled:
    docs/algorithms.md says what of the paper could be checked); L: the smoothness
    constant, `smoothness`. A deep network's L is not known, so 0 (the default)
    takes the L at which the two branches meet at tau = c n, L = 1 / (4 lr c n): then
    s = c n / tau past the threshold. The guarantee this buys depends on n, not on the
    largest delay: at most n gradients are in flight, so the mean delay is below n, at
    most half of all steps have tau > 2n, and the others keep the full step.
    """

    name = "delay-adaptive"
    default_momentum = 0.0  # the paper's method is plain SGD; --momentum may still set one
    options = (
        RuleOption("threshold", "--adaptive-threshold", float, 2.0,
                   "delay-adaptive: the full step while tau <= this times the number of "
                   "workers.", minimum=0, min_open=True),
        RuleOption("smoothness", "--adaptive-smoothness", float, 0.0,
                   "delay-adaptive: L of min(lr, 1/(4 L tau)) past it; 0: the L at which "
                   "the two meet.", minimum=0),
    )  # fmt: skip

    def __init__(self, threshold: float | None = None, smoothness: float | None = None) -> None:
        threshold = option_default(DelayAdaptive, "threshold") if threshold is None else threshold
        smoothness = (
            option_default(DelayAdaptive, "smoothness") if smoothness is None else smoothness
        )
        _option("delay-adaptive", "threshold", threshold,
                _is_number(threshold) and threshold > 0, "a number > 0")  # fmt: skip
        _option("delay-adaptive", "smoothness", smoothness,
                _is_number(smoothness) and smoothness >= 0, "a number >= 0")  # fmt: skip
        self.threshold = float(threshold)
        self.smoothness = float(smoothness)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.threshold, "smoothness": self.smoothness}

    def workers(self) -> int:
        """n: the run's number of workers (at least 1)."""
        return max(1, self.registry.current_world_size())

    def factor(self, tau: int, lr: float, workers: int) -> float:
        """s = eta_t / lr for a push of delay `tau` (class docstring)."""
        bound = self.threshold * workers
        if tau <= bound:
            return 1.0
        if not self.smoothness:  # L = 1 / (4 lr c n): min(1, c n / tau) = c n / tau here
            return bound / tau
        return min(1.0, 1.0 / (4.0 * self.smoothness * tau * lr))

    def on_push(self, push: Push) -> Outcome:
        scale = self.factor(push.staleness, self.store.optimizer.lr, self.workers())
        return Outcome.update_now(push, scale=scale)
