"""A primary replica in this process, driven one input at a time, with the test as its
backup on the real link: every request and every decision of its clock reaches the backup
before its effect, and a reply a clock decision produces waits for the backup's
acknowledgement of that decision like any other (docs/protocol.md 17.1)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from test_replica_link import Backup, _read_until
from test_server_support import RawPeer, make_params

from minips.ops.replication import PRIMARY, ReplicaSettings, ReplicatedServer
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.rules import make_rule
from minips.server.router import receive
from minips.server.server import ServerOptions
from minips.state.store import SGD


@contextmanager
def primary_with_backup() -> Iterator[tuple[ReplicatedServer, Backup]]:
    """A primary of a 2-worker run (its pulls held until both said hello) and the test's
    backup, welcomed on the real link."""
    params = make_params()
    server = ReplicatedServer(params, make_rule("asgd"), SGD(params, lr=0.5),
                              ServerOptions(world_size=2), config={"model": "test"},
                              operations=ServerOps, replica=ReplicaSettings(PRIMARY))  # fmt: skip
    link = server.link
    assert link is not None
    backup = Backup(server._link_ctx, link)
    try:
        backup.send({"r": "join"})
        _read_until(link, lambda: link.joining is not None)
        link.welcome(server)
        assert backup.receive()["r"] == "welcome"
        yield server, backup
    finally:
        backup.socket.close(linger=0)
        server.close()


def _serve_next(server: ReplicatedServer) -> None:
    """The primary's loop for one request: read it, serve it."""
    assert server.socket.poll(5000), "no request arrived"
    received = receive(server.socket, keep=server._keep_frames)
    server.serve(received.frames, received.dropped)


def _ack(server: ReplicatedServer, backup: Backup, n: int) -> None:
    backup.ack(n)
    _read_until(server.link, lambda: server.replies.acked >= n)


def _input(backup: Backup) -> dict:
    message = backup.receive()
    assert message is not None, "nothing forwarded"
    return message


def test_a_reply_a_clock_decision_produces_waits_for_the_backup_to_hold_the_decision():
    with primary_with_backup() as (server, backup), RawPeer(server.endpoint) as worker:
        worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
        _serve_next(server)
        assert _input(backup)["n"] == 1
        _ack(server, backup, 1)
        assert worker.recv().op == "hello"
        worker.send(wire.encode({"op": "pull", "worker": "w0", "rid": 2}))
        _serve_next(server)  # held: the run is assembling (one of two workers came)
        assert _input(backup)["n"] == 2
        _ack(server, backup, 2)
        assert not worker.has_reply(0.3)
        server.replicate_event({"assembled": True})  # the assembly's grace ran out
        event = _input(backup)
        assert (event["r"], event["n"], event["assembled"]) == ("event", 3, True)
        assert not worker.has_reply(0.3), "the pull's reply left before the backup held why"
        _ack(server, backup, 3)
        assert worker.recv().op == "pull"


def test_a_worker_declared_dead_by_the_clock_is_an_event_the_backup_gets_first():
    with primary_with_backup() as (server, backup), RawPeer(server.endpoint) as worker:
        worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
        _serve_next(server)
        _input(backup)
        _ack(server, backup, 1)
        silent = server.registry.by_id["w0"]
        silent.last_seen = silent.last_answered = time.monotonic() - 60  # past the 30 s bound
        event = server.timers.decide(time.monotonic())
        assert event == {"retired": ["w0"]}
        assert server.registry.by_id["w0"].alive  # decided, not applied: both apply it alike
        server.replicate_event(event)
        forwarded = _input(backup)
        assert (forwarded["r"], forwarded["retired"]) == ("event", ["w0"])
        assert not server.registry.by_id["w0"].alive


def test_a_stop_the_primary_begins_is_an_input_for_the_backup():
    with primary_with_backup() as (server, backup):
        server.stop.request("a signal")
        server.begin_stop()
        message = _input(backup)
        assert (message["r"], message["stop"]) == ("event", "a signal")
        assert server.stopping
