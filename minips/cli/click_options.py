"""The click options of a configuration class: one per field a command takes.

minips.run.config declares each field once (its help, range, the commands that take it);
this turns those declarations into the options of `minips run`, `server` and `train`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from typing import Any

import click

from minips.cli.numbers import BoundedIntRange, FiniteFloatRange
from minips.rules import RuleOption
from minips.run.config import RULE_OPTIONS, rule_flags
from minips.run.settings import Setting, setting_of


def config_options(cls: type, command: str) -> Callable[[Callable], Callable]:
    """Decorator: a click option for each field of `cls` that `command` takes.

    For `rule_options`, every rule's own flags come first (from each rule's `options`,
    their help showing the rule's default), then `--rule-option KEY=VALUE`.
    """
    options = []
    for item in fields(cls):
        if command not in setting_of(item).commands:
            continue
        if item.name == RULE_OPTIONS:
            options += [_rule_flag_option(param, *owned) for param, owned in rule_flags().items()]
        options.append(_field_option(item))

    def decorate(function: Callable) -> Callable:
        for option in reversed(options):
            function = option(function)
        return function

    return decorate


def click_type(kind: type, spec: Setting | RuleOption) -> click.ParamType:
    """The click type of a value of `kind` (int, float, str) in `spec`'s range or choices
    (a number also finite, and an integer at most MAX_INT: minips.cli.numbers)."""
    if spec.choices:
        return click.Choice(list(spec.choices))
    if kind not in (int, float):
        return click.STRING
    ranged = BoundedIntRange if kind is int else FiniteFloatRange
    return ranged(spec.minimum, spec.maximum, min_open=spec.min_open, max_open=spec.max_open)


def _field_option(item: Field) -> Callable:
    spec = setting_of(item)
    default = None if item.default is MISSING else item.default
    kwargs: dict[str, Any] = {"help": spec.help, "default": default}
    kwargs["show_default"] = default is not None
    if spec.parse is not None:
        kwargs.update(callback=_parsing(spec.parse), multiple=spec.multiple)
    elif isinstance(default, bool):
        flag = _flag(item)
        return click.option(f"{flag}/--no-{flag[2:]}", item.name, **kwargs)
    else:
        kwargs["type"] = spec.cli_type or click_type(spec.kind or type(default), spec)
    return click.option(_flag(item), item.name, **kwargs)


def _parsing(parse: Callable[[Any], Any]) -> Callable[[Any, Any, Any], Any]:
    """A click callback running `parse`, its ValueError shown as click's usage error."""

    def callback(_ctx: Any, _param: Any, value: Any) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def _flag(item: Field) -> str:
    return setting_of(item).flag or "--" + item.name.replace("_", "-")


def _rule_flag_option(param: str, rule: str, option: RuleOption) -> Callable:
    help_text = f"{option.help} [default: {option.default}]"
    return click.option(
        option.flag, param, type=click_type(option.kind, option), default=None, help=help_text
    )
