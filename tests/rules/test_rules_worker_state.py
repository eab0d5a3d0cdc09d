"""What the per-worker rules (minips.rules.gap, minips.rules.dana) keep about each
worker, and when they let it go: the reference a push is penalized against, a worker
that left and came back, a resumed worker that never came back.
"""

from types import SimpleNamespace

import numpy as np
from test_server_support import make_params, running_server

from minips.ops.rule_state import load_rule_state, rule_state
from minips.rules import make_rule
from minips.worker.client import PSClient

F32 = np.float32


def _grads(seed, names=("fc.w", "fc.b")):
    rng = np.random.default_rng(seed)
    shapes = {"fc.w": (3, 4), "fc.b": (4,)}
    return {name: rng.standard_normal(shapes[name]).astype(np.float32) for name in names}


def _copy(arrays):
    return {name: np.array(array) for name, array in arrays.items()}


def _sgd(params, grads, lr):
    return {name: params[name] - F32(lr) * grads[name] for name in grads}


def test_gap_a_push_older_than_the_workers_last_pull_has_no_reference_point():
    """The worker pulled at 1, then again at 2, and pushes a gradient computed at 1: the
    values it computed at are no longer held, so the push is plain ASGD (the values of 2
    are not its reference: they moved since, and would give it a gap)."""
    lr = 0.25
    params = make_params()
    with running_server("gap", params=params, lr=lr) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello(), mover.hello()
            mover.push(_grads(1), base=0)  # the step size exists from here on
            assert worker.pull().version == 1
            mover.push(_grads(2), base=1)
            assert worker.pull(since=1).version == 2
            mover.push(_grads(3), base=2)  # w moves on past what the worker holds
            before, g = _copy(params), _grads(4)
            assert worker.push(g, base=1).staleness == 2
    for name in g:
        np.testing.assert_array_equal(params[name], _sgd(before, g, lr)[name])


def test_gap_a_worker_back_after_a_bye_is_penalized_on_every_parameter():
    """A worker that left and came back holds nothing: its next pull is its whole
    reference, including a parameter that did not change while it was away. decay 0: C is
    the last move, so where fc.b moved since that pull the gap is 1 step (G = 2)."""
    lr = 0.5
    params = make_params()
    with running_server("gap", params=params, lr=lr, rule_options={"decay": 0.0}) as server:
        with PSClient(server.endpoint) as worker, PSClient(server.endpoint) as mover:
            worker.hello(), mover.hello()
            mover.push(_grads(1), base=0)  # both parameters have a step size
            worker.pull()  # version 1: the worker holds fc.w and fc.b of 1
            worker.bye()
            worker.hello()
            mover.push(_grads(2, names=("fc.w",)), base=1)  # fc.b stays at its version 1
            assert worker.pull().version == 2
            held = params["fc.b"].copy()
            mover.push(_grads(3), base=2)  # fc.b moves: one step from the worker's values
            before, g = _copy(params), _grads(4)
            assert worker.push(g, base=2).staleness == 1
    assert (before["fc.b"] != held).all()  # every coordinate of fc.b moved: G = 2 there
    expected = _sgd(before, {"fc.b": g["fc.b"] / F32(2)}, lr)["fc.b"]
    np.testing.assert_allclose(params["fc.b"], expected, rtol=1e-6)
    assert not np.allclose(params["fc.b"], _sgd(before, g, lr)["fc.b"])  # not unpenalized


class _Registry:
    """What a rule's resumed state looks at: the grace and who said hello again."""

    def __init__(self, grace):
        self.grace, self.by_id = grace, {}


def test_dana_forgets_the_momentum_of_a_resumed_worker_that_never_came_back():
    """Resumed with v_w0 and v_w1, only w1 comes back: after the grace w0's momentum leaves
    the look-ahead, w_hat = w - lr gamma v_w1, as if w0 had said bye."""
    lr, gamma = 0.5, 0.5
    params = make_params()
    store = SimpleNamespace(params=params, optimizer=SimpleNamespace(lr=lr, momentum=0.0))
    registry = _Registry(grace=1.0)
    rule = make_rule("dana", momentum=gamma)
    rule.attach(store, registry)
    v0, v1 = _grads(1), _grads(2)
    total = {name: v0[name] + v1[name] for name in v0}
    state = {"workers": np.array(["w0", "w1"])}
    for i, v in enumerate((v0, v1)):
        state.update({f"velocity/{i}/{name}": v[name] for name in v})
    state.update({f"velocity_sum/{name}": total[name] for name in total})
    load_rule_state(rule, state)
    registry.by_id["w1"] = object()  # w1 said hello again; w0 did not
    rule.on_tick(100.0)  # the first look: the grace starts
    ahead = rule.pull_values(None, ["fc.w"])["fc.w"]
    np.testing.assert_allclose(ahead, params["fc.w"] - F32(lr * gamma) * total["fc.w"])
    rule.on_tick(100.5)  # within the grace: still waiting for w0
    assert list(rule_state(rule)["workers"]) == ["w0", "w1"]
    rule.on_tick(101.0)
    for name in params:
        expected = params[name] - F32(lr * gamma) * v1[name]
        np.testing.assert_allclose(rule.pull_values(None, [name])[name], expected, rtol=1e-6)
    assert list(rule_state(rule)["workers"]) == ["w1"]
