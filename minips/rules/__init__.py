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
`--rule MODULE:CLASS` (a dotted module on the path, or a .py file: `--rule
my_rules.py:Damped`, examples/03_new_rule.py). docs/algorithms.md has the math of every
rule and the papers they come from.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
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


def server_momentum(rule: str | None) -> float:
    """The server's momentum under `rule` when the run gives none: the rule's own choice
    (0 under dana and dana-gap, which need it; 0 under ringmaster and delay-adaptive, whose
    papers analyse plain SGD: Rule.default_momentum), else DEFAULT_MOMENTUM. A name that
    is not a rule gets DEFAULT_MOMENTUM (the run's check says what is wrong with the name)."""
    try:
        cls = rule_class(rule) if rule else None
    except ConfigError:
        cls = None
    chosen = None if cls is None else cls.server_momentum
    if chosen is None and cls is not None:
        chosen = cls.default_momentum
    return DEFAULT_MOMENTUM if chosen is None else chosen


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by name: make_rule("ssp", staleness=2), or from outside minips as
    "MODULE:CLASS" (see rule_class). ConfigError (one line) on unknown names, on an option
    of a declared number kind that is not a number, and on options the rule's constructor
    refuses: a plug-in's for any reason (its code is the user's), a registered rule's
    with a TypeError or ValueError (anything else there is a bug of minips)."""
    cls = rule_class(name)
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
    """A registered rule's class, or "MODULE:CLASS": a Rule subclass in a dotted module on
    sys.path ("my_rules:Damped") or in a .py file ("examples/03_new_rule.py:Damped").

    The spec (not the class) is what travels: `minips run` passes `--rule MODULE:CLASS`
    to the server process, which imports it there. A rule loaded this way has the default
    worker side (no extras in pushes): workers know only the registered rules.
    """
    if name in RULES:
        return RULES[name]
    module_name, sep, class_name = name.rpartition(":")
    if not sep or not module_name or not class_name:
        raise ConfigError(
            f"unknown update rule {name!r} (known: {', '.join(RULES)}, or MODULE:CLASS)"
        )
    cls = getattr(_import_rule_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ConfigError(f"rule {name!r}: {module_name} has no Rule subclass {class_name}")
    return cls


def _import_rule_module(module_name: str) -> Any:
    """The module of a MODULE:CLASS rule: a .py file by path, else a dotted import."""
    try:
        if not module_name.endswith(".py"):
            return importlib.import_module(module_name)
        path = Path(module_name).resolve()
        if not path.is_file():
            raise ConfigError(f"rule file {module_name} not found")
        spec = importlib.util.spec_from_file_location(f"minips_rule_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]  (dataclasses need it)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module
    except ConfigError:
        raise
    except Exception as exc:  # the module's own code failed as it ran: the user's to fix
        reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
        raise ConfigError(
            f"cannot import rule module {module_name}: {type(exc).__name__}: {reason}"
        ) from None


def worker_side(described: dict[str, Any]) -> WorkerSide:
    """The worker's half of the rule a worker received in hello's config["rule"]."""
    cls = RULES.get(described.get("name", ""))
    return cls.worker_side(described) if cls else WorkerSide()


__all__ = [
    "ASGD", "DANA", "DASGD", "DCASGD", "RULES", "DANAGap", "DelayAdaptive", "FedBuff",
    "GapAware", "Ringmaster", "SSGD", "SSP", "VSGD",
    "DEFAULT_MOMENTUM", "DEFAULT_RULE", "Outcome", "Push", "Rule", "RuleOption", "Update",
    "WorkerSide", "layer_of", "make_rule", "rule_class", "server_momentum", "worker_side",
]  # fmt: skip
