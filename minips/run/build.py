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


# A browser worker's compute per step against a NumPy worker's on the same machine
# (BENCHMARKS.md, "browser worker": LeNet-5 124 ms against 53, the MLP 9 against 2.6, both
# on WebAssembly SIMD in headless Chromium).
BROWSER_STEP_FACTOR = {"lenet5": 2.3, "mlp": 3.5}


def step_factors(config: RunConfig) -> tuple[float, ...]:
    """Each worker's compute per step in units of this machine's NumPy step (the planner's
    `Cluster.step_factors`): the browser slots' slower steps, then 1 for each NumPy worker."""
    browser = BROWSER_STEP_FACTOR.get(config.model, 1.0)
    return (browser,) * config.browser + (1.0,) * (config.workers - config.browser)


def resolve_plan(config: RunConfig) -> Plan:
    """The config's plan: dense, a file, or `auto`, chosen here by the planner for the link.

    auto's link (minips.run.planner.Network): --bandwidth RATE is each worker's own,
    --netem RATE one shared by the workers; with both, the tighter; with neither,
    unlimited (so: all dense). The planner counts browser slots' steps as slower
    (`step_factors`) and ssgd's barrier (minips.run.plan_costs.Cluster).
    """
    model = build_model(config.model, seed=config.seed)
    if config.plan == "auto":
        network = Network.parse(bandwidth=config.bandwidth, netem=config.netem)
        cluster = Cluster(config.workers, step_factors=step_factors(config),
                          barrier=config.rule == "ssgd")  # fmt: skip
        plan = make_plan(model, config.batch_size, cluster, network, momentum=config.momentum).plan
    else:
        plan = load_plan(config.plan)
    shapes = {name: array.shape for name, array in model.params.items()}
    plan.check_model(shapes, {info.name: info.kind for info in model.layer_info()})
    return plan
