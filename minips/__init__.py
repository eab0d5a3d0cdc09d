"""minips: a small parameter server for distributed deep learning, written to be read.

The public API, importable from here (each name loads its module on first use, so that
`import minips` stays as light as the command line needs it):

    from minips import PSClient, ParameterServer, Worker, Rule, make_rule, lenet5

The folders show the architecture. The core, in reading order: nn/ and data/ (the model
and its data), protocol/ (what both ends agree on: the wire, addresses, keys, samples),
state/ (the parameter store and the worker registry), rules/ (when a gradient becomes an
update), transmission/ (plans, codecs, the planner), server/ (the loop) and worker/ (a
worker's step, its client, its sender). Around it, the operations: ops/ (checks, limits,
failures, telemetry, checkpoints), group/ (a server group), run/ (local runs, cluster
launch), results/ (metrics, reports, plots), classroom/ (web, dashboard, exercises) and cli/.
docs/architecture.md is the map.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# A library logs, an application decides what to show: commands configure handlers.
logging.getLogger("minips").addHandler(logging.NullHandler())

# public name -> the module that defines it
_PUBLIC = {
    "PSClient": "minips.run.assembly",
    "Worker": "minips.run.assembly",
    "ParameterServer": "minips.run.assembly",
    "ServerOptions": "minips.run.assembly",
    "SGD": "minips.state.store",
    "Rule": "minips.rules",
    "RULES": "minips.rules",
    "make_rule": "minips.run.rule_plugins",
    "RunConfig": "minips.run.config",
    "Sequential": "minips.nn",
    "build_model": "minips.nn",
    "lenet5": "minips.nn",
    "mlp": "minips.nn",
    "MinipsError": "minips.errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first used (PEP 562)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'minips' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return [*globals(), *__all__]
