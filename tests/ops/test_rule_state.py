"""A rule's own state survives a checkpoint and a resume (minips/ops/rule_state.py).

DANA keeps a momentum vector per worker, DC-ASGD a copy of what each worker last pulled,
Gap-Aware (and DANA-Gap) that copy and a running step size, VSGD a running step size. A
server resumed from a checkpoint must go on exactly as the one that wrote it: the same
next push from the same worker gives bit-for-bit the same parameters on both.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_server_support import SHAPES, make_params, running_server, snapshot

from minips.errors import DataError
from minips.ops.rule_state import StateReader, rule_state
from minips.protocol.sampling import Sampler
from minips.worker.client import PSClient

RULES = {  # rule -> (its options, the server's momentum)
    "dana": ({}, 0.0),
    "dana-gap": ({}, 0.0),
    "dcasgd": ({"lam": 2.0}, 0.0),
    "gap": ({}, 0.5),
    "vsgd": ({"rho": 0.5, "min_samples": 2}, 0.0),
}


def _grads(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def _push(client: PSClient, rule: str, step: int, base: int, at: dict) -> int:
    """One push of step `step`'s gradients computed at `at` (VSGD's samples from it)."""
    grads = _grads(step)
    if rule == "vsgd":
        sampler = Sampler(0.5, 2)
        for name in SHAPES:
            grads[f"extra/sample/{name}"] = sampler.values(name, at[name])
    return client.push(grads, base=base).version


def _same_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_resumed_server_goes_on_with_the_rules_own_state(tmp_path, rule):
    options, momentum = RULES[rule]
    path = tmp_path / "checkpoint.npz"
    settings = {"rule": rule, "rule_options": options, "momentum": momentum}
    with running_server(params=make_params(), checkpoint_path=path, **settings) as first:
        w0, w1 = PSClient(first.endpoint, worker_id="w0"), PSClient(first.endpoint, worker_id="w1")
        for client in (w0, w1):
            client.hello()
        for step in range(4):  # each pulls, the other pushes: every push is stale
            reply = w0.pull()
            _push(w1, rule, step, base=w1.pull().version, at=reply.params)
        held = w0.pull()  # w0's last pull: the version its next push is based on
        _push(w1, rule, 9, base=held.version, at=held.params)
        kept = tmp_path / "kept.npz"  # the server checkpoints again when it stops
        kept.write_bytes(Path(w0.checkpoint()).read_bytes())
        saved = {key: array.copy() for key, array in rule_state(first.rule).items()}  # live arrays
        assert saved, "the rule has state to save"
        # After the checkpoint the first server takes one more push from w0...
        _push(w0, rule, 10, base=held.version, at=held.params)
        expected = snapshot(first)
        for client in (w0, w1):
            client.close()
    # ... and a server resumed from the checkpoint, given the same push, ends the same.
    fresh = make_params(seed=5)
    with running_server(params=fresh, resume=kept, **settings) as resumed:
        _same_state(rule_state(resumed.rule), saved)
        with PSClient(resumed.endpoint, worker_id="w0") as again:
            again.hello()
            _push(again, rule, 10, base=held.version, at=held.params)
        assert snapshot(resumed) == expected


@pytest.mark.parametrize("rule", ["dana", "dcasgd"])
def test_a_resumed_workers_state_is_forgotten_when_it_does_not_come_back(tmp_path, rule):
    options, momentum = RULES[rule]
    path = tmp_path / "checkpoint.npz"
    settings = {"rule": rule, "rule_options": options, "momentum": momentum}
    with running_server(params=make_params(), checkpoint_path=path, **settings) as first:
        with (
            PSClient(first.endpoint, worker_id="w0") as w0,
            PSClient(first.endpoint, worker_id="w1") as w1,
        ):
            for client in (w0, w1):
                client.hello()
                _push(client, rule, 0, base=client.pull().version, at={})
                client.pull()
            w0.checkpoint()
    settings["heartbeat_timeout"] = 0.5
    with running_server(params=make_params(), resume=path, **settings) as resumed:
        assert list(rule_state(resumed.rule)["workers"]) == ["w0", "w1"]
        with PSClient(resumed.endpoint, worker_id="w1") as back:
            back.hello()  # w1 comes back; w0 does not
            deadline = time.monotonic() + 10
            while "w0" in rule_state(resumed.rule)["workers"]:
                assert time.monotonic() < deadline, "w0's state was never forgotten"
                back.ping()
                time.sleep(0.05)
            assert list(rule_state(resumed.rule)["workers"]) == ["w1"]


def test_a_rule_state_naming_a_worker_index_past_the_list_is_a_data_error():
    """rule/velocity/i names worker i of rule/workers: i = len(workers) is one past the
    end (a damaged checkpoint), a one-line DataError naming the key; i = len - 1 reads."""
    params = make_params()
    w = np.zeros(SHAPES["fc.w"], np.float32)
    workers = np.array(["w0", "w1"])
    found = StateReader({"workers": workers, "velocity/1/fc.w": w}, params)
    assert list(found.worker_arrays("velocity")) == ["w1"]
    for index in ("2", "3"):
        reader = StateReader({"workers": workers, f"velocity/{index}/fc.w": w}, params)
        with pytest.raises(DataError, match=f"rule/velocity/{index} names no worker"):
            reader.worker_arrays("velocity")
    counts = StateReader({"workers": workers, "pulled_version/2": np.asarray(3)}, params)
    with pytest.raises(DataError, match="rule/pulled_version/2 names no worker"):
        counts.worker_numbers("pulled_version")
