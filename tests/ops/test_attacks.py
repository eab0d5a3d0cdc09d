"""Attacks, each against a live server: none of them works.

stop without an operator key, seq hijack, observer hijack, a finite 3e38 gradient that
overflows the parameters, a 1,000-level `info`, a shape [0, 2^63].
"""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_messages import deep_info_hello
from test_server_support import SHAPES, RawPeer, packb, running_server, snapshot

from minips.provision import keyfiles
from minips.worker.client import PSClient, ServerError


def grads(value: float = 1.0) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def registered_victim(server) -> PSClient:
    victim = PSClient(server.endpoint, timeout=5, retries=1, worker_id="victim")
    victim.hello({"role": "worker"})
    victim.push(grads(0.01), base=victim.pull().version)
    return victim


def test_a_worker_key_cannot_stop_the_server_an_operator_key_can(tmp_path):
    keyfiles.make_keys(tmp_path)
    worker_keys = keyfiles.load_client_keys(tmp_path, keyfiles.WORKER)
    operator_keys = keyfiles.load_client_keys(tmp_path, keyfiles.OPERATOR)
    with running_server(keys=keyfiles.load_server_keys(tmp_path)) as server:
        with PSClient(server.endpoint, timeout=5, keys=worker_keys) as worker:
            with pytest.raises(ServerError) as refused:
                worker.stop()
            assert refused.value.code == "operator"
            with pytest.raises(ServerError):
                worker.checkpoint()
            assert not server.stopping
        with PSClient(server.endpoint, timeout=5, keys=operator_keys) as operator:
            operator.stop()
        assert server.stopping


@pytest.mark.parametrize("attacker_key", [keyfiles.WORKER, "other"])
def test_under_curve_a_worker_id_is_bound_to_its_key_and_its_connection(tmp_path, attacker_key):
    """Another client holding the victim's very key (minips run's workers share one), or
    another admitted key, cannot act as the victim."""
    keyfiles.make_keys(tmp_path, clients=(keyfiles.WORKER, "other", keyfiles.OPERATOR))
    victim_keys = keyfiles.load_client_keys(tmp_path, keyfiles.WORKER)
    attacker_keys = keyfiles.load_client_keys(tmp_path, attacker_key)
    with running_server(keys=keyfiles.load_server_keys(tmp_path)) as server:
        victim = PSClient(server.endpoint, timeout=5, worker_id="victim", keys=victim_keys)
        attacker = PSClient(server.endpoint, timeout=5, worker_id="victim", keys=attacker_keys)
        with victim, attacker:
            victim.hello()
            victim.push(grads(0.01), base=victim.pull().version)
            before = snapshot(server)
            attacker._seq = 2**62  # a push far ahead, to make the victim's next one stale
            for call in (attacker.hello, attacker.ping, attacker.pull,
                         lambda: attacker.push(grads(1.0), base=0), attacker.bye):  # fmt: skip
                with pytest.raises(ServerError) as refused:
                    call()
                assert refused.value.code == "not_owner"
            assert snapshot(server) == before
            assert victim.push(grads(0.01), base=victim.pull().version).applied  # no stale_seq


def test_another_connection_cannot_push_under_a_live_workers_id():
    with running_server() as server, RawPeer(server.endpoint) as attacker:
        with registered_victim(server) as victim:
            before = snapshot(server)
            hijack = {"op": "push", "worker": "victim", "seq": 2**63, "base": 0}
            reply = attacker.request(hijack, grads(1.0))
            assert reply.op == "error" and reply.header["code"] == "not_owner"
            for op in ("pull", "ping", "bye"):
                reply = attacker.request({"op": op, "worker": "victim"})
                assert reply.op == "error" and reply.header["code"] == "not_owner", op
            assert snapshot(server) == before
            reply = victim.push(grads(0.01), base=victim.pull().version)  # no stale_seq
            assert reply.applied


def test_another_connection_cannot_take_a_live_workers_id_as_observer():
    with running_server() as server, RawPeer(server.endpoint) as attacker:
        with registered_victim(server) as victim:
            hello = {"op": "hello", "worker": "victim", "info": {"role": "observer"}}
            reply = attacker.request(hello)
            assert reply.op == "error" and reply.header["code"] == "not_owner"
            assert victim.push(grads(0.01), base=victim.pull().version).applied


def test_a_finite_gradient_that_would_overflow_the_parameters_is_refused():
    with running_server(lr=1.0) as server, PSClient(server.endpoint, timeout=5) as client:
        client.hello()
        client.push(grads(3e38), base=0)  # parameters near -3e38: finite
        after_first = snapshot(server)
        with pytest.raises(ServerError) as refused:
            client.push(grads(3e38), base=1)  # would reach -6e38 = -inf
        assert refused.value.code == "nonfinite"
        assert snapshot(server) == after_first and server.store.version == 1
        assert all(np.isfinite(p).all() for p in server.store.params.values())


def test_a_deeply_nested_info_cannot_break_stats():
    with running_server() as server, RawPeer(server.endpoint) as attacker:
        attacker.send([deep_info_hello(1020, "deep")])
        reply = attacker.recv()
        assert reply.op == "error" and reply.header["code"] == "too_large"
        with PSClient(server.endpoint, timeout=5) as client:
            assert client.stats()["version"] == 0  # stats still answers


@pytest.mark.parametrize("shape", [[0, 2**63], [2**64 - 1, 0], [0, 2**62, 8]])
def test_a_zero_size_shape_of_huge_dimensions_is_too_large(shape):
    with running_server() as server, RawPeer(server.endpoint) as attacker:
        attacker.request({"op": "hello", "worker": "w"})
        desc = {"name": "fc.b", "dtype": "float32", "shape": shape, "codec": "dense"}
        head = {"v": 1, "op": "push", "worker": "w", "seq": 0, "base": 0, "arrays": [desc]}
        attacker.send([packb(head), b""])
        reply = attacker.recv()
        assert reply.op == "error" and reply.header["code"] == "too_large"
