"""A shard (minips/group/shard.py) outlives its root by a bound (docs/protocol.md 16.7):
killed for good, the root leaves shards that stop within --root-timeout seconds, saying so
in one line; a root restarted meanwhile keeps them; `minips server --servers K` stops its
shards at once on SIGTERM. Real processes on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from minips.group.root import GROUPS
from minips.worker.client import PSClient, ServerUnavailable

MINIPS = [sys.executable, "-m", "minips", "server", "--model", "mlp", "--dataset", "synthetic",
          "--servers", "2"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start(*argv: str, out: Path) -> subprocess.Popen:
    log = open(out, "w")  # noqa: SIM115 (the process writes it; read after it ended)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*MINIPS, *argv], stdout=log, stderr=subprocess.STDOUT, env=env)


def _joined(root: str, timeout: float = 60) -> list:
    """Wait until the root's stats show every shard joined; the addresses."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with PSClient(root, groups=GROUPS, timeout=1.0, retries=0) as ops:
                addresses = ops.stats()["group"]["addresses"]
            if all(addresses):
                return addresses
        except ServerUnavailable:
            pass
        time.sleep(0.2)
    raise AssertionError("the group never assembled")


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_a_shard_whose_root_is_gone_stops_within_its_root_timeout(tmp_path):
    port = _free_port()
    root_addr = f"tcp://127.0.0.1:{port}"
    root = _start("--shard", "0", "--bind", root_addr, out=tmp_path / "root.log")
    shard = _start("--shard", "1", "--root", root_addr, "--bind", "tcp://127.0.0.1:*",
                   "--root-timeout", "3", out=tmp_path / "shard.log")  # fmt: skip
    try:
        _joined(root_addr)
        root.send_signal(signal.SIGKILL)
        root.wait(10)
        killed = time.monotonic()
        shard.wait(20)  # before: it answered stats 90 s later
        took = time.monotonic() - killed
    finally:
        _stop(root, shard)
    text = (tmp_path / "shard.log").read_text()
    assert 2 <= took < 12, (took, text[-1500:])  # silent 3 s since its last reply
    assert shard.returncode == 0, text[-1500:]
    lines = [line for line in text.splitlines() if "answered no join for 3 s" in line]
    assert len(lines) == 1 and "this shard stops" in lines[0], text[-1500:]


def test_a_root_restarted_within_the_bound_keeps_its_shards(tmp_path):
    port = _free_port()
    root_addr = f"tcp://127.0.0.1:{port}"
    root = _start("--shard", "0", "--bind", root_addr, out=tmp_path / "root.log")
    shard = _start("--shard", "1", "--root", root_addr, "--bind", "tcp://127.0.0.1:*",
                   "--root-timeout", "10", out=tmp_path / "shard.log")  # fmt: skip
    again = None
    try:
        address = _joined(root_addr)[1]
        root.send_signal(signal.SIGKILL)
        root.wait(10)
        killed = time.monotonic()
        again = _start("--shard", "0", "--bind", root_addr, out=tmp_path / "root2.log")
        assert _joined(root_addr)[1] == address  # the shard joined the new root
        time.sleep(max(0.0, killed + 12 - time.monotonic()))  # past the bound since the kill
        assert shard.poll() is None, (tmp_path / "shard.log").read_text()[-1500:]
        with PSClient(address, groups=GROUPS, timeout=2.0, retries=1) as ops:
            assert ops.stats()["group"]["shard"] == 1
    finally:
        _stop(*(p for p in (root, again, shard) if p is not None))


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def test_minips_server_with_its_shards_here_stops_them_at_once_on_sigterm(tmp_path):
    port = _free_port()
    root_addr = f"tcp://127.0.0.1:{port}"
    group = _start("--bind", root_addr, out=tmp_path / "group.log")
    try:
        _joined(root_addr)
        shards = _children(group.pid)
        assert len(shards) == 1
        sent = time.monotonic()
        group.send_signal(signal.SIGTERM)
        group.wait(25)  # before: 30 s, waiting for a shard that never heard of the stop
        took = time.monotonic() - sent
    finally:
        _stop(group)
    text = (tmp_path / "group.log").read_text()
    assert took < 10 and group.returncode == 0, (took, text[-1500:])
    assert not Path(f"/proc/{shards[0]}").exists() or "zombie" in _state(shards[0])
    assert "did not stop with its root" not in text


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"
