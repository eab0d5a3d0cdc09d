"""`minips server --servers K` serving its whole group from one process
(minips/run/servergroup.py): stopped by Ctrl-C, then Ctrl-C again while its shards stop,
it still waits for them and assembles the group checkpoint."""

from __future__ import annotations

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
