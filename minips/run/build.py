"""Build a run's server from its configuration: the model, the rule, the optimizer, the plan.

`make_server(config)` is what `minips server` runs (a `minips run` starts that command from
its config.json); `resolve_plan(config)` is the transmission plan it serves. A shard that
joins a group takes its configuration from the root (`join_root`, `joining_config`);
`server_summary(ps)` is the line a server prints when it stops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

from minips.errors import ConfigError
from minips.group.partition import group_gain, partition_of_model
from minips.group.shard import Joiner, ShardRole, shard_params
from minips.nn import build_model
from minips.ops.checkpoints import shard_path
from minips.ops.server_ops import ServerOps
from minips.provision.keyfiles import OPERATOR, load_client_keys
from minips.results.report_text import plural
from minips.results.rundir import check_writable
from minips.run.config import RunConfig
from minips.run.config_checks import check_plan_fits
from minips.run.plan_checks import load_plan
from minips.run.plan_measure import choose_plan, parse_network
from minips.run.rule_plugins import make_rule
from minips.server.server import ParameterServer
from minips.state.store import SGD
from minips.transmission.plan import Plan
from minips.transmission.planning.plan_costs import Cluster


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
    if config.checkpoint:
        check_writable(config.checkpoint, "--checkpoint")
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
        # a root's shard silent as long as a shard waits for its root is gone (lost_shards)
        timeout = config.root_timeout if shard == 0 else None
        group = ShardRole(shard, config.servers, part, run=run, joiner=joiner,
                          shard_timeout=timeout)  # fmt: skip
    optimizer = SGD(params, config.lr, config.momentum, config.weight_decay)
    server_class, options, replica = ParameterServer, config.server_options(), {}
    if config.replicas > 1 or config.backup_of:  # one of two replicas (docs/protocol.md 17)
        from minips.run.replicas import replicated

        server_class, options, replica = replicated(config, options)
    server = server_class(
        params, rule, optimizer, options, config=hello, on_update=on_update, group=group,
        operations=ServerOps, **replica,
    )  # fmt: skip
    server.use_plan(plan)
    return server


# What a joining shard keeps of its own: where it listens, its checkpoint, its keys, its
# place in the group, how long it outlives its root (everything else comes from the root,
# docs/protocol.md 16.3).
SHARD_OWN_FIELDS = ("bind", "checkpoint", "keys", "shard", "root", "root_timeout")


def _run_for_shards(config: RunConfig, plan: Plan) -> dict[str, Any]:
    """The root's configuration as joining shards receive it: the plan itself (its file is
    on the root's machine), not its path."""
    run = asdict(config)
    run["backup_of"] = None  # a backup root's own part: its shards are primaries
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
    file beside it, ops/checkpoints.py), a resume: its own, else the root's."""
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


def join_root(
    config: RunConfig, on_wait: Callable[[str], None] | None = None
) -> tuple[RunConfig, Any]:
    """A shard 1..K-1 (or -1: whichever the root gives) asks its root what to be
    (docs/protocol.md 16.3): the run's config with its own fields, and its Joiner; any
    other server: (config, None). on_wait(line): told once if the root does not answer
    at once (Joiner.ask)."""
    if config.root is None:
        return config, None
    keys = load_client_keys(config.keys, OPERATOR) if config.keys else None  # join: an operator's
    index = config.shard if config.shard >= 1 else None
    joiner = Joiner(config.root, index, config.servers, keys, root_timeout=config.root_timeout)
    try:
        reply = joiner.ask(on_wait=on_wait)
        return replace(joining_config(reply["run"], config), shard=reply["shard"]), joiner
    except BaseException:
        joiner.close()
        raise


def server_summary(ps: Any) -> str:
    """The line a stopped server prints: why it stopped, what it did, its checkpoint."""
    stats = ps.stats()
    why = " (every worker finished its epochs)" if ps.stop.by_all_workers else ""
    line = (
        f"server stopped{why}: {plural(stats['updates'], 'update')}, {stats['samples']} samples "
        f"from {plural(len([w for w in stats['workers'] if not w['observer']]), 'worker')} "
        f"in {stats['uptime']:.1f} s, version {stats['version']}"
    )
    if ps.options.checkpoint_path:
        line += f"; checkpoint {ps.ops.checkpoints.path}"
    return line


# A browser worker's compute per step against a NumPy worker's on the same machine
# (BENCHMARKS.md, "browser worker": LeNet-5 124 ms against 53, the MLP 9 against 2.6, both
# on WebAssembly SIMD in headless Chromium).
BROWSER_STEP_FACTOR = {"lenet5": 2.3, "mlp": 3.5}


def step_factors(model: str, workers: int, browser: int) -> tuple[float, ...]:
    """Each worker's compute per step in units of this machine's NumPy step (the planner's
    `Cluster.step_factors`): the browser slots' slower steps, then 1 for each NumPy worker."""
    factor = BROWSER_STEP_FACTOR.get(model, 1.0)
    return (factor,) * browser + (1.0,) * (workers - browser)


def plan_cluster(
    model: str, workers: int, *, browser: int = 0, servers: int = 1, rule: str = "",
    shared_link: bool = False, cores: int | None = None, compute_ms: float | None = None,
) -> Cluster:  # fmt: skip
    """Who a plan is for, as `minips run` and `minips plan` both describe it: the browser
    slots' slower steps, ssgd's barrier, and a group's K links when the link is --netem's
    (each shard has one of its own: minips.run.netem)."""
    gain = group_gain(build_model(model), servers) if shared_link else 1.0
    return Cluster(workers, servers, cores, compute_ms, step_factors(model, workers, browser),
                   barrier=rule == "ssgd", link_gain=gain)  # fmt: skip


def resolve_plan(config: RunConfig) -> Plan:
    """The config's plan: dense, a file, or `auto`, chosen here by the planner for the link.

    auto's link (minips.transmission.planning.plan_costs.Network): --bandwidth RATE is each worker's
    own, --netem RATE one shared by the workers; with both, the tighter; with neither,
    unlimited (so: all dense). The planner counts browser slots' steps as slower
    (`step_factors`) and ssgd's barrier (minips.transmission.planning.plan_costs.Cluster).
    """
    model = build_model(config.model, seed=config.seed)
    if config.plan == "auto":
        network = parse_network(bandwidth=config.bandwidth, netem=config.netem)
        cluster = plan_cluster(config.model, config.workers, browser=config.browser,
                               servers=config.servers, rule=config.rule,
                               shared_link=bool(config.netem))  # fmt: skip
        report = choose_plan(model, config.batch_size, cluster, network, momentum=config.momentum)
        plan = report.plan
    else:
        plan = load_plan(config.plan)
    check_plan_fits(plan, model)
    return plan
