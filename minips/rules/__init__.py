"""Update rules: when a pushed gradient becomes an update, and with what scale.

A rule is one small class. The server (its `host`) owns sockets, workers and the parameter
store; it calls the rule's hooks on events and offers the rule three actions:

    host.apply_update(pushes, steps) -> UpdateRecord   # steps: [(name, grad, scale)], t += 1
        (keyword value_staleness={layer: d_l}: recorded in the update's telemetry)
    host.drop_push(push)                               # not applied (scale 0): t unchanged,
                                                       # telemetry records it, reply sent
    host.answer_push(push, applied)                    # send the push's reply (once)
    host.live_workers() -> list[WorkerState]           # .worker_id, .rank, .clock, ...
    host.assembling() -> bool                          # still waiting for world_size hellos
    host.store                                         # .params, .version, .param_versions

Hooks (all optional except `on_push`):

    on_hello(worker)           a worker (re)registered
    validate_push(push)        raise ProtocolError(..., "rule") to refuse a push untouched
    on_push(push)              decide: apply now, or hold the reply and apply later
    scale(push, name, grad)    -> (grad', factor): the per-gradient hook of `apply_now`
    may_answer_pull(worker)    False holds the pull; re-asked after every push / departure
    on_pulled(worker)          a pull reply was sent (DC-ASGD keeps w_bak here)
    on_worker_left(worker)     bye or declared dead: leave any barrier
    on_stop()                  the server stops: answer everything held
    on_tick(now)               called on every turn of the server loop (timers)

Adding a rule is usually one `scale` method: DASGD returns (grad, f(tau)), DC-ASGD
(g + lam*g*g*(w - w_bak), 1.0). VSGD needs the whole push at once (a layer's scale spans
its parameters), so it overrides `on_push`. Register the class in RULES (minips/rules/__init__.py).
docs/algorithms.md has the math of every rule and the papers they come from.
"""

from __future__ import annotations

from typing import Any

from minips.errors import ConfigError
from minips.rules.base import Push, Rule, RuleHost, RuleOption, WorkerSide, layer_of
from minips.rules.classic import ASGD, SSGD, SSP
from minips.rules.delay import DASGD, DCASGD, VSGD

RULES: dict[str, type[Rule]] = {cls.name: cls for cls in (ASGD, SSGD, SSP, DASGD, VSGD, DCASGD)}


def make_rule(name: str, **options: Any) -> Rule:
    """Build a rule by name: make_rule("ssp", staleness=2). ConfigError on unknown names."""
    if name not in RULES:
        raise ConfigError(f"unknown update rule {name!r} (known: {', '.join(RULES)})")
    try:
        return RULES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad options for rule {name!r}: {exc}") from None


def worker_side(described: dict[str, Any]) -> WorkerSide:
    """The worker's half of the rule a worker received in hello's config["rule"]."""
    cls = RULES.get(described.get("name", ""))
    return cls.worker_side(described) if cls else WorkerSide()


__all__ = [
    "ASGD", "DASGD", "DCASGD", "RULES", "SSGD", "SSP", "VSGD", "Push", "Rule", "RuleHost",
    "RuleOption", "WorkerSide", "layer_of", "make_rule", "worker_side",
]  # fmt: skip
