"""A replica's snapshot (minips.ops.snapshot) read into a fresh server makes it the server
that wrote it: the parameters, versions and optimizer state, the rule's own state, every
registry entry (clock, sequence numbers, answered pushes, owner and its key), the assembly,
the observers seen and the counters; and the next push does on it exactly what it does on
the original. A snapshot is taken only at a quiet point."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields

import numpy as np
import pytest
from test_server_support import make_params, running_server

from minips.ops.rule_state import rule_state
from minips.ops.server_ops import ServerOps
from minips.ops.snapshot import quiet, read_snapshot, write_snapshot
from minips.rules import make_rule
from minips.server.server import ParameterServer, ServerOptions
from minips.state.registry import WorkerState
from minips.state.requests import Origin
from minips.state.store import SGD
from minips.worker.client import PSClient

# dana-gap keeps a momentum per worker in its own state: the server's must be 0
MOMENTUM = {"dana-gap": 0.0, "dcasgd": 0.5, "gap": 0.0}


def _grads(value: float) -> dict[str, np.ndarray]:
    return {name: np.full_like(p, value) for name, p in make_params().items()}


def _fresh(rule: str, bind: str = "tcp://127.0.0.1:*") -> ParameterServer:
    """A server that has served nothing, other parameters than the one it will become."""
    params = make_params(seed=99)
    optimizer = SGD(params, lr=0.5, momentum=MOMENTUM[rule])
    options = ServerOptions(world_size=2, bind=bind, stop_grace=0.2, poll_interval=0.02)
    return ParameterServer(params, make_rule(rule), optimizer, options,
                           config={"model": "test"}, operations=ServerOps)  # fmt: skip


@contextmanager
def serving(server: ParameterServer) -> Iterator[None]:
    """`server` serving in a thread, stopped, joined and closed on exit."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.request_stop()
        thread.join(timeout=10)
        server.close()


def _train(server: ParameterServer) -> tuple[PSClient, PSClient]:
    """Two workers' pushes from stale bases (clocks and staleness apart), all answered."""
    first, second = (PSClient(server.endpoint, timeout=5.0, worker_id=w) for w in ("w0", "w1"))
    for client in (first, second):
        client.hello({"host": "test"})
    base = first.pull().version
    for step in range(3):
        first.push(_grads(0.1 * (step + 1)), base=base)
        second.push(_grads(-0.05 * (step + 1)), base=base)  # stale by the first's pushes
        base = first.pull().version
    return first, second


# What a snapshot need not keep of a worker: when it was last heard and answered (its
# silence counts afresh on the replica)
TIMES = ("last_seen", "last_answered")


def _registry(server: ParameterServer) -> dict[str, dict]:
    """Every field of every registry entry (the dataclass's own list, not the snapshot's)."""
    return {
        worker_id: {
            f.name: getattr(worker, f.name) for f in fields(WorkerState) if f.name not in TIMES
        }
        for worker_id, worker in server.registry.by_id.items()
    }


def _state(server: ParameterServer) -> dict:
    store = server.store
    counters = server.ops.counters
    return {
        "params": {name: array.tobytes() for name, array in store.params.items()},
        "version": store.version,
        "param_versions": dict(store.param_versions),
        "velocity": {n: v.tobytes() for n, v in store.optimizer.velocity.items()},
        "rule": {n: np.asarray(a).tobytes() for n, a in rule_state(server.rule).items()},
        "registry": _registry(server),
        "assembling": server.registry.assembling,
        "observers_seen": server.membership.observers_seen,
        "counters": {
            f.name: getattr(counters, f.name) for f in fields(counters) if f.name != "started"
        },  # fmt: skip
    }


def _settled(server: ParameterServer) -> dict:
    """The state once the server's thread is done with the last reply (a reply's bytes
    are counted just after it left, so the client may read it first)."""
    state = _state(server)
    while True:
        time.sleep(0.05)
        state, before = _state(server), state
        if state == before:
            return state


@pytest.mark.parametrize("rule", ["dana-gap", "dcasgd", "gap"])
def test_a_snapshot_read_into_a_fresh_server_makes_it_the_one_that_wrote_it(tmp_path, rule):
    with running_server(rule, momentum=MOMENTUM[rule], world_size=2) as original:
        first, second = _train(original)
        original.membership.observers_seen = 3  # as if three evaluators came
        key = b"rq:rM>}U?@Lns47E1%kR.o@n5FcnR:Dxu[ZUKX8y"  # a client's Z85 public key
        original.registry.by_id["w1"].origin = Origin(b"\x00w1-route", key)
        assert quiet(original)
        expected = _settled(original)
        path = write_snapshot(original, tmp_path / "snapshot.npz")
        assert _state(original) == expected  # nothing changed while it was written
        first.close()
        second.close()
    replica = _fresh(rule)
    try:
        read_snapshot(replica, path)
        got = _state(replica)
    finally:
        replica.close()
    assert expected["counters"]["updates"] == 6 and expected["rule"], "the rule has state"
    clocks = {w: row["clock"] for w, row in expected["registry"].items()}
    assert len(set(clocks.values())) > 1 or all(clocks.values())  # the clocks were kept apart
    for part in expected:
        assert got[part] == expected[part], part


def test_the_next_push_does_on_the_replica_what_it_does_on_the_original(tmp_path):
    """dana-gap: the update depends on the rule's state (its momentum per worker) and the
    worker's clock. The same client (its connection kept, as across a
    failover) sends one push to the original, then the same push to a replica made from the
    snapshot taken just before, at the same address: the two answer and update alike."""
    with running_server("dana-gap", world_size=2) as original:
        first, second = _train(original)
        base, endpoint = original.store.version - 2, original.endpoint  # stale by two
        path = write_snapshot(original, tmp_path / "snapshot.npz")
        seq = first._seq
        on_original = first.push(_grads(0.3), base=base)
        expected = {n: a.tobytes() for n, a in original.store.params.items()}
        second.close()
    replica = _fresh("dana-gap", bind=endpoint)
    read_snapshot(replica, path)
    with serving(replica):
        first._seq = seq  # the same push again, as a retry after a failover
        on_replica = first.push(_grads(0.3), base=base)
        got = {n: a.tobytes() for n, a in replica.store.params.items()}
    first.close()
    assert (on_replica.version, on_replica.applied) == (on_original.version, True)
    assert got == expected


def test_only_a_quiet_server_is_snapshotted():
    with running_server("asgd", world_size=2) as server:
        client = PSClient(server.endpoint, timeout=5.0, worker_id="w0")
        client.hello({"host": "test"})
        worker = server.registry.by_id["w0"]
        assert quiet(server)
        for field_name, busy in (("held_pushes", [object()]), ("held_pull", object()),
                                 ("partial_step", object())):  # fmt: skip
            kept = getattr(worker, field_name)
            setattr(worker, field_name, busy)
            assert not quiet(server), field_name
            setattr(worker, field_name, kept)
        assert quiet(server)
        client.close()
