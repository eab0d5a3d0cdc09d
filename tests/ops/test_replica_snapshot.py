"""A replicated group's root as real processes: a replacement backup that joined with a
snapshot knows where the shards are when it takes over, even when no shard joined since
(docs/protocol.md 17.2, 17.5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from minips.group.root import GROUPS
from minips.worker.client import PSClient, ServerUnavailable

SERVE = ("--workers", "1", "--rule", "asgd", "--model", "mlp", "--dataset", "synthetic",
         "--lr", "0.1", "--seed", "0", "--servers", "2")  # fmt: skip
TCP = ("--bind", "tcp://127.0.0.1:*")


def _wait_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"no {path}")


def _until(address: str, ready, timeout: float = 60) -> dict:
    """The server's first `stats` at `address` for which ready(stats) holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with PSClient(address, timeout=0.5, retries=0, groups=GROUPS) as client:
                stats = client.stats()
            if ready(stats):
                return stats
        except ServerUnavailable:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{address} never got there")


@contextmanager
def servers(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """`start(name, *argv)`: a `minips server` logging to tmp_path/NAME.log; every one
    started is killed when the block ends."""
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, *argv: str) -> subprocess.Popen:
        logs.append(open(tmp_path / f"{name}.log", "w"))  # noqa: SIM115
        command = [sys.executable, "-m", "minips", "server", *argv]
        procs.append(subprocess.Popen(command, stdout=logs[-1], stderr=subprocess.STDOUT))
        return procs[-1]

    try:
        yield start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for log in logs:
            log.close()


class Group(NamedTuple):
    """A group of two shards, each with a backup: procs are (root, its backup, shard 1, its
    backup); root and shard_address the clients' addresses; link the root's link."""

    procs: tuple[subprocess.Popen, ...]
    root: str
    link: str
    shard_address: str


def _group_with_backups(tmp_path: Path, start: Callable[..., subprocess.Popen]) -> Group:
    endpoint, shard_endpoint = tmp_path / "endpoint", tmp_path / "endpoint-shard1"
    primary = start("root", *SERVE, "--shard", "0", "--replicas", "2", *TCP,
                    "--endpoint-file", str(endpoint))  # fmt: skip
    root, link = _wait_file(endpoint), _wait_file(Path(f"{endpoint}-link"))
    backup = start("root-backup", *SERVE, "--shard", "0", "--backup-of", link)
    shard = start("shard", "--servers", "2", "--shard", "1", "--root", root, *TCP,
                  "--endpoint-file", str(shard_endpoint))  # fmt: skip
    shard_link = _wait_file(Path(f"{shard_endpoint}-link"))
    shard_backup = start("shard-backup", *SERVE, "--shard", "1", "--root", root,
                         "--backup-of", shard_link)  # fmt: skip
    procs = (primary, backup, shard, shard_backup)
    return Group(procs, root, link, _wait_file(shard_endpoint))


def test_a_root_backup_joined_by_snapshot_knows_the_shards_when_it_takes_over(tmp_path):
    with servers(tmp_path) as start:
        made = _group_with_backups(tmp_path, start)
        primary, first_backup, shard, shard_backup = made.procs
        root, link, shard_address = made.root, made.link, made.shard_address
        _until(root, lambda stats: stats["group"]["addresses"][1] == shard_address)
        for proc in (shard, shard_backup):  # no join from now on
            proc.send_signal(signal.SIGSTOP)
        first_backup.kill()
        # the primary lets the dead backup go, then welcomes this one with a snapshot
        replacement = start("root-backup-2", *SERVE, "--shard", "0", "--backup-of", link)
        _until(root, lambda stats: stats["replication"]["joins"] == 2
               and stats["replication"]["backup"])  # fmt: skip
        os.kill(primary.pid, signal.SIGKILL)
        stats = _until(root, lambda stats: stats["replication"]["pid"] == replacement.pid)
    assert stats["replication"]["role"] == "primary"
    assert stats["group"]["addresses"] == [root, shard_address]


def test_a_shard_backup_that_took_over_joins_the_root_with_the_clients_address(tmp_path):
    """Shard 1's backup binds a private address while it follows; once its primary is
    killed it takes over the clients' address and joins the root with that one, so the
    group map every client reads names an address that serves (17.5)."""
    with servers(tmp_path) as start:
        made = _group_with_backups(tmp_path, start)
        _, _, shard, shard_backup = made.procs
        root, shard_address = made.root, made.shard_address
        _until(shard_address, lambda stats: stats["replication"]["backup"])
        os.kill(shard.pid, signal.SIGKILL)

        # the backup took over and the root took its join (it names itself in the map)
        def taken_and_joined(stats: dict) -> bool:
            return (stats["replication"]["pid"] == shard_backup.pid
                    and stats["group"]["addresses"][1] is not None)  # fmt: skip

        taken = _until(shard_address, taken_and_joined)
        group = _until(root, lambda stats: True)["group"]
    assert taken["replication"]["role"] == "primary"
    assert taken["group"]["addresses"] == [root, shard_address]
    assert group["addresses"] == [root, shard_address]
