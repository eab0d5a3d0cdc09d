"""Single hostile requests, each reduced from a finding of tools/fuzz_server.py: the
server answers with a one-line error (or serves it), changes nothing it must not, and
keeps serving every other request."""

from __future__ import annotations

import numpy as np
from test_server_support import (
    RawPeer,
    full,
    pull_header,
    push_header,
    raw_hello,
    running_server,
    snapshot,
)

from minips.guard.wire_checks import MAX_PUSH_SAMPLES


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


def test_dcasgd_refuses_a_push_whose_compensation_overflows():
    # g = 1e20 is finite, but dcasgd's g * g (w - w_bak) is not: inf, or NaN where w = w_bak.
    with running_server(rule="dcasgd") as server, RawPeer(server.endpoint) as peer:
        raw_hello(peer, "w0")
        assert peer.request(pull_header("w0", rid=1)).op == "pull"  # w_bak: version 0
        assert peer.request(push_header("w0", 0, 0, rid=2), full("fc.b", 0.5)).header["applied"]
        before = snapshot(server)
        reply = peer.request(push_header("w0", 1, 0, rid=3), full("fc.b", 1e20))
        assert reply.header.get("code") == "nonfinite", reply.header
        assert snapshot(server) == before
        assert peer.request(push_header("w0", 2, 0, rid=4), full("fc.b", 0.5)).header["applied"]
        assert all(np.isfinite(array).all() for array in server.store.params.values())


def test_dana_gap_serves_a_push_after_a_pull_that_sent_nothing():
    # A pull with `since` = the current version sends nothing, so the server knows no value
    # the worker computes at: its next push must train (plain DANA there), not fail.
    with running_server(rule="dana-gap") as server, RawPeer(server.endpoint) as peer:
        raw_hello(peer, "w0")
        assert peer.request(push_header("w0", 0, 0, rid=1), full("fc.b", 0.5)).header["applied"]
        pulled = peer.request({**pull_header("w0", rid=2), "since": 1})
        assert pulled.op == "pull" and not pulled.arrays
        reply = peer.request(push_header("w0", 1, 1, rid=3), full("fc.b", 0.5))
        assert reply.op == "push" and reply.header["applied"], reply.header
        assert server.store.version == 2
