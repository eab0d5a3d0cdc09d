"""The final test of a run: the accuracy `minips run` reports is of the model it ended with.

The evaluator tests the final parameters when the server stops (minips.worker.evaluator).
It cannot always: it died or was killed, a restarted shard no longer knew it, or the
server's stop grace ran out while it was still testing an earlier pull. So once every
server has stopped, `test_final_model` compares the version of the evaluator's last record
with the version the run ended with (each server's last `stats`, minips.run.versions) and,
when they differ, tests the final checkpoint here, in the launcher: the model built from
the checkpoint's spec, tested on the run's test set as the evaluator does, the record
appended to eval.jsonl with `by: "launcher"`. A checkpoint that is not of the final version
(a group assembled at an older common version) is tested too when it is newer than the
evaluator's last model, and says its own version: the summary then tells which version
its accuracy is of (minips.run.versions), never passing it off as the final model's.

Nothing here waits on a clock: the final test runs as long as it takes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from minips.errors import DataError, MinipsError
from minips.run.config import RunConfig
from minips.run.metrics import MetricsLog
from minips.run.processes import ProcessGroup
from minips.run.rundir import RunDir, final_stats, latest_eval
from minips.run.versions import Version, newer_version, run_version, same_version

log = logging.getLogger("minips.run")

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


def test_final_model(config: RunConfig, run_dir: RunDir, t0: float) -> dict[str, Any] | None:
    """Test the final checkpoint unless the evaluator's last record is of the final version
    (module docstring); return the record appended, None when none was."""
    final = run_version([final_stats(run_dir, shard) for shard in range(config.servers)])
    tested = latest_eval(run_dir.eval_log).get("version")
    if final is not None and same_version(tested, final):
        return None
    try:
        checkpoint = _load(Path(config.checkpoint or run_dir.checkpoint))
    except MinipsError as exc:  # none written, or damaged: the summary says what was tested
        log.warning("the final checkpoint could not be tested: %s", exc)
        return None
    version = _version(checkpoint, config.servers)
    if not (same_version(version, final) or newer_version(version, tested)):
        return None
    try:
        accuracy, loss = _accuracy(checkpoint, config)
    except MinipsError as exc:
        log.warning("the final checkpoint could not be tested: %s", exc)
        return None
    with MetricsLog(run_dir.eval_log, start_time=t0, append=True) as metrics:
        return metrics.write(
            "eval",
            samples=int(checkpoint.meta.get("samples", 0)),
            updates=int(checkpoint.meta.get("updates", 0)),
            version=version,
            accuracy=accuracy,
            loss=loss,
            final=final is not None and same_version(version, final),
            by="launcher",
        )


def _load(path: Path) -> Any:
    from minips.server.checkpoint_file import load_checkpoint

    return load_checkpoint(path)


def _version(checkpoint: Any, servers: int) -> Version:
    """A checkpoint's version as the run counts it: a group checkpoint's, one per shard."""
    versions = (checkpoint.meta.get("group") or {}).get("versions")
    if servers > 1 and isinstance(versions, list) and len(versions) == servers:
        return [int(v) for v in versions]
    return checkpoint.version


def _accuracy(checkpoint: Any, config: RunConfig) -> tuple[float, float]:
    """Test accuracy and loss of the checkpoint's parameters on the run's test set."""
    from minips.data import load_dataset
    from minips.nn import build_model
    from minips.trainer import evaluate

    spec = checkpoint.meta.get("spec")
    if not isinstance(spec, dict):
        raise DataError(f"checkpoint {checkpoint.path} does not name its model")
    model = build_model(spec["name"], seed=0, **spec.get("kwargs", {}))
    checkpoint.check_params(model.params)
    model.set_params({name: checkpoint.arrays[f"param/{name}"] for name in model.params})
    data = load_dataset(config.dataset, config.data_dir)
    return evaluate(model, data.x_test, data.y_test)
