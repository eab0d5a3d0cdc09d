"""A training worker: hello, a pull, then `Worker.step` (forward/backward on a batch of its
own shard, push, pull) until its epochs are done or the server says stop.

The worker needs only the server's address: everything else (model, dataset, batch size,
its rank and shard, the rule's options) comes back from `hello`. A slowdown factor F makes
every step take F times its measured compute time (the extra is slept), so a heterogeneous
cluster can be reproduced on one laptop.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from minips.data import Dataset, iterate_batches, load_dataset
from minips.data.datasets import FindData
from minips.data.shuffle import EpochShuffle
from minips.nn import Sequential, build_model, softmax_cross_entropy
from minips.rules import WorkerSide, worker_side
from minips.transmission.plan import Plan, plan_from_hello
from minips.worker.client import PSClient, PullReply, PushReply, ServerError
from minips.worker.hooks import (
    COMPUTE,
    RECV,
    STEP,
    AsItIs,
    Conditions,
    FixedSlowdown,
    NullTrace,
    ProgressFn,
)
from minips.worker.transmit import StepSender

# A batch is computed again at most this many times after its push was answered `bad_base`
# (each a server gone back in time: `minips run` restarts a crashed server at most 3 times).
REWIND_ATTEMPTS = 4


@dataclass
class WorkerReport:
    """What one worker measured; written as JSON at the end of its run."""

    rank: int = -1
    pid: int = field(default_factory=os.getpid)  # lets a launcher match process and rank
    host: str = field(default_factory=socket.gethostname)  # the machine it trained on
    agent: str = "numpy"  # what computed its gradients (a browser worker says "browser")
    slowdown: float = 1.0
    steps: int = 0
    samples: int = 0
    compute_s: float = 0.0  # forward + backward
    slowdown_s: float = 0.0  # time slept to simulate a slower machine
    step_delays: list[float] | None = None  # each step's sleep when the slowdown changes
    comm_s: float = 0.0  # push + pull, including time waiting on the rule (ssgd, ssp)
    wall_s: float = 0.0
    stopped_by_server: bool = False
    finished: bool = False  # every epoch of its shard trained (its `bye` says so)
    extra_bytes: int = 0  # rule extras sent with the pushes (VSGD samples)
    push_bytes: dict[str, int] = field(default_factory=dict)  # array bytes pushed per parameter
    bandwidth: str | None = None  # this worker's --bandwidth link, if any
    staleness: list[int] = field(default_factory=list)  # clock staleness of each push

    def summary(self) -> dict:
        """The report without the per-push list, plus staleness mean and max."""
        record = asdict(self)
        stale = record.pop("staleness")
        record["staleness_mean"] = float(np.mean(stale)) if stale else 0.0
        record["staleness_max"] = int(max(stale)) if stale else 0
        return record


class Worker:
    """One data-parallel worker talking to a parameter server through a `PSClient`.

    data_dir: this machine's copy of the dataset (default: the config's). slowdown: make
    each step take F times its compute time (default: the config's `hetero[rank]`).
    max_steps: stop after this many steps (default: the config's epochs bound it).
    rank: ask the server for this rank (a restarted worker taking over a shard), in
    hello's `info` (docs/protocol.md 5.1). progress: called after every step with the
    samples done, the shard's samples over all epochs, and {"train_loss", "updates"}.
    bandwidth: this worker's link rate, e.g. "100mbit" (default: the config's; None:
    unlimited). trace: where to record compute and send/receive spans (`--trace FILE`:
    minips.results.trace; none by default). conditions: what the run emulates, a slowdown
    schedule and the link (minips.run.conditions.Emulated; by default none: a fixed
    slowdown at most, hooks.AsItIs). find_data: where the dataset's files are
    (`load_dataset`'s `find`; minips.provision.locations.find_data adds the machine's).
    The transmission plan (codecs, push intervals, wait-free) comes from hello's config.
    """

    def __init__(
        self,
        client: PSClient,
        data_dir: str | None = None,
        slowdown: float | None = None,
        max_steps: int | None = None,
        rank: int | None = None,
        progress: ProgressFn | None = None,
        bandwidth: str | None = None,
        trace: NullTrace | None = None,
        on_join: Callable[[WorkerReport, int], None] | None = None,
        conditions: Conditions | None = None,
        find_data: FindData | None = None,
    ) -> None:
        self.client = client
        self.find_data = find_data
        self.on_join = on_join
        self.bandwidth = bandwidth
        self.trace = trace or NullTrace()
        self.plan = Plan()
        self._marks: list[float] = []  # backward's per-layer end times, for the trace
        self.rank = rank
        self.progress = progress
        self._latest: dict[str, Any] = {}  # what the progress callback shows
        self.data_dir = data_dir
        self.slowdown = slowdown
        self.conditions = conditions or AsItIs()
        self.speeds = FixedSlowdown()  # the schedule hello gives (_join); none before
        self.max_steps = max_steps
        # Set by `run` from the server's hello (what `step` works with):
        self.report = WorkerReport()
        self.model: Sequential | None = None
        self.sender: StepSender | None = None  # sends each step by the plan (transmit.py)
        self.rule_side = WorkerSide()  # what the rule needs besides gradients (VSGD: samples)
        self.version = 0  # the version of the parameters in self.model (the last pull's)

    def run(self) -> WorkerReport:
        """Train until the epoch budget from the config ends or the server says stop."""
        start = time.monotonic()
        try:
            hello = self.client.hello(self.hello_info())
        except ServerError as exc:
            if exc.code != "stopping":
                raise
            # The run ended (e.g. its sample budget was spent) before this worker arrived.
            return WorkerReport(stopped_by_server=True, wall_s=time.monotonic() - start)
        hello = self.take_hello(hello)
        config = hello["config"]
        shard, rng = self._join(hello)
        if self.on_join is not None:
            self.on_join(self.report, int(hello["world_size"]))
        tick = time.monotonic()
        self.report.stopped_by_server = self._pull(since=None)
        self.report.comm_s += time.monotonic() - tick
        total = int(config["epochs"]) * len(shard.y_train)
        try:
            self._epochs(config, shard, rng, total)
        finally:
            try:
                self.sender.close()  # may wait for the sender thread: a second Ctrl-C lands here
            finally:
                self.trace.close()
        self.report.push_bytes = self.client.bytes_sent
        self.report.finished = self.report.samples >= total
        self.report.wall_s = time.monotonic() - start
        return self.report

    def _epochs(self, config: dict[str, Any], shard: Dataset, rng: Any, total: int) -> None:
        for _epoch in range(int(config["epochs"])):
            if self.report.stopped_by_server or self._budget_spent():
                break
            batches = iterate_batches(shard.x_train, shard.y_train, int(config["batch_size"]), rng)
            for xb, yb in batches:
                if not self.step(xb, yb) or self._budget_spent():
                    break
                if self.progress is not None:
                    self.progress(self.report.samples, total, self._latest)

    def hello_info(self) -> dict[str, Any]:
        """hello's `info`: role, pid and host (shown in stats and the server's log), and the
        rank asked for, if any."""
        info: dict[str, Any] = {"role": "worker", "pid": os.getpid(), "host": socket.gethostname()}
        if self.rank is not None:
            info["rank"] = self.rank
        return info

    def step(self, xb: np.ndarray, yb: np.ndarray) -> bool:
        """One batch xb (B, C, H, W), yb (B,): gradients, push, pull. False: the server stopped.

        The gradients are taken at the parameters of the last pull, version `self.version`
        (the push's `base`); the rule's worker side adds what it needs to the push. A push
        the server answered `bad_base` (it went back to an older checkpoint, whose
        parameters `push` then pulled) is computed again at those parameters, so every batch
        of the shard is trained once and the worker can end `finished` (its `bye` says so).
        """
        for _attempt in range(REWIND_ATTEMPTS):
            if self._try_step(xb, yb) or self.report.stopped_by_server:
                break
        return not self.report.stopped_by_server

    def _try_step(self, xb: np.ndarray, yb: np.ndarray) -> bool:
        """`step`'s one attempt; False when the server went back in time (its push dropped)."""
        start, tick = self.trace.now(), time.monotonic()
        self.sender.start_step(base=self.version)  # it may push layers during backward
        with self.trace.span("forward", COMPUTE):
            logits = self.model.forward(xb, train=True)  # (B, K)
            loss, dlogits = softmax_cross_entropy(logits, yb)
        self._marks = [self.trace.now()]
        self.model.backward(dlogits)
        self._slow_down(compute=time.monotonic() - tick)

        tick = time.monotonic()
        # Still the parameters of the last pull (set only by apply_pull below): VSGD's
        # samples are exactly the values the gradient was computed at.
        extra = self.rule_side.extras(self.model.params, self.model.grads)
        pushed = self.push(extra, len(xb), float(loss))  # None: the server went back in time
        trained = pushed is not None and (pushed.applied or not pushed.stop)  # else: not used
        if trained:
            self.apply_pull(pushed.pull)
        self._record_step(pushed, trained, float(loss), len(xb), extra, start, tick)
        return pushed is not None

    def _record_step(
        self,
        pushed: PushReply | None,
        trained: bool,
        loss: float,
        samples: int,
        extra: dict[str, np.ndarray],
        step_start: float,
        exchange_start: float,
    ) -> None:
        """A step's figures in the report, its span in the trace; `stopped_by_server`.

        step_start: when the step began on the trace's clock; exchange_start: when its push
        began, on time.monotonic (the report's communication time runs from there).
        """
        report = self.report
        report.extra_bytes += sum(values.nbytes for values in extra.values())
        if trained:
            report.staleness.append(int(pushed.staleness))
            self._latest.update(train_loss=loss, updates=int(pushed.version))
            report.steps, report.samples = report.steps + 1, report.samples + samples
            args = {"step": report.steps}
            self.trace.complete("step", STEP, step_start, self.trace.now(), args=args)
        report.comm_s += time.monotonic() - exchange_start
        if pushed is not None and (pushed.stop or pushed.pull.stop):
            report.stopped_by_server = True

    def push(self, extra: dict[str, np.ndarray], samples: int, loss: float) -> PushReply | None:
        """Push this step's gradients (their batch's `samples` and training `loss` with
        them) by the plan and pull in the same round trip: the plan's StepSender
        (minips/worker/transmit.py) sends what is left of the step, all of it in one fused
        push under the default dense plan.

        None when the server answers `bad_base`: it restarted from a checkpoint older than
        our parameters (docs/protocol.md 7), so pull them all again and go on from there
        (the gradient, of a version it forgot, is dropped), or stop if that pull says the
        server is stopping.
        """
        try:
            return self.sender.finish(extra, samples, self.version, loss)
        except ServerError as exc:
            if exc.code != "bad_base":
                raise
        if self._pull(since=None):
            self.report.stopped_by_server = True
        return None

    def _join(self, hello: dict[str, Any]) -> tuple[Dataset, EpochShuffle]:
        """Set up from hello's reply (report, model, rule side); the shard and its shuffler."""
        config = hello["config"]
        rank, world_size = int(hello["rank"]), int(hello["world_size"])
        hetero = config.get("hetero") or []
        slowdown = self.slowdown or (float(hetero[rank]) if rank < len(hetero) else 1.0)
        self.report = WorkerReport(rank=rank, slowdown=slowdown)
        schedule = config.get("hetero_schedule", "fixed")  # docs/model.md 4.5
        seed, partition = int(config.get("seed", 0)), config.get("partition", "iid")
        self.speeds = self.conditions.speeds(schedule, slowdown, seed, rank)
        self.report.step_delays = None if schedule == "fixed" else []
        self.model = model_from_hello(config)
        self.rule_side = worker_side(config.get("rule") or {})
        self._plan_link_trace(config)
        dataset = dataset_from_hello(config, self.data_dir, self.find_data)
        shard = dataset.shard(rank, world_size, partition, seed)
        return shard, EpochShuffle(seed, rank)  # docs/model.md 4.3

    def _plan_link_trace(self, config: dict[str, Any]) -> None:
        """From hello's config: the plan and its sender, the link's token buckets, trace hooks."""
        self.plan = self.take_plan(config)
        if self.trace.enabled:
            self.model.add_grad_hook(self._trace_layer)
        self.sender = StepSender(self.client, self.model, self.plan, self.trace)
        self.model.add_grad_hook(self.sender.layer_ready)
        self.report.bandwidth = self.bandwidth or config.get("bandwidth")
        self.client.link = self.conditions.link(self.report.bandwidth)

    def take_hello(self, hello: dict[str, Any]) -> dict[str, Any]:
        """hello's reply as the server sent it (a worker that does not trust its server
        checks its form first, minips.run.assembly.Worker)."""
        return hello

    def take_plan(self, config: dict[str, Any]) -> Plan:
        """The plan in hello's config as the server sent it (its run checked it: a worker
        that does not trust its server checks it again, minips.run.assembly.Worker)."""
        return plan_from_hello(config)

    def _pull(self, since: int | None) -> bool:
        """Fetch the parameters changed since version `since` into the model; the stop flag."""
        with self.trace.span("pull", RECV):
            reply = self.client.pull(since=since)
        self.apply_pull(reply)
        return reply.stop

    def apply_pull(self, reply: PullReply) -> None:
        """Set the parameters a pull reply carries, add its deltas; remember its version."""
        if reply.params:
            self.model.set_params(reply.params, strict=False)
        params = self.model.params
        for name, parts in reply.deltas.items():
            apply_delta(params[name], parts["indices"], parts["values"])
        self.version = reply.version

    def _trace_layer(self, layer: str) -> None:
        """Grad hook under --trace: backward from the previous mark to now was `layer`'s."""
        now = self.trace.now()
        self.trace.complete(f"backward {layer}", COMPUTE, self._marks[-1], now)
        self._marks.append(now)

    def _slow_down(self, compute: float) -> None:
        """Count `compute` seconds; sleep what this step's speed adds (the conditions':
        with a fixed slowdown F, F - 1 times as long)."""
        self.report.compute_s += compute
        extra = self.speeds.extra(self.report.steps, compute)
        if self.report.step_delays is not None:
            self.report.step_delays.append(round(extra, 4))
        if extra > 0:
            time.sleep(extra)
            self.report.slowdown_s += extra

    def _budget_spent(self) -> bool:
        return self.max_steps is not None and self.report.steps >= self.max_steps


def apply_delta(param: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
    """param.flat[indices] += values, in float32 (docs/protocol.md 13.7: what the server adds
    to its copy of this worker's parameters, bit for bit)."""
    flat = param.reshape(-1)
    flat[indices] += values.astype(np.float32, copy=False)


def model_from_hello(config: dict[str, Any]) -> Sequential:
    """The model hello's config describes (its parameters come with the first pull)."""
    spec = config["model"]
    return build_model(spec["name"], seed=0, **spec.get("kwargs", {}))


def dataset_from_hello(
    config: dict[str, Any], data_dir: str | None = None, find: FindData | None = None
) -> Dataset:
    """The dataset hello's config names, from `data_dir` if given (this machine's copy)."""
    return load_dataset(config["dataset"], data_dir or config.get("data_dir"), find=find)
