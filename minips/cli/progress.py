"""The progress bar of `minips train` and `minips run` (on stderr, so stdout stays parsable)."""

from __future__ import annotations

from typing import Any

import click


class ProgressBar:
    """A click progress bar driven by a `ProgressFn` callback (minips.metrics).

    Use: `with ProgressBar() as bar: train(..., progress=bar.update)`. The bar appears at
    the first update (the total is known only then); its label shows the newest figures
    the callback reports: training loss, test accuracy, updates.
    """

    def __init__(self) -> None:
        self._bar: Any = None
        self._done = 0

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def update(self, done: int, total: int, latest: dict[str, Any]) -> None:
        """Move the bar to `done` of `total` samples."""
        if self._bar is None:
            stream = click.get_text_stream("stderr")
            self._bar = click.progressbar(length=total, label="training", file=stream)
            self._bar.__enter__()
        label = _label(latest)
        if label:
            self._bar.label = label
        self._bar.update(max(0, done - self._done))
        self._done = max(done, self._done)


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
