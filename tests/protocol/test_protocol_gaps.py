"""The points an implementation written from docs/protocol.md alone found silent or wrong,
each checked against a live server now that the document (or the server) says it.

Which was changed: the server for VSGD samples sent as fp16 (refused now, as section 6.4
says); the document for every other point (the server was right, the text silent).
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
from test_server_support import SHAPES, RawPeer, make_params, running_server, snapshot

from minips.protocol import wire
from minips.protocol.sampling import Sampler
from minips.transmission.codecs import CODEC_CLASSES
from minips.transmission.plan import PARAM_KEYS, PULL_CODECS, ParamPlan, Plan
from minips.worker.client import PSClient

DOC = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()


def _section(title: str) -> str:
    return DOC.split(title)[1].split("\n### ")[0].split("\n## ")[0]


def _grads(value: float = 0.1) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, np.float32) for name, shape in SHAPES.items()}


# ---------------------------------------------------------------- 6.4: the server changed


def test_a_vsgd_sample_sent_as_fp16_is_refused_and_changes_nothing():
    sampler = Sampler(0.5, 2)
    options = {"rho": 0.5, "min_samples": 2}
    with running_server("vsgd", rule_options=options) as server:
        with RawPeer(server.endpoint) as peer:
            peer.request({"op": "hello", "worker": "w"})
            params = make_params()
            arrays = dict(_grads())
            codecs = {}
            for name in SHAPES:
                arrays[f"extra/sample/{name}"] = sampler.values(name, params[name])
            arrays["extra/sample/fc.w"] = arrays["extra/sample/fc.w"].astype(np.float16)
            codecs["extra/sample/fc.w"] = "fp16"
            before = snapshot(server)
            push = {"op": "push", "worker": "w", "seq": 0, "base": 0}
            reply = peer.request(push, arrays, codecs)
            assert reply.op == "error" and reply.header["code"] == "rule"
            assert "dense float32" in reply.header["reason"]
            assert snapshot(server) == before
            arrays["extra/sample/fc.w"] = sampler.values("fc.w", params["fc.w"])
            reply = peer.request({**push, "seq": 1}, arrays)  # all dense float32: applied
            assert reply.op == "push" and reply.header["applied"]
    assert "another codec (`fp16` too" in _section("### 6.4 VSGD samples")


# -------------------------------------------------------------- 13.7, 13.8: the plan


def test_the_plan_tables_are_the_codes_codecs_options_and_keys():
    section = _section("### 13.8 The plan")
    for key in (*PARAM_KEYS, "format", "wait_free", "predicted"):
        assert f"`{key}`" in section or f"`params.<name>.{key}`" in section, key
    for name, cls in CODEC_CLASSES.items():
        row = re.search(rf"^\| `{name}` \| (.*?) \|", section, re.M)
        assert row, f"no row for codec {name}"
        named = set(re.findall(r"`([a-z_]+)` \(", row.group(1)))
        assert named == set(cls.options), (name, named, cls.options)
        for required in cls.required:
            assert f"`{required}` (required" in row.group(1)
    assert set(PULL_CODECS) == {"dense", "fp16", "delta"}
    for option in PULL_CODECS["delta"]:
        assert f'"{option}"' in section
    # The syntax as written, with each documented field, is a valid plan.
    documented = {"format": 1, "wait_free": True, "predicted": {"bytes": 1},
                  "params": {"fc.w": {"push": {"codec": "topk", "ratio": 0.5, "warmup": 2,
                                               "dtype": "float16", "seed": 3},
                                      "pull": {"codec": "delta", "ratio": 0.5, "dtype": "float16"},
                                      "every": 2, "priority": 1},
                             "fc.b": {"push": "fp16", "pull": "fp16"}}}  # fmt: skip
    plan = Plan.from_dict(documented)
    assert plan.param("fc.w").every == 2 and plan.wait_free


def test_pulls_come_lower_priority_first_and_an_observer_gets_them_dense_in_that_order():
    plan = Plan({"fc.w": ParamPlan(priority=1, pull="fp16"), "fc.b": ParamPlan(priority=-1)})
    with running_server() as server:
        server.use_plan(plan)
        with RawPeer(server.endpoint) as worker, RawPeer(server.endpoint) as observer:
            worker.request({"op": "hello", "worker": "w"})
            reply = worker.request({"op": "pull", "worker": "w"})
            assert [(d["name"], d["codec"]) for d in reply.header["arrays"]] == [
                ("fc.b", "dense"), ("fc.w", "fp16")]  # fmt: skip
            observer.request({"op": "hello", "worker": "o", "info": {"role": "observer"}})
            reply = observer.request({"op": "pull", "worker": "o"})
            assert [(d["name"], d["codec"]) for d in reply.header["arrays"]] == [
                ("fc.b", "dense"), ("fc.w", "dense")]  # fmt: skip
    assert "lower first" in _section("### 13.8 The plan")


def test_a_dense_push_where_the_plan_says_topk_is_accepted():
    plan = Plan({"fc.w": ParamPlan(push={"codec": "topk", "ratio": 0.1})})
    with running_server() as server:
        server.use_plan(plan)
        with PSClient(server.endpoint, timeout=5) as client:
            client.hello()
            assert client.push(_grads(), base=0).applied  # dense, not topk
    assert "a `dense` push of a parameter whose plan" in _section("### 13.8 The plan")


# --------------------------------------------------------------------- 5.1, 5.6, 9


def test_a_rank_left_unfinished_goes_to_the_next_new_worker_asking_or_not():
    with running_server(world_size=2) as server:
        with PSClient(server.endpoint) as first, PSClient(server.endpoint) as second:
            assert first.hello()["rank"] == 0 and second.hello()["rank"] == 1
            first.bye(finished=False)
            with PSClient(server.endpoint) as newcomer:  # no info.rank
                assert newcomer.hello()["rank"] == 0
    assert "goes to the next new worker, whether or not it asks" in " ".join(
        _section("### 5.1 `hello`").split()
    )


def test_after_bye_a_pull_is_unknown_worker_until_hello():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        peer.request({"op": "bye", "worker": "w"})
        reply = peer.request({"op": "pull", "worker": "w"})
        assert reply.op == "error" and reply.header["code"] == "unknown_worker"
        peer.request({"op": "hello", "worker": "w"})
        assert peer.request({"op": "pull", "worker": "w"}).op == "pull"
    row = re.search(r"^\| `unknown_worker` \| (.*)$", DOC, re.M).group(1)
    assert "said `bye`" in row


# ------------------------------------------------------------------- silent points


def test_a_reply_with_nothing_new_has_no_arrays_key_and_no_frames():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        peer.send(wire.encode({"op": "pull", "worker": "w", "since": 0}))
        frames = peer.socket.recv_multipart()
        assert len(frames) == 1 and "arrays" not in msgpack.unpackb(frames[0])
    assert "has no `arrays` key" in DOC


@pytest.mark.parametrize("rid", ["seven", -1, 1.5, True])
def test_an_error_to_a_request_with_an_invalid_rid_has_no_rid(rid):
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.send([msgpack.packb({"v": 1, "op": "stats", "rid": rid})])
        reply = peer.recv()
        assert reply.header["code"] == "bad_field" and "rid" not in reply.header
    assert "that error's reply has no `rid`" in DOC


def test_unknown_descriptor_keys_are_ignored():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"op": "hello", "worker": "w"})
        grad = np.full(4, 0.5, np.float32)
        desc = {"name": "fc.b", "dtype": "float32", "shape": [4], "codec": "dense", "note": 1}
        head = {"v": 1, "op": "push", "worker": "w", "seq": 0, "base": 0, "arrays": [desc]}
        peer.send([msgpack.packb(head), grad.tobytes()])
        assert peer.recv().header["applied"]
    assert "A descriptor's other keys are ignored" in DOC


def test_stats_pushes_count_a_steps_last_false_pushes_and_clock_its_steps():
    with running_server() as server, PSClient(server.endpoint) as client:
        client.hello()
        client.push({"fc.w": _grads()["fc.w"]}, base=0, last=False)
        client.push({"fc.b": _grads()["fc.b"]}, base=0)
        (row,) = client.stats()["workers"]
        assert row["pushes"] == 2 and row["clock"] == 1
    assert "a step's `last: false` pushes included" in " ".join(DOC.split())


def test_ssgd_averages_in_float32_adding_the_workers_in_rank_order():
    values = [1.0, 2.0**24, -(2.0**24)]  # ranks 0, 1, 2; 1 + 2^24 rounds to 2^24 in float32
    params = {"fc.b": np.zeros(4, np.float32), "fc.w": np.zeros((3, 4), np.float32)}
    with running_server("ssgd", params=params, lr=1.0, world_size=3) as server:
        clients = [PSClient(server.endpoint, timeout=10) for _ in values]
        for rank, client in enumerate(clients):
            assert client.hello()["rank"] == rank
        threads = []
        for client, value in reversed(list(zip(clients, values, strict=True))):
            grad = {"fc.b": np.full(4, value, np.float32)}
            threads.append(threading.Thread(target=client.push, args=(grad, 0)))
            threads[-1].start()
            time.sleep(0.3)  # arrive last rank first: the sum must not follow them
        for thread in threads:
            thread.join(timeout=10)
        got = server.store.params["fc.b"]
        for client in clients:
            client.close()
    total = np.float32(0)
    for value in values:  # rank order
        total = np.float32(total + np.float32(value))
    expected = -(total / np.float32(3))
    arrival = np.float32(np.float32(-(2.0**24)) + np.float32(2.0**24)) + np.float32(1.0)
    assert expected == 0.0 and arrival != 0.0  # the order shows
    assert got.tolist() == [expected] * 4
    assert "added in rank order, whatever order their `last` pushes arrived in" in _section(
        "### 6.2 Rules"
    )


def test_the_push_that_reaches_the_sample_budget_is_applied_with_stop_false():
    with running_server(max_samples=100) as server, PSClient(server.endpoint) as client:
        client.hello()
        first = client.push(_grads(), base=0, samples=60)
        crossing = client.push(_grads(), base=first.version, samples=60)
        assert crossing.applied and not crossing.stop
        assert client.pull().stop
    assert "answered `stop: false`" in " ".join(DOC.split())
