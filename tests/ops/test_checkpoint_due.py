"""The time-based checkpoint is due once `interval` seconds passed since the last one (or
the start) and the model changed: an idle stretch (a restarted server waiting for its
workers to say hello again) does not push the next checkpoint a whole interval later."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from minips.ops.checkpoints import Checkpointer
from minips.ops.telemetry import Counters


class _Store:
    """What Checkpointer needs of a ParameterStore: a version, and its arrays (each time
    they are asked for, a checkpoint is written: recorded)."""

    def __init__(self) -> None:
        self.version = 0
        self.saved: list[int] = []

    def arrays(self) -> dict[str, np.ndarray]:
        self.saved.append(self.version)
        return {"version": np.array(self.version, np.int64)}


def test_a_change_after_an_idle_interval_is_checkpointed_at_once(tmp_path: Path) -> None:
    store = _Store()
    start = time.monotonic()  # the checkpointer's start, to within the test's margins
    checkpoints = Checkpointer(store, Counters(), tmp_path / "run.npz", interval=5.0)
    checkpoints.if_due(start + 5.5)  # an interval passed, nothing changed: nothing written
    assert store.saved == []
    store.version = 3  # the workers are back and training
    checkpoints.if_due(start + 6.0)  # more than an interval since the start, model changed
    assert store.saved == [3]
    store.version = 9
    checkpoints.if_due(start + 8.0)  # 2 s after the last checkpoint: not yet
    assert store.saved == [3]
    checkpoints.if_due(start + 11.5)
    assert store.saved == [3, 9]
