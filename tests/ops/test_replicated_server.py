"""A primary replica in this process, driven one input at a time, with the test as its
backup on the real link: every request and every decision of its clock reaches the backup
before its effect, and a reply a clock decision produces waits for the backup's
acknowledgement of that decision like any other (docs/protocol.md 17.1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import zmq
from test_replica_link import Backup, _read_until
from test_server_support import RawPeer, make_params
from test_snapshot import _state

from minips.errors import MinipsError
from minips.ops.replica_link import FAILOVER_AFTER
from minips.ops.replication import (
    BACKUP,
    PRIMARY,
    ReplicaSettings,
    ReplicatedServer,
    bind_retrying,
)
from minips.ops.server_ops import ServerOps
from minips.protocol import wire
from minips.rules import make_rule
from minips.server.router import receive
from minips.server.server import ServerOptions
from minips.state.store import SGD


def _replica(
    settings: ReplicaSettings, rule: str = "asgd", heartbeat_timeout: float = 30.0
) -> ReplicatedServer:
    """One replica of a 2-worker run (its pulls held until both said hello, or until the
    heartbeat timeout, the assembly's grace, ran out)."""
    params = make_params()
    options = ServerOptions(world_size=2, heartbeat_timeout=heartbeat_timeout)
    return ReplicatedServer(params, make_rule(rule), SGD(params, lr=0.5), options,
                            config={"model": "test"}, operations=ServerOps,
                            replica=settings)  # fmt: skip


@contextmanager
def primary_with_backup(rule: str = "asgd") -> Iterator[tuple[ReplicatedServer, Backup]]:
    """A primary and the test's backup, welcomed on the real link."""
    server = _replica(ReplicaSettings(PRIMARY), rule=rule)
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
        assert not worker.has_reply(0.3), "the hello's reply left before the backup held it"
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


def test_the_assemblys_grace_run_out_is_decided_then_applied_and_releases_the_held_pull():
    """The clock decides the assembly is over (one worker of two, past the grace); the
    decision is applied by the event, on both replicas alike, and only that releases the
    pull held meanwhile, once the backup holds the event."""
    with primary_with_backup() as (server, backup), RawPeer(server.endpoint) as worker:
        worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
        _serve_next(server)
        _ack(server, backup, _input(backup)["n"])
        assert worker.recv().op == "hello"
        worker.send(wire.encode({"op": "pull", "worker": "w0", "rid": 2}))
        _serve_next(server)  # held: one of two workers came
        _ack(server, backup, _input(backup)["n"])
        server.registry.grace = 0.05
        time.sleep(0.1)
        event = server.timers.decide(time.monotonic())
        assert event == {"assembled": True}
        assert server.registry.assembling  # decided, not applied: both apply it alike
        server.replicate_event(event)
        assert not server.registry.assembling
        _ack(server, backup, _input(backup)["n"])
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


# ------------------------------------------------------------- a real backup beside it


@contextmanager
def primary_and_backup(
    tmp_path, backup_timeout: float = 30.0
) -> Iterator[tuple[ReplicatedServer, ReplicatedServer, dict]]:
    """A primary driven by the test and a real backup following it in a thread (its own
    heartbeat timeout `backup_timeout`); `outcome` gets "took_over" (follow's answer) once
    the backup's loop returned, and "welcomed"."""
    primary = _replica(ReplicaSettings(PRIMARY), rule="dana-gap")
    backup_of = ReplicaSettings(BACKUP, backup_of=primary.link.endpoint,
                                checkpoint_path=tmp_path / "taken.npz")  # fmt: skip
    backup = _replica(backup_of, rule="dana-gap", heartbeat_timeout=backup_timeout)
    outcome: dict = {}
    backup.on_welcome = lambda: outcome.setdefault("welcomed", True)
    backup.holds_state = lambda: True  # the fence's file is the launcher's: not here
    follower = threading.Thread(target=lambda: outcome.setdefault("took_over", backup.follow()))
    follower.start()
    try:
        _read_until(primary.link, lambda: primary.link.joining is not None, timeout=30)
        primary.link.welcome(primary)
        deadline = time.monotonic() + 30
        while "welcomed" not in outcome:  # it read the snapshot
            assert time.monotonic() < deadline and follower.is_alive(), "never welcomed"
            time.sleep(0.02)
        yield primary, backup, outcome
    finally:
        primary.close()
        follower.join(timeout=10)
        backup.close()


def _until_held(primary: ReplicatedServer, timeout: float = 10.0) -> None:
    """The primary's link turned until the backup acknowledged every input sent."""
    link, deadline = primary.link, time.monotonic() + timeout
    while primary.replies.acked < link.sent:
        assert time.monotonic() < deadline, f"acknowledged {primary.replies.acked} of {link.sent}"
        link.socket.poll(20)
        link.turn(time.monotonic(), primary)


def _same_state(primary: ReplicatedServer, backup: ReplicatedServer) -> None:
    """The backup applies an input just after acknowledging it: compared once it did."""
    deadline = time.monotonic() + 10
    while _state(backup) != _state(primary) and time.monotonic() < deadline:
        time.sleep(0.02)
    expected, got = _state(primary), _state(backup)
    for part in expected:
        assert got[part] == expected[part], part


def _train_one_worker(primary: ReplicatedServer, worker: RawPeer) -> None:
    worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
    _serve_next(primary)
    _until_held(primary)
    worker.recv()
    primary.replicate_event({"assembled": True})  # the second worker never comes
    grads = {name: np.full_like(p, 0.1) for name, p in make_params().items()}
    for seq in range(3):
        worker.send(wire.encode({"op": "push", "worker": "w0", "seq": seq, "base": 0,
                                 "last": True, "rid": 10 + seq}, grads))  # fmt: skip
        _serve_next(primary)
        _until_held(primary)
        assert worker.recv().op == "push"


def test_a_backup_holds_what_its_primary_did_and_stays_while_the_link_beats(tmp_path):
    with primary_and_backup(tmp_path) as (primary, backup, outcome):
        with RawPeer(primary.endpoint) as worker:
            _train_one_worker(primary, worker)
            silent = primary.registry.by_id["w0"]
            silent.last_seen = silent.last_answered = time.monotonic() - 60
            primary.replicate_event(primary.timers.decide(time.monotonic()))
            _until_held(primary)
        _same_state(primary, backup)
        assert not backup.registry.by_id["w0"].alive and primary.store.version == 3
        beating = time.monotonic() + 2 * FAILOVER_AFTER  # only beats: still a backup
        while time.monotonic() < beating:
            primary.link.socket.poll(20)
            primary.link.turn(time.monotonic(), primary)
        assert "took_over" not in outcome and primary.link.backup is not None


def test_a_backup_whose_primary_fell_silent_takes_over_as_a_whole_primary(tmp_path):
    with primary_and_backup(tmp_path) as (primary, backup, outcome):
        with RawPeer(primary.endpoint) as worker:
            _train_one_worker(primary, worker)
        _same_state(primary, backup)
        for worker_state in backup.registry.by_id.values():  # silent a while, not dead yet
            worker_state.last_seen = worker_state.last_answered = time.monotonic() - 20
        primary.close()  # its link and the clients' address gone at once, as on SIGKILL
        deadline = time.monotonic() + 30
        while "took_over" not in outcome:
            assert time.monotonic() < deadline, "the backup never took over"
            time.sleep(0.05)
        taken_at = time.monotonic()
        assert outcome["took_over"] is True and backup.role == PRIMARY
        assert backup.endpoint == primary.endpoint  # the clients' address
        assert backup.registry.grace == ServerOptions().heartbeat_timeout  # its clock again
        # a full heartbeat for each worker to reconnect, from the takeover
        assert all(w.silent_for(taken_at) < 5 for w in backup.registry.by_id.values())
        assert backup.options.checkpoint_path == tmp_path / "taken.npz"
        assert backup.ops.checkpoints.path == tmp_path / "taken.npz"
        assert backup.link is not None and backup.link.sent == backup.sent
        assert backup.link.before_alone is not None  # the fence holds for its next backup
        (record,) = backup.failovers
        assert record["version"] == 3 and record["silent_s"] >= FAILOVER_AFTER
        assert backup.stats()["replication"]["failovers"] == [record]


def test_a_primary_that_finishes_tells_its_backup_to_end_and_it_never_takes_over(tmp_path):
    """The worker said bye, so the stop ends at once: `finished` reads the backup's
    acknowledgement of the stop itself (no beat in between), then says `end`."""
    with primary_and_backup(tmp_path) as (primary, backup, outcome):
        with RawPeer(primary.endpoint) as worker:
            _train_one_worker(primary, worker)
            worker.send(wire.encode({"op": "bye", "worker": "w0", "rid": 99}))
            _serve_next(primary)
            _until_held(primary)
            assert worker.recv().op == "bye"
        primary.stop.request("the test is done")
        primary.begin_stop()  # an input for the backup too
        assert primary.finished()  # nobody left to wait for
        deadline = time.monotonic() + 30
        while "took_over" not in outcome:
            assert time.monotonic() < deadline, "the backup never ended"
            time.sleep(0.02)
        assert outcome["took_over"] is False and backup.role == BACKUP
        assert backup.stopping  # it applied the stop as the primary did


def test_an_assembly_a_request_ended_by_the_clock_ends_on_the_backup_too(tmp_path):
    """The backup never ends the assembly by its own clock: a hello that comes after the
    primary's grace ended it there, and the primary says so as an event."""
    with primary_and_backup(tmp_path) as (primary, backup, outcome):

        def grace_run_out() -> None:
            primary.registry.grace = 0.05  # the one worker of two waited for long enough
            time.sleep(0.1)

        _hello_twice(primary, grace_run_out)  # the assembly ends in the second's handling
        assert not primary.registry.assembling
        _same_state(primary, backup)


def _hello_twice(primary, between) -> None:
    """Worker w0 says hello to `primary` twice, `between()` called in between; each hello is
    served, its effect acknowledged by the backup and its reply read."""
    with RawPeer(primary.endpoint) as worker:
        hello = wire.encode({"op": "hello", "worker": "w0", "rid": 1})
        for call in (lambda: None, between):
            call()
            worker.send(hello)
            _serve_next(primary)
            _until_held(primary)
            worker.recv()


def test_a_backup_never_ends_the_assembly_by_its_own_clock(tmp_path):
    """Whatever its own grace says (0.05 s here, the primary's 30 s): a request past it
    leaves the assembly going on the backup as on the primary, whose clock alone decides."""
    with primary_and_backup(tmp_path, backup_timeout=0.05) as (primary, backup, outcome):
        # past the backup's own grace, a request whose handling there must not end it
        _hello_twice(primary, lambda: time.sleep(0.1))
        assert primary.registry.assembling
        _same_state(primary, backup)


def test_a_join_is_welcomed_only_at_a_quiet_point_and_kept_once_welcomed():
    """A pull held (the assembly goes on) is state no snapshot holds: the backup that asks
    to join waits until it is answered; welcomed later than the bound after the link
    opened, it is not let go for the silence before it came."""
    server = _replica(ReplicaSettings(PRIMARY))
    link = server.link
    backup = Backup(server._link_ctx, link)
    try:
        with RawPeer(server.endpoint) as worker:
            worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
            _serve_next(server)  # no backup yet: answered at once
            assert worker.recv().op == "hello"
            worker.send(wire.encode({"op": "pull", "worker": "w0", "rid": 2}))
            _serve_next(server)  # held: one of two workers came
            backup.send({"r": "join"})
            time.sleep(FAILOVER_AFTER + 0.2)  # the link was silent longer than the bound
            for _ in range(10):
                link.socket.poll(20)
                link.turn(time.monotonic(), server)
            assert link.joining is not None and link.backup is None, "welcomed while not quiet"
            assert backup.receive(200) is None
            server.replicate_event({"assembled": True})  # the pull answered: quiet again
            assert worker.recv().op == "pull"
            link.turn(time.monotonic(), server)
            assert backup.receive()["r"] == "welcome" and link.backup is not None
            link.turn(time.monotonic(), server)
            assert link.backup is not None, "let go for the silence before its welcome"
    finally:
        backup.socket.close(linger=0)
        server.close()


def test_the_loop_wakes_for_an_acknowledgement_not_only_for_a_request():
    """A reply held for the backup leaves when its acknowledgement arrives, not at the
    loop's next timer turn: the loop's poller watches the link as well as the clients."""
    server = _replica(ReplicaSettings(PRIMARY))
    try:
        watched = [socket for socket, _ in server.poller().sockets]
        assert server.socket in watched and server.link.socket in watched
    finally:
        server.close()


def test_an_ssgd_round_the_assemblys_end_completes_is_answered_once_the_backup_holds_it():
    """ssgd holds a round until every worker of the run pushed; the assembly's end (an
    event of the primary's clock) makes the round the registered workers', and the rule's
    timer completes it: carried out on both replicas, answered after the acknowledgement."""
    grads = {name: np.full_like(p, 0.1) for name, p in make_params().items()}
    with primary_with_backup("ssgd") as (server, backup), RawPeer(server.endpoint) as worker:
        worker.send(wire.encode({"op": "hello", "worker": "w0", "rid": 1}))
        _serve_next(server)
        _ack(server, backup, _input(backup)["n"])
        assert worker.recv().op == "hello"
        push = {"op": "push", "worker": "w0", "seq": 0, "base": 0, "last": True, "rid": 2}
        worker.send(wire.encode(push, grads))
        _serve_next(server)  # held: the round waits for the second worker
        _ack(server, backup, _input(backup)["n"])
        assert not worker.has_reply(0.3) and server.store.version == 0
        server.replicate_event({"assembled": True})
        _ack(server, backup, _input(backup)["n"])
        reply = worker.recv()
        assert reply.op == "push" and reply.header["version"] == 1 and server.store.version == 1


def test_a_takeover_binds_the_clients_address_once_the_process_holding_it_let_it_go():
    """The dead primary's address may still be held for a moment (its process not yet
    reaped): the takeover tries again until it is free, and gives up only after its bound."""
    with zmq.Context() as context:
        holder, taker = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
        for socket in (holder, taker):
            socket.linger = 0
        holder.bind("tcp://127.0.0.1:*")
        where = holder.getsockopt_string(zmq.LAST_ENDPOINT)
        release = threading.Timer(0.5, holder.close)
        release.start()
        try:
            assert bind_retrying(taker, where, timeout=30) == where
        finally:
            release.join()
            taker.close()
        held, other = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
        held.bind("tcp://127.0.0.1:*")  # a primary that lives on
        started = time.monotonic()
        with pytest.raises(MinipsError):  # still answering, or still in use
            bind_retrying(other, held.getsockopt_string(zmq.LAST_ENDPOINT), timeout=0.5)
        assert time.monotonic() - started >= 0.5  # tried again until its bound
        held.close(linger=0)
        other.close(linger=0)
