"""A transmission plan: how each parameter travels, per direction, and when.

Its format is normative in docs/protocol.md 13.8 (a worker in another language reads a
plan from there). A plan says, per parameter ("<layer>.<param>"):

    push      the gradient's codec spec (minips.transmission.codecs: "dense", "fp16", {"codec":
              "topk", "ratio": 0.01}, {"codec": "sf", "dtype": "float16"}, ...)
    pull      how the server sends the parameter back: "dense", "fp16", or {"codec": "delta",
              "ratio": 0.05, "dtype": "float16"} (the largest changes since what this worker
              holds; docs/protocol.md 13.7), "warmup": W: its first W replies fp16 instead
    every     push interval k: the gradient is accumulated locally and pushed every k steps
    priority  pull order: lower first (default 0, then model order: input side first)

and, for the whole plan, `wait_free`: each layer's gradients are handed to a sender thread
as backward produces them (minips.worker.transmit). Parameters not named are dense both ways,
every step. The all-dense plan (`Plan()`) is the default; it is not sent in hello, so a
default run's hello carries no plan at all. A plan travels in hello's config as `to_dict()`.

    plan = Plan.from_dict({"wait_free": True, "params": {"fc1.w": {"push": "fp16"}}})
    plan.param("fc1.w").push        # "fp16"
    load_plan("plan.json")          # a file written by `minips plan --json`
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minips.errors import ConfigError
from minips.transmission.codecs import Spec, parse_spec

PLAN_FORMAT = 1

# Pull codecs (server -> worker) and their options; "delta" is docs/protocol.md 13.7.
PULL_CODECS: dict[str, tuple[str, ...]] = {
    "dense": (),
    "fp16": (),
    "delta": ("ratio", "dtype", "warmup"),
}

_PARAM_KEYS = ("push", "pull", "every", "priority")


@dataclass(frozen=True)
class ParamPlan:
    """How one parameter travels (see the module docstring)."""

    push: Spec = "dense"
    pull: Spec = "dense"
    every: int = 1
    priority: int = 0

    def is_dense(self) -> bool:
        """Dense both ways, every step, default priority: as without a plan."""
        return self == ParamPlan()

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that differ from the default."""
        default = ParamPlan()
        return {
            key: getattr(self, key)
            for key in _PARAM_KEYS
            if getattr(self, key) != getattr(default, key)
        }


def parse_pull_spec(spec: Spec) -> tuple[str, dict[str, Any]]:
    """A pull spec as (codec, options); ConfigError for an unknown codec or bad option."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping) and isinstance(spec.get("codec"), str):
        name, options = spec["codec"], {k: v for k, v in spec.items() if k != "codec"}
    else:
        raise ConfigError(f"a pull spec is a name or a map with 'codec', got {spec!r}")
    if name not in PULL_CODECS:
        raise ConfigError(f"unknown pull codec {name!r} (known: {', '.join(PULL_CODECS)})")
    unknown = sorted(set(options) - set(PULL_CODECS[name]))
    if unknown:
        raise ConfigError(f"pull codec {name}: unknown option(s) {unknown}")
    if name == "delta":
        ratio = options.get("ratio")
        if not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise ConfigError(f"pull codec delta: ratio must be in (0, 1], got {ratio!r}")
        if options.get("dtype", "float32") not in ("float32", "float16"):
            dtype = options["dtype"]
            raise ConfigError(f"pull codec delta: dtype float32 or float16, got {dtype!r}")
        warmup = options.get("warmup", 0)
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise ConfigError(f"pull codec delta: warmup must be an integer >= 0, got {warmup!r}")
    return name, options


def _param_plan(name: str, entry: Any) -> ParamPlan:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"plan entry {name!r} must be a map, got {entry!r}")
    unknown = sorted(set(entry) - set(_PARAM_KEYS))
    if unknown:
        known = ", ".join(_PARAM_KEYS)
        raise ConfigError(f"plan entry {name!r}: unknown key(s) {unknown} (known: {known})")
    plan = ParamPlan(**entry)
    parse_spec(plan.push)
    parse_pull_spec(plan.pull)
    for key in ("every", "priority"):
        value = getattr(plan, key)
        if not isinstance(value, int) or isinstance(value, bool) or (key == "every" and value < 1):
            bound = " >= 1" if key == "every" else ""
            raise ConfigError(
                f"plan entry {name!r}: {key} must be an integer{bound}, got {value!r}"
            )
    return plan


@dataclass(frozen=True)
class Plan:
    """Per-parameter `ParamPlan`s (absent: dense) and the whole plan's `wait_free` switch.

    predicted: what the planner predicted (bytes per step, ...), carried for the record and
    ignored by workers.
    """

    params: dict[str, ParamPlan] = field(default_factory=dict)
    wait_free: bool = False
    predicted: dict[str, Any] = field(default_factory=dict)

    def param(self, name: str) -> ParamPlan:
        """The plan of parameter `name` (dense when the plan does not name it)."""
        return self.params.get(name, _DENSE)

    def is_dense(self) -> bool:
        """The all-dense default: every parameter dense both ways, every step, no thread."""
        return not self.wait_free and all(p.is_dense() for p in self.params.values())

    def push_specs(self) -> dict[str, Spec]:
        """name -> push codec spec, for the parameters not pushed dense."""
        return {name: p.push for name, p in self.params.items() if p.push != "dense"}

    def worker_momentum(self) -> dict[str, float]:
        """name -> m, for the parameters pushed by top-k with momentum correction (their
        workers apply the momentum m; the server then applies them without its own)."""
        momenta = {}
        for name, p in self.params.items():
            codec, options = parse_spec(p.push)
            if codec == "topk" and options.get("momentum", 0):
                momenta[name] = float(options["momentum"])
        return momenta

    def pull_order(self, names: Iterable[str]) -> list[str]:
        """`names` (in model order) sorted by priority, model order breaking ties."""
        names = list(names)
        return sorted(names, key=lambda n: (self.param(n).priority, names.index(n)))

    def to_dict(self) -> dict[str, Any]:
        """The plan as hello's config carries it (and as a plan file holds it)."""
        params = {name: p.to_dict() for name, p in self.params.items() if not p.is_dense()}
        document: dict[str, Any] = {
            "format": PLAN_FORMAT,
            "wait_free": self.wait_free,
            "params": params,
        }
        if self.predicted:
            document["predicted"] = self.predicted
        return document

    @classmethod
    def from_dict(cls, document: Any) -> Plan:
        """A plan from `to_dict`'s form; ConfigError (one line) for anything malformed."""
        if not isinstance(document, Mapping):
            raise ConfigError(f"a plan is a JSON object, got {type(document).__name__}")
        unknown = sorted(set(document) - {"format", "wait_free", "params", "predicted"})
        if unknown:
            raise ConfigError(f"plan: unknown key(s) {unknown}")
        if document.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise ConfigError(f"plan format {document.get('format')!r} is not {PLAN_FORMAT}")
        params = document.get("params") or {}
        if not isinstance(params, Mapping):
            raise ConfigError("plan: 'params' must map parameter names to entries")
        wait_free = document.get("wait_free", False)
        if not isinstance(wait_free, bool):
            raise ConfigError(f"plan: wait_free must be true or false, got {wait_free!r}")
        return cls(
            params={str(name): _param_plan(str(name), entry) for name, entry in params.items()},
            wait_free=wait_free,
            predicted=dict(document.get("predicted") or {}),
        )

    def check_model(self, shapes: Mapping[str, tuple[int, ...]], kinds: Mapping[str, str]) -> None:
        """ConfigError unless every named parameter exists and its codecs fit it.

        shapes: parameter -> shape; kinds: layer name -> kind ("fc", "conv"). `sf` needs a
        2-D weight of an fc layer; at least one parameter must be pushed every step (a
        step's last push must carry something).
        """
        for name, p in self.params.items():
            if name not in shapes:
                raise ConfigError(f"plan names {name!r}, which this model does not have")
            codec, _ = parse_spec(p.push)
            layer = name.rsplit(".", 1)[0]
            if codec == "sf" and (kinds.get(layer) != "fc" or len(shapes[name]) != 2):
                raise ConfigError(f"plan: codec sf needs an fc layer's weight, not {name!r}")
            if codec == "lowrank" and len(shapes[name]) < 2:
                raise ConfigError(f"plan: codec lowrank needs a matrix, not {name!r}")
        # The step's last push must carry a gradient: without a sender thread it holds
        # every layer, with one only the layer nearest the input (produced last).
        first = next(iter(shapes), "").rsplit(".", 1)[0]
        last_push = [n for n in shapes if not self.wait_free or n.rsplit(".", 1)[0] == first]
        if last_push and all(self.param(name).every > 1 for name in last_push):
            where = f"of the first layer ({first}) " if self.wait_free else ""
            raise ConfigError(f"plan: at least one parameter {where}must be pushed every step")


_DENSE = ParamPlan()


def load_plan(source: str | Path | Mapping[str, Any] | None) -> Plan:
    """ "dense" / None -> the all-dense plan; a map -> Plan.from_dict; else a JSON file path.

    ("auto" is resolved by minips.transmission.planning.planner, which measures this machine.)
    """
    if source is None or source == "dense":
        return Plan()
    if isinstance(source, Mapping):
        return Plan.from_dict(source)
    if source == "auto":
        raise ConfigError("plan 'auto' must be resolved by the planner first")
    path = Path(source)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"plan {source!r} is neither dense, auto nor an existing file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"plan file {path} is not readable JSON: {exc}") from None
    return Plan.from_dict(document)


def plan_from_hello(config: Mapping[str, Any]) -> Plan:
    """The plan in hello's config (absent: the all-dense default)."""
    return load_plan(config.get("plan"))
