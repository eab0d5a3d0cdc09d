"""Clients of a server group ride through a restarted shard or root (docs/protocol.md 16.3,
16.4): real `minips server` processes, really killed and started again on their address.

An observer's ping to a restarted shard that forgot it says hello again there; a worker
whose request reaches a restarted root before the other shards joined it again waits for
the group to re-form (the root's `group` refusal, retried within the client's bound).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from minips.group.root import GROUPS
from minips.worker.client import PSClient

SERVER = [sys.executable, "-m", "minips", "server", "--servers", "2"]
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}


class Group:
    """A root and shard 1 as `minips server` processes on ipc sockets in `tmp`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root_address = f"ipc://{tmp / 'root.sock'}"
        self.shard_address = f"ipc://{tmp / 'shard1.sock'}"
        self.procs: dict[str, subprocess.Popen] = {}

    def start_root(self) -> None:
        run = ["--workers", "1", "--model", "mlp", "--dataset", "synthetic", "--rule", "asgd"]
        self._start("root", ["--shard", "0", "--bind", self.root_address, *run])

    def start_shard(self) -> None:
        self._start("shard", ["--shard", "1", "--root", self.root_address,
                              "--bind", self.shard_address])  # fmt: skip

    def _start(self, name: str, options: list[str]) -> None:
        endpoint = self.tmp / f"{name}.endpoint"
        endpoint.unlink(missing_ok=True)
        log = open(self.tmp / f"{name}-{len(self.procs)}.log", "a")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(
            [*SERVER, *options, "--endpoint-file", str(endpoint)],
            cwd=self.tmp, env=ENV, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        _wait(f"{name} to listen", endpoint.exists)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def signal(self, name: str, signum: int) -> None:
        self.procs[name].send_signal(signum)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def _wait(what: str, condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def group(tmp_path):
    running = Group(tmp_path)
    try:
        running.start_root()
        running.start_shard()
        yield running
    finally:
        running.close()


def test_an_observer_pings_a_restarted_shard_that_forgot_it(group):
    """The evaluator pings between its evaluations: a restarted shard answers the ping
    `unknown_worker`, and the observer says hello there again instead of ending."""
    with PSClient(group.root_address, groups=GROUPS, timeout=10, retries=3) as observer:
        observer.hello({"role": "observer"})
        assert observer.ping() is False
        group.kill("shard")
        group.start_shard()
        assert observer.ping() is False
        observer.pull()  # and the restarted shard serves it


def test_a_worker_waits_for_a_restarted_root_whose_shard_has_not_joined_it_yet(group):
    """The worker's push reaches the new root before shard 1 joined it (shard 1 is stopped
    meanwhile): the root refuses the worker's new hello `group`; the worker asks again
    until the group re-formed (shard 1 resumed), then its push is served."""
    with PSClient(
        group.root_address, groups=GROUPS, timeout=10, retries=3, assemble_timeout=60
    ) as worker:
        worker.hello({"host": "test"})
        worker.pull()
        group.signal("shard", signal.SIGSTOP)  # it cannot join the new root meanwhile
        group.kill("root")
        group.start_root()
        resumed = threading.Timer(3.0, group.signal, ("shard", signal.SIGCONT))
        resumed.start()
        try:
            started = time.monotonic()
            # fc1.b is held whole by the root: this push goes to the root alone
            reply = worker.push({"fc1.b": np.zeros(256, np.float32)}, base=0)
        finally:
            resumed.join()
        assert reply.applied and time.monotonic() - started >= 3.0


def test_the_dashboard_follows_a_group_through_a_restarted_shard_and_root(group):
    """The dashboard's collector asks the root for `stats` and every shard beside it (no
    hello): after shard 1 and then the root were restarted it shows both shards live."""
    from minips.classroom.dashboard.collector import Collector

    collector = Collector(group.root_address, interval=0.2)
    collector.start()
    try:
        for name in ("shard", "root"):
            seen = collector.snapshot()["seq"]
            _wait("the group live", lambda s=seen: _group_live(collector, s))
            group.kill(name)
            getattr(group, f"start_{name}")()
        seen = collector.snapshot()["seq"]
        _wait("the restarted group live", lambda: _group_live(collector, seen))
        assert collector.snapshot()["phase"] == "live"
    finally:
        collector.stop()


def _group_live(collector, after: int) -> bool:
    snapshot = collector.snapshot()
    shards = snapshot.get("shards") or []
    return (snapshot["seq"] > after and snapshot["connected"] and len(shards) == 2
            and all(row["joined"] for row in shards))  # fmt: skip
