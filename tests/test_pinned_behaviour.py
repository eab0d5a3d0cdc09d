"""Behaviours of joining, leaving, retrying and stopping that the rest of the suite missed.

Each test here goes through surfaces a reshaping of the server keeps, so that it pins the
behaviour and not the code: the
socket protocol (PSClient, hand-built frames on a RawPeer), `stats`, `on_update` records,
`server.store.params` and `minips.protocol.wire`. Whether the server holds a reply is seen with
`send_then_fence` (a `stats` sent right behind the request on the same socket comes back
first), never by looking inside the server or by timing.
"""

import numpy as np
import pytest
from test_server_support import (
    SHAPES,
    RawPeer,
    make_params,
    running_server,
    send_then_fence,
    snapshot,
    worker_rows,
)

from minips.nn import build_model
from minips.nn.losses import softmax_cross_entropy
from minips.protocol import wire
from minips.trainer import evaluate
from minips.worker.client import PSClient, ServerUnavailable


def _full(name, value):
    return {name: np.full(SHAPES[name], value, np.float32)}


def _grads(value):
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def _copy(arrays):
    return {name: np.array(array) for name, array in arrays.items()}


def _hello(peer, worker):
    reply = peer.request({"op": "hello", "worker": worker})
    assert reply.op == "hello", reply.header


def _push(worker, seq, base, rid, last=True):
    return {"op": "push", "worker": worker, "seq": seq, "base": base, "last": last, "rid": rid}


def _pull(worker, rid):
    return {"op": "pull", "worker": worker, "rid": rid}


# ----------------------------------------------------------------------------- DC-ASGD


def test_dcasgd_compensates_with_the_latest_pull_not_the_first():
    lam, lr = 0.5, 0.25
    params = make_params()
    with running_server("dcasgd", params=params, lr=lr, rule_options={"lam": lam}) as server:
        with PSClient(server.endpoint) as slow, PSClient(server.endpoint) as fast:
            slow.hello()
            fast.hello()
            first = _copy(slow.pull().params)  # version 0
            fast.push(_full("fc.w", 2.0), base=0)  # version 1
            second = slow.pull()  # the backup is now these parameters
            at_second = _copy(second.params)
            fast.push(_full("fc.w", -1.5), base=1)  # version 2: w moves on
            w = _copy(params)
            g = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4  # (3, 4)
            reply = slow.push({"fc.w": g}, base=second.version)
    assert second.version == 1 and reply.applied and reply.staleness == 1
    lam32, lr32 = np.float32(lam), np.float32(lr)
    latest = g + lam32 * g * g * (w["fc.w"] - at_second["fc.w"])
    np.testing.assert_array_equal(params["fc.w"], w["fc.w"] - lr32 * latest)
    with_first = g + lam32 * g * g * (w["fc.w"] - first["fc.w"])
    assert not np.array_equal(latest, with_first)  # the two backups tell apart


# ------------------------------------------------------------------ SSGD retry and stop


def test_ssgd_held_push_retried_from_a_new_socket_is_answered_there():
    params = make_params()
    before = _copy(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        old = RawPeer(server.endpoint, routing_id=b"\x01worker-a")
        with old, PSClient(server.endpoint) as other:
            _hello(old, "a")
            other.hello()
            grads_a = _full("fc.b", 1.0)
            assert send_then_fence(old, _push("a", 0, 0, rid=1), grads_a) is None  # held
            with RawPeer(server.endpoint, routing_id=b"\x01worker-a") as new:
                # The worker timed out and reconnected: same worker, same seq, new rid.
                assert send_then_fence(new, _push("a", 0, 0, rid=2), grads_a) is None
                other_reply = other.push(_full("fc.b", 3.0), base=0)  # completes the round
                reply = new.recv()
            assert not old.has_reply(0.3)  # the retry replaced the held request
    assert reply.op == "push" and reply.header["rid"] == 2
    assert reply.header["applied"] is True and reply.header["version"] == 1
    assert reply.header["seq"] == 0 and reply.header["stop"] is False
    assert other_reply.applied and other_reply.version == 1
    # a's gradient counted once: mean(1, 3) = 2, not mean(1, 1, 3).
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - np.float32(2.0))


def test_stop_answers_every_push_held_at_the_barrier_at_once():
    with running_server("ssgd", stop_grace=30.0) as server:
        with (
            RawPeer(server.endpoint) as a,
            RawPeer(server.endpoint) as b,
            PSClient(server.endpoint) as idle,
            PSClient(server.endpoint) as operator,
        ):
            _hello(a, "a")
            _hello(b, "b")
            idle.hello()  # never pushes: the round cannot complete
            before = snapshot(server)
            assert send_then_fence(a, _push("a", 0, 0, rid=11), _grads(1.0)) is None
            assert send_then_fence(b, _push("b", 0, 0, rid=12), _grads(2.0)) is None
            operator.stop()
            # Answered now, not when the 30 s grace ends (recv gives up after 5 s).
            replies = {"a": a.recv(), "b": b.recv()}
            assert snapshot(server) == before
            for peer, worker in ((a, "a"), (b, "b")):
                assert peer.request({"op": "bye", "worker": worker}).op == "bye"
            idle.bye()  # the last worker left: the loop ends without the grace
    for worker, rid in (("a", 11), ("b", 12)):
        header = replies[worker].header
        assert replies[worker].op == "push" and header["rid"] == rid, header
        assert header["applied"] is False and header["stop"] is True
        assert header["version"] == 0


# --------------------------------------------------------------------- SSP: late joiners


def test_ssp_late_joiner_starts_at_the_slowest_clock_and_a_rejoiner_keeps_a_higher_one():
    with running_server("ssp", rule_options={"staleness": 1}) as server:
        endpoint = server.endpoint
        with (
            PSClient(endpoint, worker_id="a") as a,
            PSClient(endpoint, worker_id="b") as b,
            RawPeer(endpoint) as a_raw,
            PSClient(endpoint) as operator,
        ):
            a.hello()
            b.hello()
            for _ in range(5):
                a.push(_grads(0.01), base=0)  # ssp holds pulls, never pushes
            for _ in range(3):
                b.push(_grads(0.01), base=0)
            assert {w: r["clock"] for w, r in worker_rows(operator).items()} == {"a": 5, "b": 3}
            with RawPeer(endpoint) as late:
                _hello(late, "late")
                assert worker_rows(operator)["late"]["clock"] == 3  # the slowest live, not 0
                # So it holds nobody back: b (clock 3) and itself may pull at once.
                assert b.pull().version == 8  # not held (a held pull would time out)
                assert send_then_fence(late, _pull("late", rid=22)) is not None
                assert late.request({"op": "bye", "worker": "late"}).op == "bye"
            # a leaves at clock 5 and comes back: it keeps 5 (higher than the slowest, 3)...
            a.bye()
            _hello(a_raw, "a")  # the raw peer is "a" now (a live id answers to who said hello)
            assert worker_rows(operator)["a"]["clock"] == 5
            # ...so it is still 2 > 1 clocks ahead of b: its pull is held until b steps.
            assert send_then_fence(a_raw, _pull("a", rid=23)) is None
            b.push(_grads(0.01), base=0)
            released = a_raw.recv()
    assert released.op == "pull" and released.header["rid"] == 23


# ------------------------------------------------------------------- SSGD: who leaves


def test_ssgd_bye_after_the_last_push_keeps_that_gradient_in_the_round():
    params = make_params()
    before = _copy(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as leaver, PSClient(server.endpoint) as stayer:
            _hello(leaver, "leaver")
            stayer.hello()
            pushed = send_then_fence(leaver, _push("leaver", 0, 0, rid=31), _full("fc.b", 1.0))
            assert pushed is None  # held at the barrier
            assert leaver.request({"op": "bye", "worker": "leaver"}).op == "bye"
            reply = stayer.push(_full("fc.b", 3.0), base=0)  # completes the round
            answered = leaver.recv()  # the leaver's push is answered too
    assert reply.applied and reply.version == 1
    assert answered.header["rid"] == 31 and answered.header["applied"] is True
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"] - np.float32(2.0))  # mean(1,3)


@pytest.mark.parametrize("leave", ["bye", "hello again"])
def test_ssgd_partial_push_of_a_worker_that_leaves_is_discarded_also_when_it_rejoins(leave):
    params = make_params()
    before = _copy(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as leaver, PSClient(server.endpoint) as stayer:
            _hello(leaver, "leaver")
            stayer.hello()
            partial = leaver.request(_push("leaver", 0, 0, rid=41, last=False), _full("fc.w", 5.0))
            assert partial.header["applied"] is False
            version = 0
            if leave == "bye":
                assert leaver.request({"op": "bye", "worker": "leaver"}).op == "bye"
                # Round 1 without it: its partial is not in the mean.
                assert stayer.push(_full("fc.w", 1.0), base=0).version == 1
                version = 1
            _hello(leaver, "leaver")  # rejoins (or re-registers) under the same id
            # The next round: only what it sends now counts for it.
            mine = _push("leaver", 1, version, rid=42)
            assert send_then_fence(leaver, mine, _full("fc.w", 2.0)) is None
            reply = stayer.push(_full("fc.w", 4.0), base=version)
            assert leaver.recv().header["applied"] is True
    assert reply.applied and reply.version == version + 1
    expected = before["fc.w"]
    if leave == "bye":
        expected = expected - np.float32(1.0)
    expected = expected - np.float32(3.0)  # mean(2, 4); with the partial it would be 5.5
    np.testing.assert_array_equal(params["fc.w"], expected)


# ---------------------------------------------------------------------------- clocks


def test_a_clock_advances_on_last_pushes_only():
    with running_server("ssp", rule_options={"staleness": 0}) as server:
        with (
            PSClient(server.endpoint, worker_id="a") as a,
            PSClient(server.endpoint, worker_id="b") as b,
            RawPeer(server.endpoint) as a_raw,
        ):
            a.hello()
            b.hello()
            a.push(_full("fc.w", 0.1), base=0, last=False)  # one step in two pushes
            a.push(_full("fc.b", 0.1), base=0, last=True)
            rows = worker_rows(a)
            assert rows["a"]["clock"] == 1 and rows["a"]["pushes"] == 2
            b.push(_grads(0.1), base=0)  # b's step: both at clock 1
            # Bound 0: a may pull only because its two pushes made one clock.
            assert send_then_fence(a_raw, _pull("a", rid=51)) is not None
            a.push(_full("fc.w", 0.1), base=0, last=False)
            assert worker_rows(a)["a"]["clock"] == 1  # a partial push alone: no step
            a.push(_full("fc.b", 0.1), base=0)
            assert worker_rows(a)["a"]["clock"] == 2


# -------------------------------------------------------------------------- evaluate


def test_evaluate_reports_the_same_loss_whatever_the_batch_size():
    model = build_model("mlp", seed=3, hidden=[16], in_features=12, n_classes=5)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((103, 12)).astype(np.float32)  # 103: batches of 7 leave 5
    y = rng.integers(0, 5, 103)
    logits = model.forward(x, train=False)
    whole_loss, _ = softmax_cross_entropy(logits, y)
    whole_accuracy = float((logits.argmax(axis=1) == y).mean())
    for batch_size in (1, 7, 50, 103, 1000):
        accuracy, loss = evaluate(model, x, y, batch_size=batch_size)
        assert accuracy == pytest.approx(whole_accuracy, abs=1e-12), batch_size
        assert loss == pytest.approx(whole_loss, rel=1e-5), batch_size


# ---------------------------------------------------------------------- client retries


def test_after_a_push_failed_with_server_unavailable_the_next_push_is_a_new_one():
    params = make_params()
    before = _copy(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with (
            PSClient(server.endpoint, worker_id="a", timeout=10.0, retries=0) as a,
            PSClient(server.endpoint, worker_id="b") as b,
        ):
            a.hello()
            b.hello()
            a.timeout = 0.3  # b never pushes: a's push is held past its timeout
            with pytest.raises(ServerUnavailable):
                a.push(_full("fc.b", 1.0), base=0)
            a.timeout = 10.0
            b.bye()  # the round completes with a's lost push alone: version 1
            # Re-using the failed push's seq would get that push's old answer (version 1)
            # and this gradient would be lost.
            reply = a.push(_full("fc.b", 2.0), base=1)
    assert reply.applied and reply.version == 2 and reply.staleness == 0
    expected = before["fc.b"] - np.float32(1.0) - np.float32(2.0)
    np.testing.assert_array_equal(params["fc.b"], expected)


# ------------------------------------------------------------------------------ wire


def test_a_message_with_exactly_max_arrays_arrays_is_accepted():
    limits = wire.Limits(max_arrays=3)
    header = {"op": "push", "worker": "w", "seq": 0, "base": 0}
    arrays = {f"p{i}.w": np.full(2, i, np.float32) for i in range(4)}
    three = dict(list(arrays.items())[:3])
    message = wire.decode(wire.encode(header, three), limits)
    assert list(message.arrays) == ["p0.w", "p1.w", "p2.w"]
    np.testing.assert_array_equal(message.arrays["p2.w"], [2.0, 2.0])
    with pytest.raises(wire.ProtocolError) as info:
        wire.decode(wire.encode(header, arrays), limits)
    assert info.value.code == "too_large"
