"""A worker whose server went back in time (restarted from an older checkpoint) trains
every batch of its shard: the batch whose push was answered `bad_base` is computed again
at the parameters pulled then (docs/protocol.md 7), so the worker ends `finished` and a
by-hand server whose workers all finished stops by itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from minips.ops.client_retries import RetryingClient
from minips.worker.worker import Worker

EPOCHS = 1
KILL_AT = 7 * 64  # samples: the server is killed after the worker's 7th step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _server(address: str, checkpoint: Path, log: Path, plan: str) -> subprocess.Popen:
    """A one-worker server checkpointing every 5 versions; restarted with the same
    command, it resumes from its checkpoint (docs/protocol.md 5.8)."""
    argv = [sys.executable, "-m", "minips", "server", "--bind", address, "--workers", "1",
            "--model", "mlp", "--dataset", "synthetic", "--epochs", str(EPOCHS),
            "--checkpoint", str(checkpoint), "--checkpoint-every", "5",
            "--checkpoint-interval", "0", "--plan", plan]  # fmt: skip
    return subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT)


@pytest.mark.parametrize("wait_free", [False, True], ids=["one-push", "wait-free"])
def test_a_worker_rewound_by_a_restarted_server_trains_every_batch(
    tmp_path: Path, wait_free: bool
) -> None:
    """wait-free: the layers' pushes go from the sender thread, so the `bad_base` that
    rewinds the step is one of theirs; the steps after it send their layers again."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    checkpoint, log = tmp_path / "run.npz", tmp_path / "server.log"
    plan = "dense"
    if wait_free:
        (tmp_path / "plan.json").write_text(json.dumps({"wait_free": True, "params": {}}))
        plan = str(tmp_path / "plan.json")
    servers = [_server(address, checkpoint, log, plan)]

    def crash_once(samples: int, _total: int, _latest: dict) -> None:
        # Called between steps: kill the server at version 7 (its last checkpoint is at 5)
        # and start it again on the same address, from that checkpoint.
        if samples >= KILL_AT and len(servers) == 1:
            os.kill(servers[0].pid, signal.SIGKILL)
            servers[0].wait(30)
            servers.append(_server(address, checkpoint, log, plan))

    client = RetryingClient(address, timeout=5.0, retries=6)
    try:
        report = Worker(client, progress=crash_once).run()
        client.bye(finished=report.finished)
        total = EPOCHS * 2000  # the synthetic training set, the one worker's whole shard
        assert len(servers) == 2, "the server was never killed"
        assert "resumed from" in log.read_text()
        assert (report.samples, report.finished) == (total, True), log.read_text()[-2000:]
        # Every rank finished: the restarted server stops by itself (docs/protocol.md 5.6).
        assert servers[1].wait(60) == 0
    finally:
        client.close()
        for server in servers:
            if server.poll() is None:
                server.kill()
                server.wait(30)
