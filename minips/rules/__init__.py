"""Update rules: when a pushed gradient becomes an update, and with what scale.

A rule is one small class that reads like its paper's formula (minips/rules/base.py has
the interface). It never acts on the server: it reads the parameter store and the worker
registry, and returns an `Outcome` -- updates to apply, pushes to answer or drop -- that
the server loop carries out:

    class DASGD(ASGD):
        def on_push(self, push):
            return Outcome.apply(push, scale=self.factor(push.staleness))   # lr * f(tau)

classic.py: asgd, ssp, ssgd. delay.py: dasgd (clock staleness), vsgd (value staleness),
dcasgd (delay compensation). gap.py: gap (Gap-Aware, value staleness per coordinate).
dana.py: dana (DANA-Zero: gradients at the momentum look-ahead), dana-gap (both). A rule's
options are declared once (`options`), and the CLI flags are derived from them. Register
a new class in RULES below; docs/algorithms.md has the math of every rule and the papers
they come from.
"""

from __future__ import annotations

from typing import Any

from minips.errors import ConfigError
from minips.rules.base import Outcome, Push, Rule, RuleOption, Update, WorkerSide, layer_of
from minips.rules.classic import ASGD, SSGD, SSP
from minips.rules.dana import DANA, DANAGap
from minips.rules.delay import DASGD, DCASGD, VSGD
from minips.rules.gap import GapAware

RULES: dict[str, type[Rule]] = {
    cls.name: cls for cls in (ASGD, SSGD, SSP, DASGD, VSGD, DCASGD, GapAware, DANA, DANAGap)
}


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by name: make_rule("ssp", staleness=2). ConfigError on unknown names."""
    if name not in RULES:
        raise ConfigError(f"unknown update rule {name!r} (known: {', '.join(RULES)})")
    try:
        return RULES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for rule {name!r}: {exc}") from None


def worker_side(described: dict[str, Any]) -> WorkerSide:
    """The worker's half of the rule a worker received in hello's config["rule"]."""
    cls = RULES.get(described.get("name", ""))
    return cls.worker_side(described) if cls else WorkerSide()


__all__ = [
    "ASGD", "DANA", "DASGD", "DCASGD", "RULES", "DANAGap", "GapAware", "SSGD", "SSP", "VSGD",
    "Outcome", "Push", "Rule", "RuleOption", "Update", "WorkerSide", "layer_of", "make_rule",
    "worker_side",
]  # fmt: skip
