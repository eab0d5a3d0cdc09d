"""`minips server --servers K` serving its whole group from one process
(minips/run/servergroup.py): stopped by Ctrl-C, then Ctrl-C again while its shards stop,
it still waits for them and assembles the group checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from minips.ops.checkpoint_file import file_version

SERVE = ["--servers", "2", "--workers", "1", "--model", "mlp", "--dataset", "synthetic",
         "--rule", "asgd", "--bind", "tcp://127.0.0.1:*"]  # fmt: skip


def test_a_second_ctrl_c_while_the_shards_stop_keeps_the_group_checkpoint(tmp_path):
    endpoint, checkpoint = tmp_path / "endpoint", tmp_path / "group.npz"
    argv = [sys.executable, "-m", "minips", "server", *SERVE, "--endpoint-file", str(endpoint),
            "--checkpoint", str(checkpoint)]  # fmt: skip
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "minips server on" not in log.read_text():  # the shard serves: it has joined
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        server.send_signal(signal.SIGINT)
        for _ in range(5):  # impatient: again and again while the shard writes its checkpoint
            time.sleep(0.1)
            server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    said = log.read_text()
    # 0, or the status of a Ctrl-C that came once the work was done (130, or -2 while
    # the interpreter ended): the stop itself is what must survive the signals
    assert server.returncode in (0, 130, -signal.SIGINT), said
    assert f"group checkpoint {checkpoint}" in said, said
    assert file_version(checkpoint) == 0  # whole: the group's model, as it was


def _children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def test_a_shard_that_dies_is_said_and_no_mixed_group_checkpoint_is_written(tmp_path):
    """SIGKILL to shard 1 while the group serves: one `warning:` line names it at once;
    stopped, the group ends with an `error:` line naming it and writes no group checkpoint
    (shard 0's final slices beside shard 1's older ones would be one model of two times)."""
    endpoint, checkpoint = tmp_path / "endpoint", tmp_path / "group.npz"
    argv = [sys.executable, "-m", "minips", "server", *SERVE, "--endpoint-file", str(endpoint),
            "--checkpoint", str(checkpoint)]  # fmt: skip
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "minips server on" not in log.read_text():  # the shard serves: it has joined
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        (shard,) = _children(server.pid)
        os.kill(shard, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while "warning: shard 1" not in log.read_text():  # said while the group serves
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    said = log.read_text()
    assert said.count(f"warning: shard 1 (pid {shard}) exited with code -9 while") == 1, said
    assert server.returncode == 2, said
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"shard 1 (pid {shard}, exit code -9)" in errors[0], said
    assert f"the group checkpoint {checkpoint} is not written" in errors[0]
    assert not checkpoint.exists() and "group checkpoint" not in said.replace(errors[0], "")
