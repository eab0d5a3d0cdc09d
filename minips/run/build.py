"""Build a run's server from its configuration: the model, the rule, the optimizer, the plan.

`make_server(config)` is what `minips server` runs (a `minips run` starts that command from
its config.json); `resolve_plan(config)` is the transmission plan it serves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minips.nn import build_model
from minips.protocol.plan import Plan, load_plan
from minips.rules import make_rule
from minips.run.config import RunConfig
from minips.run.planner import Cluster, Network, make_plan
from minips.server.server import ParameterServer
from minips.server.store import SGD


def make_server(
    config: RunConfig, on_update: Callable[[dict[str, Any]], None] | None = None
) -> ParameterServer:
    """A ParameterServer with the config's model (seeded init), rule, optimizer and plan.

    The plan travels in hello's config only when it is not the all-dense default.
    """
    config.validate()
    model = build_model(config.model, seed=config.seed)
    rule = make_rule(config.rule, **config.rule_options)
    plan = resolve_plan(config)
    hello = config.hello_config(model.spec)
    if not plan.is_dense():
        hello["plan"] = plan.to_dict()
    params = model.params  # one dict: the store and the optimizer must share it
    optimizer = SGD(params, config.lr, config.momentum, config.weight_decay)
    server = ParameterServer(
        params, rule, optimizer, config.server_options(), config=hello, on_update=on_update
    )
    server.use_plan(plan)
    return server


def resolve_plan(config: RunConfig) -> Plan:
    """The config's plan: dense, a file, or `auto`, chosen here by the planner for the link.

    auto's link (minips.run.planner.Network): --bandwidth RATE is each worker's own,
    --netem RATE one shared by the workers; with both, the tighter; with neither,
    unlimited (so: all dense).
    """
    model = build_model(config.model, seed=config.seed)
    if config.plan == "auto":
        network = Network.parse(bandwidth=config.bandwidth, netem=config.netem)
        cluster = Cluster(config.workers)
        plan = make_plan(model, config.batch_size, cluster, network, momentum=config.momentum).plan
    else:
        plan = load_plan(config.plan)
    shapes = {name: array.shape for name, array in model.params.items()}
    plan.check_model(shapes, {info.name: info.kind for info in model.layer_info()})
    return plan
