"""The values an encoded pull carries, checked against the server's parameters by a client
that computes them on its own (docs/protocol.md 13.7): fp16 pulls are the parameters
rounded to float16, delta pulls are the top k of (parameters - the worker's copy), and the
worker's copy after each pull is what the document says it is, through lost replies,
retries and pulls that change nothing. Observers always get the parameters as they are.
"""

import math

import numpy as np
from test_server_support import make_params, running_server

from minips.transmission.plan import ParamPlan, Plan
from minips.worker.client import PSClient
from minips.worker.worker import apply_delta


def plan_server(plan: Plan, params):
    context = running_server(params=params, lr=0.1)
    server = context.__enter__()
    server.use_plan(plan)
    return context, server


def expected_delta(current: np.ndarray, copy: np.ndarray, ratio: float, dtype) -> tuple:
    """(indices ascending, values) a delta pull must carry: the k = ceil(ratio * size)
    entries of current - copy largest in magnitude."""
    diff = (current - copy).reshape(-1)
    k = min(diff.size, math.ceil(ratio * diff.size))
    indices = np.sort(np.argsort(-np.abs(diff), kind="stable")[:k])
    return indices, diff[indices].astype(dtype)


def grads(rng, params):
    return {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()}


def test_fp16_pulls_are_the_parameters_rounded_each_time_they_change():
    params = make_params()
    context, server = plan_server(Plan({"fc.b": ParamPlan(pull="fp16")}), params)
    rng = np.random.default_rng(1)
    try:
        with PSClient(server.endpoint) as ps, PSClient(server.endpoint) as observer:
            ps.hello()
            observer.hello({"role": "observer"})
            version = None
            for _ in range(3):
                reply = ps.pull(version)
                np.testing.assert_array_equal(
                    reply.params["fc.b"], params["fc.b"].astype(np.float16)
                )
                assert reply.params["fc.b"].dtype == np.float16
                np.testing.assert_array_equal(reply.params["fc.w"], params["fc.w"])  # dense
                version = reply.version
                ps.push(grads(rng, params), base=version)  # both parameters change
            seen = observer.pull(None).params["fc.b"]  # an observer: as they are
            assert seen.dtype == np.float32 and np.array_equal(seen, params["fc.b"])
    finally:
        context.__exit__(None, None, None)


def test_delta_pulls_carry_the_top_k_of_what_the_copy_misses_through_retries():
    params = make_params()
    ratio = 0.1  # fc.b: ceil(0.4) = 1 entry a pull; fc.w: ceil(1.2) = 2
    delta = {"codec": "delta", "ratio": ratio, "dtype": "float16"}
    plan = Plan({"fc.w": ParamPlan(pull=delta), "fc.b": ParamPlan(pull=delta)})
    context, server = plan_server(plan, params)
    rng = np.random.default_rng(2)
    try:
        with PSClient(server.endpoint) as ps, PSClient(server.endpoint) as observer:
            ps.hello()
            observer.hello({"role": "observer"})
            first = ps.pull(None)
            assert not first.deltas  # the first pull: dense
            copy = {n: np.array(v, np.float32) for n, v in first.params.items()}
            version = first.version
            for step in range(6):
                ps.push(grads(rng, params), base=version)
                if step == 3:  # a reply lost: the retry asks from an older version
                    again = ps.pull(version - 1)
                    assert not again.deltas  # dense, and the copy starts from it
                    copy = {n: np.array(v, np.float32) for n, v in again.params.items()}
                    version = again.version
                    continue
                now = {n: np.array(p) for n, p in params.items()}
                reply = ps.pull(version)
                for name in ("fc.w", "fc.b"):
                    indices, values = expected_delta(now[name], copy[name], ratio, np.float16)
                    got = reply.deltas[name]
                    np.testing.assert_array_equal(got["indices"], indices)
                    np.testing.assert_array_equal(got["values"], values)
                    apply_delta(copy[name], got["indices"], got["values"])
                version = reply.version
                nothing_new = ps.pull(version)  # changes nothing, may be lost harmlessly
                assert not nothing_new.deltas and not nothing_new.params
            seen = observer.pull(None)
            for name in params:
                assert seen.params[name].dtype == np.float32 and not seen.deltas
                np.testing.assert_array_equal(seen.params[name], params[name])
    finally:
        context.__exit__(None, None, None)
