"""What a user imports is whole: `from minips import ParameterServer, PSClient` builds a
server with its usual operations and a client that reaches a server group, while the
core's own classes (minips/server/server.py, minips/worker/client.py) are given both."""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest
from group_support import running_group
from test_server_support import make_params

import minips
from minips.errors import ConfigError
from minips.ops.ops_options import OpsOptions
from minips.ops.server_ops import ServerOps
from minips.rules import make_rule
from minips.server.options import ServerOptions
from minips.server.server import ParameterServer as CoreServer
from minips.state.store import SGD
from minips.worker.client import PSClient as CoreClient
from minips.worker.worker import Worker as CoreWorker


def test_the_public_server_is_the_core_one_with_the_usual_operations_and_serves():
    params = make_params()
    server = minips.ParameterServer(params, make_rule("asgd"), SGD(params, lr=0.1),
                                    ServerOptions(bind="tcp://127.0.0.1:*"))  # fmt: skip
    assert isinstance(server, CoreServer) and isinstance(server.ops, ServerOps)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        with minips.PSClient(server.endpoint, timeout=5.0) as ps:
            ps.hello()
            before = {name: array.copy() for name, array in ps.pull().params.items()}
            ps.push({name: np.ones_like(array) for name, array in before.items()}, base=0)
            after = ps.pull().params
        assert all(np.allclose(after[name], before[name] - 0.1) for name in before)
    finally:
        server.request_stop()
        thread.join(10)
        server.close()


def test_the_public_client_reaches_a_group_where_the_core_one_is_given_none():
    with running_group(2, workers=1) as group:
        with minips.PSClient(group.root.endpoint) as ps:
            stats = ps.stats()
        assert isinstance(ps, CoreClient) and len(stats["shards"]) == 2
        assert all(shard is not None for shard in stats["shards"])


def _worker_holding(model):
    worker = minips.Worker(CoreClient("tcp://127.0.0.1:1"), "unused")
    worker.model = model
    return worker


def test_the_public_worker_refuses_a_plan_its_server_sends_that_does_not_fit_in_one_line():
    model = minips.lenet5()
    worker = _worker_holding(model)
    bad = [
        ({"params": {"fc9.w": {"push": "fp16"}}}, "which this model does not have"),
        ({"params": {"conv1.w": {"push": "sf"}}}, "codec sf needs an fc layer's weight"),
        ({"params": {"fc1.w": {"push": "nope"}}}, "nope"),
        ({"format": 99, "params": {}}, "plan"),
        ([1, 2], "not a map"),
    ]
    for plan, reason in bad:
        with pytest.raises(ConfigError) as info:
            worker.take_plan({"plan": plan})
        assert reason in str(info.value) and "\n" not in str(info.value)
    assert worker.take_plan({}).params == {}
    sent = {"params": {"fc1.w": {"push": "fp16", "every": 2}}}
    assert worker.take_plan({"plan": sent}).param("fc1.w").every == 2


def test_minips_worker_is_the_public_worker_that_checks_its_plan():
    from minips.cli import client_cmd

    source = inspect.getsource(client_cmd)
    assert "from minips.run.assembly import Worker" in source
    assert "minips.worker.worker import Worker" not in source
    core = CoreWorker.take_plan(_worker_holding(minips.lenet5()), {"plan": {"params": {}}})
    assert core.params == {}


def test_the_public_server_options_are_the_core_ones_with_the_operations_settings():
    """`minips.ServerOptions` takes the operations' settings (checkpoints, the sample
    budget, clipping) as it always did; the core's are read by the usual operations as
    those at their defaults."""
    assert minips.ServerOptions is OpsOptions and issubclass(OpsOptions, ServerOptions)
    options = minips.ServerOptions(checkpoint_every=3, max_samples=4, clip_norm=1.0)
    assert (options.checkpoint_every, options.max_samples, options.clip_norm) == (3, 4, 1.0)
    plain = ServerOptions(bind="ipc:///nowhere", stop_grace=0.5)
    read = OpsOptions.of(plain)
    assert (read.bind, read.stop_grace, read.checkpoint_every, read.max_samples) == (
        "ipc:///nowhere", 0.5, 0, 0)  # fmt: skip
    assert OpsOptions.of(options) is options
