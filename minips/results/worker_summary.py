"""What a worker leaves and says when its run ends: its report written as JSON (the
launcher merges them) and one line of words for the person who started it (`minips
worker`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from minips.results.whole_file import write_whole
from minips.worker.worker import WorkerReport


def summary_line(report: dict[str, Any]) -> str:
    """A worker's report (WorkerReport.summary()) in one line of words, for a person."""
    if report["rank"] < 0:
        return "the run had already ended: nothing to do"
    busy = report["compute_s"] + report["comm_s"] + report["slowdown_s"]
    rate = f" ({report['samples'] / busy:.0f} samples/s)" if busy > 0 else ""
    end = "finished its shard" if report["finished"] else "stopped before its shard was done"
    if report["stopped_by_server"] and not report["finished"]:
        end = "stopped: the run ended"
    steps = f"{report['steps']} step{'s' * (report['steps'] != 1)}"
    staleness = f"staleness mean {report['staleness_mean']:.2f} max {report['staleness_max']}"
    took = f"{report['samples']} samples in {report['wall_s']:.1f} s{rate}"
    return f"rank {report['rank']}: {steps}, {took}, {staleness}; {end}"


def write_report(report: WorkerReport, path: str | Path) -> None:
    """Write a worker's report as one JSON object (the launcher merges them), whole or not at
    all: written beside its place, then renamed, so a launcher reading it as the run stops
    never finds it half written."""
    write_whole(path, json.dumps(report.summary()) + "\n")
