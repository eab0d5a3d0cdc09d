"""A stop signal once training is over cuts the wrap-up short, not the run
(minips/run/wrapup.py), by hand: what is noted, what is done again whole, and whether the
final model was tested when the wrap-up was cut (a group's version shard by shard). The
real signal to a real run is tests/run/test_wrap_up_interrupt.py."""

from __future__ import annotations

import json

import pytest

from minips.results.versions import interrupted_line
from minips.run.wrapup import INTERRUPTED, UNTESTED_WHY, WrapUp, untested_after_interrupt
from tests.run.test_run_record import _run_dir


def _interrupted_once(result: str):
    """A step a stop signal cuts the first time it runs; then it gives `result`."""
    calls = []

    def step() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return result

    return step, calls


def test_a_step_cut_once_training_is_over_is_done_again_whole_and_noted():
    wrap_up = WrapUp(trained=lambda: True)
    step, calls = _interrupted_once("summary written")
    try:
        result = wrap_up.finish(step)
    except KeyboardInterrupt:
        pytest.fail("the step the signal cut was not done again: its result is lost")
    assert result == "summary written" and len(calls) == 2
    assert wrap_up.interrupted and wrap_up.note == INTERRUPTED


def test_a_wait_cut_once_training_is_over_ends_the_wait_and_is_noted():
    wrap_up = WrapUp(trained=lambda: True)
    with wrap_up.cut_short():
        raise KeyboardInterrupt  # the servers' stop, waited for: cut short
    assert wrap_up.note == INTERRUPTED


def test_a_step_cut_before_training_is_over_ends_the_run():
    wrap_up = WrapUp(trained=lambda: False)
    step, _ = _interrupted_once("never")
    with pytest.raises(KeyboardInterrupt):
        wrap_up.finish(step)
    with pytest.raises(KeyboardInterrupt), wrap_up.cut_short():
        raise KeyboardInterrupt
    assert wrap_up.note is None


def test_a_run_nothing_interrupted_says_nothing_of_it():
    wrap_up = WrapUp(trained=lambda: True)
    assert wrap_up.finish(lambda: 3) == 3
    with wrap_up.cut_short():
        pass
    assert wrap_up.note is None
    assert interrupted_line({"interrupted": wrap_up.note, "samples": 640}) is None


def test_a_groups_final_model_tested_by_its_evaluator_is_not_said_untested(tmp_path):
    run_dir = _run_dir(tmp_path, [{"version": [10, 9], "accuracy": 0.8}], 10)
    shard1 = {"event": "server", "time": 9.0, "stats": {"version": 9, "samples": 640}}
    run_dir.updates_log(shard=1).write_text(json.dumps(shard1) + "\n")
    assert untested_after_interrupt(run_dir, servers=2) is None
    (tmp_path / "earlier").mkdir()
    earlier = _run_dir(tmp_path / "earlier", [{"version": [4, 4], "accuracy": 0.5}], 10)
    earlier.updates_log(shard=1).write_text(json.dumps(shard1) + "\n")
    assert untested_after_interrupt(earlier, servers=2) == UNTESTED_WHY
