"""A push whose handling fails after the server accepted it (a bug in a rule): the worker
gets `internal`, a retry of the same `seq` gets the same `internal` and is never applied,
nothing stays held for the failed request, the model is as before, and the server goes
on serving that worker and the others (docs/protocol.md 8, 9). A failure after an update
was written answers every push of it still held `internal` too, whoever sent it.

The rules below have a bug on purpose (no real rule fails so); each fails only on a push
holding the gradient value BUG, so every other push is served as usual.
"""

from __future__ import annotations

import numpy as np
from test_server_support import (
    RawPeer,
    full,
    pull_header,
    push_header,
    raw_hello,
    running_server,
    send_then_fence,
)

from minips.ops.failures import internal
from minips.protocol import wire
from minips.rules import ASGD, SSGD, Outcome, Update

BUG = 13.0  # the gradient value the rules below fail on


def _has_bug(push) -> bool:
    return any((grad == BUG).any() for grad in push.grads.values())


class FailsInOnPush(ASGD):
    """asgd whose on_push raises on a push holding BUG."""

    def on_push(self, push):
        if _has_bug(push):
            raise RuntimeError("a bug in the rule")
        return super().on_push(push)


class BarrierFailsInOnPush(SSGD):
    """ssgd whose on_push raises on a push holding BUG, before the push joins the round."""

    def on_push(self, push):
        if _has_bug(push):
            raise RuntimeError("a bug in the rule")
        return super().on_push(push)


class WritesAnUnknownParameter(ASGD):
    """asgd whose update of a push holding BUG names, after a real parameter, one the
    model does not have: the store fails in the middle of writing it."""

    def on_push(self, push):
        if not _has_bug(push):
            return super().on_push(push)
        steps = [(name, grad, 1.0) for name, grad in push.grads.items()]
        steps.append(("no.such", np.zeros(4, np.float32), 1.0))
        return Outcome(updates=[Update([push], steps)], answers=[(push, True)])


class RoundFailsAfterItsWrite(SSGD):
    """ssgd whose after_update raises for a round holding BUG: the update is written, then
    carrying out the round fails (as a checkpoint on a full disk would)."""

    def after_update(self, update):
        if any(_has_bug(push) for push in update.pushes):
            raise RuntimeError("a bug in the rule")


class FailsToAnswerAfterABadPush(ASGD):
    """asgd whose may_answer_pull raises for a worker whose last push held BUG."""

    def __init__(self):
        self.bad: set[str] = set()

    def on_push(self, push):
        if _has_bug(push):
            self.bad.add(push.worker.worker_id)
        return super().on_push(push)

    def may_answer_pull(self, worker):
        if worker.worker_id in self.bad:
            raise RuntimeError("a bug in the rule")
        return True


class FailsOnceToAnswerAfterABadPush(ASGD):
    """asgd whose may_answer_pull raises once, for the first worker whose push held BUG;
    later calls allow every pull (a held pull would then be answered)."""

    def __init__(self):
        self.bad: set[str] = set()

    def on_push(self, push):
        if _has_bug(push):
            self.bad.add(push.worker.worker_id)
        return super().on_push(push)

    def may_answer_pull(self, worker):
        if worker.worker_id in self.bad:
            self.bad.discard(worker.worker_id)
            raise RuntimeError("a bug in the rule")
        return True


class DropsTheHeldPushesThenFails(ASGD):
    """asgd that holds each push without BUG (no answer); a push holding BUG is applied
    with the held ones dropped, then after_update raises: the whole outcome failed."""

    def __init__(self):
        self.held = []

    def on_push(self, push):
        if not _has_bug(push):
            self.held.append(push)
            return Outcome()
        drops, self.held = self.held, []
        steps = [(name, grad, 1.0) for name, grad in push.grads.items()]
        return Outcome(updates=[Update([push], steps)], answers=[(push, True)], drops=drops)

    def after_update(self, update):
        raise RuntimeError("a bug in the rule")


def _full_pull(peer: RawPeer, worker: str, rid: int) -> dict[str, bytes]:
    reply = peer.request(pull_header(worker, rid=rid))
    assert reply.op == "pull", reply.header
    return {name: np.asarray(array).tobytes() for name, array in reply.arrays.items()}


def _next_reply(peer: RawPeer, rid: int):
    """Send a `stats` with `rid` and return the first reply that comes after it: one sent
    before the stats (the server answers a socket's requests in order), else the stats."""
    peer.send(wire.encode({"op": "stats", "rid": rid}))
    return peer.recv()


def _assert_internal(reply) -> None:
    assert reply is not None, "the retry is held, never answered"
    assert reply.op == "error" and reply.header["code"] == "internal", reply.header
    assert not reply.arrays


def test_a_retry_of_a_push_the_rule_failed_on_gets_the_same_internal_error():
    with running_server(FailsInOnPush()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            before = _full_pull(a, "a", rid=1)
            first = a.request(push_header("a", 0, 0, rid=2), full("fc.b", BUG))
            _assert_internal(first)
            retry = send_then_fence(a, push_header("a", 0, 0, rid=3), full("fc.b", BUG))
            _assert_internal(retry)
            assert retry.header["reason"] == first.header["reason"]
            assert retry.header["rid"] == 3
            assert _full_pull(b, "b", rid=4) == before  # the failed push changed nothing
            reply = a.request(push_header("a", 1, 0, rid=5), full("fc.b", 0.5))
            assert reply.op == "push" and reply.header["applied"], reply.header
            reply = b.request(push_header("b", 0, 1, rid=6), full("fc.b", 0.5))
            assert reply.op == "push" and reply.header["applied"], reply.header
            assert reply.header["version"] == 2


def test_a_retry_of_a_failed_fused_push_gets_the_error_without_parameters():
    with running_server(FailsInOnPush()) as server, RawPeer(server.endpoint) as a:
        raw_hello(a, "a")
        before = _full_pull(a, "a", rid=1)
        fused = {**push_header("a", 0, 0, rid=2), "pull_since": None}
        _assert_internal(a.request(fused, full("fc.b", BUG)))
        _assert_internal(send_then_fence(a, {**fused, "rid": 3}, full("fc.b", BUG)))
        assert _full_pull(a, "a", rid=4) == before
        reply = a.request({**fused, "seq": 1, "rid": 5}, full("fc.b", 0.5))
        assert reply.op == "push" and reply.header["applied"], reply.header
        assert reply.header["version"] == 1 and set(reply.arrays) == {"fc.w", "fc.b"}


def test_a_failed_step_sent_in_several_pushes_is_not_applied_and_the_next_one_is():
    params = {"fc.w": np.zeros((3, 4), np.float32), "fc.b": np.zeros(4, np.float32)}
    with running_server(FailsInOnPush(), params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as a:
            raw_hello(a, "a")
            layer = a.request(push_header("a", 0, 0, rid=1, last=False), full("fc.w", 1.0))
            assert layer.op == "push" and layer.header["applied"] is False, layer.header
            closing = {**push_header("a", 1, 0, rid=2), "pull_since": 0}
            _assert_internal(a.request(closing, full("fc.b", BUG)))
            _assert_internal(send_then_fence(a, {**closing, "rid": 3}, full("fc.b", BUG)))
            layer = a.request(push_header("a", 2, 0, rid=4, last=False), full("fc.w", 0.5))
            assert layer.op == "push" and layer.header["applied"] is False, layer.header
            reply = a.request({**closing, "seq": 3, "rid": 5}, full("fc.b", 0.25))
            assert reply.op == "push" and reply.header["applied"], reply.header
            assert reply.header["version"] == 1
            # the failed step's kept layer went with it: only the second step was applied
            np.testing.assert_array_equal(reply.arrays["fc.w"], np.full((3, 4), -0.5))
            np.testing.assert_array_equal(reply.arrays["fc.b"], np.full(4, -0.25))


def test_a_push_failed_at_a_barrier_leaves_the_round_to_the_next_push():
    params = {"fc.w": np.zeros((3, 4), np.float32), "fc.b": np.zeros(4, np.float32)}
    with running_server(BarrierFailsInOnPush(), params=params, lr=1.0) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", 1.0)) is None
            _assert_internal(b.request(push_header("b", 0, 0, rid=2), full("fc.b", BUG)))
            _assert_internal(send_then_fence(b, push_header("b", 0, 0, rid=3), full("fc.b", BUG)))
            reply = b.request(push_header("b", 1, 0, rid=4), full("fc.b", 0.5))
            held = a.recv()  # a's push, held at the barrier, is answered with the round
            for answer in (reply, held):
                assert answer.op == "push" and answer.header["applied"], answer.header
                assert answer.header["version"] == 1
            assert _full_pull(a, "a", rid=5)["fc.b"] == np.full(4, -0.75, np.float32).tobytes()


def test_an_update_failing_in_the_middle_of_its_write_writes_nothing():
    with running_server(WritesAnUnknownParameter()) as server, RawPeer(server.endpoint) as a:
        raw_hello(a, "a")
        before = _full_pull(a, "a", rid=1)
        _assert_internal(a.request(push_header("a", 0, 0, rid=2), full("fc.b", BUG)))
        _assert_internal(send_then_fence(a, push_header("a", 0, 0, rid=3), full("fc.b", BUG)))
        assert _full_pull(a, "a", rid=4) == before
        reply = a.request(push_header("a", 1, 0, rid=5), full("fc.b", 0.5))
        assert reply.op == "push" and reply.header["applied"], reply.header
        assert reply.header["version"] == 1


def test_a_pull_half_the_rule_failed_on_is_not_held_for_later():
    # a's fused push is applied, then its pull half fails: a gets `internal` and nothing of
    # that request stays held, so b's push is answered once and then nothing more.
    with running_server(FailsToAnswerAfterABadPush()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            fused = {**push_header("a", 0, 0, rid=1), "pull_since": None}
            _assert_internal(a.request(fused, full("fc.b", BUG)))
            reply = send_then_fence(b, push_header("b", 0, 0, rid=2), full("fc.b", 0.5))
            assert reply is not None and reply.op == "push", reply and reply.header
            assert reply.header["applied"] and reply.header["version"] == 2
            # the failed request had its one reply: the next one a gets is for its stats
            assert a.request({"op": "stats", "rid": 3}).op == "stats"


def _assert_applied(reply, version: int) -> None:
    assert reply is not None and reply.op == "push", reply and reply.header
    assert reply.header["applied"] and reply.header["version"] == version, reply.header


def test_a_round_failing_after_its_write_answers_every_push_of_it_internal():
    with running_server(RoundFailsAfterItsWrite()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", 1.0)) is None
            _assert_internal(b.request(push_header("b", 0, 0, rid=2), full("fc.b", BUG)))
            _assert_internal(a.recv())  # a's push, held for the round that failed
            for peer, worker, rid in ((a, "a", 3), (b, "b", 4)):  # a retry: the same error
                retry = send_then_fence(peer, push_header(worker, 0, 0, rid=rid), full("fc.b", 1))
                _assert_internal(retry)
            assert send_then_fence(a, push_header("a", 1, 1, rid=5), full("fc.b", 0.5)) is None
            reply = b.request(push_header("b", 1, 1, rid=6), full("fc.b", 0.5))
            for answer in (reply, a.recv()):  # the failed round's update stays written: t = 2
                _assert_applied(answer, 2)


def test_a_round_a_bye_completes_and_fails_answers_the_held_pushes_and_the_bye_once():
    with running_server(RoundFailsAfterItsWrite()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", BUG)) is None
            bye = send_then_fence(b, {"op": "bye", "worker": "b", "rid": 2})
            assert bye is not None and bye.op == "bye", bye and bye.header  # and nothing more
            _assert_internal(a.recv())
            _assert_internal(send_then_fence(a, push_header("a", 0, 0, rid=3), full("fc.b", BUG)))
            _assert_applied(a.request(push_header("a", 1, 1, rid=4), full("fc.b", 0.5)), 2)


def test_a_round_whose_checkpoint_fails_on_a_full_disk_is_applied_and_answered(tmp_path, caplog):
    """The update-count checkpoint after a round cannot be written: the round is applied
    and both pushes are answered as usual, the failure is in the log, and once there is
    room again the next round's checkpoint is written."""
    full_disk = tmp_path / "a-file"  # the checkpoint's folder is a file: its saves fail
    full_disk.write_text("")
    options = {"checkpoint_path": full_disk / "c.npz", "checkpoint_every": 1}
    with running_server("ssgd", **options) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", 1.0)) is None
            reply = b.request(push_header("b", 0, 0, rid=2), full("fc.b", 1.0))
            for answer in (reply, a.recv()):
                _assert_applied(answer, 1)
            assert "checkpoint at version 1 not written" in caplog.text
            full_disk.unlink()  # room again: the next checkpoint, and the one at the stop, work
            assert send_then_fence(a, push_header("a", 1, 1, rid=3), full("fc.b", 0.5)) is None
            reply = b.request(push_header("b", 1, 1, rid=4), full("fc.b", 0.5))
            for answer in (reply, a.recv()):
                _assert_applied(answer, 2)
    assert (full_disk / "c.npz").exists()


def test_a_failed_fused_push_gets_one_reply_even_when_its_pull_is_allowed_later():
    # a's fused push is applied, its pull half fails; the next release (b's push) allows
    # a's pulls again, but nothing of a's failed request is left to answer a second time.
    with running_server(FailsOnceToAnswerAfterABadPush()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            fused = {**push_header("a", 0, 0, rid=1), "pull_since": None}
            first = a.request(fused, full("fc.b", BUG))
            _assert_internal(first)
            assert first.header["reason"] == internal(RuntimeError()).reason
            _assert_applied(send_then_fence(b, push_header("b", 0, 0, rid=2), full("fc.b", 0.5)), 2)
            assert _next_reply(a, 3).header["rid"] == 3  # a's stats: nothing came before it
            reply = a.request({**fused, "seq": 1, "base": 2, "rid": 4}, full("fc.b", 0.5))
            _assert_applied(reply, 3)
            assert set(reply.arrays) == {"fc.w", "fc.b"}  # a's next fused push: both halves


def test_an_outcome_failing_after_its_write_answers_its_dropped_pushes_internal():
    with running_server(DropsTheHeldPushesThenFails()) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            assert send_then_fence(a, push_header("a", 0, 0, rid=1), full("fc.b", 1.0)) is None
            _assert_internal(b.request(push_header("b", 0, 0, rid=2), full("fc.b", BUG)))
            dropped = _next_reply(a, 3)  # a's push, answered before a's stats
            _assert_internal(dropped)
            assert dropped.header["rid"] == 1
            assert a.recv().header["rid"] == 3
            _assert_internal(send_then_fence(a, push_header("a", 0, 0, rid=4), full("fc.b", 1.0)))
