"""Single hostile requests, each reduced from a finding of tools/fuzz_server.py: the
server answers with a one-line error (or serves it), changes nothing it must not, and
keeps serving every other request."""

from __future__ import annotations

from test_server_support import RawPeer, full, push_header, raw_hello, running_server, snapshot

from minips.protocol.checks import MAX_PUSH_SAMPLES


def test_huge_samples_cannot_break_stats():
    # Two pushes claiming 2^63 samples each: their sum would not fit msgpack's 64 bits.
    with running_server() as server, RawPeer(server.endpoint) as peer:
        raw_hello(peer, "w0")
        before = snapshot(server)
        for seq in range(2):
            header = {**push_header("w0", seq, 0, rid=seq), "samples": 2**63}
            reply = peer.request(header, full("fc.b", 0.1))
            assert reply.header.get("code") == "too_large", reply.header
        assert snapshot(server) == before
        stats = peer.request({"op": "stats"})
        assert stats.op == "stats", stats.header
        assert stats.header["stats"]["samples"] == 0


def test_samples_at_the_limit_are_counted():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        raw_hello(peer, "w0")
        header = {**push_header("w0", 0, 0, rid=1), "samples": MAX_PUSH_SAMPLES}
        assert peer.request(header, full("fc.b", 0.1)).header["applied"] is True
        assert peer.request({"op": "stats"}).header["stats"]["samples"] == MAX_PUSH_SAMPLES
