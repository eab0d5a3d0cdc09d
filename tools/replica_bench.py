"""Replicated servers on loopback: the failover time over repeated kills, and what R = 2
costs a step's exchange against R = 1.

    python tools/replica_bench.py [--kills 10] [--steps 300] [--rounds 5] [--model mlp]
    sudo python tools/replica_bench.py --netem 100mbit --kills 0    # the cost behind a link

Failover: a primary and its backup (`minips server --replicas 2`, `--backup-of LINK`),
one client pushing (asgd, fused push + pull) in a loop; the primary is SIGKILLed at a
random moment, a replacement backup is started once the new primary listens, and so on.
For each kill: `takeover` (the backup's own figure: the primary's last message to the
address bound, its 1 s silence bound included) and `client gap` (the kill to the
client's next reply; a request lost with the primary waits for the client's 1 s timeout).
Cost: the same client's mean step (push + pull of the whole model) against a server of
R = 1 and of R = 2, after a warm-up, measured in turn `--rounds` times (medians).
With `--netem RATE` the server's host is behind a real shaped link (minips.run.netem: its
own network namespace, a veth shaped to RATE each way): both replicas run there, as
`minips run` and `minips launch` place them (a backup takes over the primary's address,
so it shares its host), the client outside, so every push and reply crosses the link and
the replication traffic stays on the host's loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from minips.nn import build_model
from minips.worker.client import PSClient

SERVE = ["--workers", "1", "--rule", "asgd", "--dataset", "synthetic", "--lr", "0.001",
         "--seed", "0", "--heartbeat-timeout", "60"]  # fmt: skip


def wait_file(path: Path, differs_from: str = "", timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text().strip()) and text != differs_from:
            return text
        time.sleep(0.02)
    raise SystemExit(f"no {path}")


def server(model: str, *options: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    """A `minips server` (run behind `prefix`: a namespace's `ip netns exec NAME`)."""
    return subprocess.Popen([*prefix, sys.executable, "-m", "minips", "server", "--model", model,
                             *SERVE, *options], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def gradients(model: str) -> dict[str, np.ndarray]:
    return {name: np.full_like(p, 1e-4) for name, p in build_model(model, seed=0).params.items()}


def failovers(model: str, kills: int, rng: random.Random) -> None:
    work = Path(tempfile.mkdtemp(prefix="minips-replica-bench-"))
    endpoint = work / "endpoint"
    live = [server(model, "--replicas", "2", "--bind", "tcp://127.0.0.1:*",
                   "--endpoint-file", str(endpoint))]  # fmt: skip
    address = wait_file(endpoint)
    link = wait_file(Path(f"{endpoint}-link"))
    live.append(server(model, "--backup-of", link, "--endpoint-file", str(endpoint)))
    grads, gaps, takeovers = gradients(model), [], []
    try:
        with PSClient(address, timeout=1.0, retries=30, worker_id="bench") as client:
            client.hello({"host": "bench"})
            version = client.pull().version
            for _ in range(kills):
                while not (stats := client.stats())["replication"]["backup"]:
                    time.sleep(0.05)
                pid = stats["replication"]["pid"]
                kill_at = time.monotonic() + rng.uniform(0.2, 1.0)
                while time.monotonic() < kill_at:
                    version = client.push(grads, base=version, pull_since=version).version
                os.kill(pid, signal.SIGKILL)
                killed = time.monotonic()
                version = client.push(grads, base=version, pull_since=version).version
                gaps.append(time.monotonic() - killed)
                record = client.stats()["replication"]["failovers"][-1]
                takeovers.append(record["silent_s"] + record["bind_s"])
                link = wait_file(Path(f"{endpoint}-link"), differs_from=link)
                live.append(server(model, "--backup-of", link, "--endpoint-file", str(endpoint)))
    finally:
        for proc in live:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    print(f"failover over {kills} kills ({model}, loopback):")
    for name, values in (("takeover", takeovers), ("client gap", gaps)):
        print(
            f"  {name:10s} median {statistics.median(values):.3f} s, "
            f"max {max(values):.3f} s, all {' '.join(f'{v:.2f}' for v in values)}"
        )


def step_time(model: str, steps: int, replicas: int, host: Any = None) -> float:
    """The mean push + pull of the whole model against R `replicas` (behind `host`, a
    minips.run.netem.ShapedLink, when given: bound on its address, run in its namespace)."""
    work = Path(tempfile.mkdtemp(prefix="minips-replica-bench-"))
    endpoint = work / "endpoint"
    prefix = tuple(host.prefix) if host is not None else ()
    bind = f"tcp://{host.server_addr}:*" if host is not None else "tcp://127.0.0.1:*"
    options = ["--bind", bind, "--endpoint-file", str(endpoint)]
    replicated = ["--replicas", "2"] if replicas == 2 else []
    procs = [server(model, *options, *replicated, prefix=prefix)]
    try:
        address = wait_file(endpoint)
        if replicas == 2:
            link = wait_file(Path(f"{endpoint}-link"))
            procs.append(server(model, "--backup-of", link, prefix=prefix))
        grads = gradients(model)
        with PSClient(address, timeout=10.0, worker_id="bench") as client:
            client.hello({"host": "bench"})
            version = client.pull().version
            for _ in range(20):  # warm-up
                version = client.push(grads, base=version, pull_since=version).version
            start = time.perf_counter()
            for _ in range(steps):
                version = client.push(grads, base=version, pull_since=version).version
            return (time.perf_counter() - start) / steps
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--rounds", type=int, default=5, help="R=1 and R=2 measured in turn")
    parser.add_argument("--netem", metavar="RATE",
                        help="the servers' host behind a shaped link of RATE (root)")  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        host = None
        if args.netem:
            from minips.run.netem import shaped_link

            host = stack.enter_context(shaped_link(args.netem))
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.rounds):  # in turn: a shared machine's load falls on both alike
            for replicas in (1, 2):
                times[replicas].append(step_time(args.model, args.steps, replicas, host))
    one, two = statistics.median(times[1]), statistics.median(times[2])
    ratios = " ".join(f"{b / a:.2f}" for a, b in zip(times[1], times[2], strict=True))
    where = f"behind a {args.netem} link" if args.netem else "loopback"
    print(f"step exchange ({args.model}, {where}, push + pull, {args.steps} steps, median of "
          f"{args.rounds}): R=1 {one * 1e3:.2f} ms, R=2 {two * 1e3:.2f} ms, ratio "
          f"{two / one:.2f} (each round's: {ratios})")  # fmt: skip
    if args.kills:
        failovers(args.model, args.kills, random.Random(0))


if __name__ == "__main__":
    main()
