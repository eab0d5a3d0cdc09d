"""How a worker sends one step's gradients by its plan: codecs, push intervals, wait-free.

    sender = StepSender(client, model, plan, trace)
    model.add_grad_hook(sender.layer_ready)     # backward hands over each layer as it is done
    sender.start_step(base=version)
    model.backward(dlogits)                     # wait-free: fc2, fc1 go on the wire meanwhile
    reply = sender.finish(extra, samples)       # the step's last push (last=True)

Per parameter, by its `ParamPlan`:
- codec: the client's Encoder encodes it (`sf`: the layer's factors (x, dy) are handed over
  instead of the dense gradient, Dense.sufficient_factors);
- every k: the gradient is accumulated locally (a sum; for `sf` the factors are stacked,
  since [x1; x2]^T [dy1; dy2] = x1^T dy1 + x2^T dy2) and pushed every k-th step, with the
  base of the OLDEST step in the sum (its clock staleness is the largest of its parts);
- wait-free (Zhang et al., Poseidon, USENIX ATC 2017, section 3.1): each layer's push is
  handed to ONE sender thread as soon as backward produced it (`last=False`), so the fc
  layers' bytes cross the link while the conv layers' backward still computes; the layer
  nearest the input, produced last, goes in the step's final push (`last=True`), sent by
  the caller of `finish` once the sender thread is done. Without wait-free, `finish`
  sends the whole step in one push.

Gradient arrays are overwritten by the next backward, and `sf` factors by the next forward:
`finish` returns only when everything of this step has been sent, so they are safe.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from minips.nn import Sequential
from minips.transmission.codecs import Factors, Gradient, parse_spec
from minips.transmission.plan import Plan
from minips.worker.client import PSClient, PushReply
from minips.worker.hooks import SEND, NullTrace


@dataclass
class _Pending:
    """A parameter's gradient accumulated over the steps since its last push."""

    base: int  # version of the oldest gradient in the sum
    dense: np.ndarray | None = None
    xs: list[np.ndarray] = field(default_factory=list)  # sf: stacked factors
    dys: list[np.ndarray] = field(default_factory=list)

    def add(self, grad: Gradient) -> None:
        if isinstance(grad, Factors):
            self.xs.append(np.array(grad.x, np.float32))  # copies: the layer's caches change
            self.dys.append(np.array(grad.dy, np.float32))
        elif self.dense is None:
            self.dense = np.array(grad, np.float32)
        else:
            self.dense += grad

    def gradient(self) -> Gradient:
        if self.xs:
            return Factors(np.concatenate(self.xs), np.concatenate(self.dys))
        return self.dense


class StepSender:
    """Sends a worker's gradients by `plan` through `client` (see the module docstring)."""

    def __init__(
        self,
        client: PSClient,
        model: Sequential,
        plan: Plan,
        trace: NullTrace | None = None,
    ) -> None:
        self.client = client
        self.model = model
        self.plan = plan
        self.trace = trace or NullTrace()
        self.specs = plan.push_specs()
        self._sf = {name for name, spec in self.specs.items() if parse_spec(spec)[0] == "sf"}
        layers = [info.name for info in model.layer_info()]
        self._first_layer = layers[0] if layers else None  # produced last by backward
        self._pending: dict[str, _Pending] = {}
        self.step_index = 0
        self.base = 0
        self._ready: list[str] = []  # layers done this step, not yet handed over (no thread)
        self._queue: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if plan.wait_free:
            self._thread = threading.Thread(target=self._send_loop, name="sender", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the step's side
    def start_step(self, base: int) -> None:
        """A new step whose gradients are computed at parameters of version `base`."""
        self.base = base
        self._ready = []

    def layer_ready(self, layer: str) -> None:
        """The grad hook: `layer`'s gradients are ready (called during backward)."""
        if self._thread is not None and layer != self._first_layer:
            self._queue.put((layer, self.base))
        else:
            self._ready.append(layer)

    def finish(
        self,
        extra: dict[str, np.ndarray],
        samples: int,
        pull_since: int | None = None,
        loss: float | None = None,
    ) -> PushReply:
        """Wait for the sender thread, then push what is left with `last=True`.

        pull_since: fuse the step's pull into this last push (one round trip per step);
        the reply's `pull` then holds the parameters changed since that version. loss:
        the step's training loss, sent with this last push.
        """
        self._drain()
        ready = [layer for layer in self.model.layers if layer in self._ready]  # model order
        grads, bases = self._collect(ready, self.base)
        self.step_index += 1
        self._push_older(grads, bases)
        fused = {} if pull_since is None else {"pull_since": pull_since}
        with self.trace.span("last push+pull", SEND, args={"params": list(grads), **fused}):
            return self.client.push(grads, base=self.base, extra=extra, last=True,
                                    codecs=self.specs, samples=samples, loss=loss,
                                    **fused)  # fmt: skip

    def close(self) -> None:
        """Stop the sender thread (idempotent)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    # --------------------------------------------------------------------- machinery
    def _drain(self) -> None:
        """Wait until the wait-free sender thread sent every layer queued; its error, if any,
        raised once: the step it ended is over (a `bad_base` one is computed again), and the
        next step's layers must be sent, not skipped for an error already handled."""
        if self._thread is not None:
            self._queue.join()
            error, self._error = self._error, None
            if error is not None:
                raise error

    def _push_older(self, grads: dict[str, Gradient], bases: dict[str, int]) -> None:
        """Accumulated gradients with an older base travel in their own push first (taken
        out of `grads`)."""
        for base in sorted(b for b in set(bases.values()) if b != self.base):
            older = {name: grads.pop(name) for name in list(grads) if bases[name] == base}
            self._push(older, base, last=False, label="accumulated")

    def _collect(self, layers: list[str], base: int) -> tuple[dict[str, Gradient], dict[str, int]]:
        """The gradients of `layers`' parameters due this step, and the base of each."""
        grads: dict[str, Gradient] = {}
        bases: dict[str, int] = {}
        for layer in layers:
            for key in self.model.layers[layer].params:
                name = f"{layer}.{key}"
                grad = self._gradient(layer, key, name)
                every = self.plan.param(name).every
                if every == 1:
                    grads[name], bases[name] = grad, base
                    continue
                pending = self._pending.setdefault(name, _Pending(base))
                pending.add(grad)
                if (self.step_index + 1) % every == 0:
                    grads[name], bases[name] = pending.gradient(), pending.base
                    del self._pending[name]
        return grads, bases

    def _gradient(self, layer: str, key: str, name: str) -> Gradient:
        if name in self._sf:
            x, dy = self.model.layers[layer].sufficient_factors()
            return Factors(x, dy)
        return self.model.layers[layer].grads[key]

    def _push(
        self,
        grads: dict[str, Gradient],
        base: int,
        last: bool,
        label: str,
        extra: dict[str, np.ndarray] | None = None,
        samples: int | None = None,
    ) -> PushReply | None:
        if not grads and not last:
            return None
        with self.trace.span(label, SEND, args={"params": list(grads)}):
            return self.client.push(
                grads, base=base, extra=extra, last=last, codecs=self.specs, samples=samples
            )

    def _send_loop(self) -> None:
        """The sender thread: push each layer handed over, in the order backward made them."""
        while (item := self._queue.get()) is not None:
            layer, base = item
            try:
                if self._error is None:
                    grads, bases = self._collect([layer], base)
                    by_base: dict[int, dict[str, Gradient]] = {}
                    for name, grad in grads.items():
                        by_base.setdefault(bases[name], {})[name] = grad
                    for one_base, part in sorted(by_base.items()):
                        self._push(part, one_base, last=False, label=layer)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                self._error = exc
            finally:
                self._queue.task_done()
        self._queue.task_done()


def describe_sender(sender: StepSender) -> dict[str, Any]:
    """For logs: the plan's shape as this worker applies it."""
    return {"wait_free": sender.plan.wait_free, "codecs": sender.specs}
