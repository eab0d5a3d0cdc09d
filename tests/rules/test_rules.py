"""DASGD, VSGD and DC-ASGD against hand-computed expectations, over real sockets.

Each test pushes chosen gradients at chosen bases to a server in a thread and checks the
parameters bit for bit against the same float32 operations done by hand (lr * scale is a
Python float cast once to float32, as in minips.state.store.SGD).
"""

import math
import re
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from test_server_support import SHAPES, copied, full, make_params, running_server, snapshot

import minips
from minips.errors import ConfigError
from minips.protocol.sampling import (
    GOLDEN_GAMMA,
    Sampler,
    sample_indices,
    sample_size,
    splitmix64_mix,
)
from minips.rules import DASGD, DCASGD, VSGD, layer_of, make_rule
from minips.worker.client import PSClient, ServerError


def _ones(names=SHAPES):
    return {name: np.ones(SHAPES[name], np.float32) for name in names}


def _step(param, lr_times_scale, grad):
    """One plain SGD step exactly as the server does it, in float32."""
    return param - np.asarray(lr_times_scale, np.float32) * grad


def _wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def _advance(ps, n, version=0):
    """n fresh (tau 0) updates; returns the version after them."""
    for _ in range(n):
        version = ps.push({"fc.b": np.zeros(4, np.float32)}, base=version).version
    return version


# ------------------------------------------------------------------------------ DASGD


@pytest.mark.parametrize(
    "options, taus, factors",
    [
        ({}, [0, 1, 2, 4, 10], [1.0, 1.0, 0.5, 0.25, 0.1]),
        ({"schedule": "exp", "beta": 0.5}, [0, 2], [1.0, math.exp(-1.0)]),
        ({"schedule": "poly", "power": 2.0}, [0, 1, 3], [1.0, 0.25, 1 / 16]),
        ({"schedule": "cutoff", "tau_max": 2}, [0, 2, 3], [1.0, 1.0, 0.0]),
    ],
)
def test_dasgd_schedules(options, taus, factors):
    rule = DASGD(**options)
    assert [rule.factor(tau) for tau in taus] == pytest.approx(factors, abs=0)


def test_dasgd_defaults_and_describe():
    assert DASGD().describe() == {"name": "dasgd", "schedule": "inverse"}
    assert DASGD("exp").describe() == {"name": "dasgd", "schedule": "exp", "beta": 0.2}
    assert DASGD("poly").power == 0.5 and DASGD("cutoff").tau_max == 8


@pytest.mark.parametrize(
    "options, message",
    [
        ({"schedule": "linear"}, "unknown dasgd schedule"),
        ({"beta": 0.3}, "beta only applies to schedule 'exp'"),
        ({"schedule": "exp", "tau_max": 3}, "tau_max only applies to schedule 'cutoff'"),
        ({"schedule": "exp", "beta": 0}, "beta must be a number > 0"),
        ({"schedule": "poly", "power": "x"}, "option power='x' is not a number"),
        ({"schedule": "cutoff", "tau_max": 1.5}, "option tau_max=1.5 is not an integer"),
        ({"schedule": "cutoff", "tau_max": -1}, "tau_max must be an integer >= 0"),
    ],
)
def test_dasgd_bad_options_are_one_line_config_errors(options, message):
    with pytest.raises(ConfigError, match=message) as info:
        minips.make_rule("dasgd", **options)
    assert "\n" not in str(info.value)


def test_dasgd_at_tau_4_applies_exactly_a_quarter_of_the_step():
    params = make_params()
    records = []
    with running_server("dasgd", params=params, lr=0.5, on_update=records.append) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            _advance(ps, 4)  # zero gradients: 4 updates that do not move fc.b
            before = params["fc.b"].copy()
            grad = np.array([1.0, -2.0, 0.5, 4.0], np.float32)
            reply = ps.push({"fc.b": grad}, base=0)
    assert reply.applied and reply.staleness == 4 and reply.version == 5
    np.testing.assert_array_equal(params["fc.b"], _step(before, 0.5 * 0.25, grad))
    assert records[-1]["scale"] == 0.25 and records[-1]["staleness"] == [4]
    assert records[-1]["dropped"] is False and records[-1]["value_staleness"] is None


def test_dasgd_cutoff_drops_a_push_past_tau_max_without_changing_anything():
    params = make_params()
    records = []
    rule = make_rule("dasgd", schedule="cutoff", tau_max=2)
    with running_server(rule, params=params, lr=0.5, on_update=records.append) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            _advance(ps, 3)
            before = snapshot(server)
            dropped = ps.push(_ones(), base=0)  # tau 3 > 2
            assert snapshot(server) == before  # bit for bit
            kept = ps.push(_ones(), base=1)  # tau 2: a full step
            stats = ps.stats()
    assert (dropped.applied, dropped.staleness, dropped.version) == (False, 3, 3)
    assert (kept.applied, kept.staleness, kept.version) == (True, 2, 4)
    record = records[3]
    assert record["dropped"] is True and record["version"] == 3
    assert record["params"] == [] and record["scale"] == 0.0 and record["staleness"] == [3]
    assert records[4]["dropped"] is False and records[4]["scale"] == 1.0
    assert stats["updates"] == 4 and stats["dropped"] == 1 and stats["version"] == 4
    assert stats["workers"][0]["dropped"] == 1


# ----------------------------------------------------------------------------- sampling


def _reference_indices(name, size, rho, min_samples):
    """docs/protocol.md's sampling rule, in plain Python integers (no numpy)."""
    mask = (1 << 64) - 1
    k = min(size, max(min_samples, math.ceil(rho * size)))
    seed = zlib.crc32(name.encode("utf-8"))

    def key(i):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    return sorted(sorted(range(size), key=key)[:k])


@pytest.mark.parametrize(
    "name, size, rho, min_samples",
    [
        ("fc1.w", 5000, 0.01, 32),
        ("conv1.w", 500, 0.1, 8),
        ("fc.b", 4, 0.01, 32),
        ("é.w", 97, 0.5, 1),
    ],
)
def test_sample_matches_the_documented_rule(name, size, rho, min_samples):
    indices = sample_indices(name, size, rho, min_samples)
    assert indices.tolist() == _reference_indices(name, size, rho, min_samples)


def test_protocol_doc_sampling_example():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    block = re.search(r"<!-- vsgd-sample -->\s*```\s*\n(.*?)```", doc, re.S)
    assert block, "the vsgd-sample block is missing from docs/protocol.md"
    documented = [int(i) for i in block.group(1).split()]
    assert sample_indices("fc1.w", 1000, 0.01, 4).tolist() == documented
    assert zlib.crc32(b"fc1.w") == 420237065 and "420237065 (0x190c4f09)" in doc
    keys = splitmix64_mix(np.uint64(420237065) + np.arange(1, 3, dtype=np.uint64) * GOLDEN_GAMMA)
    assert [hex(int(key)) for key in keys] == ["0x87ae0b810b095c56", "0x177eb19beb46748c"]
    assert all(hex(int(key)) in doc for key in keys)


def test_sample_is_deterministic_in_bounds_and_sized_by_rho():
    for name, size in [("fc1.w", 400_000), ("conv2.w", 25_000), ("fc2.b", 10), ("conv1.w", 500)]:
        first = sample_indices(name, size, 0.01, 32)
        again = sample_indices(name, size, 0.01, 32)
        np.testing.assert_array_equal(first, again)
        k = min(size, max(32, math.ceil(0.01 * size)))
        assert len(first) == sample_size(size, 0.01, 32) == k
        assert first.dtype == np.int64 and first[0] >= 0 and first[-1] < size
        assert np.all(np.diff(first) > 0)  # ascending, no duplicates
    # Another name picks other coordinates; a large tensor's sample spans all of it.
    big = sample_indices("fc1.w", 400_000, 0.01, 32)
    assert not np.array_equal(big, sample_indices("fc2.w", 400_000, 0.01, 32))
    assert len(np.unique(big % 500)) > 450  # rows and columns of an (800, 500) weight


def test_worker_and_server_samplers_agree():
    params = make_params()
    worker, server = Sampler(0.25, 2), Sampler(0.25, 2)
    for name, param in params.items():
        np.testing.assert_array_equal(worker.values(name, param), server.values(name, param))
        idx = server.indices(name, param.size)
        np.testing.assert_array_equal(worker.values(name, param), param.reshape(-1)[idx])


# --------------------------------------------------------------------------------- VSGD

# Two layers: "a" with a weight and a bias, "b" with a weight only. min_samples 32 samples
# every coordinate of these small tensors, so the gap is computed by hand on whole arrays.
LAYERS = {"a.w": (3, 4), "a.b": (4,), "b.w": (2, 2)}


def _layer_params():
    rng = np.random.default_rng(1)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in LAYERS.items()}


def _samples(sampler, values):
    return {f"sample/{name}": sampler.values(name, array) for name, array in values.items()}


def test_vsgd_scales_each_layer_by_its_value_staleness():
    params = _layer_params()
    records = []
    rule = VSGD(rho=0.01, min_samples=32)
    sampler = Sampler(0.01, 32)
    ones = {name: np.ones(shape, np.float32) for name, shape in LAYERS.items()}
    with running_server(rule, params=params, lr=1.0, on_update=records.append) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            pulled = {name: array.copy() for name, array in ps.pull().params.items()}
            # 1. A fresh push: gap 0, nothing moved yet, full step. It moves every entry by
            #    1, so step_a.w = sqrt(12), step_a.b = 2, step_b.w = 2: step_a = 4, step_b = 2.
            ps.push(ones, base=0, extra=_samples(sampler, pulled))
            assert records[0]["value_staleness"] == {"a": 0.0, "b": 0.0}
            assert rule._step == pytest.approx({"a.w": math.sqrt(12), "a.b": 2.0, "b.w": 2.0})
            # 2. A worker whose copy of layer a is 3 away from the server's in every entry:
            #    gap_a = sqrt(16 * 9) = 12, d_a = 12 / 4 = 3; its copy of b is current: d_b = 0.
            now = {name: array.copy() for name, array in params.items()}
            claimed = {"a.w": now["a.w"] + 3, "a.b": now["a.b"] - 3, "b.w": now["b.w"]}
            reply = ps.push(ones, base=1, extra=_samples(sampler, claimed))
    assert reply.applied
    record = records[1]
    assert record["value_staleness"] == pytest.approx({"a": 3.0, "b": 0.0})
    assert record["scale"] == pytest.approx({"a.w": 1 / 3, "a.b": 1 / 3, "b.w": 1.0})
    # (d_a is 3 up to float32 rounding of the claimed values: apply the recorded scale.)
    scale_a = record["scale"]["a.w"]
    for name in ("a.w", "a.b"):  # both parameters of layer a get a's scale
        np.testing.assert_array_equal(params[name], _step(now[name], scale_a, ones[name]))
    np.testing.assert_array_equal(params["b.w"], _step(now["b.w"], 1.0, ones["b.w"]))
    # The running step: EMA with decay 0.9 of the norm this update moved each sample.
    assert rule._step["a.b"] == pytest.approx(0.9 * 2.0 + 0.1 * 2.0 / 3.0, rel=1e-6)
    assert rule._step["b.w"] == pytest.approx(2.0, rel=1e-6)


def test_vsgd_gap_in_clock_but_not_in_value_is_not_penalized():
    """Layer b never moves (zero gradients): an old clock does not shrink its step."""
    params = _layer_params()
    records = []
    sampler = Sampler(0.01, 32)
    zero_b = {"b.w": np.zeros((2, 2), np.float32)}
    with running_server("vsgd", params=params, lr=0.1, on_update=records.append) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            pulled = {name: array.copy() for name, array in ps.pull().params.items()}
            grads = {name: np.ones(shape, np.float32) for name, shape in LAYERS.items()}
            ps.push(grads, base=0, extra=_samples(sampler, pulled))  # b moves once
            for version in range(1, 4):  # then only a moves
                a_only = {"a.w": grads["a.w"], "a.b": grads["a.b"]}
                current = {name: params[name].copy() for name in a_only}
                ps.push(a_only, base=version, extra=_samples(sampler, current))
            stale = ps.push(zero_b, base=1, extra=_samples(sampler, {"b.w": params["b.w"]}))
    assert stale.staleness == 3
    assert records[-1]["value_staleness"] == {"b": 0.0} and records[-1]["scale"] == 1.0


def test_vsgd_refuses_a_push_without_its_samples():
    params = make_params()
    with running_server("vsgd", params=params) as server, PSClient(server.endpoint) as ps:
        ps.hello()
        before = snapshot(server)
        good = Sampler(0.01, 32).values("fc.w", params["fc.w"])
        bad_extras = [
            {},  # none at all
            {"sample/fc.w": good},  # fc.b's is missing
            {"sample/fc.w": good, "sample/fc.b": np.zeros(3, np.float32)},  # wrong length
            {"sample/fc.w": good.astype(np.int32), "sample/fc.b": np.zeros(4, np.float32)},
        ]
        for extra in bad_extras:
            with pytest.raises(ServerError) as info:
                ps.push(_ones(), base=0, extra=extra)
            assert info.value.code == "rule"
        assert snapshot(server) == before
        assert ps.stats()["updates"] == 0


def test_vsgd_reports_its_extra_traffic_and_describes_its_sample():
    params = {"fc1.w": np.zeros((200, 100), np.float32), "fc1.b": np.zeros(100, np.float32)}
    sampler = Sampler(0.05, 32)
    with running_server("vsgd", params=params, rule_options={"rho": 0.05}) as server:
        with PSClient(server.endpoint) as ps:
            rule = ps.hello()["config"]["rule"]
            assert rule == {"name": "vsgd", "rho": 0.05, "min_samples": 32, "step_decay": 0.9}
            grads = {name: np.ones_like(array) for name, array in params.items()}
            for version in range(3):
                ps.push(grads, base=version, extra=_samples(sampler, params))
            stats = ps.stats()
    per_push = (1000 + 32) * 4  # 5% of 20,000 entries, and the floor of 32 for the bias
    assert stats["extra_bytes_in"] == 3 * per_push
    assert stats["grad_bytes_in"] == 3 * 20_100 * 4
    assert stats["workers"][0]["extra_bytes_in"] == 3 * per_push


@pytest.mark.parametrize(
    "options, message",
    [
        ({"rho": 0}, "rho must be in"),
        ({"rho": 1.5}, "rho must be in"),
        ({"min_samples": 0}, "min_samples must be an integer"),
        ({"step_decay": 1.0}, "step_decay must be in"),
    ],
)
def test_vsgd_bad_options(options, message):
    with pytest.raises(ConfigError, match=message):
        make_rule("vsgd", **options)


def test_layer_is_the_name_up_to_the_last_dot():
    assert [layer_of(n) for n in ("fc1.w", "conv2.b", "block.conv.w", "bias")] == [
        "fc1",
        "conv2",
        "block.conv",
        "bias",
    ]


# ------------------------------------------------------------------------------ DC-ASGD


def test_dcasgd_compensates_with_the_parameters_the_worker_pulled():
    lam, lr = 0.5, 0.25
    params = make_params()
    records = []
    with running_server(
        "dcasgd", params=params, lr=lr, rule_options={"lam": lam}, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as slow, PSClient(server.endpoint) as fast:
            slow.hello()
            fast.hello()
            w_bak = {name: array.copy() for name, array in slow.pull().params.items()}
            fast.pull()
            fast.push({"fc.w": np.full((3, 4), 2.0, np.float32)}, base=0)  # w moves on
            w = {name: array.copy() for name, array in params.items()}
            g = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4  # (3, 4)
            reply = slow.push({"fc.w": g}, base=0)
    assert reply.staleness == 1
    compensated = g + np.float32(lam) * g * g * (w["fc.w"] - w_bak["fc.w"])
    np.testing.assert_array_equal(params["fc.w"], _step(w["fc.w"], lr, compensated))
    assert not np.array_equal(compensated, g)  # the correction did something
    assert records[-1]["scale"] == 1.0


def test_dcasgd_without_a_matching_pull_is_plain_asgd():
    params = make_params()
    with running_server("dcasgd", params=params, lr=1.0, rule_options={"lam": 1.0}) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            b.push(_ones(), base=0)
            before = params["fc.b"].copy()
            a.push({"fc.b": np.ones(4, np.float32)}, base=0)  # a never pulled
            np.testing.assert_array_equal(params["fc.b"], _step(before, 1.0, np.ones(4)))
            a.pull()  # backup at version 2
            before = params["fc.b"].copy()
            a.push({"fc.b": np.ones(4, np.float32)}, base=1)  # base is not the backup's
            np.testing.assert_array_equal(params["fc.b"], _step(before, 1.0, np.ones(4)))


def test_dcasgd_keeps_one_copy_per_worker_and_forgets_a_departed_one():
    rule = DCASGD(lam=0.1)
    with running_server(rule) as server:
        with PSClient(server.endpoint) as a, PSClient(server.endpoint) as b:
            a.hello()
            b.hello()
            a.pull()
            b.pull()
            _wait_until(lambda: len(rule._bak) == 2)  # on_pulled runs after the reply left
            a.bye()
            assert len(rule._bak) == 1
    with pytest.raises(ConfigError, match="lam must be a number >= 0"):
        make_rule("dcasgd", lam=-1)


def test_dcasgd_compensates_with_the_latest_pull_not_the_first():
    lam, lr = 0.5, 0.25
    params = make_params()
    with running_server("dcasgd", params=params, lr=lr, rule_options={"lam": lam}) as server:
        with PSClient(server.endpoint) as slow, PSClient(server.endpoint) as fast:
            slow.hello()
            fast.hello()
            first = copied(slow.pull().params)  # version 0
            fast.push(full("fc.w", 2.0), base=0)  # version 1
            second = slow.pull()  # the backup is now these parameters
            at_second = copied(second.params)
            fast.push(full("fc.w", -1.5), base=1)  # version 2: w moves on
            w = copied(params)
            g = np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4  # (3, 4)
            reply = slow.push({"fc.w": g}, base=second.version)
    assert second.version == 1 and reply.applied and reply.staleness == 1
    lam32, lr32 = np.float32(lam), np.float32(lr)
    latest = g + lam32 * g * g * (w["fc.w"] - at_second["fc.w"])
    np.testing.assert_array_equal(params["fc.w"], w["fc.w"] - lr32 * latest)
    with_first = g + lam32 * g * g * (w["fc.w"] - first["fc.w"])
    assert not np.array_equal(latest, with_first)  # the two backups tell apart
