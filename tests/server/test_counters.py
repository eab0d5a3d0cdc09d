"""Every counter the server keeps, read back from `stats` and compared with what was sent.

A client that counts the bytes of every frame it sends and receives (a RawPeer's socket)
talks to a real server; the server's traffic counters (server-wide and per worker), its
message, error, push, pull, step, sample, update and drop counts and its bytes per
parameter must be exactly those numbers.
"""

import numpy as np
from test_server_support import RawPeer, running_server

from minips.guard import wire_checks
from minips.protocol import wire


class CountingPeer(RawPeer):
    """A RawPeer that logs each request's op and the bytes of its frames and its reply's."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.log: list[tuple[str, int, int]] = []  # (op, bytes sent, bytes received)

    def request(self, header, arrays=None, codecs=None) -> wire.Message:
        frames = wire.encode(header, arrays, codecs)
        self.socket.send_multipart(frames)
        assert self.socket.poll(5000), "no reply"
        reply = self.socket.recv_multipart()
        sizes = (sum(memoryview(f).nbytes for f in frames), sum(len(f) for f in reply))
        self.log.append((header["op"], *sizes))
        return wire_checks.decode_reply(reply)

    def sent(self, ops=None) -> int:
        return sum(out for op, out, _ in self.log if ops is None or op in ops)

    def received(self, ops=None) -> int:
        return sum(back for op, _, back in self.log if ops is None or op in ops)


GRADS = {"fc.w": np.full((3, 4), 0.5, np.float32), "fc.b": np.full(4, 0.25, np.float32)}
WORKER_OPS = {"hello", "pull", "push", "ping"}


def test_traffic_and_request_counters_are_what_the_client_counted():
    with running_server() as server, CountingPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w", "info": {"pid": 7}})
        pull = peer.request({"op": "pull", "worker": "w"})
        assert set(pull.arrays) == {"fc.w", "fc.b"}
        for seq in range(3):
            header = {"op": "push", "worker": "w", "seq": seq, "base": seq, "samples": 5}
            peer.request(header, GRADS)
        peer.request({"op": "push", "worker": "w", "seq": 3, "base": 3, "last": False}, GRADS)
        peer.request({"op": "ping", "worker": "w"})
        assert peer.request({"op": "nope"}).op == "error"
        peer.request({"op": "stats"})
        stats = peer.request({"op": "stats"}).header["stats"]
    # A request is counted as it arrives (this stats request too); a reply once it is sent
    # (this stats reply not yet).
    assert stats["bytes_in"] == peer.sent()
    assert stats["bytes_out"] == peer.received() - peer.log[-1][2]
    assert stats["messages_in"] == len(peer.log) == 10 and stats["errors"] == 1
    assert stats["updates"] == 3 and stats["samples"] == 15 and stats["worker_steps"] == 3
    grad_bytes = sum(g.nbytes for g in GRADS.values())
    assert stats["grad_bytes_in"] == 4 * grad_bytes
    assert stats["bytes_by_param"] == {
        "fc.w": {"up": 4 * 48, "down": 48},
        "fc.b": {"up": 4 * 16, "down": 16},
    }
    (row,) = stats["workers"]
    assert (row["pushes"], row["pulls"], row["clock"], row["samples"]) == (4, 1, 3, 15)
    assert row["bytes_in"] == peer.sent(WORKER_OPS)
    assert row["bytes_out"] == peer.received(WORKER_OPS)
    assert row["info"] == {"pid": 7}


def test_a_dropped_push_is_counted_as_dropped_not_as_an_update():
    with running_server("dasgd", rule_options={"schedule": "cutoff", "tau_max": 1}) as server:
        with CountingPeer(server.endpoint) as peer:
            peer.request({"op": "hello", "worker": "w"})
            for seq in range(3):  # versions 1, 2, 3
                peer.request({"op": "push", "worker": "w", "seq": seq, "base": seq}, GRADS)
            at = peer.request({"op": "push", "worker": "w", "seq": 3, "base": 2}, GRADS)
            past = peer.request({"op": "push", "worker": "w", "seq": 4, "base": 2}, GRADS)
            stats = peer.request({"op": "stats"}).header["stats"]
    assert at.header["applied"] and at.header["staleness"] == 1  # tau = tau_max: applied
    assert not past.header["applied"] and past.header["staleness"] == 2
    assert (stats["updates"], stats["dropped"], stats["version"]) == (4, 1, 4)
    assert stats["workers"][0]["dropped"] == 1 and stats["workers"][0]["pushes"] == 5
    assert stats["staleness_max"] == 1  # a dropped push is no update's staleness


def test_counters_are_per_worker():
    with running_server() as server:
        with CountingPeer(server.endpoint) as a, CountingPeer(server.endpoint) as b:
            a.request({"op": "hello", "worker": "a"})
            b.request({"op": "hello", "worker": "b"})
            a.request({"op": "push", "worker": "a", "seq": 0, "base": 0, "samples": 3}, GRADS)
            b.request({"op": "pull", "worker": "b"})
            rows = {r["worker"]: r for r in a.request({"op": "stats"}).header["stats"]["workers"]}
    assert (rows["a"]["pushes"], rows["a"]["pulls"], rows["a"]["samples"]) == (1, 0, 3)
    assert (rows["b"]["pushes"], rows["b"]["pulls"], rows["b"]["samples"]) == (0, 1, 0)
    assert rows["a"]["bytes_in"] == a.sent(WORKER_OPS) and rows["b"]["bytes_in"] == b.sent()
    assert rows["a"]["bytes_out"] == a.received(WORKER_OPS)
    assert rows["b"]["bytes_out"] == b.received()
