"""The server's own work for one step, in-process: no peer, no network, no client.

A ParameterServer (asgd; SGD with momentum 0 unless --momentum) holding LeNet-5-sized
tensors is handed prebuilt request frames directly (`serve`), one push of all gradients and
then a pull (`pushpull`), or one fused push with `pull_since` (`fused`); the figure is the
median time of that call over 300 steps after 30 warm-up steps. Replies go to a ROUTER
socket with no peer (ZeroMQ drops them), so what is timed is decoding, checks, the update
and encoding the reply.

    python tools/bench_server_work.py pushpull|fused [--momentum 0.9] [--rule dana-gap]
    PYTHONPATH=<a checkout of an older commit> python tools/bench_server_work.py pushpull

The second form times an older version of minips (one from before `ServerOptions`, whose
handler was `_handle` and which had no fused exchange, works too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_wire import _tensors  # noqa: E402

import minips  # noqa: E402
from minips.protocol import wire  # noqa: E402
from minips.server import server as server_module  # noqa: E402

try:  # a checkout from before minips.state.store (on PYTHONPATH) has minips.optim
    from minips.state.store import SGD  # noqa: E402
except ImportError:
    from minips.optim import SGD  # noqa: E402
from minips.rules import make_rule  # noqa: E402

NEW = hasattr(server_module, "ServerOptions")


def _server(momentum: float, rule: str = "asgd"):
    params = _tensors()
    # The public class: the core's server with the usual operations (the checks a run has)
    # where the core takes them as an argument; older versions had them inside.
    cls = getattr(minips, "ParameterServer", server_module.ParameterServer)
    optimizer = SGD(params, lr=1e-6, momentum=momentum)
    if NEW:
        server = cls(params, make_rule(rule), optimizer, server_module.ServerOptions())
        return server, server.serve
    server = cls(params, make_rule("asgd"), optimizer, {})
    return server, server._handle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="pushpull", choices=("pushpull", "fused"))
    parser.add_argument("--momentum", type=float, default=0.0, help="the server's SGD momentum")
    parser.add_argument("--rule", default="asgd", help="the update rule (dana-gap: --momentum 0)")
    args = parser.parse_args()
    mode = args.mode
    if mode == "fused" and not NEW:
        raise SystemExit("this version has no fused exchange")
    server, serve = _server(args.momentum, args.rule)
    grads, rid = _tensors(1), [0]

    def frames(header, arrays=None):
        rid[0] += 1
        body = wire.encode({**header, "rid": rid[0]}, arrays)
        return [zmq.Frame(b"\x00abcd")] + [zmq.Frame(bytes(f)) for f in body]

    serve(frames({"op": "hello", "worker": "w"}))
    state = {"version": 0, "seq": 0}

    def step() -> float:
        version = state["version"]
        header = {"op": "push", "worker": "w", "seq": state["seq"], "base": version}
        if mode == "fused":
            header["pull_since"] = version
        request = frames(header, grads)
        state["seq"] += 1
        tick = time.perf_counter()
        serve(request)
        if mode != "fused":
            serve(frames({"op": "pull", "worker": "w", "since": version}))
        elapsed = time.perf_counter() - tick
        state["version"] = server.store.version
        return elapsed

    for _ in range(30):
        step()
    times = [step() for _ in range(300)]
    label = "current" if NEW else "old"
    extra = f", momentum {args.momentum:g}" if args.momentum else ""
    extra = (f", {args.rule}" if args.rule != "asgd" else "") + extra
    print(f"{label} {mode}{extra}: {statistics.median(times) * 1e3:.3f} ms (median of 300)")
    server.close()


if __name__ == "__main__":
    main()
