"""`minips server --servers K` serving its whole group from one process
(minips/run/servergroup.py): stopped by Ctrl-C, then Ctrl-C again while its shards stop,
it still waits for them and assembles the group checkpoint."""

from __future__ import annotations

import contextlib
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


def test_a_resumed_group_whose_shard_stopped_first_writes_its_group_checkpoint(tmp_path):
    """A shard that stopped before its root (SIGTERM to both, as to the process group) is
    on its way out when the root's own SIGTERM for it comes: it still ends as stopped (exit
    0), and the resumed group writes its group checkpoint with no `error:` line. The shard
    is held on its way out by a full stdout pipe, so the root's SIGTERM surely finds it
    there, after its stop (where the default handler would kill it: exit code -15)."""
    checkpoint = tmp_path / "group.npz"
    argv = [sys.executable, "-m", "minips", "server", *SERVE, "--checkpoint", str(checkpoint)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in first.stdout:  # the shard serves: it has joined
        if "minips server on" in line:
            break
    first.send_signal(signal.SIGTERM)
    said, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and file_version(checkpoint) == 0, said
    read, write = os.pipe()
    log = tmp_path / "server.log"
    with log.open("w") as err:
        server = subprocess.Popen(argv, stdout=write, stderr=err)
    out = os.fdopen(read, "rb")
    try:
        seen = b""
        while b"minips server on" not in seen:  # the resumed shard serves
            assert server.poll() is None, log.read_text()
            seen += os.read(read, 4096)
        (shard,) = _children(server.pid)
        time.sleep(1)  # past its start: serving, its handlers set
        own = tmp_path / "group-shard1.npz"
        written = own.stat().st_mtime_ns
        os.close(write)
        # fill the pipe, so that the shard's summary line waits in its write (through an
        # open file of its own: non-blocking for this test only)
        with open(f"/proc/{server.pid}/fd/1", "wb", buffering=0) as fill:
            os.set_blocking(fill.fileno(), False)
            with contextlib.suppress(BlockingIOError):
                while fill.write(b"\n" * 4096):
                    pass
        os.kill(shard, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while own.stat().st_mtime_ns == written:  # its final checkpoint
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(1)  # stopped, held writing its summary line
        server.send_signal(signal.SIGTERM)
        time.sleep(1)  # the root stops and sends its SIGTERM to the held shard
        said = (seen + out.read()).decode().replace("\n\n", "")
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        out.close()
    said += log.read_text()
    assert "resumed each shard from the model" in said, said
    assert server.returncode == 0 and "error:" not in said, said
    assert f"group checkpoint {checkpoint}" in said and file_version(checkpoint) == 0, said
