"""Two replicas of one server as real processes (`minips server --replicas 2` and
`--backup-of LINK`): the backup takes over the primary's address once the primary is
SIGKILLed, with the primary's registry, so a push retried across the failover is
answered from memory and applied once (docs/protocol.md 17)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq

from minips.nn import build_model
from minips.worker.client import PSClient, ServerUnavailable

SERVE = ("--workers", "1", "--rule", "asgd", "--model", "mlp", "--dataset", "synthetic",
         "--lr", "0.1", "--seed", "0")  # fmt: skip


def _wait_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        time.sleep(0.05)
    raise AssertionError(f"no {path}")


@contextmanager
def replicas(
    tmp_path: Path, *options: str, backup_options: tuple[str, ...] = ()
) -> Iterator[tuple[subprocess.Popen, subprocess.Popen, str]]:
    """A primary and its backup (also given `backup_options`); yields both processes and
    the clients' address."""
    endpoint = tmp_path / "endpoint"
    server = [sys.executable, "-m", "minips", "server", *SERVE, *options]
    logs = [open(tmp_path / name, "w") for name in ("primary.log", "backup.log")]  # noqa: SIM115
    primary = subprocess.Popen([*server, "--replicas", "2", "--bind", "tcp://127.0.0.1:*",
                                "--endpoint-file", str(endpoint)],
                               stdout=logs[0], stderr=subprocess.STDOUT)  # fmt: skip
    backup = None
    try:
        address = _wait_file(endpoint, primary)
        link = _wait_file(Path(f"{endpoint}-link"), primary)
        # the same endpoint file, as a launcher starts it: the fence's (protocol.md 17.2)
        backup = subprocess.Popen([*server, *backup_options, "--backup-of", link,
                                   "--endpoint-file", str(endpoint)],
                                  stdout=logs[1], stderr=subprocess.STDOUT)  # fmt: skip
        yield primary, backup, address
    finally:
        for proc in (primary, backup):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()


def test_a_backup_the_primary_let_go_never_takes_over(tmp_path):
    """The fence: the backup stalls past the bound, the primary lets it go and acknowledges
    a push alone, then dies. The backup, behind that push, exits rather than serve without
    it (an acknowledged update lost)."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path) as (primary, backup, address):
        welcomed = tmp_path / "endpoint-backup"
        _wait_file(welcomed, primary)
        with PSClient(address, timeout=5.0, retries=0, worker_id="w") as client:
            client.hello({"host": "test"})
            base = client.pull().version
            assert client.push(grads, base=base).version == 1  # held until the backup had it
            os.kill(backup.pid, signal.SIGSTOP)
            alone = client.push(grads, base=1)  # answered once the primary let the backup go
            assert alone.version == 2 and not welcomed.exists()
        os.kill(primary.pid, signal.SIGKILL)
        primary.wait()
        os.kill(backup.pid, signal.SIGCONT)
        assert backup.wait(timeout=30) == 2
    said = (tmp_path / "backup.log").read_text()
    assert "served alone" in said and "took over" not in said, said


def test_a_backup_let_go_never_takes_over_from_the_replacement_that_holds_the_state(tmp_path):
    """The fence names the one backup that holds the state: the first backup stalls and is
    let go, a replacement joins and is welcomed, a push is acknowledged with it; then the
    primary dies. The first backup, behind that push, exits though it alone could take
    over (the replacement stopped meanwhile); the replacement takes over with every
    acknowledged push."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path) as (primary, backup, address):
        link = _wait_file(tmp_path / "endpoint-link", primary)
        _wait_file(tmp_path / "endpoint-backup", primary)
        replacement, log = None, None
        try:
            with PSClient(address, timeout=5.0, retries=0, worker_id="w") as client:
                client.hello({"host": "test"})
                assert client.push(grads, base=client.pull().version).version == 1
                os.kill(backup.pid, signal.SIGSTOP)
                assert client.push(grads, base=1).version == 2  # the backup let go
                replacement, log = _replacement(tmp_path, link)
                deadline = time.monotonic() + 60
                while not _holds_the_state(tmp_path, replacement):
                    assert time.monotonic() < deadline, "the replacement was never welcomed"
                    assert replacement.poll() is None, "the replacement exited"
                    time.sleep(0.05)
                assert client.push(grads, base=2).version == 3  # held until the replacement had it
            os.kill(replacement.pid, signal.SIGSTOP)  # the first backup alone could take over
            os.kill(primary.pid, signal.SIGKILL)
            primary.wait()
            os.kill(backup.pid, signal.SIGCONT)
            assert backup.wait(timeout=30) == 2
            os.kill(replacement.pid, signal.SIGCONT)
            with PSClient(address, timeout=2.0, retries=15, worker_id="w") as client:
                stats = client.stats()
            assert replacement.poll() is None, "the replacement serves"
        finally:
            if replacement is not None:
                replacement.kill()
                replacement.wait()
                log.close()
    assert stats["version"] == 3 and stats["replication"]["pid"] == replacement.pid
    assert "took over" not in (tmp_path / "backup.log").read_text()


def test_a_backup_writes_checkpoints_only_once_it_took_over(tmp_path):
    """Both replicas are given a checkpoint path (here each its own, to tell them apart):
    the backup that follows writes none, the primary's are the run's; once the backup
    took over, its checkpoints are written."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    primary_file, backup_file = tmp_path / "primary.npz", tmp_path / "backup.npz"
    every = ("--checkpoint-every", "1", "--checkpoint-interval", "0.2")
    pair = replicas(tmp_path, *every, "--checkpoint", str(primary_file),
                    backup_options=("--checkpoint", str(backup_file)))  # fmt: skip
    with pair as (primary, backup, address):
        _wait_file(tmp_path / "endpoint-backup", primary)
        with PSClient(address, timeout=5.0, retries=10, worker_id="w") as client:
            client.hello({"host": "test"})
            version = client.pull().version
            for _ in range(3):  # each acknowledged once the backup applied it
                version = client.push(grads, base=version).version
            deadline = time.monotonic() + 30
            while not primary_file.exists():
                assert time.monotonic() < deadline, "the primary wrote no checkpoint"
                time.sleep(0.05)
            time.sleep(0.5)  # past the checkpoint interval on the backup too
            assert not backup_file.exists(), "the backup wrote a checkpoint while it followed"
            os.kill(primary.pid, signal.SIGKILL)
            assert client.push(grads, base=version).version == 4  # to the backup, which took over
            deadline = time.monotonic() + 30
            while not backup_file.exists():
                assert time.monotonic() < deadline, "the backup that took over wrote no checkpoint"
                time.sleep(0.05)


def test_a_push_retried_across_the_failover_is_applied_once(tmp_path):
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path) as (primary, backup, address):
        with PSClient(address, timeout=2.0, retries=10, worker_id="w") as client:
            client.hello({"host": "test"})
            base = client.pull().version
            first = client.push(grads, base=base)
            assert first.version == 1 and first.applied
            os.kill(primary.pid, signal.SIGKILL)
            client._seq = 0  # its reply lost with the primary: the same push again
            again = client.push(grads, base=base)
            stats = client.stats()
        assert backup.poll() is None, "the backup serves on"
    assert (again.version, again.applied) == (first.version, first.applied)
    assert stats["version"] == 1 and stats["updates"] == 1
    assert [w["pushes"] for w in stats["workers"] if w["worker"] == "w"] == [1]
    assert "took over as primary" in (tmp_path / "backup.log").read_text()


def _replacement(tmp_path: Path, link: str) -> tuple[subprocess.Popen, Any]:
    log = open(tmp_path / "replacement.log", "a")  # noqa: SIM115
    command = [sys.executable, "-m", "minips", "server", *SERVE, "--backup-of", link,
               "--endpoint-file", str(tmp_path / "endpoint")]  # fmt: skip
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log


def _holds_the_state(tmp_path: Path, replica: subprocess.Popen) -> bool:
    """Whether the fence's file names `replica` (protocol.md 17.2): it holds every
    acknowledged input while its primary is stopped and cannot let it go."""
    welcomed = tmp_path / "endpoint-backup"
    return welcomed.exists() and welcomed.read_text().strip() == str(replica.pid)


def test_a_replacement_joins_with_the_registry_and_answers_a_retry_from_it(tmp_path):
    """The backup dies; a replacement joins the primary, which has served, from a
    snapshot of its state; then the primary dies: the replacement answers a retry of a
    push applied before it joined from the registry it was given, and applies it once.

    On a loaded machine a joiner can stay silent past the bound and be let go (then the
    fence stops it from taking over); the kill comes only once the primary, stopped, has
    not let the replacement go, and a replacement let go is replaced again."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path) as (primary, backup, address):
        link = (tmp_path / "endpoint-link").read_text().strip()
        with PSClient(address, timeout=2.0, retries=10, worker_id="w") as client:
            client.hello({"host": "test"})
            base = client.pull().version
            first = client.push(grads, base=base)
            backup.kill()
            backup.wait()
            latest, replacement, log = first, None, None
            try:
                for joins in range(2, 7):
                    replacement, log = _replacement(tmp_path, link)
                    deadline = time.monotonic() + 60
                    while client.stats()["replication"]["joins"] < joins:
                        assert time.monotonic() < deadline, "the replacement never joined"
                        time.sleep(0.1)
                    latest = client.push(grads, base=latest.version)  # forwarded to it
                    os.kill(primary.pid, signal.SIGSTOP)
                    if _holds_the_state(tmp_path, replacement):
                        break
                    os.kill(primary.pid, signal.SIGCONT)  # it was let go: another one
                    replacement.kill()
                    replacement.wait()
                    log.close()
                else:
                    raise AssertionError("five replacements were all let go")
                os.kill(primary.pid, signal.SIGKILL)
                client._seq = 0  # the first push again, its reply lost
                again = client.push(grads, base=base)
                stats = client.stats()
            finally:
                if replacement is not None:
                    replacement.kill()
                    replacement.wait()
                    log.close()
    pushes = latest.version  # the first, then one per replacement started
    assert first.version == 1 and pushes >= 2
    assert (again.version, again.applied) == (first.version, first.applied)
    assert stats["version"] == pushes and stats["updates"] == pushes
    assert stats["replication"]["failovers"], "the replacement took over"


def test_the_failover_bound_is_the_runs_on_both_replicas(tmp_path):
    """`--failover-after 2.5`: the primary lets a stopped backup go only after 2.5 s (a push
    waits that long for its reply), and a backup takes over only after 2.5 s of silence."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path, "--failover-after", "2.5") as (primary, backup, address):
        _wait_file(tmp_path / "endpoint-backup", primary)
        with PSClient(address, timeout=10.0, retries=0, worker_id="w") as client:
            client.hello({"host": "test"})
            assert client.push(grads, base=client.pull().version).version == 1
            os.kill(backup.pid, signal.SIGSTOP)
            asked = time.monotonic()
            assert client.push(grads, base=1).version == 2  # once the backup was let go
            waited = time.monotonic() - asked
        os.kill(backup.pid, signal.SIGCONT)
        assert backup.wait(timeout=30) == 2  # let go: the fence stops it
    # the backup's last acknowledgement came at most a beat (0.1 s) before it stopped
    assert waited > 2.3, waited
    again = tmp_path / "again"
    again.mkdir()
    with replicas(again, "--failover-after", "2.5") as (primary, backup, address):
        _wait_file(again / "endpoint-backup", primary)
        os.kill(primary.pid, signal.SIGKILL)
        with PSClient(address, timeout=2.0, retries=15, worker_id="w") as client:
            failover = client.stats()["replication"]["failovers"][0]
    assert failover["silent_s"] >= 2.5, failover


def test_a_push_is_answered_only_once_the_backup_holds_it(tmp_path):
    """A backup that cannot acknowledge (stopped) holds the push's reply back: the client
    gets none while it is stopped; once it goes on, the retry is answered, applied once."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    with replicas(tmp_path) as (primary, backup, address):
        with PSClient(address, timeout=5.0, retries=3, worker_id="w") as client:
            client.hello({"host": "test"})
            base = client.pull().version
            client.timeout, client.retries = 0.3, 0  # well inside the 1 s bound
            os.kill(backup.pid, signal.SIGSTOP)
            try:
                with pytest.raises(ServerUnavailable):
                    client.push(grads, base=base)  # applied by the primary, not answered
            finally:
                os.kill(backup.pid, signal.SIGCONT)
            client.timeout, client.retries = 5.0, 3
            client._seq = 0  # the same push again
            again = client.push(grads, base=base)
            stats = client.stats()
    assert (again.version, again.applied) == (1, True)
    assert stats["version"] == 1 and stats["updates"] == 1


def test_a_worker_the_primary_declared_dead_is_dead_on_the_backup_that_takes_over(tmp_path):
    """The backup decides nothing by its own clock: the primary's liveness decision
    reaches it as an event, so right after the takeover (its own clock has counted the
    silence afresh) the silent worker is already gone, the other one still live."""
    with replicas(tmp_path, "--workers", "2", "--heartbeat-timeout", "2") as (primary, _, address):
        with (
            PSClient(address, timeout=1.0, retries=10, worker_id="live") as live,
            PSClient(address, timeout=1.0, retries=10, worker_id="silent") as silent,
        ):
            live.hello({"host": "test"})
            silent.hello({"host": "test"})
            deadline = time.monotonic() + 30
            while _alive(live.stats(), "silent"):  # declared dead by the primary's clock
                assert time.monotonic() < deadline, "the silent worker was never declared dead"
                live.ping()
                time.sleep(0.2)
            os.kill(primary.pid, signal.SIGKILL)
            live.ping()  # answered by the backup, once it took over
            stats = live.stats()
    assert stats["replication"]["failovers"], "the backup took over"
    assert not _alive(stats, "silent") and _alive(stats, "live")


def _alive(stats: dict, worker_id: str) -> bool:
    return any(w["worker"] == worker_id and w["alive"] for w in stats["workers"])


def test_a_stalled_primary_keeps_its_ipc_address_and_the_backup_does_not_serve_beside_it(
    tmp_path,
):
    """The primary stopped (SIGSTOP) past the failover bound: the backup takes it for dead,
    but its ipc path still answers, so the backup does not bind it (ZeroMQ would replace
    the socket file: two primaries, the workers on the old one) and exits in one line; the
    primary, continued, serves on with every update, for old and new connections alike."""
    grads = {name: np.full_like(p, 0.01) for name, p in build_model("mlp", seed=0).params.items()}
    endpoint, where = tmp_path / "endpoint", f"ipc://{tmp_path}/s.sock"
    server = [sys.executable, "-m", "minips", "server", *SERVE]
    with open(tmp_path / "primary.log", "w") as log, open(tmp_path / "backup.log", "w") as log2:
        primary = subprocess.Popen([*server, "--replicas", "2", "--bind", where,
                                    "--endpoint-file", str(endpoint)],
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        backup = None
        try:
            link = _wait_file(Path(f"{endpoint}-link"), primary)
            backup = subprocess.Popen([*server, "--backup-of", link], stdout=log2,
                                      stderr=subprocess.STDOUT)  # fmt: skip
            with PSClient(where, timeout=5.0, retries=3, worker_id="w") as client:
                client.hello({"host": "test"})
                first = client.push(grads, base=client.pull().version)
                os.kill(primary.pid, signal.SIGSTOP)
                try:
                    assert backup.wait(30) != 0, "the backup ended without an error"
                finally:
                    os.kill(primary.pid, signal.SIGCONT)
                second = client.push(grads, base=first.version)
            with PSClient(where, timeout=5.0, retries=3) as fresh:  # a new connection
                stats = fresh.stats()
        finally:
            for proc in (primary, backup):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    assert (first.version, second.version) == (1, 2) and second.applied
    assert stats["version"] == 2 and stats["replication"]["role"] == "primary"
    said = (tmp_path / "backup.log").read_text()
    assert "still answers" in said and "Traceback" not in said, said


def _link_peer(link: str) -> zmq.Socket:
    """A DEALER on the primary's replication link, as a (hostile) backup would connect."""
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(link)
    return peer


def test_garbage_on_the_link_and_a_false_acknowledgement_leave_replies_held(tmp_path):
    """Frames that are no message cost the sender, not the primary (it waits on for its
    backup); a fake backup acknowledging inputs never sent (n = 2**63) does not let later
    replies go unheld once the real backup is attached and stopped."""
    with replicas(tmp_path) as (primary, backup, address):
        link = (tmp_path / "endpoint-link").read_text().strip()
        with PSClient(address, timeout=5.0, retries=3, worker_id="w") as client:
            client.hello({"host": "test"})  # the real backup is attached: kill it
            backup.kill()
            backup.wait()
            fake = _link_peer(link)
            try:
                for garbage in ([b""], [b"\xc1"], [b"\x01\x02"], [msgpack.packb([1])]):
                    fake.send_multipart(garbage)
                fake.send(msgpack.packb({"r": "join"}))
                assert fake.poll(30_000), "the primary never welcomed the fake backup"
                assert msgpack.unpackb(fake.recv())["r"] == "welcome"
                for _ in range(5):
                    fake.send(msgpack.packb({"r": "ack", "n": 2**63}))
                    time.sleep(0.1)
            finally:
                fake.close()  # silent from now: let go after 1 s
            stats = client.stats()
            assert primary.poll() is None and stats["replication"]["role"] == "primary"
            with open(tmp_path / "real.log", "w") as log:
                real = subprocess.Popen([sys.executable, "-m", "minips", "server", *SERVE,
                                         "--backup-of", link],
                                        stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
                try:
                    deadline = time.monotonic() + 60
                    while not client.stats()["replication"]["backup"]:
                        assert time.monotonic() < deadline, "the real backup never joined"
                        time.sleep(0.1)
                    os.kill(real.pid, signal.SIGSTOP)
                    client.timeout, client.retries = 0.5, 0  # within the 1 s bound
                    with pytest.raises(ServerUnavailable):
                        client.stats()  # held: the stopped backup acknowledged nothing
                finally:
                    real.kill()
                    real.wait()


def test_a_backup_that_took_over_before_any_request_serves_at_once(tmp_path):
    """The primary killed before any client spoke: the backup that took over answers within
    the failover bound, not after a wait for a backup of its own."""
    with replicas(tmp_path) as (primary, backup, address):
        deadline = time.monotonic() + 30
        while "backup joined" not in (tmp_path / "primary.log").read_text():
            assert time.monotonic() < deadline, "the backup never joined"
            time.sleep(0.05)
        primary.kill()
        primary.wait()
        started = time.monotonic()
        with PSClient(address, timeout=10.0, retries=0) as client:
            stats = client.stats()
        assert time.monotonic() - started < 10
    assert stats["replication"]["role"] == "primary" and stats["replication"]["failovers"]


def test_a_backup_nobody_welcomes_stops_on_ctrl_c(tmp_path):
    """A backup waiting for a primary that does not answer (the wait is a minute) leaves
    at once on a signal, as any minips command does."""
    with zmq.Context() as context, context.socket(zmq.ROUTER) as silent:
        port = silent.bind_to_random_port("tcp://127.0.0.1")  # takes the join, never answers
        backup = subprocess.Popen([sys.executable, "-m", "minips", "server", *SERVE,
                                   "--backup-of", f"tcp://127.0.0.1:{port}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            assert silent.poll(30_000), "the backup never asked to join"
            backup.send_signal(signal.SIGINT)
            assert backup.wait(timeout=10) == 0
        finally:
            if backup.poll() is None:
                backup.kill()
                backup.wait()


def test_a_following_backup_stays_through_signals_until_its_primary_ends_it(tmp_path):
    """A run's stop reaches both replicas, a terminal's Ctrl-C then the launcher's SIGTERM:
    the backup keeps following (were the primary dead, it would take over and keep the
    model), and the primary's stop ends it."""
    with replicas(tmp_path) as (primary, backup, _address):
        _wait_file(tmp_path / "endpoint-backup", primary)
        backup.send_signal(signal.SIGINT)
        backup.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert backup.poll() is None  # still following
        primary.send_signal(signal.SIGTERM)
        assert primary.wait(timeout=30) == 0
        assert backup.wait(timeout=30) == 0
    assert "took over" not in (tmp_path / "backup.log").read_text()
