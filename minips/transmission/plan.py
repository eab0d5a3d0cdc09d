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

A plan is taken as given here: a run checks a plan file or map once, before it starts
(minips.run.plan_checks), and its workers take the plan their server sends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from minips.transmission.codecs import Spec, parse_spec

PLAN_FORMAT = 1

# Pull codecs (server -> worker) and their options; "delta" is docs/protocol.md 13.7.
PULL_CODECS: dict[str, tuple[str, ...]] = {
    "dense": (),
    "fp16": (),
    "delta": ("ratio", "dtype", "warmup"),
}

PARAM_KEYS = ("push", "pull", "every", "priority")


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
            for key in PARAM_KEYS
            if getattr(self, key) != getattr(default, key)
        }


def parse_pull_spec(spec: Spec) -> tuple[str, dict[str, Any]]:
    """A pull spec as (codec, options): "fp16" -> ("fp16", {}); {"codec": "delta", "ratio":
    0.05} -> ("delta", {"ratio": 0.05})."""
    if isinstance(spec, str):
        return spec, {}
    return spec["codec"], {k: v for k, v in spec.items() if k != "codec"}


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
    def from_dict(cls, document: Mapping[str, Any]) -> Plan:
        """A plan from `to_dict`'s form, as given (minips.run.plan_checks checks one that
        a user wrote)."""
        params = document.get("params") or {}
        return cls(
            params={str(name): ParamPlan(**entry) for name, entry in params.items()},
            wait_free=document.get("wait_free", False),
            predicted=dict(document.get("predicted") or {}),
        )


_DENSE = ParamPlan()


def plan_from_hello(config: Mapping[str, Any]) -> Plan:
    """The plan in hello's config (absent: the all-dense default), as its server sent it."""
    plan = config.get("plan")
    return Plan() if plan is None else Plan.from_dict(plan)
