"""Answering pulls: when (the rule may hold one), and what a reply carries (by the plan).

`Pulls` answers a pull at once or holds it until the rule allows it (SSP's staleness
bound, the cluster still assembling), and sends the parameters changed since the
puller's version: as they are, the rule's own values (DANA's look-ahead), or encoded by a
plan (`PullEncoder`: each parameter dense, fp16, or as a delta).

A `delta` pull keeps, per worker and parameter, a replica of what the worker holds, bit
for bit (when deltas are sent, the warm-up: docs/protocol.md 13.7):

    d = w - replica;   S = top-k(|d|);   send (S, v = d_S as the wire dtype)
    replica_S += float32(v)            (the worker does the same to its copy)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from minips.protocol.wire import WirePart
from minips.transmission.codecs import top_k_indices
from minips.transmission.plan import Plan, parse_pull_spec

if TYPE_CHECKING:
    from minips.rules import Rule
    from minips.server.router import Outbox
    from minips.server.seams import Operations
    from minips.server.stop import Stop
    from minips.state.registry import WorkerRegistry, WorkerState
    from minips.state.requests import HeldPull
    from minips.state.store import ParameterStore


class Pulls:
    """The server's pulls (module docstring): held per worker, answered through `outbox`.

    A fused push + pull's pull half comes here too (`hold` with the push's answer), so a
    step's one reply carries both.
    """

    def __init__(
        self,
        store: ParameterStore,
        registry: WorkerRegistry,
        rule: Rule,
        outbox: Outbox,
        ops: Operations,
        stop: Stop,
    ) -> None:
        self.store, self.registry, self.rule = store, registry, rule
        self.outbox, self.ops, self.stop = outbox, ops, stop
        self.encoder: PullEncoder | None = None  # a plan's pulls (use_plan); None: all dense

    def use_plan(self, plan: Plan) -> None:
        """Send pulls by `plan` (fp16, delta, priority order) from now on."""
        encoder = PullEncoder(self.store, plan)
        self.encoder = None if encoder.is_dense else encoder

    def hold(self, worker: WorkerState, pull: HeldPull) -> None:
        """Answer a pull now if it may be (`may_answer`), else hold it."""
        worker.held_pull = pull
        if self.may_answer(worker):
            self.answer(worker)

    def may_answer(self, worker: WorkerState) -> bool:
        """An observer's pull is answered at once, every pull when stopping; a worker's
        when the cluster has assembled and the rule allows it (SSP's staleness bound)."""
        if worker.observer or self.stop.stopping:
            return True
        return not self.registry.assembling and self.rule.may_answer_pull(worker)

    def release(self) -> None:
        """Answer every held pull the rule now allows (all of them when stopping).

        While the cluster is still assembling every worker's pull is held, whatever the
        rule: a run starts when its workers are there, so the first one does not train alone.
        """
        stopping = self.stop.stopping
        if not stopping and self.registry.assembling:
            return
        for worker in self.registry.live():
            if worker.held_pull and (stopping or self.rule.may_answer_pull(worker)):
                self.answer(worker)

    def answer(self, worker: WorkerState) -> None:
        """Send the parameters changed since the puller's `since` (`parts`); a fused push's
        answer goes in the same reply."""
        held, worker.held_pull = worker.held_pull, None
        worker.pulls += 1
        parts, store = self.parts(worker, held.since), self.store
        header = {**(held.push_reply or {"op": "pull"}), "version": store.version,
                  "param_versions": store.param_versions, "stop": self.stop.stopping}  # fmt: skip
        if not worker.observer:  # noted before the reply goes, as everything a reply reports
            self.ops.pulled(parts)
            self.rule.on_pulled(worker)
        self.outbox.reply(held.reply_to, header, worker=worker, parts=parts)

    def parts(self, worker: WorkerState, since: int | None) -> list[WirePart]:
        """The parameters changed since `since`: the current ones, a rule's own values
        (DANA's look-ahead; never an observer's), or encoded by the plan."""
        names = self.store.changed_since(since)
        values = None if worker.observer else self.rule.pull_values(worker, names)
        if self.encoder is not None:  # encoded by the plan, the rule's values included
            return self.encoder.parts(worker, since, values)
        if values is None:  # every rule but DANA: the parameters, as they are
            values = {name: self.store.snapshot(name) for name in names}
        return [WirePart(name, array) for name, array in values.items()]


@dataclass
class Replica:
    """What one worker holds of the delta-pulled parameters, bit for bit: `arrays`, as of
    the reply of `version`; `replies` the replies sent since the replica (re)started."""

    version: int
    arrays: dict[str, np.ndarray]
    replies: int = 0


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
        self._replicas: dict[str, Replica] = {}  # worker id -> its copy of the delta parameters
        self._fp16: dict[str, tuple[int, np.ndarray]] = {}  # fp16 snapshots, shared
        self._rng = np.random.default_rng(0)

    @property
    def is_dense(self) -> bool:
        """True when every pull is dense in model order (as without a plan)."""
        return all(codec == "dense" for codec, _ in self.specs.values()) and self.order == list(
            self.store.params
        )

    def parts(
        self,
        worker: WorkerState,
        since: int | None,
        values: dict[str, np.ndarray] | None = None,
    ) -> list[WirePart]:
        """The arrays of `worker`'s pull reply for its `since`, encoded by the plan.

        values: what the rule sends this worker instead of the parameters (DANA's
        look-ahead, Rule.pull_values), by name; the parameters for the names it lacks.
        """
        store = self.store
        changed = set(store.changed_since(since))
        if worker.observer:
            return [WirePart(name, store.snapshot(name)) for name in self.order if name in changed]
        sent = values or {}

        def now(name: str) -> np.ndarray:
            return sent[name] if name in sent else store.snapshot(name)

        held = self._replicas.get(worker.worker_id)
        in_sync = held is not None and since is not None and held.version == since
        parts: list[WirePart] = []
        for name in self.order:
            codec, options = self.specs[name]
            if codec == "delta" and in_sync and store.version > since:
                if held.replies < options.get("warmup", 0):
                    parts.append(self._warm(name, held.arrays[name], sent.get(name)))
                else:
                    parts += self._delta(name, held.arrays[name], options, now(name))
            elif codec == "delta" and not in_sync:
                parts.append(WirePart(name, now(name)))
            elif codec != "delta" and name in changed:
                parts.append(self._single(name, codec, sent.get(name)))
        if self.delta and not in_sync:  # dense sent: the replicas restart from the values sent
            self._replicas[worker.worker_id] = Replica(
                store.version, {name: now(name).copy() for name in self.delta}
            )
        elif self.delta and store.version > since:
            held.version, held.replies = store.version, held.replies + 1
        return parts

    def forget(self, worker: WorkerState) -> None:
        """Drop a departed worker's replicas."""
        self._replicas.pop(worker.worker_id, None)

    def _single(self, name: str, codec: str, value: np.ndarray | None = None) -> WirePart:
        """`name` dense or fp16: the parameter (fp16 made once per version, shared by every
        worker), or the rule's `value` for this worker."""
        if value is not None:
            return WirePart(name, value if codec == "dense" else value.astype(np.float16), codec)
        if codec == "dense":
            return WirePart(name, self.store.snapshot(name))
        version = self.store.param_versions[name]
        cached = self._fp16.get(name)
        if cached is None or cached[0] != version:
            cached = self._fp16[name] = (version, self.store.params[name].astype(np.float16))
        return WirePart(name, cached[1], "fp16")

    def _warm(self, name: str, replica: np.ndarray, value: np.ndarray | None) -> WirePart:
        """The whole parameter (or the rule's `value`) as fp16 (the warm-up); the replica
        takes it in, widened."""
        part = self._single(name, "fp16", value)
        np.copyto(replica, part.array, casting="unsafe")
        return part

    def _delta(
        self, name: str, replica: np.ndarray, options: dict, current: np.ndarray
    ) -> list[WirePart]:
        """Top-k of (current - replica) as indices + values; the replica takes them in."""
        flat = replica.reshape(-1)
        diff = current.reshape(-1) - flat
        k = min(diff.size, math.ceil(options["ratio"] * diff.size))
        indices = top_k_indices(np.abs(diff), k, self._rng).astype(np.int32)
        values = diff[indices].astype(np.dtype(options.get("dtype", "float32")))
        flat[indices] += values.astype(np.float32)
        of = replica.shape
        return [
            WirePart(name, indices, "delta", "indices", of),
            WirePart(name, values, "delta", "values", of),
        ]
