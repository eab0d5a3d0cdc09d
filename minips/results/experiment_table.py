"""The experiment grid's figures: one row per run, one cell per (setting, rule) over seeds,
the markdown tables and the grid plot (tools/experiment.py writes them).

A cell's accuracy is the mean and sample standard deviation (n - 1) of its runs' final
accuracies (summary.json `accuracy`); its time to the target is the mean over the runs
that reached it, with how many did. One run: no standard deviation, the table says
"1 seed".
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from minips.results.loading import load_run
from minips.results.report import summarize


def run_row(run_dir: Path, setting: str, seed: int, target: float) -> dict[str, Any]:
    """One finished run's figures, read back from its directory."""
    report = summarize(load_run(run_dir), target=target)
    s, reached, stale = report["summary"], report["target"]["reached"], report["staleness"]
    return {
        "run": run_dir.name, "setting": setting, "rule": s.get("rule"), "seed": seed,
        "accuracy": s.get("accuracy"), "time_to_target": reached["time"] if reached else None,
        "wall_s": s.get("wall_s"), "samples": s.get("samples"), "updates": s.get("updates"),
        "staleness_mean": stale["mean"], "staleness_p90": stale["p90"],
        "staleness_max": stale["max"], "bytes_up": s.get("bytes_up"),
        "bytes_down": s.get("bytes_down"),
    }  # fmt: skip


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation); sd None for one value, both None for none."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One (setting, rule) cell from its runs' rows (failed runs counted, not averaged)."""
    done = [r for r in rows if "error" not in r and r.get("accuracy") is not None]
    accuracy = [r["accuracy"] for r in done]
    times = [r["time_to_target"] for r in done if r["time_to_target"] is not None]
    acc_mean, acc_sd = mean_sd(accuracy)
    time_mean, time_sd = mean_sd(times)
    stale = [r["staleness_mean"] for r in done if r["staleness_mean"] is not None]
    return {
        "rule": rows[0]["rule"], "runs": len(rows), "failed": len(rows) - len(done),
        "seeds": [r["seed"] for r in done], "accuracy": accuracy,
        "accuracy_mean": acc_mean, "accuracy_sd": acc_sd, "reached": len(times),
        "time_to_target_mean": time_mean, "time_to_target_sd": time_sd,
        "wall_mean": mean_sd([r["wall_s"] for r in done if r["wall_s"] is not None])[0],
        "staleness_mean": mean_sd(stale)[0],
    }  # fmt: skip


def cells_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells of one setting's rows, one per rule in the order the rules first appear."""
    by_rule: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_rule.setdefault(row["rule"], []).append(row)
    return [aggregate(group) for group in by_rule.values()]


def pm(mean: float | None, sd: float | None, spec: str = ".4f", one: str = "1 seed") -> str:
    """ "0.8712 ± 0.0031", "0.8712 (1 seed)" (a mean of one value: `one` says of what) or "-"."""
    if mean is None:
        return "-"
    return f"{mean:{spec}} ± {sd:{spec}}" if sd is not None else f"{mean:{spec}} ({one})"


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def overview_table(cells: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Rules down, settings across: final accuracy mean ± sd in every cell."""
    settings, rules, found = _grid(cells)
    lines = ["| rule | " + " | ".join(settings) + " |", "| --- |" + " ---: |" * len(settings)]
    for rule in rules:
        entries = []
        for setting in settings:
            cell = found.get((setting, rule))
            entries.append(_cell_accuracy(cell) if cell else "")
        lines.append(f"| {rule} | " + " | ".join(entries) + " |")
    return lines


def _grid(cells: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[str], dict]:
    """The settings, the rules (in the order they first appear) and each (setting, rule)
    cell."""
    rules = list(dict.fromkeys(c["rule"] for row in cells.values() for c in row))
    return list(cells), rules, {(s, c["rule"]): c for s, row in cells.items() for c in row}


def _cell_accuracy(cell: dict[str, Any]) -> str:
    text = pm(cell["accuracy_mean"], cell["accuracy_sd"])
    return text + (f" ({cell['failed']} failed)" if cell["failed"] else "")


def setting_table(cells: list[dict[str, Any]], target: float) -> list[str]:
    """One setting's cells in detail: accuracy per seed, time to target, wall, staleness."""
    lines = [
        f"| rule | accuracy mean ± sd | per seed | time to {target:g} (s), mean ± sd | reached "
        "| wall (s), mean | staleness, mean |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        seeds = ", ".join(f"{a:.4f}" for a in c["accuracy"]) or "-"
        lines.append(
            f"| {c['rule']} | {_cell_accuracy(c)} | {seeds}"
            f" | {pm(c['time_to_target_mean'], c['time_to_target_sd'], '.1f', '1 run')}"
            f" | {c['reached']}/{c['runs']} | {_fmt(c['wall_mean'], '.1f')}"
            f" | {_fmt(c['staleness_mean'], '.2f')} |"
        )
    return lines


def plot_grid(cells: dict[str, list[dict[str, Any]]], out: Path, title: str) -> Path:
    """One PNG: final accuracy per setting, a bar per rule (mean), error bars one sd."""
    from minips.results.plot import _pyplot, _save

    plt = _pyplot()
    settings, rules, found = _grid(cells)
    width = 0.8 / max(len(rules), 1)
    fig, ax = plt.subplots(figsize=(2 + max(5.0, 0.25 * len(settings) * len(rules)), 4.5))
    for i, rule in enumerate(rules):
        xs, means, sds = [], [], []
        for j, setting in enumerate(settings):
            cell = found.get((setting, rule))
            if cell and cell["accuracy_mean"] is not None:
                xs.append(j + (i - (len(rules) - 1) / 2) * width)
                means.append(cell["accuracy_mean"])
                sds.append(cell["accuracy_sd"] or 0.0)
        ax.bar(xs, means, width, yerr=sds, capsize=2, label=rule)
    ax.set_xticks(range(len(settings)), settings)
    ax.set_ylabel("final test accuracy (mean ± sd over seeds)")
    ax.set_ylim(0, 1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars
    ax.set_title(title)
    fig.tight_layout()
    return _save(fig, plt, out)
