"""One round trip per step: a push that also pulls (docs/protocol.md 5.3, `pull_since`)."""

import threading

import numpy as np
from test_server_support import SHAPES, RawPeer, make_params, running_server

from minips.ops.server_ops import ServerOps
from minips.worker.client import PSClient


def _grads(value=1.0):
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


def test_fused_push_returns_the_updated_parameters():
    params = make_params()
    before = {k: v.copy() for k, v in params.items()}
    with running_server("asgd", params=params, lr=0.5) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        version = ps.pull().version
        reply = ps.push(_grads(), base=version, pull_since=version)
        assert reply.applied and reply.version == 1 and reply.pull is not None
        assert reply.pull.version == 1 and reply.pull.param_versions == {"fc.w": 1, "fc.b": 1}
        for name in SHAPES:
            np.testing.assert_array_equal(reply.pull.params[name], before[name] - 0.5)
        # Only what changed since `pull_since` comes back.
        only_b = ps.push({"fc.b": np.ones(4, np.float32)}, base=1, pull_since=1)
        assert list(only_b.pull.params) == ["fc.b"]
        # Without pull_since the reply is a plain push reply, as before.
        plain = ps.push(_grads(), base=2)
        assert plain.pull is None


def test_fused_push_under_ssgd_returns_the_rounds_result():
    params = make_params()
    before = params["fc.b"].copy()
    with running_server("ssgd", params=params, lr=1.0) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            results = {}

            def push(client, value, key):
                results[key] = client.push(_grads(value), base=0, pull_since=0)

            threads = [threading.Thread(target=push, args=(c, v, k))
                       for c, v, k in ((a, 1.0, "a"), (b, 3.0, "b"))]  # fmt: skip
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=10)
    for key in ("a", "b"):
        reply = results[key]
        assert reply.applied and reply.version == 1
        np.testing.assert_array_equal(reply.pull.params["fc.b"], before - 2.0)  # the mean


def test_fused_pull_half_is_held_by_ssp_like_a_pull():
    with running_server("ssp", rule_options={"staleness": 0}) as server:
        with PSClient(server.endpoint) as fast, PSClient(server.endpoint) as slow:
            fast.hello()
            slow.hello()
            done = {}
            thread = threading.Thread(
                target=lambda: done.setdefault("r", fast.push(_grads(), base=0, pull_since=0))
            )
            thread.start()
            thread.join(timeout=0.5)
            assert thread.is_alive()  # fast is one clock ahead of slow: the reply waits
            slow.push(_grads(), base=0)
            thread.join(timeout=10)
            assert done["r"].applied and done["r"].pull.version == 2


def test_a_retried_fused_push_is_applied_once_and_gets_the_parameters():
    params = make_params()
    with running_server("asgd", params=params, lr=0.5) as server:
        with RawPeer(server.endpoint) as raw:
            raw.request({"op": "hello", "worker": "w"})
            push = {"op": "push", "worker": "w", "seq": 0, "base": 0, "pull_since": 0, "rid": 1}
            first = raw.request(push, _grads())
            again = raw.request({**push, "rid": 2}, _grads())
            assert first.header["applied"] and again.header["applied"]
            assert server.store.version == 1  # applied once
            assert again.header["rid"] == 2 and set(again.arrays) == set(SHAPES)
            np.testing.assert_array_equal(again.arrays["fc.b"], first.arrays["fc.b"])


def test_a_worker_step_under_the_default_plan_is_one_fused_push_of_every_gradient():
    """The dense plan goes through the same sender as every plan: one push per step,
    carrying every parameter's float32 gradient as it is, and its reply the parameters."""
    from minips.nn import build_model
    from minips.rules import make_rule
    from minips.server.server import ParameterServer, ServerOptions
    from minips.state.store import SGD
    from minips.worker.worker import Worker

    params = build_model("mlp", seed=0).params
    config = {"model": {"name": "mlp"}, "dataset": "synthetic", "epochs": 1, "batch_size": 32}
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.05),
                             ServerOptions(world_size=1), config=config,
                             operations=ServerOps)  # fmt: skip
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    try:
        with PSClient(server.endpoint, timeout=30) as client:
            sent: list[list[tuple[str, str]]] = []
            request = client._request_locked

            def spying(header, parts):
                if header["op"] == "push":
                    sent.append([(part.name, part.codec) for part in parts])
                    grads = worker.model.grads
                    assert all(part.array is grads[part.name] for part in parts)  # no copy
                return request(header, parts)

            client._request_locked = spying
            worker = Worker(client, max_steps=4)
            report = worker.run()
            stats = client.stats()
    finally:
        server.request_stop()
        loop.join(timeout=10)
        server.close()
    names = list(server.store.params)
    assert report.steps == 4 and sent == [[(name, "dense") for name in names]] * 4
    assert stats["worker_steps"] == 4 and stats["updates"] == 4
    assert stats["messages_in"] == 1 + 1 + 4 + 1  # hello, the first pull, 4 steps, stats
