"""How one configuration field is declared, and the checks of a value against it.

`setting(...)` declares a dataclass field with its `Setting` (default, help, range, the
commands that take it, where it goes); `setting_of(field)` reads it back. `check_range`
holds a value to its declared range (a config's `validate()`), `check_type` a config.json
value to its field's kind (`from_json`); both are used by minips.run.config's ConfigBase.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field
from pathlib import Path
from typing import Any

import click

from minips.errors import ConfigError
from minips.rules import RuleOption

TRAIN_RUN_SERVER = ("train", "run", "server", "launch")
RUN_SERVER = ("run", "server", "launch")

# The largest integer a setting may hold: msgpack's int64, which hello carries to workers
# in every language (Python's msgpack cannot pack an int past 2^64 at all).
MAX_INT = 2**63 - 1


@dataclass(frozen=True)
class Setting:
    """How one configuration field is offered and where it goes (its dataclass metadata).

    help: the option's help. commands: the commands that take it as an option. to_workers:
    sent to workers in hello's config. server_option: the server option it sets (an
    OpsOptions field, minips/ops/ops_options.py).
    minimum / maximum (`*_open`: the bound itself excluded) and choices: its range, checked
    by the CLI and by `validate()`. kind: the value's type when the default does not say
    it (a default of None that stands for a number: `momentum`; else a None default
    holds text). cli_type: a click type for fields whose default does not say it (paths).
    parse: option text -> value, for values that are not a plain
    number or word (a comma list); `multiple`: the option may repeat.
    flag: the option's name when it is not "--" + the field's name with dashes.
    """

    help: str
    commands: tuple[str, ...] = RUN_SERVER
    to_workers: bool = False
    server_option: str | None = None
    minimum: float | None = None
    min_open: bool = False
    maximum: float | None = None
    max_open: bool = False
    choices: tuple[str, ...] = ()
    kind: type | None = None
    cli_type: click.ParamType | None = None
    parse: Callable[[Any], Any] | None = None
    multiple: bool = False
    flag: str | None = None
    omit_default: bool = False  # to_workers, but left out of hello while at its default


def setting(default: Any = MISSING, help: str = "", **how: Any) -> Any:
    """A dataclass field declared with its `Setting`; a list or dict default is copied."""
    metadata = {"setting": Setting(help=help, **how)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.copy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def setting_of(item: Field) -> Setting:
    """The `Setting` a configuration field was declared with."""
    if "setting" not in item.metadata:
        raise TypeError(f"configuration field {item.name!r} is not declared with setting()")
    return item.metadata["setting"]


def check_type(item: Field, value: Any, path: str | Path) -> None:
    """ConfigError when a config.json value is not of its field's kind (the default's type;
    a field that defaults to None holds text unless its Setting names a kind)."""
    default = item.default_factory() if item.default is MISSING else item.default
    kind = setting_of(item).kind or (str if default is None else type(default))
    if value is None and default is None:
        return
    if kind is float and type(value) is int:
        return  # a hand-written 1 for 1.0: the same value
    if type(value) is not kind:
        raise ConfigError(f"{path}: {item.name} must be {kind.__name__}, got {value!r}")


def check_range(label: str, value: Any, spec: Setting | RuleOption) -> None:
    """ConfigError "epochs must be >= 1, got 0" when `value` is outside `spec`'s range
    (a number, also when it is NaN or infinite, or an integer past MAX_INT)."""
    low, high = spec.minimum, spec.maximum
    if spec.choices and value not in spec.choices:
        raise ConfigError(f"{label} must be one of {', '.join(spec.choices)}, got {value!r}")
    check_finite(label, value)
    below = low is not None and (value <= low if spec.min_open else value < low)
    above = high is not None and (value >= high if spec.max_open else value > high)
    if not (below or above):
        return
    if high is None:
        want = f"{'>' if spec.min_open else '>='} {low:g}"
    elif low is None:
        want = f"{'<' if spec.max_open else '<='} {high:g}"
    else:
        want = f"in {'(' if spec.min_open else '['}{low:g}, {high:g}{')' if spec.max_open else ']'}"
    raise ConfigError(f"{label} must be {want}, got {value!r}")


def check_finite(label: str, value: Any) -> None:
    """ConfigError for a float that is NaN or infinite, or an integer past MAX_INT: they
    pass every range (NaN compares false with any bound) and no run can use them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{label} must be a finite number, got {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_INT:
        raise ConfigError(f"{label} must be <= {MAX_INT}, got {value}")
