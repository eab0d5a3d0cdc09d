"""A replicated server under CURVE keys (`minips run --auth --replicas 2`): the primary
SIGKILLed, the backup takes over with the same server key and the same owners, and the run
ends as the calm one; a client without a valid key gets nothing from it, a worker key
neither stops it nor acts as another worker. And the replication link admits only a
process that holds the server's secret key (docs/protocol.md 17.3).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq
import zmq.utils.monitor
from run_support import paused, workers_of
from test_replicas import (
    _calm_run,
    _each_lost_replica_replaced,
    _finish,
    _held_by,
    _killed,
    _same_model,
    _start,
)
from test_replicas_group import _endpoint
from test_replicas_group import _start as _start_group
from test_run_auth import _refused_as, _unanswered

from minips.guard import curve, wire_checks
from minips.protocol import wire
from minips.provision import keyfiles
from minips.worker.client import PSClient, ServerError

# With test_replicas.py's RUN (ssgd, 30 epochs). The workers are paused while the test
# tries the keys (_training_paused): a server retires a worker silent for the heartbeat
# timeout, 30 s by default, which a loaded machine could reach meanwhile.
KEYED = ("--auth", "--replicas", "2", "--heartbeat-timeout", "300")


def _stats(out: Path, endpoint_file: str = "endpoint") -> dict | None:
    """The `stats` of the one server whose endpoint file is `out/endpoint_file`, asked with
    the run's operator key on a socket of its own (None while none answers)."""
    try:
        endpoint = (out / endpoint_file).read_text().strip()
        keys = keyfiles.load_client_keys(out / "keys", keyfiles.OPERATOR)
    except (FileNotFoundError, ValueError):  # not written yet, or being replaced
        return None
    if not endpoint:
        return None
    with zmq.Context() as context, context.socket(zmq.DEALER) as socket:
        socket.linger = 0
        curve.make_curve_client(socket, keys)
        socket.connect(endpoint)
        socket.send_multipart(wire.encode({"op": "stats", "rid": 1}))
        if not socket.poll(2000):
            return None
        return wire_checks.decode_reply(socket.recv_multipart()).header["stats"]


def _wait_for(out: Path, ready, what: str, endpoint_file: str = "endpoint") -> dict:
    """The stats of the server at `out/endpoint_file` once `ready(stats)` holds."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        stats = _stats(out, endpoint_file)
        if stats is not None and ready(stats):
            return stats
        time.sleep(0.1)
    raise AssertionError(f"the run never {what}")


def _held(out: Path, stats: dict, shard: int | None = None) -> bool:
    """A backup holds the state of the server (shard `shard`'s) whose `stats` these are."""
    primary = stats["replication"]["pid"]
    endpoint = _endpoint(out, shard or 0)
    return stats["replication"]["backup"] and _held_by(endpoint, out, shard, primary) is not None


@contextmanager
def _training_paused(run: subprocess.Popen):
    """The run's workers SIGSTOPped meanwhile: the run stays live however long the checks
    made against it take (KEYED's heartbeat timeout keeps the paused workers known), and
    ssgd ends the same whenever its steps come."""
    workers = workers_of(run)
    assert len(workers) == 2, workers
    with paused(workers):
        yield


def _stop_all(*procs) -> None:
    for running in procs:
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
            running.communicate()


def _strangers(tmp_path: Path, out: Path) -> tuple[curve.ClientKeys, curve.ClientKeys]:
    """The run's operator keys, and a pair the run never allowed (it knows the server's key)."""
    operator = keyfiles.load_client_keys(out / "keys", keyfiles.OPERATOR)
    keyfiles.make_keys(tmp_path / "other")
    stranger = keyfiles.load_client_keys(tmp_path / "other", keyfiles.OPERATOR)
    return operator, curve.ClientKeys(stranger.pair, operator.server_public)


def test_a_keyed_primary_killed_changes_nothing_and_its_backup_keeps_the_keys(
    tmp_path, tmp_path_factory
):
    """The keyed run ends exactly as test_replicas.py's run without keys never killed."""
    out = tmp_path / "killed"
    proc = _start(out, *KEYED)
    try:
        stats = _wait_for(out, lambda s: s["version"] > 40 and _held(out, s),
                          "trained with a backup holding its state")  # fmt: skip
        os.kill(stats["replication"]["pid"], signal.SIGKILL)
        # the workers' retries, under their keys, meet the takeover
        _wait_for(out, lambda s: s["replication"]["failovers"], "failed over")
        with _training_paused(proc):
            endpoint = (out / "endpoint").read_text().strip()
            operator, wrong = _strangers(tmp_path, out)
            # the backup serves with the server's key and its allow-list: no key, or a key
            # it never allowed, gets nothing at all
            _unanswered(PSClient(endpoint, timeout=0.5, retries=0, worker_id="intruder"))
            _unanswered(PSClient(endpoint, timeout=0.5, retries=0, worker_id="intruder",
                                 keys=wrong))  # fmt: skip
            # the keys the primary's clients used came with their requests: a worker key is
            # no operator, and cannot act as the workers that said hello with it
            worker_keys = keyfiles.load_client_keys(out / "keys", keyfiles.WORKER)
            with PSClient(endpoint, timeout=5, keys=worker_keys) as worker:
                with pytest.raises(ServerError) as refused:
                    worker.stop()
                assert refused.value.code == "operator"
                victims = [row["worker"] for row in worker.stats()["workers"] if row["alive"]]
            assert victims
            for victim in victims:
                assert _refused_as(endpoint, worker_keys, victim) == ["not_owner"] * 5
        (calm_out, calm_summary), summary = _calm_run(tmp_path_factory), _finish(proc, out)
    finally:
        _stop_all(proc)
    assert (summary["loss"], summary["accuracy"], summary["updates"]) == (
        calm_summary["loss"],
        calm_summary["accuracy"],
        calm_summary["updates"],
    )
    _same_model(out, calm_out)
    replication = summary["replication"]
    assert len(replication["failovers"]) == 1 and summary["updates_lost"] == 0
    assert replication["failovers"][0]["exit_code"] == -signal.SIGKILL
    _each_lost_replica_replaced(replication)  # keyed replacements joined the new primary
    assert _killed(replication["backups_lost"]) == []  # a stalled primary's backup may be lost


def _join(link: str, keys: curve.ClientKeys | None, join: bool = True) -> tuple[bool, bool]:
    """A socket with `keys` (None: no CURVE) connected to the link, sending a `join` if
    `join`: whether its CURVE handshake succeeded, and whether anything answered, within
    3 s (a socket that asks nothing: until its handshake succeeded, at most 20 s)."""
    with zmq.Context() as context, context.socket(zmq.DEALER) as socket:
        socket.linger = 0
        if keys is not None:
            curve.make_curve_client(socket, keys)
        monitor = socket.get_monitor_socket()
        socket.connect(link)
        if join:
            socket.send(b"\x81\xa1r\xa4join")  # msgpack {"r": "join"}
        handshook = answered = False
        deadline = time.monotonic() + (3 if join else 20)
        while time.monotonic() < deadline and not (handshook and not join):
            if monitor.poll(50):
                event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
                handshook |= event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            answered |= bool(socket.poll(0))
        socket.disable_monitor()
        monitor.close()
        return handshook, answered


def test_only_a_holder_of_the_server_secret_key_joins_the_replication_link(tmp_path):
    out = tmp_path / "run"
    proc = _start(out, *KEYED)
    try:
        _wait_for(out, lambda s: s["version"] > 20 and s["replication"]["backup"],
                  "trained with a backup attached")  # fmt: skip
        link = (out / "endpoint-link").read_text().strip()
        operator, wrong = _strangers(tmp_path, out)
        worker = keyfiles.load_client_keys(out / "keys", keyfiles.WORKER)
        server = keyfiles.load_server_keys(out / "keys").pair
        with _training_paused(proc):
            # no CURVE; the run's own client keys (admitted by the server, not by its link);
            # a pair nobody allowed: none completes the handshake, none is welcomed; the
            # server's own pair does (it asks nothing: a join would be welcomed were the
            # live backup let go meanwhile, as a replacement is); side by side, so that the
            # workers are paused 3 s, not 12
            tries = [(curve.ClientKeys(server, server.public), False), (None, True),
                     (worker, True), (operator, True), (wrong, True)]  # fmt: skip
            with ThreadPoolExecutor(len(tries)) as pool:
                outcomes = list(pool.map(lambda t: _join(link, *t), tries))
            assert outcomes == [(True, False)] + [(False, False)] * 4
        stats = _wait_for(out, lambda s: s["replication"]["backup"], "kept a backup attached")
        summary = _finish(proc, out)
    finally:
        _stop_all(proc)
    assert summary["ended"] == "finished" and summary["updates_lost"] == 0
    replication = summary["replication"]
    assert replication["failovers"] == [] and _killed(replication["backups_lost"]) == []
    _each_lost_replica_replaced(replication)
    # the backups the run started, and no other (a backup that stalled past the bound on a
    # loaded machine is let go and replaced)
    assert stats["replication"]["joins"] <= 1 + len(replication["replacements"])


def test_a_keyed_group_shard_fails_over_and_its_backup_joins_the_root_with_a_key(tmp_path):
    """`--servers 2 --replicas 2 --auth`, asgd: shard 1's primary killed; its backup takes
    over and joins the root (an operator's request under keys, 16.3), and every push is
    applied once on both shards."""
    out = tmp_path / "group"
    proc = _start_group(out, "asgd", "--auth")
    try:
        stats = _wait_for(out, lambda s: s["version"] > 40 and _held(out, s, 1),
                          "trained with shard 1's backup holding its state",
                          "endpoint-shard1")  # fmt: skip
        os.kill(stats["replication"]["pid"], signal.SIGKILL)
        summary = _finish(proc, out)
    finally:
        _stop_all(proc)
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
    assert len(reports) == 2 and all(report["finished"] for report in reports)
    steps = sum(report["steps"] for report in reports)
    assert [row["updates"] for row in summary["shards"]] == [steps, steps]
    replication = summary["replication"]
    assert [f["shard"] for f in replication["failovers"]] == [1]
    assert summary["updates_lost"] == 0 and summary["restarts"] == 0
