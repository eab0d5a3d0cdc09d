"""Your own worker loop on `minips.PSClient`: hello, then pull / compute / push, bye.

minips/worker/worker.py is the worker `minips worker` runs; this is the same loop with nothing but
the essentials, to change at will (another batch schedule, gradient clipping, sending only
some layers, ...). By default the script starts a `minips server` subprocess on a free
loopback port and stops it at the end; `--connect ADDR` uses a server you started yourself:

    minips server --model mlp --workers 1 --bind tcp://127.0.0.1:5555
    python examples/02_custom_worker.py --connect tcp://127.0.0.1:5555

    python examples/02_custom_worker.py          (--fast: 20 steps only, for the tests)
"""

import argparse
import socket
import subprocess
import sys

import numpy as np

from minips import PSClient
from minips.data import load_dataset
from minips.nn import build_model, softmax_cross_entropy
from minips.provision.locations import find_data
from minips.worker.client import ServerUnavailable


def train(ps: PSClient, max_steps: int) -> None:
    """The worker loop: everything (model, data, batch size, rank) comes from `hello`."""
    hello = ps.hello({"role": "worker", "note": "examples/02_custom_worker.py"})
    config, rank = hello["config"], hello["rank"]
    spec = config["model"]  # {"name": "mlp", "kwargs": {...}, "seed": 0}
    model = build_model(spec["name"], seed=spec["seed"], **spec["kwargs"])
    data = load_dataset(config["dataset"], find=find_data)  # where `minips worker` finds it
    data = data.shard(rank, hello["world_size"])  # my disjoint part
    batch_size = config["batch_size"]
    print(f"rank {rank} of {hello['world_size']}, model {spec['name']}, rule {config['rule']}")
    version = None  # the version of the parameters this worker holds (None: none yet)
    rng = np.random.default_rng(rank)
    for step in range(max_steps):
        reply = ps.pull(since=version)  # only the parameters changed since `version`
        model.set_params(reply.params)
        version = reply.version
        if reply.stop:
            break
        batch = rng.choice(len(data.y_train), batch_size, replace=False)
        loss, dlogits = softmax_cross_entropy(
            model.forward(data.x_train[batch]), data.y_train[batch]
        )
        model.backward(dlogits)
        # base = the version the gradient was computed at: the server measures staleness
        # tau = t - base from it (0 here: we are the only worker).
        pushed = ps.push(model.grads, base=version, samples=batch_size)
        if step % 5 == 0:
            print(
                f"step {step:3d}  loss {loss:.3f}  server version {pushed.version}  "
                f"staleness {pushed.staleness}"
            )
        if pushed.stop:
            break
    # This loop runs a number of steps, not its shard's epochs: `finished=False` says so.
    # (A plain `bye()` means "my shard is done"; once every rank is done the server ends
    # the run by itself: docs/protocol.md 5.6.)
    ps.bye(finished=False)


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    """`minips server` as a subprocess: an MLP, one worker (us), on a free loopback port."""
    address = f"tcp://127.0.0.1:{free_port()}"
    argv = [
        sys.executable,
        "-m",
        "minips",
        "server",
        "--model",
        "mlp",
        "--workers",
        "1",
        "--lr",
        "0.05",
        "--bind",
        address,
    ]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL)  # its errors stay visible
    with PSClient(address, timeout=1.0, retries=30) as probe:
        probe.stats()  # any answer means it is serving (retries while it starts up)
    return server, address


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connect", help="a running server (default: start one)")
    parser.add_argument("--fast", action="store_true", help="20 steps, for the tests")
    args = parser.parse_args()
    server, address = (None, args.connect) if args.connect else start_server()
    try:
        with PSClient(address, timeout=30.0) as ps:
            train(ps, max_steps=20 if args.fast else 500)
            stats = ps.stats()
            print(
                f"server: {stats['updates']} updates, {stats['samples']} samples, "
                f"{stats['bytes_in']:,} bytes in, {stats['bytes_out']:,} bytes out"
            )
            if server is not None:
                ps.stop()  # operator op: the server checkpoints (if asked to) and exits
    except ServerUnavailable as exc:
        sys.exit(f"error: {exc}")
    finally:
        if server is not None:
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
