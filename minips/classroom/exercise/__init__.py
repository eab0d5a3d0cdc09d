"""Exercises a teacher hands out, and the automatic checks `minips exercise check` runs.

Each exercise is a starter file in minips/classroom/exercise/starters/ (TODOs, the learning goal,
the expected time) and a check here that runs the student's code against references
(minips's own layers, centred differences, a real in-process server) and says *what* is
wrong:

    minips exercise handout DIR          # every starter, for a student with the package only
    minips exercise list
    minips exercise check dense-backward --file my_dense.py

The starters ship in the package; solutions do not (the tests keep theirs in
tests/exercise_solutions/, which is not part of the package).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from minips.classroom.exercise.common import CheckResult, StudentCodeError, load_student_module
from minips.classroom.exercise.experiment_check import check_staleness_table
from minips.classroom.exercise.nn_checks import (
    check_conv_backward,
    check_dense_backward,
    check_softmax_cross_entropy,
)
from minips.classroom.exercise.ps_checks import (
    check_dasgd_scale,
    check_ssp_hold,
    check_topk_feedback,
    check_worker_loop,
)
from minips.errors import ConfigError, MinipsError


@dataclass(frozen=True)
class Exercise:
    """One exercise: its starter file (in STARTERS), goal, time and check.

    module_check: takes the student's imported module; file_check: takes the path (for
    exercises whose answer is data, not code). Exactly one of the two is set.
    """

    name: str
    starter: str
    minutes: int
    goal: str
    module_check: Callable | None = None
    file_check: Callable[[Path], CheckResult] | None = None


STARTERS = Path(__file__).resolve().parent / "starters"
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
    """The file to check: `path`, else the starter's name in the current directory."""
    if path is not None:
        if not Path(path).is_file():
            raise MinipsError(f"no file {path}")
        return Path(path)
    place = (cwd or Path.cwd()) / exercise.starter
    if place.is_file():
        return place
    raise MinipsError(
        f"no {exercise.starter} in {place.parent}; give the file with --file "
        "(`minips exercise handout DIR` writes the starters)"
    )


def handout(directory: str | Path, force: bool = False) -> list[Path]:
    """Write every starter (and the handout's README.md) into `directory`; the files written.

    Made if missing. MinipsError (one line) when a file there already exists, unless
    `force` (a student's work is never overwritten by accident).
    """
    target = Path(directory)
    files = sorted(p for p in STARTERS.iterdir() if p.is_file() and p.suffix != ".pyc")
    existing = [target / p.name for p in files if (target / p.name).exists()]
    if existing and not force:
        names = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise MinipsError(f"{target} already holds {names}; choose another folder or --force")
    target.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copyfile(p, target / p.name)) for p in files]


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


__all__ = [
    "EXERCISES",
    "STARTERS",
    "CheckResult",
    "Exercise",
    "check",
    "find_answer",
    "get_exercise",
    "handout",
]
