"""Plots of run directories (matplotlib, an optional extra): the library behind `minips plot`.

    runs = [load_run(d) for d in dirs]
    plot_accuracy(runs, "accuracy.png", target=0.85)   # accuracy vs wall time and vs samples
    plot_staleness(runs, "staleness.png")              # per run: a staleness histogram per worker

matplotlib is imported on first use, with the headless Agg backend, so `import minips.results.plot`
works without it and nothing ever needs a display.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from minips.errors import MissingExtraError
from minips.results.loading import Run
from minips.results.report import run_label, staleness_by_worker


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; a one-line error when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError("plotting needs matplotlib: pip install 'minips[plot]'") from None
    matplotlib.use("Agg")  # headless: CI machines and ssh sessions have no display
    import matplotlib.pyplot as plt

    return plt


def labels_for(runs: list[Run]) -> list[str]:
    """Legend labels: the directory names, or rule + heterogeneity when those collide."""
    names = [run.name for run in runs]
    if len(set(names)) == len(names):
        return names
    labels = [run_label(run) for run in runs]
    if len(set(labels)) == len(labels):
        return labels
    return [str(run.path) for run in runs]  # last resort: always distinct


def plot_accuracy(
    runs: list[Run], out: str | Path, target: float | None = None, title: str | None = None
) -> Path:
    """One PNG, two panels: test accuracy vs wall time (s) and vs samples processed."""
    plt = _pyplot()
    fig, (by_time, by_samples) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for run, label in zip(runs, labels_for(runs), strict=True):
        evals = [e for e in run.events("eval") if e.get("accuracy") is not None]
        times = [e["time"] for e in evals]
        wall = run.summary.get("wall_s")
        if evals and evals[-1].get("final") and wall is not None:
            times[-1] = min(times[-1], wall)  # the final model existed when training ended
        accuracy = [e["accuracy"] for e in evals]
        (line,) = by_time.plot(times, accuracy, marker=".", label=label)
        by_samples.plot([e["samples"] for e in evals], accuracy, marker=".",
                        color=line.get_color(), label=label)  # fmt: skip
    for ax, xlabel in ((by_time, "wall time (s)"), (by_samples, "samples processed")):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    by_time.set_ylabel("test accuracy")
    by_samples.legend(fontsize="small", loc="lower right")
    fig.suptitle(title or "test accuracy")
    fig.tight_layout()
    return _save(fig, plt, out)


def plot_staleness(runs: list[Run], out: str | Path, title: str | None = None) -> Path:
    """One PNG, one panel per run: the clock staleness histogram of each worker's pushes.

    Each worker is a step outline over integer staleness values (bars of several workers
    would hide each other); the counts are fractions of that worker's pushes, so a slow
    worker with few pushes is as visible as a fast one.
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    cols = min(3, len(runs)) or 1
    rows = max(1, math.ceil(len(runs) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.5 * rows), squeeze=False)
    for ax, run, label in zip(axes.flat, runs, labels_for(runs), strict=False):
        hetero = run.config.get("hetero") or []
        by_worker = staleness_by_worker(run.events("update"))
        for rank, taus in by_worker.items():
            counts = Counter(taus)
            fractions = [counts.get(x, 0) / len(taus) for x in range(max(counts) + 1)]
            edges = [x - 0.5 for x in range(len(fractions) + 1)]  # each bar centred on tau
            slow = f" ({hetero[rank]:g}x)" if rank < len(hetero) else ""
            ax.stairs(fractions, edges, label=f"w{rank}{slow}", linewidth=1.5)
        top = max((max(taus) for taus in by_worker.values()), default=0)
        ax.set_xlim(-0.5, max(top, 2) + 1)  # a few integers in view, or ticks go fractional
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # staleness is a count
        ax.set_title(label, fontsize="medium")
        ax.set_xlabel("staleness (updates)")
        ax.set_ylabel("fraction of pushes")
        ax.grid(alpha=0.3)
        if by_worker:
            ax.legend(fontsize="x-small", ncol=2)
        else:
            ax.text(0.5, 0.5, "no updates logged", ha="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(runs) :]:
        ax.set_visible(False)  # the unused cells of the last row
    fig.suptitle(title or "clock staleness per worker")
    fig.tight_layout()
    return _save(fig, plt, out)


def _save(fig: Any, plt: Any, out: str | Path) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)  # figures are global in pyplot: a long grid would keep every one alive
    return path


def staleness_path(accuracy_png: str | Path) -> Path:
    """Where `minips plot --out X.png` puts the staleness figure: X-staleness.png."""
    path = Path(accuracy_png)
    return path.with_name(f"{path.stem}-staleness{path.suffix or '.png'}")
