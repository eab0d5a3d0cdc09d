"""The progress display of `minips train`, `minips run` and `minips worker` (on stderr, so
stdout stays parsable): a bar on a terminal, a compact line every few seconds elsewhere."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

LINE_INTERVAL = 5.0  # seconds between two progress lines when stderr is not a terminal


class ProgressBar:
    """Progress driven by a `ProgressFn` callback (minips.results.metrics).

    Use: `with ProgressBar() as bar: train(..., progress=bar.update)`. On a terminal a click
    progress bar appears at the first update (the total is known only then), its label the
    newest figures the callback reports (training loss, test accuracy, updates). Piped or
    logged (stderr not a terminal), a line such as `training 1536/6000 samples (26%) loss
    0.512` every `interval` seconds and one at the end, instead of a line per update.
    """

    def __init__(self, interval: float = LINE_INTERVAL, label: str = "training") -> None:
        self.interval = interval
        self.label = label
        self._stream = sys.stderr
        self._on_terminal = self._stream.isatty()
        self._bar: Any = None
        self._done = 0
        self._total = 0
        self._latest: dict[str, Any] = {}
        self._last_line: float | None = None  # time.monotonic() of the last progress line
        self._shown: tuple[int, int] | None = None  # (done, total) at the last progress line
        self._waiting: str | None = None  # the seats the last waiting line named

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
        elif self._total and self._shown != (self._done, self._total):
            self._line()  # the last figures, whatever the interval

    def update(self, done: int, total: int, latest: dict[str, Any]) -> None:
        """Move the bar to `done` of `total` samples. Before the first sample, while the
        run waits for browser seats (latest["waiting"]: SeatWatch.waiting), one line that
        says so instead: counting down in place on a terminal, else printed again only
        when the free seats change."""
        if latest.get("waiting") and done == 0:
            self._wait(latest["waiting"])
            return
        if self._waiting is not None and self._on_terminal:
            self._stream.write("\n")  # keep the last waiting line; the bar starts below
        self._waiting = None
        self._total, self._latest = total, latest
        if not self._on_terminal:
            self._done = max(done, self._done)
            last = self._last_line
            if last is None or time.monotonic() - last >= self.interval:
                self._line()
            return
        if self._bar is None:
            self._bar = click.progressbar(length=total, label=self.label, file=self._stream)
            self._bar.__enter__()
        label = _label(self._latest)
        if label:
            self._bar.label = label
        if self._bar.length != total:  # the seats taken changed what the run will train
            self._bar.length = total
        self._bar.update(max(0, done - self._done))
        self._done = max(done, self._done)

    def _wait(self, waiting: dict[str, Any]) -> None:
        seats = waiting["seats"]
        line = f"waiting for {seats}: {waiting['left_s']:.0f} s left, then {waiting['then']}"
        if self._on_terminal:
            self._stream.write(f"\r{line}\x1b[K")  # the same line, rewritten
            self._stream.flush()
        elif seats != self._waiting:
            click.echo(line, file=self._stream)
        self._waiting = seats

    def _line(self) -> None:
        percent = 100 * self._done / self._total if self._total else 0
        figures = _label(self._latest)
        click.echo(
            f"{self.label} {self._done}/{self._total} samples ({percent:.0f}%)"
            + (f" {figures}" if figures else ""),
            file=self._stream,
        )
        self._last_line, self._shown = time.monotonic(), (self._done, self._total)


def _label(latest: dict[str, Any]) -> str:
    """ "loss 0.512 acc 0.871 upd 120", from whichever of these figures are known."""
    parts = []
    if latest.get("train_loss") is not None:
        parts.append(f"loss {latest['train_loss']:.3f}")
    if latest.get("accuracy") is not None:
        parts.append(f"acc {latest['accuracy']:.3f}")
    if latest.get("updates") is not None:
        parts.append(f"upd {latest['updates']}")
    return " ".join(parts)
