"""`minips server --servers K` on one machine: the root here, the other shards beside it.

The root binds the group's one address (--bind) and serves in this process; shards 1..K-1
are child processes (`minips server --shard J --root ROOT`), bound to the same host on
ports of their own, each joining the root and taking the run's configuration from it
(docs/protocol.md 16.3). When the root stops (a `stop`, the workers' byes, SIGTERM) this
process stops the shards at once (SIGTERM: each stops as on `stop`), waits for them, then
assembles the group checkpoint from their files (ops/checkpoints.py). A shard process
that dies meanwhile is said at once and not restarted, and the group then ends, stopped or
once the root heard no join from it for --root-timeout s (minips.group.lost_shards), with
an `error:` line instead of a group checkpoint (minips.run.shardwatch). Killed itself,
it leaves shards that stop once their root answered no join for --root-timeout seconds.
Started on a checkpoint path that holds a group's model (`--config RUN/config.json` after
the run) without --resume, every shard resumes from it (`kept_model`), so stopping the
group never writes an older model over the trained one (docs/protocol.md 5.8).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from minips.group.lost_shards import ShardGone
from minips.ops import checkpoints
from minips.ops.checkpoint_file import file_version
from minips.ops.mixed_resume import mixed_shards_line
from minips.ops.signals import serve_forever, stop_on_signals
from minips.results.metrics import MetricsLog
from minips.results.whole_file import write_whole
from minips.run.build import make_server, server_summary
from minips.run.config import RunConfig
from minips.run.shardwatch import ShardWatch, dead_shards_error
from minips.server.stop import Stop

log = logging.getLogger("minips.server")


def shard_bind(root_bind: str, shard: int) -> str:
    """Where shard `shard` listens beside a root bound to `root_bind`: the same host on a
    free port (tcp), or a socket file beside the root's (ipc)."""
    tcp = re.match(r"^tcp://(.+):[^:]+$", root_bind)
    if tcp is not None:
        return f"tcp://{tcp.group(1)}:*"
    path = Path(root_bind.removeprefix("ipc://"))
    suffix = path.suffix or ".sock"
    return "ipc://" + str(path.with_name(f"{path.stem}-shard{shard}{suffix}"))


def shard_argv(config: RunConfig, root: str, shard: int, updates_log: str | None,
               verbose: bool, resume: str | None = None) -> list[str]:  # fmt: skip
    """The command line of shard `shard` of the group whose root listens at `root`
    (`resume`: the checkpoint it starts from, see `kept_model`)."""
    argv = [sys.executable, "-m", "minips", "server", "--servers", str(config.servers),
            "--shard", str(shard), "--root", root,
            "--bind", shard_bind(config.bind, shard),
            "--root-timeout", repr(config.root_timeout)]  # fmt: skip
    if resume:
        argv += ["--resume", resume]
    if config.keys:
        argv += ["--keys", config.keys]
    if updates_log:
        log_path = Path(updates_log)
        argv += ["--updates-log", str(log_path.with_name(f"{log_path.stem}-shard{shard}.jsonl"))]
    return argv + (["--verbose"] if verbose else [])


def serve_group_here(
    config: RunConfig,
    endpoint_file: str | None,
    updates_log: str | None,
    t0: float | None,
    verbose: bool = False,
) -> None:
    """Serve the whole group of `config.servers` shards from this machine (module docstring)."""
    with MetricsLog(updates_log, start_time=t0) as updates:

        def on_update(record: dict[str, Any]) -> None:
            updates.write("update", **{k: v for k, v in record.items() if k != "time"})

        resumes = kept_model(config)
        root = make_server(replace(config, shard=0, resume=resumes[0]), on_update=on_update)
        shards = [
            subprocess.Popen(
                shard_argv(config, root.endpoint, j, updates_log, verbose, resumes[j])
            )  # fmt: skip
            for j in range(1, config.servers)
        ]
        gone: ShardGone | None = None
        try:
            _announce(config, root.endpoint, resumes, endpoint_file)
            with ShardWatch(shards):  # a shard that dies meanwhile is said at once
                serve_forever(root)
        except ShardGone as exc:  # its joins stopped: the root ended; said below
            gone = exc
        finally:
            with stop_on_signals(Stop()):  # another Ctrl-C must not orphan the shards
                _wait_for(shards)
        with stop_on_signals(Stop()):
            updates.write("server", stats=root.stats())
    with stop_on_signals(Stop()):  # the group checkpoint is the model the run keeps
        click.echo(server_summary(root))
        if (dead := dead_shards_error(shards, config.checkpoint)) is not None:
            raise dead  # its checkpoint would mix a dead shard's old slices with the final
        if gone is not None:  # a shard stopped by hand before its root (exit 0)
            click.echo(f"warning: {gone}", err=True)
        group = checkpoints.assemble(config.checkpoint, final=True) if config.checkpoint else None
        if group is not None:
            click.echo(f"group checkpoint {config.checkpoint}")
            if torn := group.torn_line():  # a shard stopped by hand before its root
                click.echo(f"warning: {torn}", err=True)


def _announce(
    config: RunConfig, endpoint: str, resumes: list[str | None], endpoint_file: str | None
) -> None:
    """Say where the group serves and what it resumed from; write the endpoint file."""
    click.echo(f"minips server group of {config.servers} on {endpoint}, rule "
               f"{config.rule}; shards 1..{config.servers - 1} joining")  # fmt: skip
    if any(resumes) and resumes[0] != config.resume:
        click.echo(f"resumed each shard from the model already at {config.checkpoint}"
                   + (f", newer than --resume {config.resume}" if config.resume else "")
                   + " (a server never writes an older model over it; another "
                   "--checkpoint starts elsewhere)")  # fmt: skip
    if mixed := mixed_shards_line(resumes):  # shards stopped apart: a mix, said
        click.echo(f"warning: {mixed}", err=True)
    if endpoint_file:  # whole or not at all: the launcher never reads half an address
        write_whole(endpoint_file, endpoint + "\n")


def kept_model(config: RunConfig) -> list[str | None]:
    """The checkpoint each shard 0..K-1 starts from, so that the group never writes an
    older model over the one at its checkpoint path (docs/protocol.md 5.8): that model,
    each shard's own file there (its slices and its rule's state), else the group
    checkpoint; --resume's file instead when the path holds none of a higher version (a
    group cannot write beside it as a lone server does); None: from the start."""
    if not config.checkpoint:
        return [config.resume] * config.servers
    whole = Path(config.checkpoint)
    own = [checkpoints.shard_path(whole, j) for j in range(config.servers)]
    fallback = str(whole) if whole.exists() else None
    kept = [str(path) if path.exists() else fallback for path in own]
    if config.resume and not _newer(kept, config.resume):
        return [config.resume] * config.servers
    return kept


def _newer(kept: list[str | None], resume: str) -> bool:
    """Whether every shard has a model in `kept` and all are of a higher version than
    the file `resume`."""
    versions = [file_version(path) if path else None for path in kept]
    start = file_version(resume)
    return start is not None and all(v is not None and v > start for v in versions)


def _wait_for(shards: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """Stop the shards now that their root stopped: each is sent SIGTERM (it stops as on
    `stop`: its final checkpoint and update record, docs/protocol.md 5.7), which the root's
    join replies may not have said in time (a root with nothing to drain stops at once);
    any left after `timeout` seconds is killed."""
    for proc in shards:
        if proc.poll() is None:
            proc.terminate()
    for proc in shards:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("shard process %d did not stop with its root: killing it", proc.pid)
            proc.kill()
            proc.wait(5)
