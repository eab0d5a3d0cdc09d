"""A training worker: hello, then {pull, forward/backward on its own shard, push} until done.

The worker needs only the server's address: everything else (model, dataset, batch size,
its rank and shard, the rule's options) comes back from `hello`. A slowdown factor F makes
every step take F times its measured compute time (the extra is slept), so a heterogeneous
cluster can be reproduced on one laptop.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from minips.client import PSClient, ServerError
from minips.data import iterate_batches, load_dataset
from minips.nn import build_model, softmax_cross_entropy
from minips.sampling import Sampler


@dataclass
class WorkerReport:
    """What one worker measured; written as JSON at the end of its run."""

    rank: int = -1
    pid: int = field(default_factory=os.getpid)  # lets a launcher match process and rank
    slowdown: float = 1.0
    steps: int = 0
    samples: int = 0
    compute_s: float = 0.0  # forward + backward
    slowdown_s: float = 0.0  # time slept to simulate a slower machine
    comm_s: float = 0.0  # push + pull, including time waiting on the rule (ssgd, ssp)
    wall_s: float = 0.0
    stopped_by_server: bool = False
    extra_bytes: int = 0  # rule extras sent with the pushes (VSGD samples)
    staleness: list[int] = field(default_factory=list)  # clock staleness of each push

    def summary(self) -> dict:
        """The report without the per-push list, plus staleness mean and max."""
        record = asdict(self)
        stale = record.pop("staleness")
        record["staleness_mean"] = float(np.mean(stale)) if stale else 0.0
        record["staleness_max"] = int(max(stale)) if stale else 0
        return record


class Worker:
    """One data-parallel worker talking to a parameter server through a `PSClient`."""

    def __init__(
        self,
        client: PSClient,
        data_dir: str | None = None,
        slowdown: float | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.client = client
        self.data_dir = data_dir
        self.slowdown = slowdown
        self.max_steps = max_steps

    def run(self) -> WorkerReport:
        """Train until the epoch budget from the config ends or the server says stop."""
        start = time.monotonic()
        try:
            hello = self.client.hello({"role": "worker", "pid": os.getpid()})
        except ServerError as exc:
            if exc.code != "stopping":
                raise
            # The run ended (e.g. its sample budget was spent) before this worker arrived.
            return WorkerReport(stopped_by_server=True, wall_s=time.monotonic() - start)
        config = hello["config"]
        rank, world_size = int(hello["rank"]), int(hello["world_size"])
        hetero = config.get("hetero") or []
        slowdown = self.slowdown or (float(hetero[rank]) if rank < len(hetero) else 1.0)
        report = WorkerReport(rank=rank, slowdown=slowdown)

        data_dir = self.data_dir or config.get("data_dir")
        shard = load_dataset(config["dataset"], data_dir).shard(rank, world_size)
        model = build_model(config["model"]["name"], seed=0, **config["model"].get("kwargs", {}))
        rng = np.random.default_rng(int(config.get("seed", 0)) * 1000 + rank)
        rule = config.get("rule") or {}
        sampler = None
        if rule.get("name") == "vsgd":  # same sample as the server's (minips.sampling)
            sampler = Sampler(float(rule["rho"]), int(rule["min_samples"]))

        tick = time.monotonic()
        reply = self.client.pull()
        report.comm_s += time.monotonic() - tick
        model.set_params(reply.params, strict=False)
        version = reply.version

        report.stopped_by_server = reply.stop
        for _epoch in range(int(config["epochs"])):
            if report.stopped_by_server or self._budget_spent(report):
                break
            batches = iterate_batches(shard.x_train, shard.y_train, int(config["batch_size"]), rng)
            for xb, yb in batches:
                tick = time.monotonic()
                logits = model.forward(xb, train=True)  # (B, K)
                _, dlogits = softmax_cross_entropy(logits, yb)
                model.backward(dlogits)
                compute = time.monotonic() - tick
                report.compute_s += compute
                if slowdown > 1:
                    # Stretch this step to `slowdown` times its compute time.
                    time.sleep((slowdown - 1) * compute)
                    report.slowdown_s += (slowdown - 1) * compute

                tick = time.monotonic()
                extra = None
                if sampler is not None:
                    # The parameters are still those of the last pull (they change only
                    # in set_params below): exactly the values the gradient was taken at.
                    params = model.params
                    extra = {f"sample/{n}": sampler.values(n, params[n]) for n in model.grads}
                    report.extra_bytes += sum(values.nbytes for values in extra.values())
                pushed = self.client.push(model.grads, base=version, extra=extra, samples=len(xb))
                if pushed.stop and not pushed.applied:
                    # It arrived after the run stopped: not trained on, so not counted.
                    report.comm_s += time.monotonic() - tick
                    report.stopped_by_server = True
                    break
                report.staleness.append(int(pushed.staleness))
                report.steps += 1
                report.samples += len(xb)
                reply = self.client.pull(since=version)
                report.comm_s += time.monotonic() - tick
                if reply.params:
                    model.set_params(reply.params, strict=False)
                version = reply.version
                if pushed.stop or reply.stop:
                    report.stopped_by_server = True
                    break
                if self._budget_spent(report):
                    break
        report.wall_s = time.monotonic() - start
        return report

    def _budget_spent(self, report: WorkerReport) -> bool:
        return self.max_steps is not None and report.steps >= self.max_steps


def write_report(report: WorkerReport, path: str | Path) -> None:
    """Write a worker's report as one JSON object (the launcher merges them)."""
    Path(path).write_text(json.dumps(report.summary()) + "\n", encoding="utf-8")
