"""What the dashboard shows, collected in one background thread: the server's `stats`
(polled through PSClient.stats(), read-only: no hello, no rank; a server group's root
answers for the group, with every shard's stats beside its own), the `eval` records of a
metrics JSONL file and the `update` records of the server's update log (minips.classroom.dashboard
.tails), turned into one JSON-ready snapshot with rates computed from consecutive polls.

A snapshot's `phase` says where the run is: "connecting" (no answer yet), "live",
"stopping", "finished" (the server stopped after saying so, or the launcher said the run
ended: `finish(summary)`), or "lost" (a server that was live stopped answering). Once the
server is gone the last numbers stay: the page keeps the run's final state.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from minips.classroom.dashboard.tails import EvalTail, UpdateTail, single_log
from minips.classroom.web.slots import agent_name, free_ranks
from minips.group.root import GROUPS
from minips.guard.curve import ClientKeys
from minips.ops.client_retries import RetryingClient, keys_hint
from minips.worker.client import ServerUnavailable

HISTORY = 900  # points of updates/s and samples kept for the chart (15 min at 1 s)
RATE_WINDOW = 3.0  # seconds of server uptime a rate is averaged over


def rate(older: dict[str, Any], newer: dict[str, Any], key: str) -> float:
    """(newer[key] - older[key]) / elapsed server uptime; 0.0 when no time passed."""
    elapsed = newer["uptime"] - older["uptime"]
    return (newer[key] - older[key]) / elapsed if elapsed > 0 else 0.0


def worker_state(row: dict[str, Any]) -> str:
    """ "waiting" (live, no push yet: its pull is held while the class assembles, or it is
    still loading), "training" (live), "finished" (said bye after its shard), or "left"
    (closed its tab, crashed, or declared dead: its rank is free for a replacement)."""
    if row["alive"]:
        return "training" if row["pushes"] else "waiting"
    return "finished" if row.get("finished") else "left"


def empty_seat(rank: int) -> dict[str, Any]:
    """The row of a rank nobody took yet: "waiting" (for a worker or a student's tab);
    once the run ended, "never taken" (Collector._publish)."""
    return {"rank": rank, "alive": False, "state": "waiting", "empty": True, "clock": 0, "steps": 0,
            "pushes": 0, "samples": 0, "samples_per_s": 0.0, "steps_per_s": 0.0, "behind": 0,
            "bytes_in": 0, "bytes_out": 0, "host": "", "agent": "-"}  # fmt: skip


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
        info = w.get("info") or {}
        rows.append(
            {
                "rank": w["rank"],
                "alive": w["alive"],
                "state": worker_state(w),
                "clock": w["clock"],
                "steps": w.get("steps", w["clock"]),  # a server without the count: its clock
                "pushes": w["pushes"],
                "samples": w["samples"],
                "samples_per_s": samples_per_s,
                "steps_per_s": steps_per_s,
                "behind": fastest - w["clock"],
                "bytes_in": w["bytes_in"],
                "bytes_out": w["bytes_out"],
                "host": str(info.get("host", "")),
                "agent": agent_name(info),
            }
        )
    seen = {row["rank"] for row in rows}
    rows += [empty_seat(rank) for rank in free_ranks(stats) if rank not in seen]
    return sorted(rows, key=lambda row: row["rank"])


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


def labels_from_stats(stats: dict[str, Any]) -> dict[str, Any] | None:
    """Each worker's examples per label from the data `stats` names (docs/protocol.md 5.5),
    as a run's report computes them (None: iid, or a server that does not say)."""
    from minips.results.report_labels import label_summary

    data = stats.get("data") or {}
    return label_summary({**data, "world_size": stats.get("world_size") or 1})


class Collector:
    """Polls `stats` every `interval` s in a thread; `snapshot()` is the latest view.

    `wait_newer(seq, timeout)` blocks until a snapshot newer than `seq` exists (for SSE).
    updates: the server's update logs (tails.UpdateTail), for the staleness histogram and
    each rank's staleness. keys: the client keys of an authenticated server (`stats` is open
    to every admitted key). on_notice: told, in one line, when nothing answers at `connect`
    (it keeps trying), when it answers after that, and when a live server stops answering;
    the snapshot's `notice` is the same line while it holds.
    """

    def __init__(
        self,
        connect: str,
        metrics_path: Any = None,
        interval: float = 1.0,
        updates: UpdateTail | None = None,
        keys: ClientKeys | None = None,
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.connect = connect
        self.on_notice = on_notice
        self.notice: str | None = None
        self.interval = interval
        self.keys = keys
        self.evals = EvalTail(metrics_path)
        self.updates = updates or UpdateTail(single_log(None))
        self.polls: deque[dict[str, Any]] = deque(maxlen=64)
        self.history: deque[dict[str, float]] = deque(maxlen=HISTORY)
        self.seq = 0
        self.error: str | None = None
        self.phase = "connecting"
        self.summary: dict[str, Any] | None = None  # the run's summary, once it ended
        # under a label-skewing partition: {"partition", "histograms": a row per rank}
        self.labels: dict[str, Any] | None = None
        self._labels_asked = False  # the run's data never changes: read from stats once
        self._last: dict[str, Any] = {}  # the last snapshot's stats and workers
        # Served before the first poll too (a page or script may ask at once): say so.
        self._snapshot: dict[str, Any] = {"seq": 0, "phase": self.phase, "connect": connect,
                                          "connected": False}  # fmt: skip
        self._changed = threading.Condition()
        self._stopped = threading.Event()  # everything: the poller and the event streams
        self._polling = threading.Event()  # set: the poller stops (the run ended)
        self._thread = threading.Thread(target=self._run, name="dashboard-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._polling.set()
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)

    def finish(self, summary: dict[str, Any] | None) -> None:
        """The run ended (its launcher says so, with its summary): publish the final view and
        poll no more."""
        self._polling.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.summary, self.phase = summary, "finished"
        self.evals.poll()
        self.updates.poll()
        self._publish(None)

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
        client = RetryingClient(self.connect, timeout=2.0, retries=0, keys=self.keys, groups=GROUPS)
        with client:
            while not self._polling.is_set():
                try:
                    stats, self.error = client.stats(), None
                except ServerUnavailable as exc:
                    stats, self.error = None, str(exc)
                self.evals.poll()
                self.updates.poll()
                if not self._polling.is_set():  # finish() may have published the end
                    line = self._notice(stats, self._next_phase(stats))
                    self._publish(stats)  # the page holds the notice before the terminal says it
                    if line is not None and self.on_notice is not None:
                        self.on_notice(line)
                self._polling.wait(self.interval)

    def _notice(self, stats: dict[str, Any] | None, phase: str) -> str | None:
        """The one line to say when what the server does changes (phase: the one this poll
        leads to): nothing answers (yet, or any more), or it answers again; else None."""
        if stats is not None and self.notice is not None:
            self.notice = None
            line = f"{self.connect} answers: {phase}"
        elif stats is None and phase in ("connecting", "lost") and self.notice is None:
            line = self.notice = (
                f"nothing answers at {self.connect} (still trying): is the server started, "
                f"and is the address right? {keys_hint(self.keys)}"
                if phase == "connecting"
                else f"the server at {self.connect} stopped answering (still trying)"
            )
        else:
            return None
        return line

    def _next_phase(self, stats: dict[str, Any] | None) -> str:
        if self.phase == "finished":
            return "finished"
        if stats is not None:
            return "stopping" if stats.get("stopping") else "live"
        # Gone after saying it was stopping, after the evaluator tested the final model,
        # or after the server wrote its final record: the run is over, not lost.
        if self.phase == "stopping" or self.evals.final or self.updates.ended:
            return "finished"
        return "lost" if self.phase in ("live", "lost") else self.phase

    def _publish(self, stats: dict[str, Any] | None) -> None:
        self.phase = self._next_phase(stats)
        snapshot: dict[str, Any] = {"connect": self.connect, "connected": stats is not None}
        if stats is not None:
            if self.labels is None and not self._labels_asked:  # a by-hand server's
                self._labels_asked = True
                self.labels = labels_from_stats(stats)
            window = self._window(stats)
            self.polls.append(stats)
            per_s = rate(window[0], stats, "updates") if window else 0.0
            self.history.append(
                {"uptime": stats["uptime"], "updates_per_s": per_s, "samples": stats["samples"]}
            )
            keys = ("version", "updates", "dropped", "samples", "rule", "world_size",
                    "live_workers", "bytes_in", "bytes_out", "staleness_mean",
                    "staleness_max", "uptime", "stopping")  # fmt: skip
            self._last = {
                "stats": {key: stats.get(key) for key in keys},
                "updates_per_s": per_s,
                "workers": worker_rows(stats, window),
                "shards": shard_rows(stats, window),
            }
        else:
            self._last["updates_per_s"] = 0.0  # nothing moves any more
        snapshot.update(self._last)
        snapshot["workers"] = [self._with_staleness(row) for row in self._last.get("workers", [])]
        if self.phase == "finished":  # who was still training when the run ended: stopped
            for row in snapshot["workers"]:
                ended = {"training": "stopped", "waiting": "never taken" if row.get("empty")
                         else "stopped"}  # fmt: skip
                row["state"] = ended.get(row["state"], row["state"])
        snapshot["phase"] = self.phase
        snapshot["summary"] = self.summary
        snapshot["labels"] = self.labels
        snapshot["error"] = self.error
        snapshot["notice"] = self.notice
        snapshot["history"] = list(self.history)
        snapshot["evals"] = list(self.evals.records)
        snapshot["staleness_histogram"] = self.updates.bins()
        with self._changed:
            self.seq += 1
            snapshot["seq"] = self.seq
            self._snapshot = snapshot
            self._changed.notify_all()

    def _with_staleness(self, row: dict[str, Any]) -> dict[str, Any]:
        """A copy of a worker's row with its pushes' staleness and scale (None: none seen)."""
        pushes = self.updates.by_rank.get(row["rank"])
        if pushes is None:
            return {**row, "staleness_mean": None, "staleness_max": None, "scale_mean": None}
        return {**row, **pushes.summary()}

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
