"""`minips train`: the single-process trainer (its options derived from minips.run.config).

Ctrl-C or SIGTERM ends training after its current step, as `minips run` does: the model
trained so far is saved to --save, the metrics file gets its summary (`"interrupted":
true`), one line says what is kept, and the exit status is 130. A second signal ends at
once. --save refuses an existing file unless --force, as `minips run --out` refuses a
previous run's directory; the file is written whole or not at all (minips.ops.checkpoint_file).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from minips.cli.click_options import config_options
from minips.cli.progress import ProgressBar
from minips.errors import MinipsError
from minips.run.config import TrainConfig

INTERRUPTED = 130  # as `minips run`: the shell's status for Ctrl-C


@click.command()
@config_options(TrainConfig, "train")
@click.option(
    "--metrics", "metrics_path", type=click.Path(dir_okay=False), help="Write JSONL here."
)
@click.option(
    "--save",
    "save_path",
    type=click.Path(dir_okay=False),
    help="Save the model as a checkpoint (.npz; `minips run --resume` takes it).",
)
@click.option("--force", is_flag=True, help="Replace an existing --save file.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    metrics_path: str | None, save_path: str | None, force: bool, quiet: bool, **options: Any
) -> None:
    """Train a model in one process (the baseline for distributed runs).

    Prints `test accuracy: 0.XXXX` at the end. Ctrl-C (or SIGTERM) stops after the current
    step: the model trained so far is saved to --save, and the exit status is 130.
    """
    from minips.results.metrics import MetricsLog
    from minips.results.rundir import check_writable
    from minips.trainer import train as run_training

    config = TrainConfig.from_options(options)
    if save_path:
        if Path(save_path).exists() and not force:
            raise MinipsError(
                f"--save {save_path} already exists (a model saved earlier?); "
                "choose another file or add --force to replace it"
            )
        check_writable(save_path, "--save")
    with MetricsLog(metrics_path) as metrics, stop_requests() as stop:
        if quiet:
            _, result = run_training(config, metrics, save=save_path, stop=stop)
        else:
            with ProgressBar() as bar:
                _, result = run_training(
                    config, metrics, progress=bar.update, save=save_path, stop=stop
                )
    if result.interrupted:
        click.echo(f"interrupted: {_kept(result.samples, save_path)}", err=True)
        raise SystemExit(INTERRUPTED)
    click.echo(
        f"trained {result.samples} samples in {result.wall_s:.1f} s "
        f"({result.samples / max(result.wall_s, 1e-9):.0f} samples/s)"
    )
    click.echo(f"test accuracy: {result.accuracy:.4f}")


def _kept(samples: int, save_path: str | None) -> str:
    """What an interrupted training keeps, in one clause."""
    if not samples:
        return "training was cut short before its first step; no model was saved"
    if save_path is None:
        return f"training was cut short after {samples} samples; no model was saved (no --save)"
    return f"training was cut short; the model after {samples} samples is kept in {save_path}"


@contextlib.contextmanager
def stop_requests() -> Iterator[Callable[[], bool]]:
    """Inside, SIGINT and SIGTERM are noted, not fatal: the callable says whether one came
    (the trainer asks before each step, so no step is cut in two). A second one ends at once
    (KeyboardInterrupt), for a user who will not wait. Only in the main thread (the only one
    Python delivers signals to); elsewhere nothing is ever requested."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def note(signum: int, _frame: object) -> None:
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)

    stopping = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, note) for signum in stopping}
    try:
        yield lambda: bool(requested)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
