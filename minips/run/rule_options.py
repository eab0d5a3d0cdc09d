"""A rule's options checked before it is built, so each refusal is one line a user can act
on: an option the rule has no keyword for (naming the ones it has), a value of a declared
number kind that is not a number (RuleOption.kind), and whatever its constructor refuses.

    rule = build_rule("ssp", RULES["ssp"], {"staleness": 2})

The declarations (RuleOption) are the rules' own (minips.rules.base); every run path
builds its rule here, through minips.run.rule_plugins.make_rule (`minips.make_rule`).
"""

from __future__ import annotations

import inspect
from typing import Any

from minips.errors import ConfigError
from minips.rules import RULES, Rule


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
