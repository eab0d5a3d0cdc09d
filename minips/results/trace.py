"""`--trace FILE`: a Chrome trace of one worker's compute and communication, and its summary.

The file is in the Trace Event Format (Google's Catapult spec "Trace Event Format", the JSON
that chrome://tracing and https://ui.perfetto.dev open). Every span is a complete event:

    {"ph": "X", "name": "fc1", "cat": "send", "ts": 1234.5, "dur": 56.7, "pid": 4242,
     "tid": 2, "args": {...}}          # ts and dur in microseconds since the trace began

plus one "M" (metadata) event per thread naming its row ("main", "sender", ...).

Categories the worker uses and `summarize` reads (use these names):
    step      one training step, args {"step": i}: the summary's unit
    compute   forward / backward of a layer (name = layer)
    send      a push of a layer's gradient on the wire (name = layer)
    recv      a pull of a layer's parameters (name = layer)

Tracing is off by default: `open_trace(None)` is a `NullTrace` whose `span` returns one shared
do-nothing context manager, so the worker's code can trace unconditionally.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from minips.results.whole_file import write_whole

# The categories and the switched-off trace are the worker's (it is given a trace).
from minips.worker.hooks import COMM, COMPUTE, RECV, SEND, STEP, NullTrace  # noqa: F401


class _Span:
    """The context manager `Trace.span` returns: times its body, records it on exit."""

    __slots__ = ("trace", "name", "cat", "tid", "args", "start")

    def __init__(self, trace: Trace, name: str, cat: str, tid: str | None, args) -> None:
        self.trace, self.name, self.cat, self.tid, self.args = trace, name, cat, tid, args

    def __enter__(self) -> _Span:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.trace.complete(
            self.name, self.cat, self.start, time.perf_counter(), self.tid, self.args
        )


class Trace:
    """Collects complete events in memory (thread-safe) and writes the JSON file on `close`.

    Times given to `complete` are `time.perf_counter()` seconds (`Trace.now()`), the clock
    `span` uses. `tid` is a row name ("main", "sender"); None means the calling thread's
    name. Writing once at the end keeps the per-event cost to a list append (~1 us).
    """

    enabled = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.pid = os.getpid()
        self._origin = time.perf_counter()
        self._events: list[dict[str, Any]] = []
        self._tids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def now() -> float:
        """The trace's clock: time.perf_counter() seconds."""
        return time.perf_counter()

    def span(
        self, name: str, cat: str, tid: str | None = None, args: dict[str, Any] | None = None
    ) -> AbstractContextManager[Any]:
        """`with trace.span("conv1", "compute"):` records the body as one complete event."""
        return _Span(self, name, cat, tid, args)

    def complete(
        self,
        name: str,
        cat: str,
        start: float,
        end: float,
        tid: str | None = None,
        args: dict[str, Any] | None = None,
    ) -> None:
        """Record a span that ran from `start` to `end` (perf_counter seconds) on row `tid`."""
        row = threading.current_thread().name if tid is None else tid
        event = {
            "ph": "X",
            "name": name,
            "cat": cat,
            "ts": (start - self._origin) * 1e6,
            "dur": max(0.0, end - start) * 1e6,
            "pid": self.pid,
        }
        if args:
            event["args"] = args
        with self._lock:
            event["tid"] = self._tids.setdefault(row, len(self._tids) + 1)
            self._events.append(event)

    def events(self) -> list[dict[str, Any]]:
        """All events so far: the row-naming metadata first, then the spans in record order."""
        with self._lock:
            names = [
                {"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "ts": 0,
                 "args": {"name": row}}
                for row, tid in self._tids.items()
            ]  # fmt: skip
            return names + list(self._events)

    def close(self) -> None:
        """Write the file (atomically: a reader never sees half a trace). Idempotent."""
        if self._closed:
            return
        self._closed = True
        document = {"traceEvents": self.events(), "displayTimeUnit": "ms"}
        write_whole(self.path, json.dumps(document, separators=(",", ":")))

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_trace(path: str | os.PathLike[str] | None) -> Trace | NullTrace:
    """A Trace writing to `path`, or a NullTrace when `path` is None (no --trace)."""
    return NullTrace() if path is None else Trace(path)


# --- summary ------------------------------------------------------------------------------


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end) intervals into disjoint ones, sorted."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list:
    """Intersection of two disjoint sorted interval lists (a two-pointer sweep)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _clip(spans: list[tuple[float, float]], start: float, end: float) -> list:
    return [(max(s, start), min(e, end)) for s, e in spans if s < end and e > start]


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step: wall time, compute time, comm time and their overlap, in milliseconds.

    compute = length of the union of `compute` spans inside the step; comm = the same for
    `send` and `recv` spans; overlap = length of (compute union) & (comm union), the time
    the wire was busy while the CPU computed: what wait-free sending buys. exposed_comm =
    comm - overlap is the communication the step had to wait for. Without `step` spans the
    whole trace is one step. Returns {"steps": [...], "mean": {...}} with the same keys.
    """
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e["cat"] == STEP]
    if not steps and spans:
        first = min(e["ts"] for e in spans)
        last = max(e["ts"] + e["dur"] for e in spans)
        steps = [{"ts": first, "dur": last - first, "args": {"step": 0}}]
    compute = _union((e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] == COMPUTE)
    comm = _union((e["ts"], e["ts"] + e["dur"]) for e in spans if e["cat"] in COMM)
    rows = []
    for index, step in enumerate(sorted(steps, key=lambda e: e["ts"])):
        start, end = step["ts"], step["ts"] + step["dur"]
        busy_cpu, busy_wire = _clip(compute, start, end), _clip(comm, start, end)
        overlap = _length(_intersect(busy_cpu, busy_wire))
        row = {
            "step": step.get("args", {}).get("step", index),
            "wall_ms": (end - start) / 1e3,
            "compute_ms": _length(busy_cpu) / 1e3,
            "comm_ms": _length(busy_wire) / 1e3,
            "overlap_ms": overlap / 1e3,
        }
        row["exposed_comm_ms"] = row["comm_ms"] - row["overlap_ms"]
        rows.append(row)
    keys = ["wall_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms"]
    mean = {k: sum(r[k] for r in rows) / len(rows) if rows else 0.0 for k in keys}
    return {"steps": rows, "mean": mean}


def load_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a trace file (either the object form or a bare JSON array)."""
    document = json.loads(Path(path).read_text())
    return document["traceEvents"] if isinstance(document, dict) else document


def main(argv: list[str] | None = None) -> int:
    """`python -m minips.results.trace FILE...`: print each trace's mean step breakdown."""
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m minips.results.trace TRACE.json [...]", file=sys.stderr)
        return 2
    print(f"{'trace':30} {'steps':>5} {'wall':>8} {'compute':>8} {'comm':>8} {'overlap':>8}"
          f" {'exposed':>8}  (ms, mean per step)")  # fmt: skip
    for path in paths:
        summary = summarize(load_events(path))
        m = summary["mean"]
        print(f"{str(path)[-30:]:30} {len(summary['steps']):5d} {m['wall_ms']:8.2f}"
              f" {m['compute_ms']:8.2f} {m['comm_ms']:8.2f} {m['overlap_ms']:8.2f}"
              f" {m['exposed_comm_ms']:8.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
