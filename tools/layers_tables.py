"""The layer-aware experiment's markdown tables, from its rows (tools/experiment_layers.py).

A row is one run: link, plan, seed, final accuracy, wall time, time_to / samples_to /
fitted_time_to per target ("0.80", "0.85"), bytes up and down per worker step, the load.
Times are the first evaluation at or above a target (`minips.results.report.time_to_target`)
and the fit of the whole curve (`experiment_layers.fitted_time_to`).
"""

from __future__ import annotations

import statistics
from typing import Any


def _mean_sd(values: list[float | None], digits: str = ".4g") -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    text = format(statistics.mean(got), digits)
    if len(got) > 1:
        text += f" ± {statistics.stdev(got):.2g}"
    return text + ("" if len(got) == len(values) else f" ({len(got)}/{len(values)})")


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.mean(got) if got and len(got) == len(values) else None


def group_rows(rows: list[dict[str, Any]], links: list[str]) -> dict[tuple[str, str], list[dict]]:
    keys = sorted({(r["link"], r["plan"]) for r in rows},
                  key=lambda k: (links.index(k[0]) if k[0] in links else 99, k[1]))  # fmt: skip
    return {k: [r for r in rows if (r["link"], r["plan"]) == k] for k in keys}


def table(rows: list[dict[str, Any]], links: list[str]) -> str:
    """Markdown: one line per (link, plan), means ± sd over seeds."""
    lines = [
        "| link | plan | seeds | time to 0.80 (s) | time to 0.85 (s) | final accuracy | "
        "wall (s) | KB up/step | KB down/step | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (link, plan), group in group_rows(rows, links).items():
        loads = [r["load"].get("before") for r in group if r.get("load")]
        lines.append(
            f"| {link} | {plan} | {len(group)} | "
            f"{_mean_sd([r['time_to']['0.80'] for r in group])} | "
            f"{_mean_sd([r['time_to']['0.85'] for r in group])} | "
            f"{_mean_sd([r['accuracy'] for r in group], '.4f')} | "
            f"{_mean_sd([r['wall_s'] for r in group])} | "
            f"{statistics.mean(r['up_per_step'] for r in group) / 1e3:,.1f} | "
            f"{statistics.mean(r['down_per_step'] for r in group) / 1e3:,.1f} | "
            f"{f'{min(loads):.1f}-{max(loads):.1f}' if loads else '-'} |"
        )
    return "\n".join(lines)


def per_seed(rows: list[dict[str, Any]], links: list[str]) -> str:
    """Markdown: one line per run, with the samples of the first evaluation at 0.85."""
    lines = [
        "| link | plan | seed | final accuracy | time to 0.80 (s) | time to 0.85 (s) | "
        "samples at 0.85 | fitted time to 0.80 / 0.85 (s) | first update (s) | wall (s) | "
        "KB up/step | KB down/step | load start-end |",
        "| --- | --- " + "| ---: " * 11 + "|",
    ]
    for (link, plan), group in group_rows(rows, links).items():
        for r in sorted(group, key=lambda r: r["seed"]):
            t80, t85 = (r["time_to"][t] for t in ("0.80", "0.85"))
            at85 = r.get("samples_to", {}).get("0.85")
            fit = " / ".join("-" if v is None else f"{v:.1f}" for v in r["fitted_time_to"].values())
            load = r.get("load") or {}
            first = "-" if r.get("first_update_s") is None else f"{r['first_update_s']:.1f}"
            lines.append(
                f"| {link} | {plan} | {r['seed']} | {r['accuracy']:.4f} | "
                + " | ".join("-" if v is None else f"{v:.1f}" for v in (t80, t85))
                + f" | {'-' if at85 is None else f'{at85:,}'} | {fit} | {first} | "
                f"{r['wall_s']:.1f} | "
                f"{r['up_per_step'] / 1e3:,.1f} | {r['down_per_step'] / 1e3:,.1f} | "
                f"{load.get('before', 0):.1f}-{load.get('after', 0):.1f} |"
            )
    return "\n".join(lines)


def _sooner(dense: list[dict], other: list[dict], key: str) -> list[str]:
    """Per target, dense's mean time over `other`'s (rows' `key`: time_to, fitted_time_to or
    after_first_update), as a table cell; "-" where either group never got there."""
    cells = []
    for target in ("0.80", "0.85"):
        d = _mean([r[key][target] for r in dense])
        o = _mean([r[key][target] for r in other])
        cells.append(f"{d / o:.2f}" if d and o else "-")
    return cells


def versus(rows: list[dict[str, Any]], links: list[str], plan: str = "auto") -> str:
    """Markdown: `plan` against dense per link: how much sooner to each target, the
    accuracy difference, and how many times fewer bytes up and in total."""
    lines = [
        f"| link | dense / {plan}: time to 0.80 | time to 0.85 | accuracy {plan} - dense "
        "(points) | bytes up: dense / " + plan + " | bytes in all: dense / " + plan + " |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    groups = group_rows(rows, links)
    for link in links:
        dense, other = groups.get((link, "dense")), groups.get((link, plan))
        if not dense or not other:
            continue
        cells = _sooner(dense, other, "time_to")
        gap = 100 * (statistics.mean(r["accuracy"] for r in other)
                     - statistics.mean(r["accuracy"] for r in dense))  # fmt: skip
        up = [statistics.mean(r["up_per_step"] for r in g) for g in (dense, other)]
        total = [statistics.mean(r["up_per_step"] + r["down_per_step"] for r in g)
                 for g in (dense, other)]  # fmt: skip
        lines.append(f"| {link} | {cells[0]} | {cells[1]} | {gap:+.2f} | "
                     f"{up[0] / up[1]:.1f} | {total[0] / total[1]:.1f} |")  # fmt: skip
    return "\n".join(lines)


def fitted(rows: list[dict[str, Any]], links: list[str]) -> str:
    """Markdown: the fitted times to 0.80 and 0.85 (`fitted_time_to`), means ± sd over
    seeds, and dense's mean over each plan's on the same link."""
    titles = ["fitted time to 0.80 (s)", "fitted time to 0.85 (s)"]
    return _against_dense(rows, links, "fitted_time_to", titles)


def after_startup(rows: list[dict[str, Any]], links: list[str]) -> str:
    """Markdown: the times to 0.80 and 0.85 counted from the run's first update (its
    processes started, the data loaded: 6-8 s here, the same work under every plan),
    means ± sd over seeds, and dense's mean over each plan's on the same link."""
    titles = ["to 0.80 after it (s)", "to 0.85 after it (s)"]
    first = ("first update (s)", "first_update_s")
    return _against_dense(rows, links, "after_first_update", titles, first)


def _against_dense(
    rows: list[dict[str, Any]],
    links: list[str],
    key: str,
    titles: list[str],
    first: tuple[str, str] | None = None,
) -> str:
    """Markdown, a line per (link, plan): the seeds, the mean ± sd of the row key `first`
    names (if any), of the rows' `key` times to 0.80 and 0.85, and dense's mean over the
    plan's (`_sooner`)."""
    columns = ["link", "plan", "seeds", *([first[0]] if first else []), *titles]
    columns += ["dense / plan: 0.80", "0.85"]
    lines = [
        "| " + " | ".join(columns) + " |",
        "| --- | --- " + "| ---: " * (len(columns) - 2) + "|",
    ]
    groups = group_rows(rows, links)
    for (link, plan), group in groups.items():
        cells = [str(len(group))]
        if first:
            cells.append(_mean_sd([r.get(first[1]) for r in group]))
        cells += [_mean_sd([r[key][target] for r in group]) for target in ("0.80", "0.85")]
        cells += _sooner(groups.get((link, "dense"), []), group, key)
        lines.append(f"| {link} | {plan} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
