"""The table `minips plan` prints: a planner report (minips.run.plan_measure.choose_plan) as text.

One row per parameter (its layer's measured compute, its bytes dense, fp16 and top-k 1%,
the chosen push and pull with their bytes), then the link, the predicted step and time to
accuracy, and the choice.
"""

from __future__ import annotations

import os

from minips.run.plan_measure import describe_network
from minips.transmission.planning.plan_costs import pull_bytes, push_bytes, spec_text
from minips.transmission.planning.planner import PlanReport, topk


def format_table(report: PlanReport) -> str:
    """The per-parameter table `minips plan` prints, then the link, the predicted step and
    time to accuracy, and the choice."""
    b = report.batch_size
    times = {t.layer: t for t in report.measured.layers}
    head = (
        f"{'param':8} {'shape':>10} {'fwd ms':>7} {'bwd ms':>7} {'dense':>9} {'fp16':>9} "
        f"{'topk 1%':>9}  {'push':>12} {'bytes':>9}  {'pull':>14} {'bytes':>9}"
    )
    lines = [head]
    shown = set()
    for c in report.choices:
        t = times.get(c.layer)
        fwd = bwd = ""
        if t is not None and c.layer not in shown:
            fwd, bwd = f"{t.forward_ms:.2f}", f"{t.backward_ms:.2f}"
            shown.add(c.layer)
        cells = [push_bytes(s, c.shape, b) for s in ("dense", "fp16", topk(0.01))]
        lines.append(
            f"{c.name:8} {'x'.join(map(str, c.shape)):>10} {fwd:>7} {bwd:>7} "
            + " ".join(f"{v:9,d}" for v in cells)
            + f"  {spec_text(c.push):>12} {push_bytes(c.push, c.shape, b):9,d}"
            f"  {spec_text(c.pull):>14} {pull_bytes(c.pull, c.shape):9,d}"
        )
    p, cluster = report.plan.predicted, report.cluster
    dense = sum(push_bytes("dense", c.shape, b) for c in report.choices)
    parts = p["step_parts_ms"]
    how = (
        "given" if cluster.compute_ms is not None
        else f"{p['compute_cpu_ms']:.1f} ms CPU x {cluster.contention():.2g} "
        f"({cluster.workers} workers and {cluster.servers} server(s) on "
        f"{cluster.cores or os.cpu_count()} cores)"
    )  # fmt: skip
    lines += [
        "",
        f"link: {describe_network(report.network, cluster)}",
        f"compute per step of {b}: {p['compute_ms']:.1f} ms ({how})",
        f"bytes per step: up {p['up_bytes_per_step']:,} (dense {dense:,}), "
        f"down {p['down_bytes_per_step']:,} (dense {dense:,})",
        f"predicted step: {p['step_ms']:.1f} ms = compute {parts['compute']:.1f} + push "
        f"{parts['push']:.1f} + server {parts['server']:.1f} + pull {parts['pull']:.1f} "
        f"(dense: {p['dense_step_ms']:.1f} ms)",
        f"samples to an accuracy: x{p['samples_factor']:.3f} of dense's; time to it: "
        f"x{p['time_to_accuracy_vs_dense']:.3f} of dense's",
        f"candidates, time to accuracy x dense's: dense sent wait-free "
        f"x{p['dense_wait_free_time_vs_dense']:.3f}, lossless codecs (dense, fp16, sf) "
        f"x{p['lossless_time_vs_dense']:.3f}, with lossy ones x{p['lossy_time_vs_dense']:.3f}"
        f" (a step down is taken at x{p['min_gain']:g} of the less lossy or less): "
        f"{p['chosen']}",
        "choice: "
        + {
            "dense": "all dense (the link is fast enough)",
            "dense wait-free": "all dense, wait-free sending (the push hides behind backward)",
        }.get(p["chosen"], "per-layer codecs above, wait-free sending"),
    ]
    return "\n".join(lines)
