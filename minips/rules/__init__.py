"""Update rules: when a pushed gradient becomes an update, and with what scale.

A rule is one small class that reads like its paper's formula (minips/rules/base.py has
the interface). It never acts on the server: it reads the parameter store and the worker
registry, and returns an `Outcome` -- updates to apply, pushes to answer or drop -- that
the server loop carries out:

    class DASGD(ASGD):
        def on_push(self, push):
            return Outcome.update_now(push, scale=self.factor(push.staleness))   # lr * f(tau)

classic.py: asgd, ssp, ssgd. delay.py: dasgd (clock staleness), vsgd (value staleness),
dcasgd (delay compensation). gap.py: gap (Gap-Aware, value staleness per coordinate).
dana.py: dana (DANA-Zero: gradients at the momentum look-ahead), dana-gap (both).
ringmaster.py: ringmaster (drop a push whose delay reached R). delay_adaptive.py:
delay-adaptive (the step shrunk past a delay of a few times the number of workers).
fedbuff.py: fedbuff (the mean of every K pushes, as one update). A rule's
options are declared once (`options`), and the CLI flags are derived from them. Register
a new class in RULES below, or, without touching minips, name it on the command line as
`--rule MODULE:CLASS` (minips/run/rule_plugins.py, examples/03_new_rule.py).
docs/algorithms.md has the math of every rule and the papers they come from.
"""

from __future__ import annotations

from typing import Any

from minips.errors import ConfigError
from minips.rules.base import Outcome, Push, Rule, RuleOption, Update, WorkerSide, layer_of
from minips.rules.classic import ASGD, SSGD, SSP
from minips.rules.dana import DANA, DANAGap
from minips.rules.delay import DASGD, DCASGD, VSGD
from minips.rules.delay_adaptive import DelayAdaptive
from minips.rules.fedbuff import FedBuff
from minips.rules.gap import GapAware
from minips.rules.ringmaster import Ringmaster

RULES: dict[str, type[Rule]] = {
    cls.name: cls
    for cls in (ASGD, SSGD, SSP, DASGD, VSGD, DCASGD, GapAware, DANA, DANAGap, Ringmaster,
                DelayAdaptive, FedBuff)
}  # fmt: skip

# The rule and momentum a run gets when it names none. dana-gap, because it is the rule
# measured to converge at every number of workers from 1 to 16, homogeneous or not, on
# every link, where asgd with momentum 0.9 ended at chance in some runs from 4 workers on
# (docs/algorithms.md, "The default", has the table). Its momentum is its own, per worker
# (the server's is then 0, DANA.server_momentum); rules that use the server's get 0.9.
DEFAULT_RULE = DANAGap.name
DEFAULT_MOMENTUM = 0.9


def server_momentum(cls: type[Rule] | None) -> float:
    """The server's momentum under rule class `cls` when the run gives none: the rule's own
    choice (0 under dana and dana-gap, which need it; 0 under ringmaster and delay-adaptive,
    whose papers analyse plain SGD: Rule.default_momentum), else DEFAULT_MOMENTUM (also
    for no rule)."""
    chosen = None if cls is None else cls.server_momentum
    if chosen is None and cls is not None:
        chosen = cls.default_momentum
    return DEFAULT_MOMENTUM if chosen is None else chosen


def make_rule(name: str, **options: Any) -> Rule:
    """Build a registered rule by name: make_rule("ssp", staleness=2). The constructor
    checks the values; a run's (and `minips.make_rule`: minips.run.rule_options) checks
    the options' names and kinds first and says every refusal in one line."""
    return rule_class(name)(**options)


def rule_class(name: str) -> type[Rule]:
    """A registered rule's class; ConfigError (one line) naming the known ones."""
    if name not in RULES:
        raise ConfigError(
            f"unknown update rule {name!r} (known: {', '.join(RULES)}, or MODULE:CLASS)"
        )
    return RULES[name]


def worker_side(described: dict[str, Any]) -> WorkerSide:
    """The worker's half of the rule a worker received in hello's config["rule"]."""
    cls = RULES.get(described.get("name", ""))
    return cls.worker_side(described) if cls else WorkerSide()


__all__ = [
    "ASGD", "DANA", "DASGD", "DCASGD", "RULES", "DANAGap", "DelayAdaptive", "FedBuff",
    "GapAware", "Ringmaster", "SSGD", "SSP", "VSGD",
    "DEFAULT_MOMENTUM", "DEFAULT_RULE", "Outcome", "Push", "Rule", "RuleOption", "Update",
    "WorkerSide", "layer_of", "make_rule", "rule_class", "server_momentum",
    "worker_side",
]  # fmt: skip
