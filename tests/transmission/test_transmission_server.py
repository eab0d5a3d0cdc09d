"""The server side of plans: delta/fp16 pulls, steps assembled from per-layer pushes, per-layer
bytes; and a whole run whose counted bytes match the planner's prediction."""

import json

import numpy as np
import pytest
from test_server_protocol_doc import _doc_frame
from test_server_support import make_params, running_server

from minips.errors import ConfigError
from minips.guard import wire_checks
from minips.protocol import wire
from minips.results.trace import load_events, summarize
from minips.run.config import RunConfig
from minips.run.launch import run_local
from minips.transmission.plan import ParamPlan, Plan
from minips.worker.client import PSClient
from minips.worker.worker import apply_delta

DELTA = {"codec": "delta", "ratio": 0.25, "dtype": "float16"}


def _plan_server(plan, **kw):
    context = running_server(**kw)
    server = context.__enter__()
    server.use_plan(plan)
    return context, server


def test_delta_pulls_keep_the_worker_copy_equal_to_the_server_replica():
    params = make_params()
    context, server = _plan_server(
        Plan({"fc.w": ParamPlan(pull=DELTA), "fc.b": ParamPlan(pull="fp16")}), params=params
    )
    rng = np.random.default_rng(0)
    try:
        with PSClient(server.endpoint, worker_id="a") as a:
            a.hello()
            first = a.pull(None)
            assert set(first.params) == {"fc.w", "fc.b"} and not first.deltas  # dense first
            copy = {name: np.array(v, np.float32) for name, v in first.params.items()}
            version = first.version
            for _ in range(5):
                grads = {
                    n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()
                }  # noqa: E501
                reply = a.push(grads, base=version, pull_since=version).pull
                (indices, values) = reply.deltas["fc.w"]["indices"], reply.deltas["fc.w"]["values"]
                assert values.dtype == np.float16 and indices.size == 3  # ceil(0.25 * 12)
                apply_delta(copy["fc.w"], indices, values)
                assert reply.params["fc.b"].dtype == np.float16
                copy["fc.b"] = reply.params["fc.b"].astype(np.float32)
                version = reply.version
                replica = server.pulls.encoder._replicas["a"].arrays["fc.w"]
                assert np.array_equal(copy["fc.w"], replica)  # bit for bit
            # Nothing new: the delta parameter is left out (a lost reply changes nothing).
            assert "fc.w" not in a.pull(version).deltas
            # A pull from an older version (a retry after a lost reply): dense again.
            again = a.pull(version - 1)
            assert "fc.w" in again.params and not again.deltas
            np.testing.assert_array_equal(again.params["fc.w"], params["fc.w"])
    finally:
        context.__exit__(None, None, None)


def test_a_step_in_several_pushes_is_one_update_with_the_oldest_base():
    records = []
    with running_server("asgd", lr=1.0, on_update=records.append) as server:
        with PSClient(server.endpoint, worker_id="a") as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            b.push({"fc.b": np.ones(4, np.float32)}, base=0)  # t = 1
            part = a.push({"fc.w": np.full((3, 4), 1.0, np.float32)}, base=0, last=False)
            assert not part.applied and part.version == 1
            a.push({"fc.w": np.full((3, 4), 2.0, np.float32)}, base=1, last=False)
            last = a.push({"fc.b": np.full(4, 1.0, np.float32)}, base=1)
            assert last.applied and last.version == 2 and last.staleness == 1  # base 0
            stats = a.stats()
    assert len(records) == 2 and records[1]["params"] == ["fc.w", "fc.b"]
    by_param = stats["bytes_by_param"]
    assert by_param["fc.w"]["up"] == 2 * 48 and by_param["fc.b"]["up"] == 2 * 16
    assert stats["worker_steps"] == 2


def test_delta_is_refused_in_a_push():
    frames = wire.encode_parts(
        {"op": "push", "worker": "a", "seq": 0, "base": 0},
        [wire.WirePart("fc.w", np.array([1], np.int32), "delta", "indices", (3, 4)),
         wire.WirePart("fc.w", np.array([1.0], np.float32), "delta", "values", (3, 4))],
    )  # fmt: skip
    try:
        wire_checks.decode_request([bytes(f) for f in frames])
    except wire.ProtocolError as exc:
        assert exc.code == "bad_field"
    else:
        raise AssertionError("a delta push was accepted")


def test_protocol_delta_example_is_what_the_server_side_encodes():
    header = {"op": "pull", "rid": 3, "version": 2, "param_versions": {"fc.w": 2, "fc.b": 1},
              "stop": False}  # fmt: skip
    parts = [
        wire.WirePart("fc.w", np.array([1, 5], np.int32), "delta", "indices", (2, 3)),
        wire.WirePart("fc.w", np.array([0.25, -0.5], np.float16), "delta", "values", (2, 3)),
    ]
    frames = [bytes(f) for f in wire.encode_parts(header, parts)]
    assert frames == [_doc_frame(f"codec-delta-frame-{i}") for i in range(3)]
    message = wire_checks.decode_reply(frames)
    held = np.ones((2, 3), np.float32)
    apply_delta(held, message.parts["fc.w"]["indices"], message.parts["fc.w"]["values"])
    np.testing.assert_array_equal(held, [[1, 1.25, 1], [1, 1, 0.5]])


def test_auto_plan_run_bytes_match_the_planner_and_the_trace_shows_wait_free(tmp_path):
    """A real run (2 workers, 20 Mbit/s each): the server's per-parameter counts are within
    5% of the planner's predicted bytes per step; the trace has sender-thread sends."""
    out = tmp_path / "run"
    # 60 steps: the last steps' pulls are fewer than one a step (a worker's final step,
    # a pull with nothing changed), ~3 pulls of the fp16 parameters in all, so a shorter run
    # would be more than 5% under the prediction for that reason alone.
    config = RunConfig(workers=2, epochs=1, max_samples=3840, plan="auto", bandwidth="20mbit",
                       trace=str(tmp_path / "trace.json"))  # fmt: skip
    run_local(config, out, eval_interval=5.0)
    predicted = json.loads((out / "plan.json").read_text())["predicted"]
    records = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    stats = next(r for r in records if r.get("event") == "server")["stats"]
    steps, by_param = stats["worker_steps"], stats["bytes_by_param"]
    up = sum(v["up"] for v in by_param.values()) / steps
    # Each worker's first pull is dense whatever the plan (nothing to take a delta from),
    # and its next `warmup_pulls` carry the delta parameters whole, fp16 (the warm-up).
    warm = 2 * predicted["warmup_pulls"]
    extra = warm * (predicted["down_bytes_per_step_warmup"] - predicted["down_bytes_per_step"])
    down = (sum(v["down"] for v in by_param.values()) - 2 * 431_080 * 4 - extra) / steps
    assert abs(up / predicted["up_bytes_per_step"] - 1) < 0.05, (up, predicted)
    assert abs(down / predicted["down_bytes_per_step"] - 1) < 0.05, (down, predicted)
    assert predicted["up_bytes_per_step"] < 431_080 * 4 / 5
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["bytes_by_layer"]["fc1"]["up"] == by_param["fc1.w"]["up"] + by_param["fc1.b"]["up"]
    )  # noqa: E501
    events = load_events(tmp_path / "trace.json")
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    sends = [e for e in events if e.get("cat") == "send" and rows[e["tid"]] == "sender"]
    assert {e["name"] for e in sends} >= {"fc2", "fc1", "conv2"}
    assert summarize(events)["mean"]["comm_ms"] > 0


def test_a_delta_warm_up_sends_the_parameter_as_fp16_then_deltas_from_what_the_worker_holds():
    params = make_params()
    warm = {**DELTA, "warmup": 2}
    context, server = _plan_server(Plan({"fc.w": ParamPlan(pull=warm)}), params=params)
    rng = np.random.default_rng(2)
    try:
        with PSClient(server.endpoint, worker_id="a") as a:
            a.hello()
            first = a.pull(None)
            copy, version, kinds = np.array(first.params["fc.w"], np.float32), first.version, []
            for _ in range(4):
                grads = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in
                         params.items()}  # fmt: skip
                reply = a.push(grads, base=version, pull_since=version).pull
                if "fc.w" in reply.params:  # the warm-up: the whole parameter, fp16
                    kinds.append(str(reply.params["fc.w"].dtype))
                    copy = reply.params["fc.w"].astype(np.float32)
                else:
                    kinds.append("delta")
                    delta = reply.deltas["fc.w"]
                    apply_delta(copy, delta["indices"], delta["values"])
                version = reply.version
                assert np.array_equal(copy, server.pulls.encoder._replicas["a"].arrays["fc.w"])
        assert kinds == ["float16", "float16", "delta", "delta"]  # versions 1, 2 <= warmup
    finally:
        context.__exit__(None, None, None)


def test_a_parameter_pushed_with_momentum_correction_is_applied_without_the_servers_momentum():
    """fc.w by top-k with momentum correction: the server adds lr x what arrived (the
    worker's velocity) and keeps no velocity of its own; fc.b, dense, takes its momentum."""
    params = make_params()
    before = {name: array.copy() for name, array in params.items()}
    spec = {"codec": "topk", "ratio": 0.5, "momentum": 0.9}
    plan = Plan({"fc.w": ParamPlan(push=spec)})
    context, server = _plan_server(plan, params=params, lr=0.5, momentum=0.9)
    rng = np.random.default_rng(1)
    g1, g2 = ({n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()}
              for _ in range(2))  # fmt: skip
    try:
        with PSClient(server.endpoint, worker_id="a") as a:
            a.hello()
            version = a.pull(None).version
            for grads in (g1, g2):
                version = a.push(grads, base=version, codecs=plan.push_specs()).version
            held_back = a.encoder.codec("fc.w", spec).residual
        store = server.store
        assert store.optimizer.plain == {"fc.w"} and "fc.w" not in store.optimizer.velocity
        arrived = g1["fc.w"] + (np.float32(0.9) * g1["fc.w"] + g2["fc.w"]) - held_back
        expected_w = before["fc.w"] - 0.5 * arrived
        np.testing.assert_allclose(store.params["fc.w"], expected_w, rtol=1e-5, atol=1e-6)
        velocity_b = np.float32(0.9) * g1["fc.b"] + g2["fc.b"]
        expected_b = before["fc.b"] - 0.5 * (g1["fc.b"] + velocity_b)
        np.testing.assert_allclose(store.params["fc.b"], expected_b, rtol=1e-6)
    finally:
        context.__exit__(None, None, None)


def test_a_plan_whose_top_k_momentum_is_not_the_servers_is_refused():
    plan = Plan({"fc.w": ParamPlan(push={"codec": "topk", "ratio": 0.1, "momentum": 0.5})})
    with running_server(momentum=0.9) as server:
        with pytest.raises(ConfigError, match="momentum 0.5 is not the server's 0.9"):
            server.use_plan(plan)
        assert server.store.optimizer.plain == frozenset()
