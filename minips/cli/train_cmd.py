"""`minips train`: the single-process trainer."""

from __future__ import annotations

import click

from minips.metrics import MetricsLog
from minips.trainer import TrainConfig
from minips.trainer import train as run_training


@click.command()
@click.option("--model", default="lenet5", show_default=True, help="Model from the zoo.")
@click.option("--dataset", default="sample", show_default=True, help="Dataset name.")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Directory with IDX files.")
@click.option("--epochs", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=0.01, show_default=True)
@click.option(
    "--momentum", type=click.FloatRange(0, 1, max_open=True), default=0.9, show_default=True
)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--eval-every",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Evaluate every N samples (0: once per epoch).",
)
@click.option(
    "--metrics", "metrics_path", type=click.Path(dir_okay=False), help="Write JSONL here."
)
@click.option("--save", "save_path", type=click.Path(dir_okay=False), help="Save the model (.npz).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(
    model: str,
    dataset: str,
    data_dir: str | None,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    weight_decay: float,
    seed: int,
    eval_every: int,
    metrics_path: str | None,
    save_path: str | None,
    quiet: bool,
) -> None:
    """Train a model in one process (the baseline for distributed runs).

    Prints `test accuracy: 0.XXXX` at the end.
    """
    config = TrainConfig(
        model=model, dataset=dataset, epochs=epochs, batch_size=batch_size, lr=lr,
        momentum=momentum, weight_decay=weight_decay, seed=seed, eval_every=eval_every,
        data_dir=data_dir,
    )  # fmt: skip
    with MetricsLog(metrics_path) as metrics:
        if quiet:
            trained, result = run_training(config, metrics)
        else:
            with _ProgressBar() as bar:
                trained, result = run_training(config, metrics, progress=bar.update)
    if save_path:
        trained.save(save_path)
    click.echo(
        f"trained {result.samples} samples in {result.wall_s:.1f} s "
        f"({result.samples / max(result.wall_s, 1e-9):.0f} samples/s)"
    )
    click.echo(f"test accuracy: {result.accuracy:.4f}")


class _ProgressBar:
    """A click progress bar driven by the trainer's progress callback."""

    def __init__(self) -> None:
        self._bar = None
        self._done = 0

    def __enter__(self) -> _ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, done: int, total: int, latest: dict) -> None:
        if self._bar is None:
            self._bar = click.progressbar(
                length=total, label="training", file=click.get_text_stream("stderr")
            )
            self._bar.__enter__()
        accuracy = latest.get("accuracy")
        self._bar.label = f"loss {latest.get('train_loss', float('nan')):.3f}" + (
            f" acc {accuracy:.3f}" if accuracy is not None else ""
        )
        self._bar.update(done - self._done)
        self._done = done
