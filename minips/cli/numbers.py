"""Number types for command-line options: click's ranges, refusing what no run can use.

click's FloatRange lets NaN through every bound (NaN < 0 and NaN > 0 are both false) and
takes "inf" or "1e400" (which is inf); its IntRange takes integers of any size, which
msgpack cannot carry to a worker. These two are those ranges with both refused at the
option, before anything starts.
"""

from __future__ import annotations

import math
from typing import Any

import click

from minips.run.settings import MAX_INT


class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that refuses NaN and +-infinity; with no bound, any finite float."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number

    def _describe_range(self) -> str:
        return "" if self.min is None and self.max is None else super()._describe_range()


class BoundedIntRange(click.IntRange):
    """click.IntRange that refuses integers past MAX_INT (its bound when none is given,
    which --help leaves out)."""

    def __init__(self, min: int | None = None, max: int | None = None, **kwargs: Any) -> None:
        super().__init__(min, MAX_INT if max is None else max, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        number = click.INT.convert(value, param, ctx)
        if number > MAX_INT and self.max == MAX_INT:  # a smaller max: its range says it
            self.fail(f"{number} is more than {MAX_INT}, the largest a worker reads.", param, ctx)
        return super().convert(number, param, ctx)

    def _describe_range(self) -> str:
        if self.max != MAX_INT:
            return super()._describe_range()
        if self.min is None:
            return ""
        return f"x{'>' if self.min_open else '>='}{self.min}"
