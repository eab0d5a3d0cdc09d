"""Build a run's server from its configuration: the model, the rule, the optimizer, the plan.

`make_server(config)` is what `minips server` runs (a `minips run` starts that command from
its config.json); `resolve_plan(config)` is the transmission plan it serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from minips.errors import ConfigError
from minips.nn import build_model
from minips.protocol.partition import partition_of_model
from minips.protocol.plan import Plan, load_plan
from minips.rules import make_rule
from minips.run.config import RunConfig
from minips.run.planner import group_gain, make_plan
from minips.server.checkpoints import shard_path
from minips.server.group import Joiner, ShardRole, shard_params
from minips.server.server import ParameterServer
from minips.server.store import SGD
from minips.worker.netlimit import parse_rate


def make_server(
    config: RunConfig,
    on_update: Callable[[dict[str, Any]], None] | None = None,
    joiner: Joiner | None = None,
) -> ParameterServer:
    """A ParameterServer with the config's model (seeded init), rule, optimizer and plan.

    The plan travels in hello's config only when it is not the all-dense default. With
    `servers` K > 1 it is shard `shard` (0: the root) of a group: its slices of the seeded
    model (docs/protocol.md 16); joiner: a non-root shard's link to its root (Joiner.ask
    already answered: `joining_config`).
    """
    config.validate()
    model = build_model(config.model, seed=config.seed)
    rule = make_rule(config.rule, **config.rule_options)
    plan = resolve_plan(config)
    hello = config.hello_config(model.spec)
    if not plan.is_dense():
        hello["plan"] = plan.to_dict()
    params, group = model.params, None  # one dict: the store and the optimizer share it
    if config.servers > 1:
        shard = max(config.shard, 0)
        part = partition_of_model(params, config.servers)
        params = shard_params(params, part, shard)
        run = _run_for_shards(config, plan) if shard == 0 else None
        group = ShardRole(shard, config.servers, part, run=run, joiner=joiner)
    optimizer = SGD(params, config.lr, config.momentum, config.weight_decay)
    server = ParameterServer(
        params, rule, optimizer, config.server_options(), config=hello, on_update=on_update,
        group=group,
    )  # fmt: skip
    server.use_plan(plan)
    return server


# What a joining shard keeps of its own: where it listens, its checkpoint, its keys, its
# place in the group (everything else comes from the root, docs/protocol.md 16.3).
SHARD_OWN_FIELDS = ("bind", "checkpoint", "keys", "shard", "root")


def _run_for_shards(config: RunConfig, plan: Plan) -> dict[str, Any]:
    """The root's configuration as joining shards receive it: the plan itself (its file is
    on the root's machine), not its path."""
    run = asdict(config)
    if not plan.is_dense():
        run["plan"] = plan.to_dict()
    if (
        config.resume
        and config.checkpoint
        and Path(config.resume) == shard_path(config.checkpoint, 0)
    ):
        run["resume"] = None  # the root restarted from its own slices: not the others'
    return run


def joining_config(run: dict[str, Any], own: RunConfig) -> RunConfig:
    """A joining shard's configuration: the root's `run` with this shard's own fields. Its
    checkpoint, unless given: the root's group checkpoint's name (the shard writes its
    file beside it, server/checkpoints.py), a resume: its own, else the root's."""
    known = {f.name for f in fields(RunConfig)}
    config = RunConfig(**{key: value for key, value in run.items() if key in known})
    kept = {name: getattr(own, name) for name in SHARD_OWN_FIELDS}
    kept["checkpoint"] = own.checkpoint or config.checkpoint
    kept["resume"] = own.resume or config.resume
    if config.servers != own.servers:
        raise ConfigError(
            f"the root serves a group of {config.servers}, not --servers {own.servers}"
        )
    return replace(config, **kept)


def auto_rate(config: RunConfig) -> float | None:
    """Each worker's share of the link in bytes/s: --netem's rate / N (times the planner's
    group_gain: a group's shards each have a link of that rate), --bandwidth's, the
    smaller of the two, or None (unlimited)."""
    gain = group_gain(build_model(config.model), config.servers) if config.netem else 1.0
    shares = [parse_rate(config.netem) / config.workers * gain] if config.netem else []
    shares += [parse_rate(config.bandwidth)] if config.bandwidth else []
    return min(shares) if shares else None


def resolve_plan(config: RunConfig) -> Plan:
    """The config's plan: dense, a file, or `auto`, chosen here by the planner for the link.

    auto's link: --netem RATE is shared by the workers, --bandwidth RATE is each worker's
    own; with both, the tighter; with neither, unlimited (so: all dense).
    """
    model = build_model(config.model, seed=config.seed)
    if config.plan == "auto":
        plan = make_plan(model, config.batch_size, config.workers, auto_rate(config), False).plan
    else:
        plan = load_plan(config.plan)
    shapes = {name: array.shape for name, array in model.params.items()}
    plan.check_model(shapes, {info.name: info.kind for info in model.layer_info()})
    return plan
