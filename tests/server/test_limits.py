"""Every limit of docs/protocol.md section 10, at the limit and one past it.

The wire's limits are parameters (`wire.Limits`): each is checked with a small value, at
exactly the limit (accepted, the values intact) and one unit past it (`too_large`), and the
defaults are read back from the table. The server's own limits (hello's `info`, observers,
worker ids, answered pushes) are met through a real server over sockets.
"""

import time

import msgpack
import numpy as np
import pytest
from test_server_support import RawPeer, make_params, running_server

from minips.guard.wire_checks import MAX_NAME_CHARS, MAX_NDIM, decode_request
from minips.ops.request_checks import MAX_INFO_BYTES, MAX_INFO_DEPTH
from minips.protocol import wire
from minips.protocol.wire import Limits, WirePart, all_finite
from minips.state.registry import MAX_OBSERVERS, MAX_REGISTERED, SEQ_WINDOW
from minips.transmission.codecs.base import to_wire_float

PUSH = {"op": "push", "worker": "w", "seq": 0, "base": 0}


def code_of(frames, limits=wire.DEFAULT_LIMITS) -> str | None:
    """The ProtocolError code decoding `frames` as a request raises (None: accepted)."""
    try:
        decode_request(frames, limits)
    except wire.ProtocolError as exc:
        return exc.code
    return None


def header_of_size(size: int) -> bytes:
    """A msgpack `stats` header of exactly `size` bytes (an ignored `pad` field fills it)."""
    head = {"v": 1, "op": "stats", "pad": ""}
    base = len(msgpack.packb(head))
    for pad in range(max(0, size - base - 8), size):
        packed = msgpack.packb({**head, "pad": "x" * pad})
        if len(packed) == size:
            return packed
    raise AssertionError(f"no header of {size} bytes")


# ------------------------------------------------------------------------ the wire's limits


def test_array_frames_per_message_at_and_past_the_limit():
    limits = Limits(max_arrays=3)
    arrays = {f"a{i}": np.full(2, i, np.float32) for i in range(4)}
    three = dict(list(arrays.items())[:3])
    assert code_of(wire.encode(PUSH, three), limits) is None
    assert code_of(wire.encode(PUSH, arrays), limits) == "too_large"
    # The default, 4096: empty arrays keep the message small.
    many = {f"a{i}": np.zeros(0, np.float32) for i in range(4097)}
    at = dict(list(many.items())[:4096])
    assert len(decode_request(wire.encode(PUSH, at)).arrays) == 4096
    assert code_of(wire.encode(PUSH, many)) == "too_large"


def test_whole_message_at_and_past_the_limit():
    frames = wire.encode(PUSH, {"a": np.arange(8, dtype=np.float32)})
    total = sum(memoryview(f).nbytes for f in frames)
    message = decode_request(frames, Limits(max_message_bytes=total))
    np.testing.assert_array_equal(message.arrays["a"], np.arange(8))
    assert code_of(frames, Limits(max_message_bytes=total - 1)) == "too_large"


def test_header_frame_at_and_past_the_limit():
    limits = Limits(max_header_bytes=300)
    assert decode_request([header_of_size(300)], limits).op == "stats"
    assert code_of([header_of_size(301)], limits) == "too_large"
    # The default, 1 MiB.
    assert decode_request([header_of_size(1 << 20)]).op == "stats"
    assert code_of([header_of_size((1 << 20) + 1)]) == "too_large"


def test_one_array_frame_at_and_past_the_limit():
    limits = Limits(max_frame_bytes=64)  # 16 float32
    at = decode_request(wire.encode(PUSH, {"a": np.arange(16, dtype=np.float32)}), limits)
    assert at.arrays["a"][-1] == 15
    assert code_of(wire.encode(PUSH, {"a": np.zeros(17, np.float32)}), limits) == "too_large"
    # One byte past: an odd limit (a frame's size is a whole number of entries).
    odd = Limits(max_frame_bytes=63)
    assert code_of(wire.encode(PUSH, {"a": np.zeros(16, np.float32)}), odd) == "too_large"
    assert code_of(wire.encode(PUSH, {"a": np.zeros(31, np.float16)}, {"a": "fp16"}), odd) is None


def test_array_names_at_and_past_the_limit():
    name = "n" * MAX_NAME_CHARS
    assert list(decode_request(wire.encode(PUSH, {name: np.ones(1, np.float32)})).arrays) == [name]
    assert code_of(wire.encode(PUSH, {name + "n": np.ones(1, np.float32)})) == "too_large"


def test_worker_ids_at_and_past_the_limit():
    at = {**PUSH, "worker": "w" * MAX_NAME_CHARS}
    assert decode_request(wire.encode(at)).header["worker"] == at["worker"]
    assert code_of(wire.encode({**PUSH, "worker": "w" * (MAX_NAME_CHARS + 1)})) == "too_large"
    assert code_of(wire.encode({**PUSH, "worker": ""})) == "bad_field"  # 1..256 characters


def test_dimensions_per_array_at_and_past_the_limit():
    eight = np.ones((1,) * MAX_NDIM, np.float32)
    assert decode_request(wire.encode(PUSH, {"a": eight})).arrays["a"].shape == (1,) * 8
    nine = np.ones((1,) * (MAX_NDIM + 1), np.float32)
    assert code_of(wire.encode(PUSH, {"a": nine})) == "too_large"


def test_one_dimension_at_and_past_the_frame_limit_even_beside_a_zero():
    limits = Limits(max_frame_bytes=64)

    def shaped(shape):
        desc = {"name": "a", "dtype": "float32", "codec": "dense", "shape": shape}
        return [msgpack.packb({**PUSH, "v": 1, "arrays": [desc]}), b""]

    assert decode_request(shaped([0, 64]), limits).arrays["a"].shape == (0, 64)
    assert code_of(shaped([0, 65]), limits) == "too_large"
    assert code_of(shaped([0, (64 << 20) + 1])) == "too_large"
    assert decode_request(shaped([64 << 20, 0])).arrays["a"].shape == (64 << 20, 0)


def test_a_multi_part_tensors_dense_shape_is_bounded_in_float32_bytes():
    # `of` describes the dense float32 gradient the parts decode to: 16 entries fit 64 bytes.
    limits = Limits(max_frame_bytes=64)

    def topk(of):
        parts = [
            WirePart("a", np.array([0], np.int32), "topk", "indices", of),
            WirePart("a", np.array([1.5], np.float32), "topk", "values", of),
        ]
        return wire.encode_parts(PUSH, parts)

    message = decode_request(topk((16,)), limits)
    assert message.dense_shapes["a"] == (16,)
    np.testing.assert_array_equal(message.parts["a"]["values"], [1.5])
    assert code_of(topk((17,)), limits) == "too_large"
    assert code_of(topk((4, 5)), limits) == "too_large"


def test_the_defaults_are_the_tables():
    limits = wire.DEFAULT_LIMITS
    assert (limits.max_header_bytes, limits.max_frame_bytes) == (1 << 20, 64 << 20)
    assert (limits.max_message_bytes, limits.max_arrays) == (256 << 20, 4096)
    assert (MAX_NAME_CHARS, MAX_NDIM, MAX_INFO_BYTES, MAX_INFO_DEPTH) == (256, 8, 1024, 4)
    assert (SEQ_WINDOW, MAX_OBSERVERS, MAX_REGISTERED) == (64, 32, 1024)


# --------------------------------------------------------------- the server's own limits


def info_of_size(size: int) -> dict:
    """A hello `info` of exactly `size` bytes packed."""
    for pad in range(size):
        info = {"pad": "x" * pad}
        if len(msgpack.packb(info)) == size:
            return info
    raise AssertionError(size)


def nested(levels: int) -> dict:
    """An info of `levels` levels of maps and lists, counting info itself."""
    value: object = 1
    for level in range(levels - 1):
        value = [value] if level % 2 else {"x": value}
    return {"deep": value}


def hello(peer: RawPeer, worker: str, info: dict | None = None) -> wire.Message:
    return peer.request({"op": "hello", "worker": worker, "info": info or {}})


def test_hello_info_size_and_depth_at_and_past_the_limit():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        at = hello(peer, "size-at", info_of_size(MAX_INFO_BYTES))
        assert at.op == "hello"
        past = hello(peer, "size-past", info_of_size(MAX_INFO_BYTES + 1))
        assert (past.op, past.header["code"]) == ("error", "too_large")
        assert "1025 bytes exceeds the limit of 1024" in past.header["reason"]
        assert hello(peer, "deep-at", nested(MAX_INFO_DEPTH)).op == "hello"
        deep = hello(peer, "deep-past", nested(MAX_INFO_DEPTH + 1))
        assert (deep.op, deep.header["code"]) == ("error", "too_large")
        lists = hello(peer, "lists", {"l": [[[[1]]]]})  # lists are levels too
        assert lists.header.get("code") == "too_large"
        # What was refused was never registered; what was accepted is in stats, as sent.
        rows = {
            row["worker"]: row for row in peer.request({"op": "stats"}).header["stats"]["workers"]
        }
        assert set(rows) == {"size-at", "deep-at"}
        assert rows["size-at"]["info"] == info_of_size(MAX_INFO_BYTES)


def test_observers_at_and_past_the_limit_and_a_leaving_one_frees_its_place():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        for i in range(MAX_OBSERVERS):
            assert hello(peer, f"obs{i}", {"role": "observer"}).op == "hello"
        full = hello(peer, "one-more", {"role": "observer"})
        assert (full.op, full.header["code"]) == ("error", "full")
        assert peer.request({"op": "bye", "worker": "obs0"}).op == "bye"
        assert hello(peer, "one-more", {"role": "observer"}).op == "hello"
        # Workers are not counted against the observers' cap.
        assert hello(peer, "worker").header["rank"] == 0


def test_worker_ids_remembered_at_and_past_the_limit_forget_only_an_unfinished_dead_one():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        for i in range(MAX_REGISTERED):
            assert hello(peer, f"w{i}").op == "hello"
            finished = i != 5  # w5 leaves unfinished: the only id that may be forgotten
            assert peer.request({"op": "bye", "worker": f"w{i}", "finished": finished}).op == "bye"
        newcomer = hello(peer, "newcomer")
        assert newcomer.op == "hello"
        refused = hello(peer, "one-too-many")
        assert (refused.op, refused.header["code"]) == ("error", "full")
        rows = {r["worker"] for r in peer.request({"op": "stats"}).header["stats"]["workers"]}
        assert len(rows) == MAX_REGISTERED and "w5" not in rows and "w6" in rows


def push(peer: RawPeer, seq: int, value: float = 1.0) -> wire.Message:
    grads = {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}
    return peer.request({"op": "push", "worker": "w", "seq": seq, "base": 0}, grads)


SHAPES = {name: array.shape for name, array in make_params().items()}


def test_answered_pushes_remembered_at_and_past_the_window():
    with running_server(lr=1.0) as server, RawPeer(server.endpoint) as peer:
        hello(peer, "w")
        replies = [push(peer, seq) for seq in range(SEQ_WINDOW + 1)]
        assert [r.header["version"] for r in replies] == list(range(1, SEQ_WINDOW + 2))
        before = server.store.params["fc.b"].copy()
        # seq 1 is the oldest of the last 64 answered: the same reply, not applied again.
        retry = push(peer, 1)
        assert retry.header == replies[1].header
        # seq 0 is one past the window: refused as stale, not applied either.
        stale = push(peer, 0)
        assert (stale.op, stale.header["code"]) == ("error", "stale_seq")
        np.testing.assert_array_equal(server.store.params["fc.b"], before)
        assert server.store.version == SEQ_WINDOW + 1


@pytest.mark.parametrize(("budget", "pushes_to_stop"), [(16, 2), (17, 3)])
def test_the_sample_budget_stops_at_and_past_it(budget, pushes_to_stop):
    with running_server(max_samples=budget) as server, RawPeer(server.endpoint) as peer:
        hello(peer, "w")
        stops = []
        for seq in range(pushes_to_stop):
            grads = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
            header = {"op": "push", "worker": "w", "seq": seq, "base": seq, "samples": 8}
            assert peer.request(header, grads).header["applied"]
            stops.append(peer.request({"op": "ping", "worker": "w"}).header["stop"])
        assert stops == [False] * (pushes_to_stop - 1) + [True]


def test_a_silent_observer_is_kept_three_heartbeat_timeouts_then_forgotten():
    # Its silence counts from its own last request, the hello, which the server reads after
    # `sent` and before the reply comes back (the stats asked here are not its own): it
    # cannot be forgotten before sent + 3 x 0.2 s, whatever the machine's speed, and must
    # be soon after.
    with running_server(heartbeat_timeout=0.2) as server, RawPeer(server.endpoint) as peer:
        with RawPeer(server.endpoint) as observer:
            sent = time.monotonic()
            assert hello(observer, "obs", {"role": "observer"}).op == "hello"
            deadline = sent + 10
            while peer.request({"op": "stats"}).header["stats"]["workers"][0]["alive"]:
                assert time.monotonic() < deadline, "a silent observer was never forgotten"
                time.sleep(0.02)
            assert time.monotonic() - sent >= 3 * 0.2


def test_float16_finiteness_at_the_largest_half_and_past_it():
    """65504 is the largest finite float16; +-Inf and every NaN (quiet or signalling) are not."""
    finite = np.array([65504.0, -65504.0, 6e-8, -0.0, 1.0], np.float16)
    assert all_finite(finite)
    for bits in (0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFFFF):  # +Inf, -Inf, sNaN, qNaN, -NaN
        one_bad = np.concatenate([finite, np.array([bits], np.uint16).view(np.float16)])
        assert not all_finite(one_bad), hex(bits)
    assert to_wire_float(np.array([65504.0], np.float32), "float16", "g")[0] == 65504
    with pytest.raises(wire.ProtocolError, match="overflows float16") as refused:
        to_wire_float(np.array([1.0, 70000.0], np.float32), "float16", "g")
    assert refused.value.code == "nonfinite"
