"""The signs of a collapse (minips.ops.collapse), each against a run that is only slow."""

import math

import pytest

from minips.ops import collapse
from minips.ops.collapse import GROWN, LOSS_WINDOW, NONFINITE_WINDOW, CollapseWatch

LN10 = math.log(10)


def _trained(watch, updates):
    for _ in range(updates):
        watch.on_applied()


def test_nonfinite_pushes_from_two_workers_in_a_row_are_a_collapse_and_said_once():
    said = []
    watch = CollapseWatch(10, workers=4, lr=3.0, rule="asgd", say=said.append)
    assert watch.on_nonfinite("a") is None
    assert watch.on_nonfinite("a") is None  # one worker, twice: could be that worker alone
    found = watch.on_nonfinite("b")
    assert found.sign == "nonfinite" and found.updates == 0
    assert found.line() == (
        "collapsed: pushes from 2 workers refused as non-finite (the gradients overflowed); "
        "try a smaller --lr than 3 (e.g. 0.3), or the default --rule dana-gap "
        "(docs/algorithms.md)"
    )
    assert watch.on_nonfinite("c") is None and watch.collapse is found  # said once
    assert said == [found.line()]


def test_refusals_more_than_the_window_of_updates_apart_start_the_count_again():
    watch = CollapseWatch(10, workers=2)
    watch.on_nonfinite("a")
    _trained(watch, NONFINITE_WINDOW + 1)
    assert watch.on_nonfinite("b") is None  # a's refusal is too old to count with it
    assert watch.on_nonfinite("a").sign == "nonfinite"


def test_refusals_within_the_window_count_though_updates_applied_between():
    # A refused worker may stop at once (the reference worker does), while another's
    # finite pushes still apply: a diverging model still overflows within a few updates.
    watch = CollapseWatch(10, workers=2)
    watch.on_nonfinite("a")
    _trained(watch, NONFINITE_WINDOW)
    found = watch.on_nonfinite("b")
    assert found is not None and found.sign == "nonfinite"


def test_a_single_worker_run_collapses_on_its_one_worker():
    assert CollapseWatch(10, workers=1).on_nonfinite("a").sign == "nonfinite"


def test_a_loss_ten_times_a_guess_is_diverging_at_any_time():
    watch = CollapseWatch(10, lr=0.5, rule="dana-gap")
    found = [watch.on_train_loss(50.0) for _ in range(collapse.LOSS_WINDOW)]
    assert found[:-1] == [None] * (collapse.LOSS_WINDOW - 1)
    assert found[-1].sign == "loss" and "diverging" in found[-1].what
    assert "--rule" not in found[-1].advice  # it is the default rule already


def test_a_loss_no_better_than_a_guess_after_the_warm_up_is_a_collapse():
    watch = CollapseWatch(10, lr=3.0)
    for _ in range(collapse.LOSS_WINDOW):  # a fresh small-weight model: ln 10 too, too early
        assert watch.on_train_loss(LN10 + 0.001) is None
    _trained(watch, collapse.WARMUP_UPDATES)
    found = watch.on_train_loss(LN10 - 0.01)  # a dead model's constant output: about ln C
    assert found.sign == "loss" and "no better than a guess (ln 10 = 2.3026)" in found.what
    assert found.advice == "try a smaller --lr than 3 (e.g. 0.3)"


def test_a_model_that_never_learned_with_a_tiny_lr_is_told_so():
    watch = CollapseWatch(10, lr=1e-5)
    _trained(watch, collapse.WARMUP_UPDATES)
    found = [watch.on_train_loss(3.0) for _ in range(collapse.LOSS_WINDOW)][-1]
    assert found.advice == "--lr 1e-05 may be too small to learn at all: try 0.01"


def test_a_model_passing_through_ln_c_while_it_learns_is_not_stuck():
    watch = CollapseWatch(10)
    _trained(watch, collapse.WARMUP_UPDATES)
    scattered = [LN10 + 0.2 * math.sin(i) for i in range(3 * collapse.LOSS_WINDOW)]
    assert all(watch.on_train_loss(loss) is None for loss in scattered)
    assert watch.on_train_loss(float("nan")) is None  # the push's gradients say it


@pytest.mark.parametrize(
    "evaluations, collapsed",
    [
        ([(0.10, LN10, 300)] * 3, True),
        ([(0.10, 3.2, 300)] * 3, True),  # above a guess is not better
        ([(0.10, LN10, 50)] * 3, False),  # before the warm-up: a fresh model is at chance
        ([(0.10, LN10, 300), (0.35, 2.1, 320), (0.10, LN10, 340)], False),  # not in a row
        ([(0.10, LN10, 300), (0.10, LN10, 320), (0.35, 2.1, 340), (0.10, LN10, 360)], False),
        ([(0.10, LN10, 300)] * 2 + [(0.35, 2.1, 340)] + [(0.10, LN10, 360)] * 3, True),
        ([(0.12, 2.0, 300)] * 3, False),  # its loss falls: learning, slowly
        ([(0.30, LN10, 300)] * 3, False),
    ],
)
def test_accuracy_at_chance_for_three_evaluations_in_a_row(evaluations, collapsed):
    watch = CollapseWatch(10)
    found = [watch.on_evaluation(*evaluation) for evaluation in evaluations]
    assert found[:-1] == [None] * (len(found) - 1)
    assert (found[-1] is not None) == collapsed
    if collapsed:
        assert found[-1].sign == "accuracy" and "chance: 0.100" in found[-1].what
        assert found[-1].record()["line"] == found[-1].line()


def test_a_nonfinite_training_loss_is_left_to_the_nonfinite_sign():
    """An inf or NaN loss (its push is refused as non-finite) enters no loss window: 19
    ordinary losses and an inf are not a diverging mean, and the window still waits."""
    watch = CollapseWatch(10)
    assert [watch.on_train_loss(0.5) for _ in range(LOSS_WINDOW - 1)] == [None] * 19
    assert watch.on_train_loss(math.inf) is None
    assert watch.on_train_loss(math.nan) is None
    assert watch.collapse is None
    assert watch.on_train_loss(GROWN * LN10 * 30) is not None  # the 20th finite one counts
