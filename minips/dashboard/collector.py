"""What the dashboard shows, collected in one background thread: the server's `stats`
(polled through PSClient.stats(), read-only: no hello, no rank; a server group's root
answers for the group, with every shard's stats beside its own) and the `eval` records of
a metrics JSONL file, turned into one JSON-ready snapshot with rates computed from
consecutive polls.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path
from typing import Any

from minips.worker.client import PSClient, ServerUnavailable

HISTORY = 900  # points of updates/s and samples kept for the chart (15 min at 1 s)
RATE_WINDOW = 3.0  # seconds of server uptime a rate is averaged over


def rate(older: dict[str, Any], newer: dict[str, Any], key: str) -> float:
    """(newer[key] - older[key]) / elapsed server uptime; 0.0 when no time passed."""
    elapsed = newer["uptime"] - older["uptime"]
    return (newer[key] - older[key]) / elapsed if elapsed > 0 else 0.0


def worker_rows(stats: dict[str, Any], window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per training worker (observers left out), with samples/s and steps/s.

    window: earlier polls, oldest first; a worker's rates are measured from the oldest one
    that already knew it (a worker that joined a second ago has a one-second rate).
    `behind` is how many clocks the worker is behind the fastest one.
    """
    workers = [w for w in stats.get("workers", []) if not w.get("observer")]
    fastest = max((w["clock"] for w in workers), default=0)
    rows = []
    for w in sorted(workers, key=lambda row: row["rank"]):
        samples_per_s = steps_per_s = 0.0
        for poll in window:
            old = next((v for v in poll.get("workers", []) if v["worker"] == w["worker"]), None)
            span = stats["uptime"] - poll["uptime"]
            if old is not None and span > 0:
                samples_per_s = (w["samples"] - old["samples"]) / span
                steps_per_s = (w["clock"] - old["clock"]) / span
                break
        rows.append(
            {
                "rank": w["rank"],
                "alive": w["alive"],
                "clock": w["clock"],
                "pushes": w["pushes"],
                "samples": w["samples"],
                "samples_per_s": samples_per_s,
                "steps_per_s": steps_per_s,
                "behind": fastest - w["clock"],
                "bytes_in": w["bytes_in"],
                "bytes_out": w["bytes_out"],
                "host": (w.get("info") or {}).get("host", ""),
            }
        )
    return rows


def shard_rows(stats: dict[str, Any], window: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per shard of a server group (none for a plain server): its updates, bytes,
    updates/s and bytes/s over the window, and `load`: its share of the group's bytes/s
    (each shard should carry about 1/K of them; docs/protocol.md 16.1)."""
    shards = stats.get("shards") or []
    rows = []
    for index, shard in enumerate(shards):
        row = {"shard": index, "joined": shard is not None, "updates": None, "version": None,
               "bytes_in": None, "bytes_out": None, "updates_per_s": 0.0, "bytes_per_s": 0.0,
               "load": 0.0}  # fmt: skip
        if shard is not None:
            row.update(updates=shard["updates"], bytes_in=shard["bytes_in"],
                       bytes_out=shard["bytes_out"], version=shard["version"])  # fmt: skip
            old = next((p["shards"][index] for p in window if len(p.get("shards") or []) > index
                        and p["shards"][index] is not None), None)  # fmt: skip
            if old is not None and shard["uptime"] > old["uptime"]:
                span = shard["uptime"] - old["uptime"]
                moved = shard["bytes_in"] + shard["bytes_out"] - old["bytes_in"] - old["bytes_out"]
                row["updates_per_s"] = (shard["updates"] - old["updates"]) / span
                row["bytes_per_s"] = moved / span
        rows.append(row)
    total = sum(row["bytes_per_s"] for row in rows)
    for row in rows:
        row["load"] = row["bytes_per_s"] / total if total > 0 else 0.0
    return rows


class EvalTail:
    """Reads `eval` records appended to a JSONL file, a complete line at a time."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self.offset = 0
        self.records: list[dict[str, Any]] = []

    def poll(self) -> None:
        if self.path is None or not self.path.is_file():
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
            if isinstance(record, dict) and record.get("event") == "eval":
                keys = ("time", "samples", "accuracy", "loss", "updates")
                self.records.append({k: record.get(k) for k in keys})


class Collector:
    """Polls `stats` every `interval` s in a thread; `snapshot()` is the latest view.

    `wait_newer(seq, timeout)` blocks until a snapshot newer than `seq` exists (for SSE).
    """

    def __init__(self, connect: str, metrics_path: str | Path | None, interval: float = 1.0):
        self.connect = connect
        self.interval = interval
        self.evals = EvalTail(metrics_path)
        self.polls: deque[dict[str, Any]] = deque(maxlen=64)
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY)
        self.seq = 0
        self.error: str | None = None
        self._snapshot: dict[str, Any] = {"seq": 0, "connected": False, "connect": connect}
        self._changed = threading.Condition()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def snapshot(self) -> dict[str, Any]:
        with self._changed:
            return self._snapshot

    def wait_newer(self, seq: int, timeout: float) -> dict[str, Any]:
        with self._changed:
            self._changed.wait_for(
                lambda: self._snapshot["seq"] > seq or self._stopped.is_set(), timeout
            )
            return self._snapshot

    def _run(self) -> None:
        # A short timeout and no retries: a stopped server must not freeze the page.
        with PSClient(self.connect, timeout=2.0, retries=0) as client:
            while not self._stopped.is_set():
                try:
                    stats, self.error = client.stats(), None
                except ServerUnavailable as exc:
                    stats, self.error = None, str(exc)
                self.evals.poll()
                self._publish(stats)
                self._stopped.wait(self.interval)

    def _publish(self, stats: dict[str, Any] | None) -> None:
        snapshot: dict[str, Any] = {"connect": self.connect, "connected": stats is not None}
        if stats is not None:
            window = self._window(stats)
            self.polls.append(stats)
            per_s = rate(window[0], stats, "updates") if window else 0.0
            self.history.append(
                {"uptime": stats["uptime"], "updates_per_s": per_s, "samples": stats["samples"]}
            )
            keys = ("version", "updates", "dropped", "samples", "rule", "world_size",
                    "live_workers", "bytes_in", "bytes_out", "staleness_mean",
                    "staleness_max", "uptime", "stopping")  # fmt: skip
            snapshot["stats"] = {key: stats.get(key) for key in keys}
            snapshot["updates_per_s"] = per_s
            snapshot["workers"] = worker_rows(stats, window)
            snapshot["shards"] = shard_rows(stats, window)
        snapshot["error"] = self.error
        snapshot["history"] = list(self.history)
        snapshot["evals"] = list(self.evals.records)
        with self._changed:
            self.seq += 1
            snapshot["seq"] = self.seq
            self._snapshot = snapshot
            self._changed.notify_all()

    def _window(self, stats: dict[str, Any]) -> list[dict[str, Any]]:
        """The kept polls within RATE_WINDOW s before this one (at least the last), oldest
        first; empty at the start or when the server restarted (its counters began again)."""
        if not self.polls or stats["uptime"] < self.polls[-1]["uptime"]:
            self.polls.clear()
            return []
        window = [self.polls[-1]]
        for poll in list(self.polls)[-2::-1]:
            if stats["uptime"] - poll["uptime"] > RATE_WINDOW:
                break
            window.insert(0, poll)
        return window
