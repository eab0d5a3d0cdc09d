"""A LeNet-5 server group for the benchmarks: K shard processes, each a ParameterServer over
its slices (asgd, plain SGD), no fixed world size (clients come and go between
measurements), shards 1..K-1 joined to the root before `start_group` returns.

    procs, root = start_group(2, "tcp://127.0.0.1:*")    # one process per shard
    ... PSClient(root, groups=GROUPS) ...                # the group, behind one address
    stop_group(procs, root)
"""

from __future__ import annotations

import multiprocessing as mp
import re
import time

import numpy as np

LENET5_SPEC = {"name": "lenet5", "kwargs": {}, "seed": 0}


def serve_shard(queue, bind: str, servers: int, shard: int, root: str | None,
                lr: float, momentum: float) -> None:  # fmt: skip
    """One shard's process: the seeded LeNet-5's slices, asgd; its endpoint on `queue`."""
    from minips.group.partition import partition_of_model
    from minips.group.shard import Joiner, ShardRole, shard_params
    from minips.nn import lenet5
    from minips.ops.server_ops import ServerOps
    from minips.ops.signals import serve_forever
    from minips.rules import make_rule
    from minips.server.server import ParameterServer, ServerOptions
    from minips.state.store import SGD

    model = lenet5(seed=0)
    part = partition_of_model(model.params, servers)
    params = shard_params(model.params, part, shard)
    joiner = None
    if shard:
        joiner = Joiner(root, shard, servers)
        joiner.ask()
    group = ShardRole(shard, servers, part, run={}, joiner=joiner)
    server = ParameterServer(params, make_rule("asgd"), SGD(params, lr=lr, momentum=momentum),
                             ServerOptions(bind=bind), config={"model": LENET5_SPEC},
                             group=group, operations=ServerOps)  # fmt: skip
    queue.put(server.endpoint)
    serve_forever(server)


def shard_bind(bind: str, shard: int) -> str:
    """Shard `shard`'s bind address: tcp binds take any port; ipc paths get -shardJ."""
    if bind.startswith("ipc://"):
        return re.sub(r"(\.sock)?$", f"-shard{shard}.sock", bind, count=1)
    return bind


def start_group(servers: int, bind: str, lr: float = 1e-6, momentum: float = 0.0):
    """Start the K shard processes; return (processes, the root's endpoint) once every
    shard has joined."""
    from minips.group.root import GROUPS
    from minips.worker.client import PSClient

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=serve_shard, args=(queue, bind, servers, 0, None, lr, momentum),
                         daemon=True)]  # fmt: skip
    procs[0].start()
    root = queue.get(timeout=60)
    for shard in range(1, servers):
        args = (queue, shard_bind(bind, shard), servers, shard, root, lr, momentum)
        procs.append(ctx.Process(target=serve_shard, args=args, daemon=True))
        procs[-1].start()
        queue.get(timeout=60)
    with PSClient(root, groups=GROUPS, timeout=10) as operator:
        deadline = time.monotonic() + 60
        while not all(operator.stats().get("group", {}).get("addresses", [root])):
            if time.monotonic() > deadline:
                raise RuntimeError("the benchmark's group did not assemble")
            time.sleep(0.05)
    return procs, root


def stop_group(procs, root: str) -> None:
    """`stop` to every shard (the operator's fan-out), then wait for the processes."""
    from minips.group.root import GROUPS
    from minips.worker.client import PSClient

    with PSClient(root, groups=GROUPS, timeout=10) as operator:
        operator.stats()
        operator.stop()
    for proc in procs:
        proc.join(timeout=30)


def lenet5_gradients(seed: int) -> dict[str, np.ndarray]:
    from minips.nn import lenet5

    rng = np.random.default_rng(seed)
    return {n: (1e-6 * rng.standard_normal(a.shape)).astype(np.float32)
            for n, a in lenet5(seed=0).params.items()}  # fmt: skip
