"""What a run's report says about its data per worker: under a label-skewing --partition
(docs/model.md 4.2), each worker's examples per label, a row per worker.

    label_summary(run.config)  # {"partition", "histograms": [[n_0 .. n_9] per rank]} or None
    label_lines(report)        # the report's lines about it
"""

from __future__ import annotations

from typing import Any

from minips.errors import MinipsError
from minips.results.labels import worker_histograms


def label_summary(config: dict[str, Any]) -> dict[str, Any] | None:
    """The partition and its histograms, recomputed from the config (None: iid). When the
    dataset cannot be read here, the partition and why instead of the histograms."""
    partition = config.get("partition") or "iid"
    if partition == "iid" or "dataset" not in config:
        return None
    try:
        return {"partition": partition, "histograms": worker_histograms(config)}
    except MinipsError as exc:
        return {"partition": partition, "histograms": None, "why": str(exc)}


def label_lines(report: dict[str, Any]) -> list[str]:
    """ "examples per label (--partition dirichlet:0.1):", then one row per worker."""
    labels = report.get("labels")
    if not labels:
        return []
    head = f"  examples per label (--partition {labels['partition']}):"
    if labels["histograms"] is None:
        return [f"{head} not computed here: {labels['why']}"]
    rows = [head, f"  {'worker':>6} " + " ".join(f"{c:>5}" for c in range(10)) + "  labels"]
    for rank, counts in enumerate(labels["histograms"]):
        present = sum(1 for n in counts if n)
        rows.append(f"  {rank:>6} " + " ".join(f"{n:>5}" for n in counts) + f"  {present:>6}")
    return rows
