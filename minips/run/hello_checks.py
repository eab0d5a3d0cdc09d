"""hello's reply checked before a worker uses it: the server may be another implementation,
or a hostile one, and a field of the wrong type would otherwise end the worker in a
traceback deep in the model, the data or the rule (docs/protocol.md 5.1 gives the reply).

    check_hello(hello)      # ProtocolError `malformed`, one line naming the field

Only what the reference worker reads is checked, and only its form: the run that started
the server chose the values (the plan is checked apart, minips.run.plan_checks; a server
group's `group`, read inside the client's hello before the worker sees the reply, where it
is read: minips.group.group_checks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from minips.data.sharding import parse_partition
from minips.errors import ConfigError
from minips.protocol.wire import ProtocolError
from minips.run.speeds import ScheduleError, SpeedSchedule

# config's integer fields the worker reads, and each one's least value
CONFIG_INTEGERS = {"epochs": 1, "batch_size": 1, "seed": 0}


def check_hello(hello: Mapping[str, Any]) -> None:
    """ProtocolError unless hello's reply has the form the worker reads: rank and
    world_size integers (0 <= rank < world_size for a worker), a config map with its
    model map, rule map, integer fields, and hetero, hetero_schedule and partition as
    docs/model.md 4 describes them."""
    config = hello.get("config")
    if not isinstance(config, Mapping):
        _refuse("config", config, "a map")
    rank, world_size = hello.get("rank"), hello.get("world_size")
    if not _is_int(world_size) or world_size < 1:
        _refuse("world_size", world_size, "an integer >= 1")
    if not _is_int(rank) or not 0 <= rank <= world_size:
        _refuse("rank", rank, f"an integer in 0..{world_size}")
    for key, least in CONFIG_INTEGERS.items():
        if key in config and (not _is_int(config[key]) or config[key] < least):
            _refuse(f"config.{key}", config[key], f"an integer >= {least}")
    _check_model(config.get("model"))
    if not isinstance(config.get("rule", {}), Mapping):
        _refuse("config.rule", config.get("rule"), "a map")
    _check_conditions(config)


def _check_model(model: Any) -> None:
    if not isinstance(model, Mapping) or not isinstance(model.get("name"), str):
        _refuse("config.model", model, "a map with a name")
    if not isinstance(model.get("kwargs", {}), Mapping):
        _refuse("config.model.kwargs", model.get("kwargs"), "a map")


def _check_conditions(config: Mapping[str, Any]) -> None:
    """hetero (one positive slowdown per rank), hetero_schedule and partition."""
    hetero = config.get("hetero") or []
    if not isinstance(hetero, list) or not all(_is_positive(f) for f in hetero):
        _refuse("config.hetero", hetero, "a list of positive numbers")
    for key, parse in (("hetero_schedule", SpeedSchedule.parse), ("partition", parse_partition)):
        if key in config:
            try:
                parse(config[key])
            except (ScheduleError, ConfigError, AttributeError, TypeError):
                _refuse(f"config.{key}", config[key], "one of the forms of docs/model.md 4")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive(value: Any) -> bool:
    number = _is_int(value) or isinstance(value, float) and math.isfinite(value)
    return number and value > 0


def _refuse(field: str, value: Any, expected: str) -> None:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise ProtocolError(f"the server's hello: {field} must be {expected}, got {shown}")
