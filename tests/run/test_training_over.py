"""`TrainingWatch.training_over`, asked as a stop signal lands: from the run's files as they
are then, without raising where they are caught mid-write."""

import time

from minips.results.rundir import RunDir
from minips.run.processes import ProcessGroup
from minips.run.training_watch import TrainingWatch


class _Watch(TrainingWatch):
    def __init__(self, path):
        self.dir = RunDir(path)
        (path / "logs").mkdir(parents=True)
        self.processes = ProcessGroup(path / "logs", {})
        self.training_ended = None
        self.t0 = time.monotonic()

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0


def test_the_evaluators_final_record_ends_training(tmp_path):
    watch = _Watch(tmp_path)
    assert not watch.training_over()  # nothing started, nothing written
    (tmp_path / "eval.jsonl").write_text('{"event": "eval", "time": 1.0, "final": true}\n')
    assert watch.training_over() and watch.training_ended is not None


def test_a_half_written_final_record_is_not_yet_the_end(tmp_path):
    watch = _Watch(tmp_path)
    (tmp_path / "eval.jsonl").write_text('{"event": "eval", "time": 1.0}\n{"event": "ev')
    assert not watch.training_over() and watch.training_ended is None
