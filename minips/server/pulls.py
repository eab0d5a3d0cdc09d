"""Server side of a plan's pulls: each parameter sent dense, fp16, or as a delta.

A `delta` pull (docs/protocol.md 13.7) sends, of a parameter, the entries that changed most
since what this worker holds. The server keeps a *replica* per worker and parameter: the
values the worker has, bit for bit, because both sides add the same float32 numbers:

    d = w - replica;   S = top-k(|d|);   send (S, v = d_S as the wire dtype)
    replica_S += float32(v)            (the worker does the same to its copy)

What is not sent stays in w - replica and competes again at the next pull: the error
feedback of top-k (minips/codecs/topk.py), applied to the parameters going down.

A lost reply must not desynchronise the replica. The worker's `since` is the version of
the last pull reply it applied, so the server sends deltas only when `since` equals the
version of the last reply it sent this worker, and only when the version advanced since
(a reply that changed no replica may be lost harmlessly). Otherwise (a first pull, a
retry after a lost reply, a re-registered worker) the parameter goes dense and the
replica restarts from it. Observers (the evaluator) always get dense parameters.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from minips.codecs import top_k_indices
from minips.protocol.plan import Plan, parse_pull_spec
from minips.protocol.wire import WirePart

if TYPE_CHECKING:
    from minips.server.registry import WorkerState
    from minips.server.store import ParameterStore


class PullEncoder:
    """Builds a pull reply's parts by the plan; keeps the per-worker replicas of delta pulls.

    store: the server's ParameterStore. plan: the run's plan (pull codec and priority per
    parameter). `parts(worker, since)` -> the reply's WireParts, in pull order (by priority,
    then model order: the input side first, as the next forward needs it first).
    """

    def __init__(self, store: ParameterStore, plan: Plan) -> None:
        self.store = store
        self.order = plan.pull_order(store.params)
        self.specs = {name: parse_pull_spec(plan.param(name).pull) for name in store.params}
        self.delta = {name for name, (codec, _) in self.specs.items() if codec == "delta"}
        self._replicas: dict[str, tuple[int, dict[str, np.ndarray]]] = {}  # worker -> (v, arrays)
        self._fp16: dict[str, tuple[int, np.ndarray]] = {}  # fp16 snapshots, shared
        self._rng = np.random.default_rng(0)

    @property
    def plain(self) -> bool:
        """True when every pull is dense in model order (the server's plain path)."""
        return all(codec == "dense" for codec, _ in self.specs.values()) and self.order == list(
            self.store.params
        )

    def parts(self, worker: WorkerState, since: int | None) -> list[WirePart]:
        """The arrays of `worker`'s pull reply for its `since`, encoded by the plan."""
        store = self.store
        changed = set(store.changed_since(since))
        if worker.observer:
            return [WirePart(name, store.snapshot(name)) for name in self.order if name in changed]
        held = self._replicas.get(worker.worker_id)
        in_sync = held is not None and since is not None and held[0] == since
        parts: list[WirePart] = []
        for name in self.order:
            codec, options = self.specs[name]
            if codec == "delta" and in_sync:
                if store.version > since:
                    parts += self._delta(name, held[1][name], options)
            elif codec == "delta":
                parts.append(WirePart(name, store.snapshot(name)))
            elif name in changed:
                parts.append(self._single(name, codec))
        if self.delta and (not in_sync or store.version > since):
            if not in_sync:  # dense sent: the replicas restart from the current values
                held = (0, {name: store.snapshot(name).copy() for name in self.delta})
            self._replicas[worker.worker_id] = (store.version, held[1])
        return parts

    def forget(self, worker: WorkerState) -> None:
        """Drop a departed worker's replicas."""
        self._replicas.pop(worker.worker_id, None)

    def _single(self, name: str, codec: str) -> WirePart:
        if codec == "dense":
            return WirePart(name, self.store.snapshot(name))
        version = self.store.param_versions[name]
        cached = self._fp16.get(name)
        if cached is None or cached[0] != version:
            cached = self._fp16[name] = (version, self.store.params[name].astype(np.float16))
        return WirePart(name, cached[1], "fp16")

    def _delta(self, name: str, replica: np.ndarray, options: dict) -> list[WirePart]:
        """Top-k of (current - replica) as indices + values; the replica takes them in."""
        flat = replica.reshape(-1)
        diff = self.store.params[name].reshape(-1) - flat
        k = min(diff.size, math.ceil(options["ratio"] * diff.size))
        indices = top_k_indices(np.abs(diff), k, self._rng).astype(np.int32)
        values = diff[indices].astype(np.dtype(options.get("dtype", "float32")))
        flat[indices] += values.astype(np.float32)
        of = replica.shape
        return [
            WirePart(name, indices, "delta", "indices", of),
            WirePart(name, values, "delta", "values", of),
        ]
