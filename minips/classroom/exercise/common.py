"""What every exercise check shares: loading a student's file, calling into it safely, and
comparing arrays in a way that says *where* they differ.

A check never stops at the first problem it cannot recover from silently: it collects
findings (one line each, the first words naming what is wrong) into a `CheckResult`.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np


class StudentCodeError(Exception):
    """The student's code could not be called (missing, unfinished, raised): a finding."""


@dataclass
class CheckResult:
    """Outcome of one `minips exercise check`: passed when no finding was recorded.

    findings: what is wrong, one line each. notes: what was verified (shown on success).
    """

    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.findings

    def fail(self, message: str) -> None:
        self.findings.append(message)

    def ok(self, message: str) -> None:
        self.notes.append(message)


def load_student_module(path: Path) -> ModuleType:
    """Import the file at `path` as a fresh module (never cached: the student edits it)."""
    name = f"minips_exercise_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StudentCodeError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the student's file: any error is a finding, not a crash
        raise StudentCodeError(f"{path} fails to import: {_where(exc)}") from None
    finally:
        sys.modules.pop(name, None)
    return module


def student_function(module: ModuleType, name: str) -> Callable[..., Any]:
    """The function `name` of the student's module, or a StudentCodeError saying it is absent."""
    function = getattr(module, name, None)
    if not callable(function):
        raise StudentCodeError(f"the file defines no function {name}()")
    return function


def call(function: Callable[..., Any], *args: Any, what: str = "", **kwargs: Any) -> Any:
    """Call student code; NotImplementedError and other exceptions become one-line findings."""
    label = f"{function.__name__}() {what}".strip()
    try:
        return function(*args, **kwargs)
    except NotImplementedError:
        raise StudentCodeError(
            f"{function.__name__}() is not written yet (it raises NotImplementedError): "
            "replace the TODOs"
        ) from None
    except Exception as exc:
        raise StudentCodeError(f"{label} raised {_where(exc)}") from None


def _where(exc: BaseException) -> str:
    """'ValueError: msg (line 12 of file.py)': the last frame, which is in the student's file."""
    frames = traceback.extract_tb(exc.__traceback__)
    place = f" (line {frames[-1].lineno} of {Path(frames[-1].filename).name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{place}"


def compare(name: str, got: Any, want: np.ndarray, rtol: float = 1e-5) -> str | None:
    """None when `got` matches `want`; else what differs: shape, NaN, or the worst element.

    Element error = |got - want| / max(|want|, 1e-3 * max|want|, 1e-12): relative where the
    reference is large, absolute-ish where it is near zero (no blow-up on tiny entries).
    """
    if got is None:
        return f"{name} is None (did you forget to return it?)"
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return f"{name} has shape {got.shape}, expected {want.shape}"
    if not np.all(np.isfinite(got)):
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return f"{name} has non-finite values (first at index {index})"
    floor = max(1e-3 * float(np.max(np.abs(want), initial=0.0)), 1e-12)
    errors = np.abs(got - want) / np.maximum(np.abs(want), floor)
    worst = int(np.argmax(errors)) if errors.size else 0
    if errors.size == 0 or errors.flat[worst] <= rtol:
        return None
    index = tuple(int(i) for i in np.unravel_index(worst, want.shape))
    return (
        f"max relative error {errors.flat[worst]:.2g} at index {index} "
        f"(got {got.flat[worst]:.6g}, expected {want.flat[worst]:.6g})"
    )
