"""Ringmaster ASGD (Maranjyan, Tyurin, Richtarik, ICML 2025): drop a gradient whose delay
reached the threshold R, apply every other one at once."""

from __future__ import annotations

from typing import Any

from minips.rules.base import Outcome, Push, RuleOption, _option, option_default
from minips.rules.classic import ASGD


class Ringmaster(ASGD):
    """Ringmaster ASGD (Maranjyan, Tyurin, Richtarik, "Ringmaster ASGD: The First
    Asynchronous SGD with Optimal Time Complexity", ICML 2025, arXiv 2501.16168).

        tau = t - base < R:   w <- w - lr * g(w_base)            (an update, t += 1)
        tau = t - base >= R:  the push is dropped                (t and w unchanged)

    A dropped push is answered `applied: false` and its worker pulls the current
    parameters with it, so it computes its next gradient at the newest point: the
    paper's "ignore the stale gradient, start a new one at x^k". R: `delay_threshold`;
    0 (the default) takes R = the number of workers of the run (the paper's R comes from
    the gradient noise and the target accuracy, which a run does not know; this choice is
    minips's, docs/algorithms.md says why). The paper's optional second half, stopping a
    computation as soon as it is bound to arrive too stale, is not done: a minips server
    only answers requests, so it cannot interrupt a worker in mid-step.
    """

    name = "ringmaster"
    default_momentum = 0.0  # the paper's method is plain SGD; --momentum may still set one
    options = (
        RuleOption("delay_threshold", "--ringmaster-r", int, 0,
                   "ringmaster: apply a push only while its delay tau < R; "
                   "0: R = the number of workers.", minimum=0),
    )  # fmt: skip

    def __init__(self, delay_threshold: int | None = None) -> None:
        value = option_default(Ringmaster, "delay_threshold") if delay_threshold is None else (
            delay_threshold)  # fmt: skip
        _option("ringmaster", "delay_threshold", value,
                isinstance(value, int) and value >= 0, "an integer >= 0")  # fmt: skip
        self.delay_threshold = value

    def threshold(self) -> int:
        """R: the option, or with 0 the number of workers (at least 1)."""
        if self.delay_threshold:
            return self.delay_threshold
        registry = getattr(self, "registry", None)
        return max(1, registry.current_world_size() if registry is not None else 1)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "delay_threshold": self.threshold()}

    def on_push(self, push: Push) -> Outcome:
        if push.staleness >= self.threshold():
            return Outcome(drops=[push])  # not an update: t counts the changes bases refer to
        return Outcome.update_now(push)
