"""A run's cross-field checks: what `RunConfig.validate` asks beyond each field's range.

Each raises a one-line ConfigError for options that no run could use together, said before
any process starts or `--force` removes anything. `check_resume` reads a file, so the run
commands call it themselves, once, before --out is claimed (a server reads its --resume
only to resume from it, which checks it the same way).
"""

from __future__ import annotations

import math
from typing import Any

from minips.data.sharding import N_CLASSES, parse_partition
from minips.errors import ConfigError


def check_hetero(hetero: list[float], workers: int) -> None:
    """ConfigError unless --hetero is empty or one finite factor >= 1 per worker."""
    if hetero and len(hetero) != workers:
        raise ConfigError(f"--hetero gives {len(hetero)} factors for {workers} workers")
    if not all(_is_number(factor) and math.isfinite(factor) for factor in hetero):
        raise ConfigError(f"--hetero factors must be finite numbers, got {hetero}")
    if any(factor < 1 for factor in hetero):
        raise ConfigError("--hetero factors must be >= 1 (1 = full speed)")


def check_speed_schedule(schedule: str, workers: int) -> None:
    """ConfigError unless --hetero-schedule is a schedule (minips.run.speeds) whose
    `away` rank, if any, is one of the run's."""
    from minips.run.speeds import ScheduleError, SpeedSchedule

    try:
        kind, args = SpeedSchedule.parse(schedule)
    except ScheduleError as exc:
        raise ConfigError(f"--hetero-schedule {exc}") from None
    if kind == "away" and args[0] >= workers:
        raise ConfigError(
            f"--hetero-schedule {schedule!r}: rank {args[0]:g} is not one of {workers} workers"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_group(servers: int, shard: int, root: str | None, model: str) -> None:
    """ConfigError when --servers, --shard and --root cannot make a server group of
    `model`'s parameters."""
    if shard >= servers:
        raise ConfigError(
            f"--shard {shard} is not a shard of --servers {servers} (0..{servers - 1})"
        )
    if shard >= 1 and not root:
        raise ConfigError(f"--shard {shard} joins a group: give its root's address (--root)")
    if root and shard == 0:
        raise ConfigError("--root is for a shard that joins a group: give --shard 1..K-1 (or -1)")
    if root and servers < 2:
        raise ConfigError("--root joins a server group: give its size, --servers K (K >= 2)")
    if servers > 1:
        from minips.group.partition import partition_of_model
        from minips.nn import build_model

        params = build_model(model).params
        rows = sum(max(array.shape[0] if array.ndim else 1, 1) for array in params.values())
        if servers > rows:  # each shard holds at least one row (or scalar) of a parameter
            raise ConfigError(
                f"--servers {servers} is more than the {rows} parameter rows of {model} "
                "that shards could split"
            )
        partition_of_model(params, servers)  # a shard left empty


def check_resume(resume: str | None, servers: int, model: str) -> None:
    """DataError/ShapeError when --resume is not a checkpoint of the run's model, said
    before `minips run --force` removes the previous run or any process starts. (A server
    group's shards each check their own slices when they load them.)"""
    if not resume or servers > 1:
        return
    from minips.nn import build_model
    from minips.ops.checkpoint_file import load_checkpoint

    load_checkpoint(resume).check_params(build_model(model).params)


def check_plan_file(plan: str, model: str) -> None:
    """ConfigError when `--plan FILE` is no plan of `model` (a parameter it does not have,
    an unknown codec, a codec its layer cannot take). `dense` and `auto` are plans of every
    model; auto's is chosen when the run starts."""
    if plan in ("dense", "auto"):
        return
    from minips.nn import build_model
    from minips.run.plan_checks import load_plan

    check_plan_fits(load_plan(plan), build_model(model))


def check_plan_fits(plan: Any, net: Any) -> None:
    """ConfigError unless `plan` (a Plan) names only parameters of `net` (a Sequential)
    with codecs their layers can take (minips.run.plan_checks.check_model)."""
    from minips.run.plan_checks import check_model

    shapes = {name: array.shape for name, array in net.params.items()}
    check_model(plan, shapes, {info.name: info.kind for info in net.layer_info()})


def check_can_shape(netem: str | None) -> None:
    """ConfigError when `--netem` is set and this machine cannot build the shaped link (not
    root, no ip or tc): asked before --out is claimed, as the link is built after."""
    if netem is None:
        return
    from minips.run import netem as shaping

    try:
        shaping.check_can_shape()
    except shaping.NetemError as exc:
        raise ConfigError(f"--netem {netem}: {exc}") from None


def check_plan_batch(plan: str, batch_size: int) -> None:
    """ConfigError when `--plan auto` would time batches larger than the planner holds."""
    from minips.run.plan_measure import MAX_PLAN_BATCH

    if plan == "auto" and batch_size > MAX_PLAN_BATCH:
        raise ConfigError(
            f"--plan auto times batches of --batch-size here: at most {MAX_PLAN_BATCH}, "
            f"got {batch_size}"
        )


def check_browser_slots(browser: int, workers: int, headless: bool, listen: str) -> None:
    """ConfigError when --browser, --browser-headless and --listen cannot make a run."""
    if browser > workers:
        raise ConfigError(
            f"--browser {browser} is more than --workers {workers} "
            "(--workers counts every worker, the browser slots included)"
        )
    if headless and not browser:
        raise ConfigError("--browser-headless needs --browser N (the slots it fills)")
    if browser:
        from minips.classroom.web.slots import check_browser_options

        check_browser_options(listen, headless)


def check_partition(text: str, world_size: int) -> None:
    """ConfigError for a partition no run of `world_size` workers can use."""
    part = parse_partition(text)
    if part.kind == "shards" and world_size * part.k < N_CLASSES:
        raise ConfigError(
            f"--partition {text} with {world_size} workers: {world_size * part.k} shards "
            f"cannot cover {N_CLASSES} labels (need workers * K >= {N_CLASSES})"
        )
