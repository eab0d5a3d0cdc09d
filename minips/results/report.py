"""What a run says: the library behind `minips report`.

A run directory (minips.results.rundir) is loaded with `load_run`; everything here is a pure
function over its records, so the numbers can be tested on hand-written logs:

    run = load_run("runs/latest")
    report = summarize(run, target=0.85)     # a JSON-ready dict
    print(format_report(report))             # the terminal view (minips.results.report_text)

Staleness is the clock staleness tau = t - base of each push, as the server logged it in
its `update` records (one entry per push folded into the update), attributed to the
pushing worker.
"""

from __future__ import annotations

import math
from typing import Any

from minips.classroom.web.slots import agent_name
from minips.ops.checkpoint_file import file_version
from minips.results.loading import Run
from minips.results.report_labels import label_summary
from minips.results.report_plan import link_text, plan_summary
from minips.results.rundir import LAST_EVALUATION, RunDir, final_stats
from minips.results.versions import kept_fields

# Staleness histogram bins: exact values up to 3, then powers of two (4-7, 8-15, ...), so a
# long tail of rare large delays fits on one line next to the common small ones.
EXACT_BINS = 4


# --- statistics ------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least q% of values <= it.

    Nearest rank (not interpolation) so an integer staleness stays an integer that
    actually occurred. `values` must be non-empty.
    """
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def bin_label(value: int) -> str:
    """The histogram bin of a staleness value: "0".."3", then "4-7", "8-15", ..."""
    if value < EXACT_BINS:
        return str(value)
    low = 1 << (int(value).bit_length() - 1)
    return f"{low}-{2 * low - 1}"


def histogram(values: list[int]) -> dict[str, int]:
    """Counts per staleness bin, bins in increasing order, empty bins in between kept."""
    if not values:
        return {}
    top = max(values)
    labels = [str(v) for v in range(min(top + 1, EXACT_BINS))]
    low = EXACT_BINS
    while low <= top:
        labels.append(f"{low}-{2 * low - 1}")
        low *= 2
    counts = dict.fromkeys(labels, 0)
    for value in values:
        counts[bin_label(int(value))] += 1
    return counts


def distribution(values: list[float], with_histogram: bool = True) -> dict[str, Any]:
    """count, mean, p50, p90, max (and the binned histogram) of a list of delays."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "max": None}
    stats: dict[str, Any] = {
        "count": len(values),
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "max": max(values),
    }
    if with_histogram:
        stats["histogram"] = histogram([int(v) for v in values])
    return stats


def staleness_by_worker(updates: list[dict[str, Any]]) -> dict[int, list[int]]:
    """The clock staleness of every push, grouped by the rank that pushed it.

    An `update` record lists the pushes it folds together: `workers[i]` pushed with
    staleness `staleness[i]` (one entry each under asgd, one per worker under ssgd).
    """
    by_worker: dict[int, list[int]] = {}
    for update in updates:
        pairs = zip(update.get("workers", []), update.get("staleness", []), strict=False)
        for rank, tau in pairs:  # not strict: a hand-edited or older log still reports
            by_worker.setdefault(int(rank), []).append(int(tau))
    return dict(sorted(by_worker.items()))


def push_rate_by_worker(
    updates: list[dict[str, Any]], samples: dict[int, int | None]
) -> dict[int, float]:
    """Samples per second of each rank while it trained: its samples times (n - 1) / n over
    the time from its first to its last applied push (n pushes: the first push's samples
    were computed before that time began). Ranks with one push, or none, have no rate."""
    times: dict[int, list[float]] = {}
    for update in updates:
        for rank in update.get("workers", []):
            if isinstance(update.get("time"), (int, float)):
                times.setdefault(int(rank), []).append(float(update["time"]))
    rates = {}
    for rank, seen in times.items():
        span, n, done = max(seen) - min(seen), len(seen), samples.get(rank)
        if n > 1 and span > 0 and done:
            rates[rank] = done * (n - 1) / n / span
    return rates


def scale_by_worker(updates: list[dict[str, Any]]) -> dict[int, float]:
    """Mean applied scale per worker (a per-layer scale counts as its mean over layers)."""
    sums: dict[int, list[float]] = {}
    for update in updates:
        scale = update.get("scale")
        if isinstance(scale, dict):
            scale = sum(scale.values()) / len(scale) if scale else None
        if scale is None:
            continue
        for rank in update.get("workers", []):
            sums.setdefault(int(rank), []).append(float(scale))
    return {rank: sum(v) / len(v) for rank, v in sorted(sums.items())}


def value_staleness_by_layer(updates: list[dict[str, Any]]) -> dict[str, list[float]]:
    """VSGD's value staleness d_l per layer, over all updates that logged it."""
    by_layer: dict[str, list[float]] = {}
    for update in updates:
        for layer, d in (update.get("value_staleness") or {}).items():
            if d is not None:
                by_layer.setdefault(layer, []).append(float(d))
    return by_layer


def time_to_target(
    evals: list[dict[str, Any]], target: float, wall_s: float | None = None
) -> dict[str, Any] | None:
    """The first evaluation at or above `target` accuracy: its time and samples, or None.

    The `final` evaluation runs during shutdown, after training ended at `wall_s`; the model
    it tests existed at `wall_s`, so that is the time it is credited with.
    """
    for record in evals:
        if record.get("accuracy") is not None and record["accuracy"] >= target:
            time = record.get("time")
            if record.get("final") and wall_s is not None and time is not None:
                time = min(time, wall_s)
            return {"time": time, "samples": record.get("samples")}
    return None


def run_label(run: Run) -> str:
    """rule + heterogeneity, e.g. "asgd x4 hetero 1,1,2,8 dirichlet:0.1": for runs whose names
    collide."""
    cfg, summary = run.config, run.summary
    label = f"{cfg.get('rule', summary.get('rule', '?'))} x{cfg.get('workers', '?')}"
    if cfg.get("hetero"):
        label += " hetero " + ",".join(f"{f:g}" for f in cfg["hetero"])
    if cfg.get("partition", "iid") != "iid":
        label += f" {cfg['partition']}"
    return label


def summarize(run: Run, target: float | None = None) -> dict[str, Any]:
    """Everything `minips report` shows about one run, as a JSON-ready dict."""
    updates = run.events("update")
    evals = run.events("eval")
    workers = {int(w["rank"]): w for w in run.events("worker") if "rank" in w}
    staleness = staleness_by_worker(updates)
    scales = scale_by_worker(updates)
    rates = push_rate_by_worker(updates, {r: w.get("samples") for r, w in workers.items()})
    hetero = run.config.get("hetero") or []
    per_worker = {}
    for rank in sorted(set(staleness) | set(workers)):
        report = workers.get(rank, {})
        per_worker[str(rank)] = {
            "agent": agent_name({"agent": report.get("agent", "numpy"), "ua": report.get("ua")}),
            "host": report.get("host"),
            "samples_per_s": rates.get(rank),
            "slowdown": report.get("slowdown", hetero[rank] if rank < len(hetero) else 1.0),
            "steps": report.get("steps"),
            "samples": report.get("samples"),
            "compute_s": report.get("compute_s"),
            "comm_s": report.get("comm_s"),
            "slowdown_s": report.get("slowdown_s"),
            "scale_mean": scales.get(rank),
            "staleness": distribution(staleness.get(rank, [])),
        }
    # A rank of a run directory nobody ever took (a browser seat no student opened): listed
    # as such (a `minips train` metrics file has no ranks).
    ranks = range(int(run.config.get("workers") or 0)) if run.path.is_dir() else range(0)
    never = [rank for rank in ranks if str(rank) not in per_worker]
    for rank in never:
        per_worker[str(rank)] = {"never_taken": True, "agent": None, "host": None,
                                 "samples_per_s": None, "slowdown": None, "steps": None,
                                 "samples": None, "scale_mean": None,
                                 "staleness": distribution([])}  # fmt: skip
    per_worker = dict(sorted(per_worker.items(), key=lambda item: int(item[0])))
    every_push = [tau for taus in staleness.values() for tau in taus]
    summary = dict(run.summary)
    if not summary and evals:  # an interrupted run: what the logs can tell
        summary = partial_summary(run, evals, updates)
    if summary and run.path.is_dir() and int(run.config.get("servers") or 1) == 1:
        # the model the directory keeps may not be the one the accuracy is of
        summary.update(kept_fields(summary, file_version(RunDir(run.path).checkpoint)))
    result: dict[str, Any] = {
        "run": run.name,
        "path": str(run.path),
        "complete": run.complete,
        "label": run_label(run),
        "config": {
            key: run.config.get(key)
            for key in (
                "model",
                "dataset",
                "epochs",
                "max_samples",
                "batch_size",
                "lr",
                "momentum",
                "rule",
                "rule_options",
                "workers",
                "hetero",
            )
        },  # fmt: skip
        "summary": summary,
        "never_taken": len(never),
        "evals": len(evals),
        "staleness": distribution(every_push),
        "workers": per_worker,
    }
    if run.notes:  # lines skipped reading the run (a process killed mid-write)
        result["notes"] = run.notes
    result["plan"] = plan_summary(run.path, run.config)
    result["link"] = link_text(run.config)
    if labels := label_summary(run.config):
        result["labels"] = labels
    if any("dropped" in u for u in updates):  # rules that may discard a push (e.g. cutoff)
        result["dropped"] = sum(bool(u.get("dropped")) for u in updates)
    layers = value_staleness_by_layer(updates)
    if layers:
        result["value_staleness"] = {
            layer: distribution(values, with_histogram=False) for layer, values in layers.items()
        }
    if summary.get("bytes_by_layer"):
        result["bytes_by_layer"] = layer_bytes_per_step(summary)
    if summary.get("shards"):  # a server group: each shard's counters and restarts
        result["shards"] = summary["shards"]
    if target is not None:
        reached = time_to_target(evals, target, summary.get("wall_s"))
        result["target"] = {"accuracy": target, "reached": reached}
    return result


def layer_bytes_per_step(summary: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per layer: array bytes up and down, in all and per worker step (server's counts)."""
    steps = summary.get("worker_steps") or 0
    rows = {}
    for layer, counts in summary["bytes_by_layer"].items():
        rows[layer] = dict(counts)
        if steps:
            rows[layer].update(
                up_per_step=counts["up"] / steps, down_per_step=counts["down"] / steps
            )  # noqa: E501
    return rows


def partial_summary(
    run: Run, evals: list[dict[str, Any]], updates: list[dict[str, Any]]
) -> dict[str, Any]:
    """What the logs of an interrupted run (no summary) tell: the last evaluation's accuracy;
    the samples and updates the server counted in its last `stats` (written when it stopped,
    also on Ctrl-C), else the last evaluation's count, which lags the training, and
    `samples_from` says so; `logged_s`, the last record's time (a lower bound of the wall
    time)."""
    summary: dict[str, Any] = {"accuracy": evals[-1].get("accuracy"),
                               "loss": evals[-1].get("loss"),
                               "accuracy_version": evals[-1].get("version")}  # fmt: skip
    final = final_stats(RunDir(run.path))[0] if run.path.is_dir() else {}
    if final.get("samples") is not None:
        summary["samples"] = final["samples"]
        summary["updates"] = final.get("updates", len(updates))
    else:
        summary["samples"] = evals[-1].get("samples")
        summary["updates"] = len(updates)
        summary["samples_from"] = LAST_EVALUATION
    times = [r["time"] for r in run.records if isinstance(r.get("time"), (int, float))]
    if times:
        summary["logged_s"] = max(times)
    return summary
