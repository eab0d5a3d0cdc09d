"""`minips launch`: one process of a job started by torchrun, srun, mpirun or a DMLC script.

Thin: the launcher's variables (minips.run.launchenv) give the role, minips.run.cluster
takes it. The same command line on every process; only rank 0 (DMLC: the scheduler)
returns, with the run's summary.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import click

from minips.cli.click_options import config_options
from minips.cli.numbers import BoundedIntRange, FiniteFloatRange
from minips.cli.progress import ProgressBar
from minips.run.config import RunConfig


@click.command("launch")
@config_options(RunConfig, "launch")
@click.option(
    "--out", type=click.Path(file_okay=False), default="runs/launch", show_default=True,
    help="Run directory (rank 0 writes it; the workers' reports go there too: on a cluster, "
    "a directory every machine sees).",
)  # fmt: skip
@click.option(
    "--port", type=BoundedIntRange(1, 65535), default=5555, show_default=True,
    help="The root's port when the launcher sets no MASTER_PORT or DMLC_PS_ROOT_PORT.",
)  # fmt: skip
@click.option(
    "--startup-timeout", type=FiniteFloatRange(min=1), default=60.0, show_default=True,
    help="Seconds the job has to assemble (every shard joined, every worker said hello); "
    "past them rank 0 names who is missing and stops the job.",
)  # fmt: skip
@click.option("--eval-interval", type=FiniteFloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between evaluations of the model (rank 0).")  # fmt: skip
@click.option(
    "--force",
    is_flag=True,
    help="Reuse --out even if it holds a previous run "
    "(not the files this run reads, nor a folder that holds no run).",
)
def launch(
    out: str, port: int, startup_timeout: float, eval_interval: float, force: bool, **options: Any
) -> None:
    """Take this process's role in a job started by torchrun, srun, mpirun or DMLC.

    With N processes and --servers K, ranks 0..K-1 serve the parameters (a server group
    behind rank 0's address) and ranks K..N-1 train; rank 0 also writes the run directory,
    evaluates and prints the summary, as `minips run` does. E.g.
    `mpirun -n 4 minips launch --servers 2 --out runs/mpi`. With --replicas 2 each
    serving rank runs its server's primary and backup as two child processes and replaces
    whichever dies (not under DMLC, where a server's shard is known only once it joined).
    """
    from minips.cli.ps_cmd import INTERRUPTED
    from minips.results.versions import (
        accuracy_line,
        interrupted_line,
        stopped_line,
        untested_line,
    )
    from minips.run.cluster import COORDINATOR, role_of
    from minips.run.cluster import launch as take_role
    from minips.run.launchenv import read_launch_env
    from minips.run.prepare import check_run_can_start, claim_run_dir, run_inputs

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    env = read_launch_env(os.environ, default_port=port)
    config = RunConfig.from_options(options)
    if role_of(env, config.servers).kind == COORDINATOR:
        config.validate()
        check_run_can_start(config)
        # OUT is its run's while this process lives (minips.run.runlock): held, not used
        _run_lock = claim_run_dir(Path(out), force, keep=run_inputs(config))
        click.echo(f"minips launch ({env.launcher}): the group's root on {env.root}")
        threads = os.environ.get("OPENBLAS_NUM_THREADS", "?")
        click.echo(f"BLAS threads per process: {threads} (OPENBLAS_NUM_THREADS; set it to change)")
    # The same progress as `minips run` on rank 0 (a shard or a worker becomes its own
    # command, or exits once its replicas stopped, before any progress: never returns here).
    with ProgressBar() as bar:
        summary = take_role(config, env, Path(out), eval_interval, startup_timeout, bar.update)
    click.echo(
        f"{summary['samples']} samples, {summary['updates']} updates in {summary['wall_s']:.1f} s "
        f"by {summary['workers']} workers and {summary.get('servers', 1)} servers"
    )
    click.echo(f"run directory: {out}")
    click.echo(accuracy_line(summary))
    if untested := untested_line(summary):  # the accuracy is of an earlier model: say so
        click.echo(f"warning: {untested}", err=True)
    if stopped := stopped_line(summary):  # cut short: fewer samples than planned
        click.echo(f"warning: {stopped}", err=True)
    if interrupted := interrupted_line(summary):  # Ctrl-C once training was over
        click.echo(f"warning: {interrupted}", err=True)
        raise SystemExit(INTERRUPTED)
