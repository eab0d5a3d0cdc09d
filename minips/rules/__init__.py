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

import inspect
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
    """Build a registered rule by name: make_rule("ssp", staleness=2) (a rule from outside
    minips, "MODULE:CLASS": minips.run.rule_plugins.make_rule)."""
    return build_rule(name, rule_class(name), options)


def build_rule(name: str, cls: type[Rule], options: dict[str, Any]) -> Rule:
    """cls(**options), `cls` the rule `name` names. ConfigError (one line) on an option of
    a declared number kind that is not a number, and on options the rule's constructor
    refuses: a plug-in's (a class not in RULES) for any reason (its code is the user's), a
    registered rule's with a TypeError or ValueError (anything else there is a bug of
    minips)."""
    check_option_names(name, cls, options)
    check_option_kinds(name, cls, options)
    refusals = (Exception,) if name not in RULES else (TypeError, ValueError)
    try:
        return cls(**options)
    except ConfigError:
        raise
    except refusals as exc:
        reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        given = ", ".join(f"{key}={value!r}" for key, value in options.items())
        what = f"bad options for rule {name!r}: {given} refused" if options else (
            f"rule {name!r} could not be made")  # fmt: skip
        raise ConfigError(f"{what} ({type(exc).__name__}: {reason})") from None


def check_option_names(name: str, cls: type[Rule], options: dict[str, Any]) -> None:
    """ConfigError naming an option a registered rule does not have, and the ones it has
    (a plug-in's constructor is left to say it: its options may not be declared)."""
    if name not in RULES:
        return
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the constructor says it
        return
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    known = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in options:
        if key not in known:
            has = f"its options are {', '.join(known)}" if known else "it takes no options"
            raise ConfigError(f"rule {name!r} has no option {key!r}: {has}")


def check_option_kinds(name: str, cls: type[Rule], options: dict[str, Any]) -> None:
    """ConfigError naming an option the rule declares a number (RuleOption.kind int or
    float) whose value is not one (a bool is not), before the rule sees it."""
    for declared in cls.options:
        value = options.get(declared.key)
        if value is None or declared.kind not in (int, float):
            continue
        kinds = (int,) if declared.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            wanted = "an integer" if declared.kind is int else "a number"
            raise ConfigError(f"rule {name!r}: option {declared.key}={value!r} is not {wanted}")


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
    "WorkerSide", "build_rule", "layer_of", "make_rule", "rule_class", "server_momentum",
    "worker_side",
]  # fmt: skip
