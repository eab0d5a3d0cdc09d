"""The time-based checkpoint is due once `interval` seconds passed since the last one (or
the start) and the model changed: an idle stretch (a restarted server waiting for its
workers to say hello again) does not push the next checkpoint a whole interval later."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from minips.ops.checkpoint_file import file_version
from minips.ops.checkpoints import Checkpointer
from minips.ops.telemetry import Counters
from minips.state.store import SGD, ParameterStore


def _advance(store: ParameterStore, version: int) -> None:
    """Updates until the store is at `version`."""
    while store.version < version:
        store.write([("w", np.ones(2, np.float32), 1.0)])


def test_a_change_after_an_idle_interval_is_checkpointed_at_once(tmp_path: Path) -> None:
    params = {"w": np.zeros(2, np.float32)}
    store, path = ParameterStore(params, SGD(params, lr=0.1)), tmp_path / "run.npz"
    start = time.monotonic()  # the checkpointer's start, to within the test's margins
    checkpoints = Checkpointer(store, Counters(), path, interval=5.0)
    checkpoints.if_due(start + 5.5)  # an interval passed, nothing changed: nothing written
    assert file_version(path) is None
    _advance(store, 3)  # the workers are back and training
    checkpoints.if_due(start + 6.0)  # more than an interval since the start, model changed
    assert file_version(path) == 3
    _advance(store, 9)
    checkpoints.if_due(start + 8.0)  # 2 s after the last checkpoint: not yet
    assert file_version(path) == 3
    checkpoints.if_due(start + 11.5)
    assert file_version(path) == 9
