"""The terminal view of what a run says: `minips report`'s text.

`format_report(summarize(run))` (minips.results.report) is a few lines about the run and a
per-worker staleness table (with a sparkline of each histogram), then the bytes per
layer, a server group's shards and the value staleness when the run has them.
`human_bytes` and `plural` are the small words of it, used by other commands' lines too.
"""

from __future__ import annotations

import math
from typing import Any

from minips.results.group_counts import behind_line
from minips.results.report_labels import label_lines
from minips.results.report_plan import plan_lines
from minips.results.versions import (
    interrupted_line,
    stopped_line,
    untested_line,
    version_text,
)

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


def _from(summary: dict[str, Any]) -> str:
    """ " (the last evaluation's count; the server left none)": where an interrupted run's
    count is from when its server left none (an evaluation lags the training)."""
    if not summary.get("samples_from"):
        return ""
    return f" ({summary['samples_from']}'s count; the server left none)"


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


def _workers_text(workers: Any, never_taken: Any) -> str:
    """ "4 workers", or "3 of 4 workers took part (1 seat never taken)"."""
    if not never_taken or workers is None:
        return plural(workers, "worker")
    seats = plural(never_taken, "seat")
    return f"{workers - never_taken} of {plural(workers, 'worker')} took part ({seats} never taken)"


def _of_version(summary: dict[str, Any]) -> str:
    """ " (version 688)": the version the accuracy is of, when the summary names it."""
    version = summary.get("accuracy_version")
    return "" if version is None else f" ({version_text(version)})"


def format_report(report: dict[str, Any]) -> str:
    """The terminal view of one `summarize` result: a few lines and a per-worker table."""
    cfg, s = report["config"], report["summary"]
    lines = [f"== {report['path']}"]
    if not report["complete"]:
        lines.append("  INCOMPLETE: no metrics.jsonl (interrupted?); read from the partial logs")
    lines += [f"  NOTE: {note}" for note in report.get("notes", [])]
    lines.append(
        f"  {cfg.get('rule')}, {_workers_text(cfg.get('workers'), report.get('never_taken'))}"
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
        f"  accuracy {_num(s.get('accuracy'), '.4f')}{_of_version(s)}"
        f"  loss {_num(s.get('loss'), '.4f')}"
        f"  {_wall_text(wall, s.get('logged_s'))}  samples {_num(samples)}{rate}{_from(s)}"
        f"  updates {_num(s.get('updates'))}"
    )
    if untested := untested_line(s):
        lines.append(f"  NOT THE FINAL MODEL: {untested}")
    if stopped := stopped_line(s):
        lines.append(f"  STOPPED EARLY: {stopped}")
    if interrupted := interrupted_line(s):
        lines.append(f"  INTERRUPTED: {interrupted}")
    lines.append(
        f"  bytes up {human_bytes(s.get('bytes_up'))}  down {human_bytes(s.get('bytes_down'))}"
        f"  evaluations {report['evals']}"
    )
    lines += plan_lines(report)
    lines += label_lines(report)
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
        if w.get("never_taken"):
            lines.append(f"  {rank:>6} {'-':<11} {'-':<14} {'-':>9} never taken")
            continue
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
        if behind := behind_line(s.get("behind")):  # the run's counts are that shard's
            lines.append(f"  {behind}")
    if "value_staleness" in report:
        lines.append("  value staleness per layer (typical updates behind, in value):")
        lines.append(f"  {'layer':>10} {'count':>6} {'mean':>7} {'p50':>7} {'p90':>7} {'max':>7}")
        for layer, d in report["value_staleness"].items():
            lines.append(
                f"  {layer:>10} {d['count']:>6} {_num(d['mean']):>7} {_num(d['p50']):>7}"
                f" {_num(d['p90']):>7} {_num(d['max']):>7}"
            )
    return "\n".join(lines)
