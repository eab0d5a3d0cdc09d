"""Exercises a teacher hands out, and the automatic checks `minips exercise check` runs.

Each exercise is a starter file in examples/exercises/ (TODOs, the learning goal, the
expected time) and a check here that runs the student's code against references (minips's
own layers, centred differences, a real in-process server) and says *what* is wrong:

    minips exercise list
    minips exercise check dense-backward --file my_dense.py

Solutions are not shipped: the tests keep theirs in tests/exercise_solutions/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minips.errors import ConfigError, MinipsError
from minips.exercise.common import CheckResult, StudentCodeError, load_student_module
from minips.exercise.experiment_check import check_staleness_table
from minips.exercise.nn_checks import (
    check_conv_backward,
    check_dense_backward,
    check_softmax_cross_entropy,
)
from minips.exercise.ps_checks import (
    check_dasgd_scale,
    check_ssp_hold,
    check_topk_feedback,
    check_worker_loop,
)


@dataclass(frozen=True)
class Exercise:
    """One exercise: its starter file (in examples/exercises/), goal, time and check.

    module_check: takes the student's imported module; file_check: takes the path (for
    exercises whose answer is data, not code). Exactly one of the two is set.
    """

    name: str
    starter: str
    minutes: int
    goal: str
    module_check: Callable | None = None
    file_check: Callable[[Path], CheckResult] | None = None


EXERCISES: dict[str, Exercise] = {
    e.name: e
    for e in [
        Exercise("dense-backward", "dense_backward.py", 20,
                 "derive dx, dW, db of y = x W + b", check_dense_backward),
        Exercise("conv-backward", "conv_backward.py", 60,
                 "backprop through a strided, padded convolution", check_conv_backward),
        Exercise("softmax-xent", "softmax_xent.py", 25,
                 "a numerically stable softmax cross-entropy and its gradient",
                 check_softmax_cross_entropy),
        Exercise("worker-loop", "worker_loop.py", 30,
                 "a worker's hello / pull / push / bye loop on PSClient", check_worker_loop),
        Exercise("dasgd-scale", "dasgd_scale.py", 15,
                 "DASGD's step scale f(tau) for every schedule", check_dasgd_scale),
        Exercise("ssp-hold", "ssp_hold.py", 10,
                 "when SSP holds a pull: the bounded-staleness condition", check_ssp_hold),
        Exercise("topk-feedback", "topk_feedback.py", 30,
                 "top-k sparsification that loses nothing (error feedback)",
                 check_topk_feedback),
        Exercise("staleness-experiment", "staleness.csv", 45,
                 "measure staleness against the number of workers, and explain it",
                 file_check=check_staleness_table),
    ]
}  # fmt: skip


def get_exercise(name: str) -> Exercise:
    """The exercise called `name`; ConfigError listing the names otherwise."""
    if name not in EXERCISES:
        raise ConfigError(f"unknown exercise {name!r}; choose from {', '.join(EXERCISES)}")
    return EXERCISES[name]


def find_answer(exercise: Exercise, path: str | Path | None, cwd: Path | None = None) -> Path:
    """The file to check: `path`, else the starter's name here or in examples/exercises/."""
    if path is not None:
        if not Path(path).is_file():
            raise MinipsError(f"no file {path}")
        return Path(path)
    cwd = cwd or Path.cwd()
    places = [cwd / exercise.starter, cwd / "examples" / "exercises" / exercise.starter]
    for place in places:
        if place.is_file():
            return place
    raise MinipsError(
        f"no {exercise.starter} in {places[0].parent} or {places[1].parent}; "
        "give the file with --file"
    )


def check(name: str, path: str | Path | None = None) -> tuple[Path, CheckResult]:
    """Run exercise `name`'s check on the student's file; (the file checked, the result).

    Problems in the student's code (it does not import, a function is missing or raises)
    are findings of the result, not exceptions.
    """
    exercise = get_exercise(name)
    answer = find_answer(exercise, path)
    try:
        if exercise.file_check is not None:
            return answer, exercise.file_check(answer)
        return answer, exercise.module_check(load_student_module(answer))
    except StudentCodeError as exc:
        return answer, CheckResult(findings=[str(exc)])


__all__ = ["EXERCISES", "CheckResult", "Exercise", "check", "find_answer", "get_exercise"]
