"""What a run says: the library behind `minips report`.

A run directory (minips.run.rundir) is loaded with `load_run`; everything here is a pure
function over its records, so the numbers can be tested on hand-written logs:

    run = load_run("runs/latest")
    report = summarize(run, target=0.85)     # a JSON-ready dict
    print(format_report(report))             # the terminal view

Staleness is the clock staleness tau = t - base of each push, as the server logged it in
its `update` records (one entry per push folded into the update), attributed to the
pushing worker.
"""

from __future__ import annotations

import math
from typing import Any

from minips.run.rundir import Run
from minips.web.slots import agent_name

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
    """rule + heterogeneity, e.g. "asgd x4 hetero 1,1,2,8": for runs whose names collide."""
    cfg, summary = run.config, run.summary
    label = f"{cfg.get('rule', summary.get('rule', '?'))} x{cfg.get('workers', '?')}"
    if cfg.get("hetero"):
        label += " hetero " + ",".join(f"{f:g}" for f in cfg["hetero"])
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
    every_push = [tau for taus in staleness.values() for tau in taus]
    summary = dict(run.summary)
    if not summary and evals:  # an interrupted run: what the logs can tell
        summary = {"accuracy": evals[-1].get("accuracy"), "loss": evals[-1].get("loss"),
                   "updates": len(updates), "samples": evals[-1].get("samples")}  # fmt: skip
        times = [r["time"] for r in run.records if isinstance(r.get("time"), (int, float))]
        if times:
            summary["logged_s"] = max(times)  # the last record: a lower bound of the wall time
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
        "evals": len(evals),
        "staleness": distribution(every_push),
        "workers": per_worker,
    }
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


# --- terminal view ---------------------------------------------------------------------

_BARS = " ▁▂▃▄▅▆▇█"


def human_bytes(n: float | None) -> str:
    """1234567 -> "1.2 MB" (decimal units, as network rates are quoted)."""
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # unreachable; keeps type checkers content


def sparkline(counts: dict[str, int]) -> str:
    """One block character per histogram bin, height relative to the largest bin."""
    top = max(counts.values(), default=0)
    if top == 0:
        return ""
    return "".join(_BARS[math.ceil(c / top * (len(_BARS) - 1))] for c in counts.values())


def _num(value: Any, spec: str = ".2f") -> str:
    if value is None:
        return "-"  # unknown, as opposed to "" (not applicable)
    return format(value, spec) if isinstance(value, float) else str(value)


def plural(count: Any, noun: str) -> str:
    """ "1 worker", "4 workers" ("? workers" when the count is unknown)."""
    return f"{count if count is not None else '?'} {noun}{'' if count == 1 else 's'}"


def _wall_text(wall: float | None, logged: float | None) -> str:
    """ "wall 12.30 s"; for an interrupted run "logged 8.31 s" (its last record) or nothing
    known: "wall unknown"."""
    if wall is not None:
        return f"wall {wall:.2f} s"
    return f"logged {logged:.2f} s" if logged is not None else "wall unknown"


def _staleness_row(
    name: str, who: str, slow: str, steps: Any, dist: dict[str, Any], scale: Any
) -> str:
    hist = dist.get("histogram") or {}
    bins = " ".join(f"{label}:{count}" for label, count in hist.items() if count)
    return (
        f"  {name:>6} {who} {slow:>5} {_num(steps):>6} {dist['count']:>6} {_num(dist['mean']):>6}"
        f" {_num(dist['p50']):>4} {_num(dist['p90']):>4} {_num(dist['max']):>4}"
        f" {_num(scale, '.3g'):>6}  {sparkline(hist)} {bins}"
    ).rstrip()


def _who(worker: dict[str, Any]) -> str:
    """A worker's agent, host and speed columns of the per-worker table."""
    host = str(worker.get("host") or "-")[:14]
    return (
        f"{worker.get('agent') or '-':<11} {host:<14} {_num(worker.get('samples_per_s'), '.0f'):>9}"
    )


def format_report(report: dict[str, Any]) -> str:
    """The terminal view of one `summarize` result: a few lines and a per-worker table."""
    cfg, s = report["config"], report["summary"]
    lines = [f"== {report['path']}"]
    if not report["complete"]:
        lines.append("  INCOMPLETE: no metrics.jsonl (interrupted?); read from the partial logs")
    lines.append(
        f"  {cfg.get('rule')}, {plural(cfg.get('workers'), 'worker')}"
        + (f" (hetero {','.join(f'{f:g}' for f in cfg['hetero'])})" if cfg.get("hetero") else "")
        + f", {cfg.get('model')} on {cfg.get('dataset')}, "
        + (
            f"budget {cfg['max_samples']} samples,"
            if cfg.get("max_samples")
            else f"{cfg.get('epochs')} epoch(s),"
        )
        + f" batch {cfg.get('batch_size')}, lr {cfg.get('lr')}, momentum {cfg.get('momentum')}"
    )
    wall, samples = s.get("wall_s"), s.get("samples")
    rate = f" ({samples / wall:.0f}/s)" if wall and samples else ""
    lines.append(
        f"  accuracy {_num(s.get('accuracy'), '.4f')}  loss {_num(s.get('loss'), '.4f')}"
        f"  {_wall_text(wall, s.get('logged_s'))}  samples {_num(samples)}{rate}"
        f"  updates {_num(s.get('updates'))}"
    )
    lines.append(
        f"  bytes up {human_bytes(s.get('bytes_up'))}  down {human_bytes(s.get('bytes_down'))}"
        f"  evaluations {report['evals']}"
    )
    if s.get("collapse"):
        c = s["collapse"]
        lines.append(
            f"  COLLAPSED, stopped after {c['updates']} updates: {c['what']}; {c['advice']}"
        )
    if report.get("dropped"):
        lines.append(f"  dropped updates {report['dropped']} (logged but not applied)")
    if "target" in report:
        goal, hit = report["target"]["accuracy"], report["target"]["reached"]
        lines.append(
            f"  reached {goal:g} at {hit['time']:.2f} s ({hit['samples']} samples)"
            if hit
            else f"  never reached {goal:g}"
        )
    lines.append("  clock staleness per push (updates applied between a worker's pull and push):")
    lines.append(
        f"  {'worker':>6} {'agent':<11} {'host':<14} {'samples/s':>9} {'slow':>5} {'steps':>6}"
        f" {'pushes':>6} {'mean':>6} {'p50':>4} {'p90':>4} {'max':>4} {'scale':>6}  histogram"
    )
    for rank, w in report["workers"].items():
        slow = f"{w['slowdown']:g}x" if w["slowdown"] is not None else "-"
        who = _who(w)
        lines.append(_staleness_row(rank, who, slow, w["steps"], w["staleness"], w["scale_mean"]))
    blank = " " * len(_who({}))
    lines.append(_staleness_row("all", blank, "", "", report["staleness"], None))
    if "bytes_by_layer" in report:
        lines.append(
            "  bytes per layer (workers' pushes up, their pulls down; per step and in all):"
        )
        lines.append(f"  {'layer':>10} {'up/step':>10} {'down/step':>10} {'up':>10} {'down':>10}")
        for layer, b in report["bytes_by_layer"].items():
            lines.append(
                f"  {layer:>10} {human_bytes(b.get('up_per_step')):>10}"
                f" {human_bytes(b.get('down_per_step')):>10}"
                f" {human_bytes(b['up']):>10} {human_bytes(b['down']):>10}"
            )
    if "shards" in report:
        lines.append(f"  server group of {len(report['shards'])} shards (bytes: all clients'):")
        lines.append(f"  {'shard':>6} {'updates':>8} {'bytes up':>10} {'down':>10}"
                     f" {'share':>6} {'restarts':>8} {'updates lost':>12}")  # fmt: skip
        total = sum((row["bytes_up"] or 0) + (row["bytes_down"] or 0) for row in report["shards"])
        for row in report["shards"]:
            moved = (row["bytes_up"] or 0) + (row["bytes_down"] or 0)
            share = f"{100 * moved / total:.0f}%" if total else "-"
            lines.append(
                f"  {row['shard']:>6} {_num(row['updates']):>8} {human_bytes(row['bytes_up']):>10}"
                f" {human_bytes(row['bytes_down']):>10} {share:>6} {row['restarts']:>8}"
                f" {row['updates_lost']:>12}"
            )
    if "value_staleness" in report:
        lines.append("  value staleness per layer (typical updates behind, in value):")
        lines.append(f"  {'layer':>10} {'count':>6} {'mean':>7} {'p50':>7} {'p90':>7} {'max':>7}")
        for layer, d in report["value_staleness"].items():
            lines.append(
                f"  {layer:>10} {d['count']:>6} {_num(d['mean']):>7} {_num(d['p50']):>7}"
                f" {_num(d['p90']):>7} {_num(d['max']):>7}"
            )
    return "\n".join(lines)
