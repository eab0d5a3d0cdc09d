"""The server's safety checks in each form of the optimizer they guard, over real sockets.

The overflow check refuses a push whose step would make a parameter non-finite; the step
is the optimizer's, so it is met with momentum on and off and with weight decay, each time
with one push that must be refused (nothing changed) and one right beside it that must be
applied exactly. Gradient clipping is met at its norm and past it.
"""

import numpy as np
import pytest
from test_server_support import RawPeer, running_server

from minips.ops.request_checks import OverflowCheck
from minips.protocol.wire import ProtocolError
from minips.provision import keyfiles
from minips.state.store import SGD, ParameterStore
from minips.worker.client import PSClient, ServerError


def one_param(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"b": np.full(4, value, np.float32)}


def push(peer: RawPeer, seq: int, value: float, base: int = 0):
    header = {"op": "push", "worker": "w", "seq": seq, "base": base}
    return peer.request(header, {"b": np.full(4, value, np.float32)})


def pushes(peer, values):
    """Push each value in turn (fc.b filled with it): the reply headers' (op, code)."""
    assert peer.request({"op": "hello", "worker": "w"}).op == "hello"
    return [(r.op, r.header.get("code")) for r in (push(peer, s, v) for s, v in enumerate(values))]


F32 = np.float32


def test_with_momentum_the_velocity_counts_in_the_overflow_check():
    # v = 3e38 after the first push; then g = -1e38: v' = 0.9 v + g = 1.7e38 and
    # w' = -3e38 - 1.7e38 overflows, although w - g alone (-2e38) would not.
    params = one_param()
    with running_server(params=params, lr=1.0, momentum=0.9) as server:
        with RawPeer(server.endpoint) as peer:
            assert pushes(peer, [3e38, -1e38]) == [("push", None), ("error", "nonfinite")]
            np.testing.assert_array_equal(server.store.params["b"], -F32(3e38))
            np.testing.assert_array_equal(server.store.optimizer.velocity["b"], F32(3e38))
            # g = -2.5e38: v' = 0.2e38, w' = -3.2e38: finite, so applied (momentum 0.9
            # taken as it is: with momentum 1, -3.5e38 would overflow).
            assert push(peer, 2, -2.5e38).header.get("applied"), "refused"
    velocity = F32(0.9) * F32(3e38) + F32(-2.5e38)
    np.testing.assert_array_equal(params["b"], -F32(3e38) - velocity)


def test_without_momentum_the_same_pushes_are_applied():
    params = one_param()
    with running_server(params=params, lr=1.0) as server, RawPeer(server.endpoint) as peer:
        assert pushes(peer, [3e38, -1e38]) == [("push", None), ("push", None)]
        assert not server.store.optimizer.velocity
    np.testing.assert_array_equal(params["b"], -F32(3e38) - F32(-1e38))


def test_with_weight_decay_the_decay_counts_in_the_overflow_check():
    # wd = 1: the step is g + w = -1e38 - 3e38, past float32's range.
    params = one_param()
    with running_server(params=params, lr=1.0, weight_decay=1.0) as server:
        with RawPeer(server.endpoint) as peer:
            assert pushes(peer, [3e38, -1e38]) == [("push", None), ("error", "nonfinite")]
            assert push(peer, 2, 2e38).header.get("applied")  # g + w = -1e38: fine
    np.testing.assert_array_equal(params["b"], -F32(3e38) - (F32(2e38) - F32(3e38)))


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.9, 0.0), (0.0, 1.0)])
def test_the_cheap_bound_counts_the_velocity_and_the_decay(momentum, weight_decay):
    # A huge learning rate with small norms: the cheap bound ||w|| + lr (m ||v|| + ||g|| +
    # wd ||w||) alone sees that the step overflows (no norm here overflows on its own).
    params = {"w": np.full(1, 1e19 if weight_decay else 0.0, np.float32)}
    store = ParameterStore(
        params, SGD(params, lr=1e20, momentum=momentum, weight_decay=weight_decay)
    )
    if momentum:
        store.optimizer.velocity["w"] = np.full(1, 1e19, np.float32)
    check = OverflowCheck(store)
    with pytest.raises(ProtocolError) as refused:
        check.check({"w": np.ones(1, np.float32)}, {})
    assert refused.value.code == "nonfinite"
    # The same push with a learning rate whose step stays finite is let through.
    store.optimizer.lr = 1e10
    check.check({"w": np.ones(1, np.float32)}, {})


@pytest.mark.parametrize(("norm", "applied_norm"), [(1.0, 1.0), (1.5, 1.0), (0.5, 0.5)])
def test_clip_norm_at_and_past_it(norm, applied_norm):
    # g = norm * (0.6, 0.8, 0, 0): at the clip norm and below it untouched, past it scaled to it.
    params = one_param()
    direction = np.array([0.6, 0.8, 0.0, 0.0], np.float32)
    with running_server(params=params, lr=1.0, clip_norm=1.0) as server:
        with RawPeer(server.endpoint) as peer:
            assert peer.request({"op": "hello", "worker": "w"}).op == "hello"
            grad = {"b": (direction * F32(norm)).astype(np.float32)}
            reply = peer.request({"op": "push", "worker": "w", "seq": 0, "base": 0}, grad)
            assert reply.header["applied"]
    np.testing.assert_allclose(-params["b"], direction * applied_norm, rtol=1e-6)


def test_clipping_scales_every_array_of_a_push_together():
    params = {"a": np.zeros(1, np.float32), "b": np.zeros(1, np.float32)}
    with running_server(params=params, lr=1.0, clip_norm=1.0) as server:
        with RawPeer(server.endpoint) as peer:
            assert peer.request({"op": "hello", "worker": "w"}).op == "hello"
            grads = {"a": np.full(1, 3.0, np.float32), "b": np.full(1, 4.0, np.float32)}
            assert (
                peer.request({"op": "push", "worker": "w", "seq": 0, "base": 0}, grads).op == "push"
            )
    np.testing.assert_allclose([params["a"][0], params["b"][0]], [-0.6, -0.8], rtol=1e-6)


def test_a_hello_whose_role_is_not_a_string_is_refused():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        reply = peer.request({"op": "hello", "worker": "w", "info": {"role": 1}})
        assert (reply.op, reply.header["code"]) == ("error", "bad_field")
        assert (
            peer.request({"op": "hello", "worker": "w", "info": {"role": "worker"}}).op == "hello"
        )


def test_under_curve_only_an_operator_key_may_stop_or_checkpoint(tmp_path):
    """require_operator: an allowed worker key gets `operator` for both, and nothing changes."""
    keyfiles.make_keys(tmp_path / "k")
    worker = keyfiles.load_client_keys(tmp_path / "k", keyfiles.WORKER)
    operator = keyfiles.load_client_keys(tmp_path / "k", keyfiles.OPERATOR)
    path = tmp_path / "ckpt.npz"
    keys = keyfiles.load_server_keys(tmp_path / "k")
    with running_server(keys=keys, checkpoint_path=path) as server:
        with PSClient(server.endpoint, timeout=5, keys=worker) as ps:
            assert ps.hello()["rank"] == 0  # the worker key is allowed in
            for call in (ps.stop, ps.checkpoint):
                with pytest.raises(ServerError) as refused:
                    call()
                assert refused.value.code == "operator"
            assert not ps.stats()["stopping"] and not path.exists()
        with PSClient(server.endpoint, timeout=5, keys=operator) as op:
            assert op.checkpoint() == str(path) and path.exists()
            op.stop()
            assert op.stats()["stopping"]
