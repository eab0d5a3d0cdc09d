"""A rule of one's own, named on the command line: `--rule MODULE:CLASS` is a Rule subclass
outside minips, in a dotted module on sys.path ("my_rules:Damped") or in a .py file
("examples/03_new_rule.py:Damped").

    rule = make_rule("examples/03_new_rule.py:Damped", gamma=0.7)   # or make_rule("ssp")

`rule_class`, `make_rule` and `rule_momentum` take a registered rule's name as
minips.rules's do, and a MODULE:CLASS spec too. The spec (not the class) is what travels:
`minips run` passes `--rule MODULE:CLASS` to the server process, which imports it there. A
rule loaded this way has the default worker side (no extras in pushes): workers know only
the registered rules.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from minips import rules
from minips.errors import ConfigError
from minips.rules import RULES, Rule, server_momentum
from minips.run.rule_options import build_rule


def rule_class(name: str) -> type[Rule]:
    """A registered rule's class (minips.rules.RULES), or the Rule subclass "MODULE:CLASS"
    names; ConfigError (one line) when there is none."""
    module_name, _, class_name = name.rpartition(":")
    if name in RULES or not module_name or not class_name:
        return rules.rule_class(name)  # a registered one, or its error naming them
    cls = getattr(_import_rule_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Rule)):
        raise ConfigError(f"rule {name!r}: {module_name} has no Rule subclass {class_name}")
    return cls


def make_rule(name: str, **options: Any) -> Rule:
    """A rule by name or MODULE:CLASS, with `options`: make_rule("ssp", staleness=2).
    ConfigError (one line) as minips.run.rule_options.build_rule says; a plug-in's
    constructor may refuse its options for any reason (its code is the user's)."""
    return build_rule(name, rule_class(name), options)


def rule_momentum(name: str | None) -> float:
    """The server's momentum under the rule `name` names when the run gives none
    (minips.rules.server_momentum). A name that is not a rule gets DEFAULT_MOMENTUM (the
    run's check says what is wrong with the name)."""
    try:
        cls = rule_class(name) if name else None
    except ConfigError:
        cls = None
    return server_momentum(cls)


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
