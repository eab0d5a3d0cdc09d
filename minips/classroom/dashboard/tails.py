"""The JSONL files the dashboard follows as they grow: the evaluator's `eval` records and
the server's `update` records (its --updates-log; `minips run` writes RUN_DIR/updates.jsonl
and, after a restart, updates-N.jsonl), read a complete line at a time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HISTOGRAM_BINS = 30  # staleness 0..29, then one bin for 30 and more


class JsonlTail:
    """The records appended to one JSONL file since the last `poll()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def poll(self) -> Iterator[dict[str, Any]]:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self.offset += end
        for line in chunk[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # not ours to judge: the dashboard only reads
            if isinstance(record, dict):
                yield record


class EvalTail:
    """Reads `eval` records appended to a JSONL file, a complete line at a time."""

    def __init__(self, path: str | Path | None) -> None:
        self.tail = JsonlTail(Path(path)) if path else None
        self.records: list[dict[str, Any]] = []
        self.final = False  # the evaluator tested the final model (the server said stop)

    def poll(self) -> None:
        for record in self.tail.poll() if self.tail else ():
            if record.get("event") == "eval":
                keys = ("time", "samples", "accuracy", "loss", "updates")
                self.records.append({k: record.get(k) for k in keys})
                self.final = self.final or bool(record.get("final"))


@dataclass
class WorkerStaleness:
    """One rank's pushes as the server applied them: how stale, and how much they counted."""

    pushes: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    scale_sum: float = 0.0  # the factor on lr of each push (DASGD shrinks stale ones)

    def add(self, tau: int, scale: float) -> None:
        self.pushes += 1
        self.staleness_sum += tau
        self.staleness_max = max(self.staleness_max, tau)
        self.scale_sum += scale

    def summary(self) -> dict[str, float]:
        n = self.pushes or 1
        return {
            "staleness_mean": self.staleness_sum / n,
            "staleness_max": self.staleness_max,
            "scale_mean": self.scale_sum / n,
        }


@dataclass
class UpdateTail:
    """The staleness distribution (all pushes) and each rank's staleness and scale, from
    the `update` records of the server's update logs. `paths()` lists the logs to follow
    (a run's grows by one file per server restart)."""

    paths: Callable[[], list[Path]]
    histogram: Counter = field(default_factory=Counter)
    by_rank: dict[int, WorkerStaleness] = field(default_factory=dict)
    ended: bool = False
    _tails: dict[Path, JsonlTail] = field(default_factory=dict)

    def poll(self) -> None:
        for path in self.paths():
            tail = self._tails.setdefault(path, JsonlTail(path))
            for record in tail.poll():
                if record.get("event") == "update":
                    self._count(record)
                    self.ended = False  # a server (restarted, perhaps) is updating
                elif record.get("event") == "server":
                    self.ended = True

    def _count(self, record: dict[str, Any]) -> None:
        scale = record.get("scale", 1.0)
        if isinstance(scale, dict):  # one factor per parameter: their mean stands for it
            scale = sum(scale.values()) / len(scale) if scale else 1.0
        ranks, taus = record.get("workers", []), record.get("staleness", [])
        for rank, tau in zip(ranks, taus, strict=False):  # equal lengths, unless damaged
            if isinstance(rank, int) and isinstance(tau, int):
                self.histogram[min(tau, HISTOGRAM_BINS)] += 1
                self.by_rank.setdefault(rank, WorkerStaleness()).add(tau, float(scale))

    def bins(self) -> list[int]:
        """Counts of staleness 0, 1, ..., HISTOGRAM_BINS - 1, and HISTOGRAM_BINS or more
        (trailing empty bins left out)."""
        top = max(self.histogram, default=-1)
        return [self.histogram.get(tau, 0) for tau in range(top + 1)]


def single_log(path: str | Path | None) -> Callable[[], list[Path]]:
    """paths() for one update log (None: none)."""
    return (lambda: [Path(path)]) if path else (lambda: [])


def run_logs(run_dir: Path) -> Callable[[], list[Path]]:
    """paths() for a `minips run` directory: updates.jsonl, then updates-1.jsonl, ..."""
    from minips.results.rundir import RunDir

    return RunDir(run_dir).update_logs
