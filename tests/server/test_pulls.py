"""Answering pulls (minips.server.pulls) over real sockets: a stopping server answers the
pulls its rule still holds, a pull from an older version than the last reply (a retry
after a lost one) restarts the delta replica dense, and a delta warm-up is exactly its
`warmup` replies long (docs/protocol.md 5.7, 13.7)."""

from __future__ import annotations

import numpy as np
from test_server_support import (
    RawPeer,
    make_params,
    pull_header,
    push_header,
    raw_hello,
    running_server,
    send_then_fence,
)

from minips.protocol import wire
from minips.transmission.plan import ParamPlan, Plan
from minips.worker.client import PSClient

DELTA = {"codec": "delta", "ratio": 0.25, "dtype": "float16"}


def test_a_stopping_server_answers_a_pull_its_rule_still_holds():
    with running_server("ssp", rule_options={"staleness": 0}) as server:
        with RawPeer(server.endpoint) as a, RawPeer(server.endpoint) as b:
            raw_hello(a, "a")
            raw_hello(b, "b")
            grads = {"fc.b": np.ones(4, np.float32)}
            assert a.request(push_header("a", 0, 0, rid=1), grads).header["applied"]
            assert send_then_fence(a, pull_header("a", rid=2)) is None  # a is 1 clock ahead
            assert b.request({"op": "stop", "rid": 3}).op == "stop"
            a.send(wire.encode({"op": "stats", "rid": 4}))
            pulled = a.recv()  # answered by the stop, before a's stats
            assert pulled.op == "pull" and pulled.header["rid"] == 2, pulled.header
            assert pulled.header["stop"] is True and pulled.header["version"] == 1
            assert a.recv().header["rid"] == 4


def _plan_server(pull: dict):
    """A server whose pulls of fc.w follow `pull` (fc.b dense)."""
    context = running_server(params=make_params())
    server = context.__enter__()
    server.use_plan(Plan({"fc.w": ParamPlan(pull=pull)}))
    return context, server


def _grads(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in make_params().items()}


def test_a_pull_since_an_older_version_than_the_last_reply_gets_the_parameter_dense():
    context, server = _plan_server(DELTA)
    try:
        with PSClient(server.endpoint, worker_id="a") as a:
            a.hello()
            assert "fc.w" in a.pull(None).params  # dense first: the replica starts at 0
            a.push(_grads(0), base=0)
            assert "fc.w" in a.pull(0).deltas  # in step: a delta against version 0
            a.push(_grads(1), base=1)
            # That reply was lost: the worker still holds version 0 and asks since 0 again.
            retry = a.pull(0)
            assert retry.version == 2 and not retry.deltas
            held = server.pulls.encoder._replicas["a"]
            np.testing.assert_array_equal(retry.params["fc.w"], held.arrays["fc.w"])
            assert held.version == 2  # the replica restarted from what was sent
            since_retry = a.pull(2)  # in step again: nothing new, fc.w left out
            assert "fc.w" not in since_retry.params and "fc.w" not in since_retry.deltas
    finally:
        context.__exit__(None, None, None)


def test_a_delta_warm_up_of_one_reply_is_one_fp16_reply_then_deltas():
    context, server = _plan_server({**DELTA, "warmup": 1})
    try:
        with PSClient(server.endpoint, worker_id="a") as a:
            a.hello()
            version, kinds = a.pull(None).version, []
            for step in range(3):
                reply = a.push(_grads(step), base=version, pull_since=version).pull
                if "fc.w" in reply.params:
                    kinds.append(str(reply.params["fc.w"].dtype))
                else:
                    kinds.append("delta" if "fc.w" in reply.deltas else "none")
                version = reply.version
        assert kinds == ["float16", "delta", "delta"]
    finally:
        context.__exit__(None, None, None)
