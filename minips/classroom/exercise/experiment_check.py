"""Check of the open experiment: the staleness table a student measured with `minips run`.

The table is a CSV with a header `workers,staleness_mean,staleness_max` and one row per
number of workers (asgd, equal speeds). The check cannot know the student's numbers, only
what every correct measurement shares: with one worker tau is 0, a mean is at most its max,
and the mean grows with the number of workers (about N - 1 for asgd at equal speeds).
"""

from __future__ import annotations

import csv
from pathlib import Path

from minips.classroom.exercise.common import CheckResult, StudentCodeError

COLUMNS = ("workers", "staleness_mean", "staleness_max")


def read_table(path: Path) -> list[dict[str, float]]:
    """Rows of the CSV as numbers; StudentCodeError naming the first cell that is not one."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise StudentCodeError(f"cannot read {path} as CSV: {exc}") from None
    if not rows or any(column not in rows[0] for column in COLUMNS):
        raise StudentCodeError(f"{path} needs a header with the columns {', '.join(COLUMNS)}")
    table = []
    for line, row in enumerate(rows, start=2):
        try:
            table.append({column: float(row[column]) for column in COLUMNS})
        except (TypeError, ValueError):
            bad = next(c for c in COLUMNS if not _is_number(row[c]))
            raise StudentCodeError(
                f"line {line}: {bad} is {row[bad]!r}, not a number: run the experiment "
                "(the starter script fills the table) and fill it in"
            ) from None
    return table


def _is_number(text: str | None) -> bool:
    try:
        float(text or "")
    except ValueError:
        return False
    return True


def check_staleness_table(path: Path) -> CheckResult:
    """The measured table is complete and consistent (see the module docstring)."""
    result = CheckResult()
    table = sorted(read_table(path), key=lambda row: row["workers"])
    counts = [int(row["workers"]) for row in table]
    if len(set(counts)) < 3 or counts[0] != 1:
        result.fail(f"measure at least 3 worker counts, starting with 1; the table has {counts}")
    for row in table:
        n, mean, top = int(row["workers"]), row["staleness_mean"], row["staleness_max"]
        if n == 1 and (mean != 0 or top != 0):
            result.fail(
                f"workers=1: staleness mean {mean:g}, max {top:g}, expected 0: alone, nobody "
                "updates between your pull and your push (tau = t - base)"
            )
        if mean > top or mean < 0:
            result.fail(f"workers={n}: mean {mean:g} is not between 0 and the max {top:g}")
        if n > 1 and mean < 0.1 * (n - 1):
            result.fail(
                f"workers={n}: mean staleness {mean:g} is far below what asgd gives at equal "
                f"speeds (about N - 1 = {n - 1}): was the rule asgd, and did all {n} work?"
            )
    if table and table[-1]["staleness_mean"] <= table[0]["staleness_mean"] and len(table) > 1:
        result.fail("the mean staleness does not grow with the number of workers: re-measure")
    if result.passed:
        summary = ", ".join(f"{int(r['workers'])}: {r['staleness_mean']:g}" for r in table)
        result.ok(f"table consistent (mean staleness by workers: {summary}); now the questions")
    return result
