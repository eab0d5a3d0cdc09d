"""The final test of a run: the accuracy `minips run` reports is of the model it ended with.

The evaluator tests the final parameters when the server stops (minips.results.evaluator).
It cannot always: it died or was killed, a restarted shard no longer knew it, or the
server's stop grace ran out while it was still testing an earlier pull. So once every
server has stopped, `ensure_final_tested` compares the version of the evaluator's last
record with the version the run ended with (each server's last `stats`,
minips.results.versions) and, when they differ, tests the last checkpoint here, in the
launcher: the run's checkpoint file, or a group's shard files (each shard's last, the model
it ended with) put together; the model built from the checkpoint's spec and tested on the
run's test set as the evaluator does; the record appended to eval.jsonl with `by:
"launcher"`. A checkpoint older than the final version is tested too when it is newer than
the evaluator's last model; the summary then names the version its accuracy is of and why
the final one was not tested (`untested_why`), never passing it off as the final model's.

Nothing here waits on a clock: the final test runs as long as it takes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from minips.errors import DataError, MinipsError
from minips.group.partition import partition_of_model
from minips.results.metrics import MetricsLog
from minips.results.rundir import RunDir, final_stats, latest_eval
from minips.results.versions import Version, newer_version, run_version, same_version, version_text
from minips.run.config import RunConfig
from minips.run.processes import ProcessGroup

if TYPE_CHECKING:
    from minips.nn.model import Sequential

Params = dict[str, np.ndarray]  # parameter name -> array

LEAVING = 30.0  # seconds an evaluator whose final record is written has to say bye


def let_evaluator_leave(processes: ProcessGroup, eval_log: Path) -> None:
    """Once the servers stopped: an evaluator that wrote its final record is leaving (its
    bye is short); let it exit by itself. One that did not cannot test the final model any
    more (the servers are gone): it is stopped with the others and the launcher tests."""
    evaluator = processes["evaluator"]
    if evaluator.exited() or not latest_eval(eval_log).get("final"):
        return
    deadline = time.monotonic() + LEAVING  # its test is done: only its goodbye is timed
    while not evaluator.exited() and time.monotonic() < deadline:
        time.sleep(0.05)


def ensure_final_tested(config: RunConfig, run_dir: RunDir, t0: float) -> str | None:
    """Test the last checkpoint unless the evaluator's last record is of the final version
    (module docstring); None when the final model is tested, else why it is not (one
    clause, for the summary's `untested_why`)."""
    final = run_version(final_stats(run_dir, config.servers))
    tested = latest_eval(run_dir.eval_log).get("version")
    if final is not None and same_version(tested, final):
        return None
    try:
        version, params, meta = _last_checkpoint(config, run_dir)
        if not (same_version(version, final) or newer_version(version, tested)):
            return f"the last checkpoint is of {version_text(version)}"
        accuracy, loss = _accuracy(params, meta, config)
    except MinipsError as exc:  # none written, or damaged
        return f"the last checkpoint could not be tested ({exc})"
    with MetricsLog(run_dir.eval_log, start_time=t0, append=True) as metrics:
        metrics.write("eval", samples=int(meta.get("samples", 0)),
                      updates=int(meta.get("updates", 0)), version=version, accuracy=accuracy,
                      loss=loss, final=same_version(version, final), by="launcher")  # fmt: skip
    if final is None:
        return "a server left no final stats, so the final version is unknown"
    if not same_version(version, final):
        return f"the last checkpoint is of {version_text(version)}"
    return None


def _last_checkpoint(config: RunConfig, run_dir: RunDir) -> tuple[Version, Params, dict]:
    """The parameters of the run's last checkpoint, their version and the checkpoint's meta.
    A group's: each shard's own last file (the model it ended with), put together by the
    partition; the group checkpoint may be assembled at an older version all shards saved."""
    from minips.ops.checkpoint_file import load_checkpoint
    from minips.ops.group_checkpoints import shard_path

    path = Path(config.checkpoint or run_dir.checkpoint)
    if config.servers == 1:
        checkpoint = load_checkpoint(path)
        params = {name: checkpoint.arrays[f"param/{name}"] for name in checkpoint.param_names()}
        return checkpoint.version, params, checkpoint.meta
    shards = [load_checkpoint(shard_path(path, j)) for j in range(config.servers)]
    part = partition_of_model(_model(shards[0].meta, path).params, config.servers)
    params = {}
    for name in part.shapes:  # a shard's file names its slice of a parameter like the whole
        key = f"param/{name}"
        pieces = {j: shard.arrays[key] for j, shard in enumerate(shards) if key in shard.arrays}
        params[name] = part.assemble(name, pieces)
    return [shard.version for shard in shards], params, shards[0].meta


def _model(meta: dict[str, Any], path: Path) -> Sequential:
    """The model (untrained) a checkpoint's meta names."""
    from minips.nn import build_model

    spec = meta.get("spec")
    if not isinstance(spec, dict):
        raise DataError(f"checkpoint {path} does not name its model")
    return build_model(spec["name"], seed=0, **spec.get("kwargs", {}))


def _accuracy(params: Params, meta: dict[str, Any], config: RunConfig) -> tuple[float, float]:
    """Test accuracy and loss of `params` (the model `meta` names) on the run's test set."""
    from minips.data import load_dataset
    from minips.provision.locations import find_data
    from minips.trainer import evaluate

    model = _model(meta, Path(config.checkpoint or ""))
    model.set_params(params, strict=True)
    data = load_dataset(config.dataset, config.data_dir, find=find_data)
    return evaluate(model, data.x_test, data.y_test)
