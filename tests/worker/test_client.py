"""PSClient: timeouts, Lazy-Pirate retries, stale replies, transports."""

import threading

import numpy as np
import pytest
import zmq
from test_server_support import SHAPES, copied, full, make_params, running_server

from minips.errors import MinipsError
from minips.guard import wire_checks
from minips.protocol import wire
from minips.transmission.codecs import Factors, decode_gradients
from minips.worker.client import PSClient, ServerError, ServerUnavailable


class FakeServer:
    """A ROUTER that answers pushes by a script: `behaviour(n, header) -> list of replies`."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.requests = []
        self.messages = []
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # as the server's router (minips/server/router.py): a client's next attempt comes on
        # a new socket with the same id, which takes the id over from the closed one (on a
        # loaded machine the old connection may not be torn down yet)
        self.socket.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while self.running:
            if not self.socket.poll(20):
                continue
            routing, *frames = self.socket.recv_multipart()
            message = wire_checks.decode_request(frames)
            header = message.header
            self.requests.append(header)
            self.messages.append(message)
            for reply in self.behaviour(len(self.requests), header):
                self.socket.send_multipart([routing, *wire.encode(reply)])

    def close(self):
        self.running = False
        self.thread.join(timeout=5)
        self.socket.close()
        self.context.term()


def _push_reply(rid, version):
    return {
        "op": "push",
        "rid": rid,
        "version": version,
        "seq": 0,
        "applied": True,
        "staleness": 0,
        "stop": False,
    }


def test_no_server_raises_server_unavailable(tmp_path):
    address = f"ipc://{tmp_path}/nobody.sock"
    with PSClient(address, timeout=0.1, retries=2) as ps:
        with pytest.raises(ServerUnavailable) as info:
            ps.stats()
    assert isinstance(info.value, MinipsError)
    assert "3 attempts" in str(info.value)


def test_retry_resends_the_same_seq_with_a_new_rid():
    # The first attempt is ignored (as if lost); the second is answered.
    fake = FakeServer(lambda n, h: [] if n == 1 else [_push_reply(h["rid"], 7)])
    try:
        with PSClient(fake.endpoint, timeout=0.3, retries=2) as ps:
            reply = ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
        assert reply.version == 7
        assert [h["seq"] for h in fake.requests] == [0, 0]
        assert fake.requests[0]["rid"] != fake.requests[1]["rid"]
    finally:
        fake.close()


def test_retries_2_is_three_attempts_the_last_one_answered():
    """`retries` counts the attempts after the first: with 2, the third is still made."""
    fake = FakeServer(lambda n, h: [] if n <= 2 else [_push_reply(h["rid"], 7)])
    try:
        with PSClient(fake.endpoint, timeout=2.0, retries=2) as ps:
            assert ps.push({"fc.b": np.ones(4, np.float32)}, base=0).version == 7
        assert len(fake.requests) == 3
    finally:
        fake.close()


def test_a_reply_with_another_rid_is_dropped():
    def behaviour(n, header):
        return [_push_reply(header["rid"] + 1000, 111), _push_reply(header["rid"], 7)]

    fake = FakeServer(behaviour)
    try:
        with PSClient(fake.endpoint, timeout=2.0, retries=0) as ps:
            assert ps.push({"fc.b": np.ones(4, np.float32)}, base=0).version == 7
            # The next push is a new one: a new seq.
            ps.push({"fc.b": np.ones(4, np.float32)}, base=0)
        assert [h["seq"] for h in fake.requests] == [0, 1]
    finally:
        fake.close()


def test_server_errors_are_raised_with_their_code():
    with running_server() as server, PSClient(server.endpoint) as ps:
        ps.hello()
        with pytest.raises(ServerError) as info:
            ps.push({"fc.b": np.ones(5, np.float32)}, base=0)
        assert info.value.code == "shape" and "fc.b" in info.value.reason
        with pytest.raises(ServerError) as info:
            ps.push({"fc.b": np.full(4, np.nan, np.float32)}, base=0)
        assert info.value.code == "nonfinite"


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_worker_round_trip_over_transport(transport, tmp_path):
    bind = "tcp://127.0.0.1:*" if transport == "tcp" else f"ipc://{tmp_path}/ps.sock"
    params = make_params()
    with running_server(params=params, bind=bind, lr=0.25) as server:
        assert server.endpoint.startswith(transport)
        with PSClient(server.endpoint) as ps:
            assert ps.hello()["rank"] == 0
            model = dict(ps.pull().params)
            grads = {name: np.full(shape, 2.0) for name, shape in SHAPES.items()}  # float64 ok
            reply = ps.push(grads, base=0, extra={"sample/fc.b": np.zeros(2, np.float32)})
            assert reply.applied
            pulled = ps.pull(since=0)
            model.update(pulled.params)
            for name in SHAPES:
                np.testing.assert_array_equal(model[name], params[name])
                assert model[name].dtype == np.float32
            assert ps.ping() is False
            ps.bye()
            assert server.stats()["live_workers"] == 0


def test_hello_reply_fields():
    with running_server(heartbeat_timeout=12.5) as server, PSClient(server.endpoint) as ps:
        reply = ps.hello()
        assert set(reply) == {"rank", "world_size", "config", "version", "heartbeat_timeout"}
        assert reply["heartbeat_timeout"] == 12.5 and reply["world_size"] == 1
        assert ps.config == reply["config"]


def test_wire_header_of_a_client_push_is_plain_msgpack():
    seen = []

    def behaviour(n, header):
        seen.append(header)
        return [_push_reply(header["rid"], 1)]

    fake = FakeServer(behaviour)
    try:
        with PSClient(fake.endpoint, worker_id="me") as ps:
            ps.push({"fc.b": np.ones(4, np.float32)}, base=3, last=False)
        header = seen[0]
        assert header["worker"] == "me" and header["base"] == 3 and header["last"] is False
        assert header["arrays"] == [
            {"name": "fc.b", "dtype": "float32", "shape": [4], "codec": "dense"}
        ]
    finally:
        fake.close()


def test_push_with_codecs_sends_what_the_server_decodes_and_counts_bytes():
    fake = FakeServer(lambda n, h: [_push_reply(h["rid"], n)])
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 5))
    grad = rng.standard_normal((40, 30)).astype(np.float32)
    specs = {"fc.w": {"codec": "sf"}, "c.w": {"codec": "topk", "ratio": 0.1}, "c.b": "fp16"}
    try:
        with PSClient(fake.endpoint, timeout=2) as ps:
            grads = {"fc.w": Factors(x, dy.astype(np.float32)), "c.w": grad, "c.b": grad[0]}
            ps.push(grads, base=0, codecs=specs, extra={"k": np.ones(3, np.float32)})
            ps.push(grads, base=0, codecs=specs)
        decoded, extras = decode_gradients(fake.messages[0])
        np.testing.assert_allclose(decoded["fc.w"], x.T @ dy, rtol=1e-5, atol=1e-6)
        assert np.count_nonzero(decoded["c.w"]) == 120 and list(extras) == ["extra/k"]
        # Per parameter, both pushes: sf 8 * (6 + 5) floats, top-k 120 int32 + 120 float32.
        assert ps.bytes_sent == {"fc.w": 2 * 352, "c.w": 2 * 960, "c.b": 2 * 60, "extra/k": 12}
        # The second top-k push carried the first one's residual: the sum of both is exact.
        second, _ = decode_gradients(fake.messages[1])
        residual = ps.encoder.codec("c.w", specs["c.w"]).residual
        np.testing.assert_allclose(decoded["c.w"] + second["c.w"] + residual, 2 * grad, rtol=1e-6)
    finally:
        fake.close()


def test_a_retried_codec_push_resends_the_same_bytes_and_encodes_once():
    fake = FakeServer(lambda n, h: [] if n == 1 else [_push_reply(h["rid"], 1)])
    spec = {"codec": "topk", "ratio": 0.5}
    try:
        with PSClient(fake.endpoint, timeout=0.3, retries=2) as ps:
            ps.push({"w": np.arange(8, dtype=np.float32)}, base=0, codecs={"w": spec})
            assert ps.encoder.codec("w", spec).steps == 1
        first, second = fake.messages
        assert first.header["seq"] == second.header["seq"] == 0
        for part in ("indices", "values"):
            assert first.parts["w"][part].tobytes() == second.parts["w"][part].tobytes()
    finally:
        fake.close()


def test_a_sender_thread_and_the_main_thread_share_one_client():
    params = make_params()
    with running_server("asgd", params=params) as server:
        with PSClient(server.endpoint, timeout=5) as ps:
            ps.hello()
            grads = {name: np.ones(shape, np.float32) for name, shape in SHAPES.items()}
            errors, replies = [], []

            def sender():
                try:
                    for _ in range(40):
                        replies.append(ps.push(grads, base=0, codecs={"fc.b": "fp16"}))
                except Exception as exc:  # surfaced by the assertion below
                    errors.append(exc)

            thread = threading.Thread(target=sender)
            thread.start()
            versions = [ps.pull().version for _ in range(40)]
            thread.join(timeout=30)
            assert not errors and len(replies) == 40
            assert all(reply.applied for reply in replies)
            assert versions == sorted(versions)
            assert ps.stats()["updates"] == 40


def test_after_a_push_failed_with_server_unavailable_the_next_push_is_a_new_one():
    params = make_params()
    before = copied(params)
    with running_server("ssgd", params=params, lr=1.0) as server:
        with (
            PSClient(server.endpoint, worker_id="a", timeout=10.0, retries=0) as a,
            PSClient(server.endpoint, worker_id="b") as b,
        ):
            a.hello()
            b.hello()
            a.timeout = 0.3  # b never pushes: a's push is held past its timeout
            with pytest.raises(ServerUnavailable):
                a.push(full("fc.b", 1.0), base=0)
            a.timeout = 10.0
            b.bye()  # the round completes with a's lost push alone: version 1
            # Re-using the failed push's seq would get that push's old answer (version 1)
            # and this gradient would be lost.
            reply = a.push(full("fc.b", 2.0), base=1)
    assert reply.applied and reply.version == 2 and reply.staleness == 0
    expected = before["fc.b"] - np.float32(1.0) - np.float32(2.0)
    np.testing.assert_array_equal(params["fc.b"], expected)
