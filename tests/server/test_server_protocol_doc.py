"""docs/protocol.md's worked example, built by hand (msgpack + raw bytes), against a server.

If this fails, either the server or the normative document is wrong: fix them together.
"""

import re
import struct
from pathlib import Path

import msgpack
import numpy as np
import zmq
from test_server_support import running_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def _doc_frame(label: str) -> bytes:
    """The hex block that follows `<!-- label -->` in docs/protocol.md."""
    match = re.search(rf"<!-- {label} -->\s*```\s*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"{label} not found in {DOC}"
    return bytes.fromhex(match.group(1))


def _exchange(sock, frames):
    sock.send_multipart(frames)
    assert sock.poll(5000), "no reply"
    return sock.recv_multipart()


def test_worked_example_by_hand():
    hello = msgpack.packb({"v": 1, "op": "hello", "rid": 1, "worker": "w0"})
    push = msgpack.packb(
        {
            "v": 1,
            "op": "push",
            "rid": 2,
            "worker": "w0",
            "seq": 0,
            "base": 0,
            "arrays": [{"name": "fc.b", "dtype": "float32", "shape": [2], "codec": "dense"}],
        }
    )
    gradient = struct.pack("<2f", 0.5, -1.0)
    # The document shows exactly these bytes.
    assert _doc_frame("hello-frame-0") == hello
    assert _doc_frame("push-frame-0") == push
    assert _doc_frame("push-frame-1") == gradient

    params = {"fc.w": np.zeros((2, 2), np.float32), "fc.b": np.array([1.0, 2.0], np.float32)}
    with running_server("asgd", params=params, lr=0.5) as server:
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(server.endpoint)
        try:
            (frame,) = _exchange(sock, [hello])
            reply = msgpack.unpackb(frame)
            assert reply["op"] == "hello" and reply["rid"] == 1 and reply["rank"] == 0
            assert reply["worker"] == "w0" and reply["version"] == 0

            (frame,) = _exchange(sock, [push, gradient])
            assert msgpack.unpackb(frame) == {
                "v": 1,
                "op": "push",
                "rid": 2,
                "version": 1,
                "seq": 0,
                "applied": True,
                "staleness": 0,
                "stop": False,
            }
            np.testing.assert_array_equal(params["fc.b"], [0.75, 2.5])

            pull = msgpack.packb({"v": 1, "op": "pull", "rid": 3, "worker": "w0", "since": 0})
            head, values = _exchange(sock, [pull])
            assert msgpack.unpackb(head) == {
                "v": 1,
                "op": "pull",
                "rid": 3,
                "version": 1,
                "param_versions": {"fc.w": 0, "fc.b": 1},
                "stop": False,
                "arrays": [{"name": "fc.b", "dtype": "float32", "shape": [2], "codec": "dense"}],
            }
            assert values == bytes.fromhex("00 00 40 3f 00 00 20 40")
        finally:
            sock.close()
            context.term()
