"""Every branch of every rule's formula, over real sockets, against hand computations.

The convergence tests cannot notice wrong rule arithmetic; these can. Each test pushes
chosen gradients at chosen bases and compares the parameters with the same float32
operations done by hand (lr * scale is a Python float cast once to float32, as the
server's SGD does; momentum 0 unless the test is about momentum). Branches already pinned
exactly elsewhere are not repeated: DASGD at tau 4 and the cutoff drop (dropped record, t
unchanged, applied false), DC-ASGD with a matching base and without one (test_rules.py);
the partial-push cases of SSGD are in test_server_rules.py.
"""

import math

import numpy as np
import pytest
from test_server_support import RawPeer, make_params, running_server, send_then_fence

from minips.protocol.sampling import Sampler
from minips.worker.client import PSClient


def _step(param, lr_times_scale, grad):
    """One plain SGD step exactly as the server does it, in float32."""
    return param - np.asarray(lr_times_scale, np.float32) * grad


def _copy(arrays):
    return {name: np.array(array) for name, array in arrays.items()}


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _dyadic(shape, seed):
    """Quarters in [-2, 2): sums and halves of these are exact in float32, in any order."""
    return (np.random.default_rng(seed).integers(-8, 8, shape) / 4).astype(np.float32)


def _advance(ps, n, base=0):
    """n updates of fc.b by zero gradients (fc.w untouched); returns the version after."""
    version = base
    for _ in range(n):
        version = ps.push({"fc.b": np.zeros(4, np.float32)}, base=version).version
    return version


# ------------------------------------------------------------------------ asgd and ssp


@pytest.mark.parametrize("rule, options", [("asgd", {}), ("ssp", {"staleness": 10})])
def test_asgd_and_ssp_apply_a_stale_push_with_the_full_step(rule, options):
    lr = 0.3
    params = make_params()
    records = []
    with running_server(
        rule, params=params, lr=lr, rule_options=options, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            _advance(ps, 3)
            before = _copy(params)
            g = _random((3, 4), seed=1)
            reply = ps.push({"fc.w": g}, base=0)
    assert reply.applied and reply.staleness == 3 and reply.version == 4
    np.testing.assert_array_equal(params["fc.w"], _step(before["fc.w"], lr, g))
    np.testing.assert_array_equal(params["fc.b"], before["fc.b"])
    assert records[-1]["scale"] == 1.0 and records[-1]["staleness"] == [3]


# -------------------------------------------------------------------------------- ssgd


def test_ssgd_mean_is_per_parameter_over_the_workers_that_sent_it():
    """a sends fc.w in two pushes of one step (summed: one worker) and fc.b; b sends fc.w
    only; c sends fc.b only. fc.w is averaged over {a, b}, fc.b over {a, c}: halves."""
    lr = 0.5
    params = make_params()
    before = _copy(params)
    records = []
    w = [_dyadic((3, 4), seed) for seed in (1, 2, 3)]
    b = [_dyadic(4, seed) for seed in (4, 5)]
    with running_server("ssgd", params=params, lr=lr, on_update=records.append) as server:
        with RawPeer(server.endpoint) as pa, RawPeer(server.endpoint) as pb:
            with PSClient(server.endpoint, worker_id="c") as c:
                for peer, worker in ((pa, "a"), (pb, "b")):
                    assert peer.request({"op": "hello", "worker": worker}).op == "hello"
                c.hello()
                head = {"op": "push", "worker": "a", "base": 0}
                partial = pa.request({**head, "seq": 0, "last": False, "rid": 1}, {"fc.w": w[0]})
                assert partial.header["applied"] is False and partial.header["version"] == 0
                last_a = {**head, "seq": 1, "last": True, "rid": 2}
                assert send_then_fence(pa, last_a, {"fc.w": w[1], "fc.b": b[0]}) is None
                last_b = {"op": "push", "worker": "b", "base": 0, "seq": 0, "rid": 3}
                assert send_then_fence(pb, last_b, {"fc.w": w[2]}) is None
                reply_c = c.push({"fc.b": b[1]}, base=0)  # the last of the round
                replies = [pa.recv(), pb.recv()]
    assert reply_c.applied and reply_c.version == 1
    assert all(r.header["applied"] and r.header["version"] == 1 for r in replies)
    mean_w = (w[0] + w[1] + w[2]) / np.float32(2)
    mean_b = (b[0] + b[1]) / np.float32(2)
    np.testing.assert_array_equal(params["fc.w"], _step(before["fc.w"], lr, mean_w))
    np.testing.assert_array_equal(params["fc.b"], _step(before["fc.b"], lr, mean_b))
    (record,) = records  # one update for the whole round
    assert sorted(record["workers"]) == [0, 1, 2] and record["scale"] == 1.0


# ------------------------------------------------------------------------------- dasgd


@pytest.mark.parametrize(
    "options, tau, factor",
    [
        ({}, 0, 1.0),  # inverse: 1 / max(1, tau)
        ({}, 1, 1.0),
        ({}, 3, 1 / 3),
        ({"schedule": "exp", "beta": 0.5}, 2, math.exp(-1.0)),  # exp(-beta tau)
        ({"schedule": "exp"}, 5, math.exp(-0.2 * 5)),  # default beta 0.2
        ({"schedule": "poly", "power": 2.0}, 3, 1 / 16),  # (1 + tau) ** -power
        ({"schedule": "poly"}, 3, 0.5),  # default power 0.5
        ({"schedule": "cutoff", "tau_max": 2}, 2, 1.0),  # at tau_max: a full step
        ({"schedule": "cutoff", "tau_max": 0}, 0, 1.0),
        ({"schedule": "cutoff"}, 8, 1.0),  # default tau_max 8
    ],
)
def test_dasgd_scales_the_step_by_its_schedule(options, tau, factor):
    lr = 0.5
    params = make_params()
    records = []
    with running_server(
        "dasgd", params=params, lr=lr, rule_options=options, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            _advance(ps, tau)
            before = _copy(params)
            g = _random((3, 4), seed=tau)
            reply = ps.push({"fc.w": g}, base=0)
    assert reply.applied and reply.staleness == tau and reply.version == tau + 1
    np.testing.assert_array_equal(params["fc.w"], _step(before["fc.w"], lr * factor, g))
    assert records[-1]["scale"] == pytest.approx(factor, rel=1e-12)
    assert records[-1]["dropped"] is False


def test_momentum_enters_after_the_rule_scale():
    """v <- m v + f(tau) g;  w <- w - lr v: the scale shrinks the gradient, not the step."""
    lr, momentum = 0.5, 0.9
    params = make_params()
    w0 = params["fc.w"].copy()
    g1, g2 = _random((3, 4), seed=1), _random((3, 4), seed=2)
    with running_server("dasgd", params=params, lr=lr, momentum=momentum) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            ps.push({"fc.w": g1}, base=0)  # tau 0: scale 1
            _advance(ps, 1, base=1)  # fc.b only: fc.w's velocity untouched
            reply = ps.push({"fc.w": g2}, base=0)  # tau 2: scale 1/2
    assert reply.staleness == 2
    lr32 = np.float32(lr)
    velocity = g1.copy()
    w1 = w0 - lr32 * velocity
    velocity = np.float32(momentum) * velocity + np.float32(0.5) * g2
    np.testing.assert_array_equal(params["fc.w"], w1 - lr32 * velocity)


# -------------------------------------------------------------------------------- vsgd

# Layers a (a.w, a.b) and b (b.w); rho 0.1 samples a subset of each (20, 4 and 10 entries),
# so a gap computed on whole arrays instead of the samples would differ.
VSGD_SHAPES = {"a.w": (8, 25), "a.b": (25,), "b.w": (10, 10)}
RHO, MIN_SAMPLES, DECAY = 0.1, 4, 0.75


def _vsgd_params():
    rng = np.random.default_rng(7)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in VSGD_SHAPES.items()}


def _hand_d(sampler, params, claimed, step):
    """d_l = sqrt(sum_p ||w[S_p] - claimed_p||^2) / sqrt(sum_p step_p^2), 0 if no step."""
    gap2, step2 = {}, {}
    for name in VSGD_SHAPES:
        layer = name.split(".")[0]
        diff = sampler.values(name, params[name]).astype(np.float64) - claimed[name]
        gap2[layer] = gap2.get(layer, 0.0) + float(diff @ diff)
        step2[layer] = step2.get(layer, 0.0) + step.get(name, 0.0) ** 2
    return {l: math.sqrt(gap2[l] / step2[l]) if step2[l] > 0 else 0.0 for l in gap2}


def _moves(sampler, before, after):
    """How far an update moved each parameter's sample: ||w'[S_p] - w[S_p]||."""
    return {
        n: float(np.linalg.norm(sampler.values(n, after[n]) - sampler.values(n, before[n])))
        for n in VSGD_SHAPES
    }


def test_vsgd_value_staleness_per_layer_matches_a_hand_computation():
    lr = 0.5
    params = _vsgd_params()
    sampler = Sampler(RHO, MIN_SAMPLES)
    assert [len(sampler.indices(n, params[n].size)) for n in VSGD_SHAPES] == [20, 4, 10]
    options = {"rho": RHO, "min_samples": MIN_SAMPLES, "step_decay": DECAY}
    records = []
    grads = [{n: _random(s, seed=10 * k + i) for i, (n, s) in enumerate(VSGD_SHAPES.items())}
             for k in range(3)]  # fmt: skip
    # How far the worker's claimed sample is from the server's, per layer and push.
    offsets = [{"a": 0.3, "b": 0.2}, {"a": 2.0, "b": 0.001}, {"a": 0.05, "b": 0.5}]
    step, expected_d, scales = {}, [], []
    with running_server(
        "vsgd", params=params, lr=lr, rule_options=options, on_update=records.append
    ) as server:
        with PSClient(server.endpoint) as ps:
            ps.hello()
            for k in range(3):
                before = _copy(params)
                claimed = {
                    n: sampler.values(n, before[n]) + np.float32(offsets[k][n.split(".")[0]])
                    for n in VSGD_SHAPES
                }
                d = _hand_d(sampler, before, claimed, step)
                extra = {f"sample/{n}": v for n, v in claimed.items()}
                assert ps.push(grads[k], base=k, extra=extra).applied
                record = records[k]
                assert record["value_staleness"] == pytest.approx(d, rel=1e-6), k
                scale = record["scale"]
                scale = scale if isinstance(scale, dict) else dict.fromkeys(VSGD_SHAPES, scale)
                for n in VSGD_SHAPES:  # 1 / max(1, d_l) for every parameter of layer l
                    want = 1.0 / max(1.0, d[n.split(".")[0]])
                    assert scale[n] == pytest.approx(want, rel=1e-6), (k, n)
                    np.testing.assert_array_equal(
                        params[n], _step(before[n], lr * scale[n], grads[k][n])
                    )
                moves = _moves(sampler, before, params)
                step = {  # the first move initialises the EMA, later ones are averaged in
                    n: moves[n] if n not in step else DECAY * step[n] + (1 - DECAY) * moves[n]
                    for n in VSGD_SHAPES
                }
                expected_d.append(d)
                scales.append(scale)
    # The branches taken: nothing moved yet (d 0 despite a gap); d > 1 (shrunk);
    # 0 < d < 1 (not enlarged: scale 1).
    assert expected_d[0] == {"a": 0.0, "b": 0.0} and scales[0]["a.w"] == 1.0
    assert expected_d[1]["a"] > 1 and scales[1]["a.w"] < 1 and scales[1]["a.b"] < 1
    assert 0 < expected_d[1]["b"] < 1 and scales[1]["b.w"] == 1.0
    assert all(d > 0 for d in expected_d[2].values())


# ------------------------------------------------------------------------------ dcasgd


def _dcasgd(g, w, w_bak, lam):
    return g + np.float32(lam) * g * g * (w - w_bak)


def test_dcasgd_keeps_one_backup_per_worker():
    lam, lr = 0.5, 0.25
    params = make_params()
    with running_server("dcasgd", params=params, lr=lr, rule_options={"lam": lam}) as server:
        endpoint = server.endpoint
        with PSClient(endpoint) as a, PSClient(endpoint) as b, PSClient(endpoint) as mover:
            for ps in (a, b, mover):
                ps.hello()
            bak_a = _copy(a.pull().params)  # version 0
            mover.push({"fc.w": _random((3, 4), seed=1)}, base=0)
            bak_b = _copy(b.pull().params)  # version 1
            mover.push({"fc.w": _random((3, 4), seed=2)}, base=1)
            g_a, g_b = _random((3, 4), seed=3), _random((3, 4), seed=4)
            w = _copy(params)
            assert a.push({"fc.w": g_a}, base=0).staleness == 2
            expected = _step(w["fc.w"], lr, _dcasgd(g_a, w["fc.w"], bak_a["fc.w"], lam))
            np.testing.assert_array_equal(params["fc.w"], expected)
            w = _copy(params)
            assert b.push({"fc.w": g_b}, base=1).staleness == 2
    expected = _step(w["fc.w"], lr, _dcasgd(g_b, w["fc.w"], bak_b["fc.w"], lam))
    np.testing.assert_array_equal(params["fc.w"], expected)


def test_dcasgd_forgets_the_backup_of_a_worker_that_left():
    lr = 0.25
    params = make_params()
    with running_server("dcasgd", params=params, lr=lr, rule_options={"lam": 1.0}) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello()
            mover.hello()
            worker.pull()  # backup at version 0
            worker.bye()
            worker.hello()  # back, without pulling again: no reference point
            mover.push({"fc.w": _random((3, 4), seed=1)}, base=0)
            w = params["fc.w"].copy()
            g = _random((3, 4), seed=2)
            worker.push({"fc.w": g}, base=0)
    np.testing.assert_array_equal(params["fc.w"], _step(w, lr, g))  # plain ASGD


def test_dcasgd_with_lambda_0_is_plain_asgd():
    lr = 0.25
    params = make_params()
    with running_server("dcasgd", params=params, lr=lr, rule_options={"lam": 0.0}) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello()
            mover.hello()
            worker.pull()  # a matching backup: only lambda = 0 keeps it out
            mover.push({"fc.w": _random((3, 4), seed=1)}, base=0)
            w = params["fc.w"].copy()
            g = _random((3, 4), seed=2)
            reply = worker.push({"fc.w": g}, base=0)
            assert reply.staleness == 1
            rule = worker.config["rule"]
    assert rule == {"name": "dcasgd", "lam": 0.0}
    np.testing.assert_array_equal(params["fc.w"], _step(w, lr, g))


# -------------------------------------------------------------------- dana, dana-gap


@pytest.mark.parametrize("rule", ["dana", "dana-gap"])
def test_dana_applies_every_part_of_a_step_sent_in_several_pushes(rule):
    """Wait-free sending: fc.w in a `last: false` push, fc.b in the step's last one. The
    step is one update of both (a worker's first: v_i = g, w <- w - lr v_i); the rule's
    check of the last push alone must not stand for the whole step."""
    lr = 0.5
    params = make_params()
    before = _copy(params)
    w, b = _dyadic((3, 4), 1), _dyadic(4, 2)
    with running_server(rule, params=params, lr=lr) as server:
        with RawPeer(server.endpoint) as peer:
            assert peer.request({"op": "hello", "worker": "a"}).op == "hello"
            head = {"op": "push", "worker": "a", "base": 0}
            part = peer.request({**head, "seq": 0, "last": False, "rid": 1}, {"fc.w": w})
            assert part.header["applied"] is False
            last = peer.request({**head, "seq": 1, "last": True, "rid": 2}, {"fc.b": b})
            assert last.header["applied"] is True and last.header["version"] == 1
    np.testing.assert_array_equal(params["fc.w"], _step(before["fc.w"], lr, w))
    np.testing.assert_array_equal(params["fc.b"], _step(before["fc.b"], lr, b))
