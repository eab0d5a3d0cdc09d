"""The single-process trainer: the baseline every distributed run is compared with.

One model, one SGD optimizer, plain minibatch SGD over the whole training set:

    for each epoch: shuffle; for each batch (x, y):
        loss, dlogits = softmax_cross_entropy(model(x), y)
        model.backward(dlogits);  w <- w - lr * (momentum-accumulated) grad

Test accuracy is measured every `eval_every` samples and at the end of every epoch.
`TrainConfig` (the run's settings) is declared in minips.run.config.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from minips.data import Dataset, iterate_batches, load_dataset
from minips.errors import ConfigError
from minips.nn import Sequential, build_model, softmax_cross_entropy
from minips.ops.checkpoint_file import load_store, save_store
from minips.provision.locations import find_data
from minips.results.metrics import MetricsLog, ProgressFn
from minips.run.config import TrainConfig
from minips.state.store import SGD, ParameterStore


@dataclass
class TrainResult:
    """What a finished run reports (also the `summary` metrics line). interrupted: a stop
    request ended training early; accuracy and loss are then the last test's (None: none)."""

    accuracy: float | None
    loss: float | None
    wall_s: float
    samples: int
    steps: int
    interrupted: bool = False


def evaluate(
    model: Sequential, x: np.ndarray, y: np.ndarray, batch_size: int = 1000
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of `model` on (x (N, C, H, W), y (N,)), no dropout."""
    correct = 0
    loss_sum = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start : start + batch_size], y[start : start + batch_size]
        logits = model.forward(xb, train=False)  # (B, K)
        loss, _ = softmax_cross_entropy(logits, yb)
        loss_sum += loss * len(xb)
        correct += int((logits.argmax(axis=1) == yb).sum())
    return correct / len(x), loss_sum / len(x)


def train(
    config: TrainConfig,
    metrics: MetricsLog | None = None,
    progress: ProgressFn | None = None,
    dataset: Dataset | None = None,
    save: str | Path | None = None,
    stop: Callable[[], bool] | None = None,
) -> tuple[Sequential, TrainResult]:
    """Train `config.model` on `config.dataset`; returns the model and the final result.

    `dataset` may be passed in (tests use synthetic data) instead of loading by name.
    `config.resume`: start from a checkpoint (a server's, or one saved here). `save`: write
    the final parameters and optimizer state as a checkpoint, the server's format
    (minips.state.store), its version the number of steps taken, so `minips run --resume` can
    continue from it. `stop()`: asked before each step; True ends training there (the
    model is whole: no step is cut in two), skips the final test and saves what was trained
    (nothing when no step was taken); the result says `interrupted`.
    """
    config.validate()
    metrics = metrics if metrics is not None else MetricsLog(None)
    data = (
        dataset
        if dataset is not None
        else load_dataset(config.dataset, config.data_dir, find=find_data)
    )
    model = build_model(config.model, seed=config.seed)
    params = model.params  # one dict: the store and the optimizer must share it
    optimizer = SGD(params, config.lr, config.momentum, config.weight_decay)
    store = ParameterStore(params, optimizer, in_place=True)  # the server's checkpoint format
    if config.resume:
        load_store(store, config.resume)
    rng = np.random.default_rng(config.seed)

    total = config.epochs * len(data.x_train)
    samples = steps = 0
    next_eval = config.eval_every or None
    latest: dict = {}  # the newest figures, shown by the progress bar
    start = time.monotonic()

    def run_eval() -> None:
        accuracy, loss = evaluate(model, data.x_test, data.y_test)
        latest.update(accuracy=accuracy, loss=loss, evaluated_at=samples)
        metrics.write("eval", samples=samples, accuracy=accuracy, loss=loss)

    stopped = False
    for _epoch in range(config.epochs):
        for xb, yb in iterate_batches(data.x_train, data.y_train, config.batch_size, rng):
            if stop is not None and stop():
                stopped = True
                break
            # Overflow shows up as a non-finite loss, reported below as one clear line.
            with np.errstate(over="ignore", invalid="ignore"):
                logits = model.forward(xb, train=True)  # (B, K)
                loss, dlogits = softmax_cross_entropy(logits, yb)
            if not np.isfinite(loss):
                raise ConfigError(
                    f"training diverged (loss={loss}) at step {steps}: lower the learning rate"
                )
            model.backward(dlogits)
            optimizer.step(model.grads)
            samples += len(xb)
            steps += 1
            latest["train_loss"] = loss
            if next_eval is not None and samples >= next_eval:
                run_eval()
                next_eval += config.eval_every
            if progress is not None:
                progress(samples, total, latest)
        if stopped:
            break
        if latest.get("evaluated_at") != samples:  # skip if eval_every just landed here
            run_eval()

    wall = time.monotonic() - start
    result = TrainResult(latest.get("accuracy"), latest.get("loss"), wall, samples, steps, stopped)
    record = asdict(result)
    if not stopped:
        del record["interrupted"]  # the summary of a whole run is as it always was
    metrics.write("summary", **record, config=asdict(config))
    if save is not None and (steps or not stopped):
        save_checkpoint(store, save, steps, model.spec)
    return model, result


def save_checkpoint(
    store: ParameterStore, path: str | Path, steps: int, spec: dict | None = None
) -> Path:
    """Write the trained parameters as a server checkpoint: every step counted as one
    update, so version and parameter versions advance by `steps`."""
    store.version += steps
    store.param_versions = dict.fromkeys(store.params, store.version)
    return save_store(store, path, {"trainer": "minips train", "updates": steps, "spec": spec})
