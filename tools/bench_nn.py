"""Time one LeNet-5 training step in minips.nn side by side with the same network in PyTorch.

A step is forward, softmax cross-entropy, backward and a plain SGD update, batch 64, float32,
one BLAS/OpenMP thread each. The two frameworks run in alternating rounds in the same
process, so machine noise (other jobs, frequency changes) hits both alike; each prints the
median of its rounds and the ratio minips / torch (target <= 1.2).

    python tools/bench_nn.py [--steps 40] [--warmup 5] [--batch 64]

On machines that set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (work-arounds for old OpenBLAS
builds) numpy may run a slower kernel than it could; unset both in the benchmark command
only to compare like with like: `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python ...`.
"""

from __future__ import annotations

import os

# One thread each, set before numpy or torch load their BLAS (they read these at import).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from minips.nn import lenet5, softmax_cross_entropy  # noqa: E402
from minips.server.store import SGD  # noqa: E402


def cpu_model() -> str:
    """The processor name from /proc/cpuinfo (or platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info() -> str:
    """Which BLAS kernel numpy runs, via threadpoolctl when it is installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    return "; ".join(
        f"{d.get('internal_api')} {d.get('version')} {d.get('architecture')} "
        f"threads={d.get('num_threads')}"
        for d in threadpool_info()
        if d.get("user_api") == "blas"
    )


def minips_step_fn(x: np.ndarray, y: np.ndarray):
    """A closure running one minips training step (forward, loss, backward, SGD)."""
    model = lenet5(seed=0)
    opt = SGD(model.params, lr=0.01)
    grads = model.grads

    def step() -> float:
        loss, dlogits = softmax_cross_entropy(model.forward(x), y)
        model.backward(dlogits)
        opt.step(grads)
        return loss

    return step


def torch_step_fn(x: np.ndarray, y: np.ndarray):
    """The same step in PyTorch (same architecture, plain SGD), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    nn = torch.nn
    net = nn.Sequential(
        nn.Conv2d(1, 20, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(800, 500),
        nn.ReLU(),
        nn.Linear(500, 10),
    )
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed rounds (median taken)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)  # (N, 1, 28, 28)
    y = rng.integers(0, 10, size=args.batch).astype(np.int64)  # (N,)
    runners = {"minips": minips_step_fn(x, y)}
    torch_step = torch_step_fn(x, y)
    if torch_step is not None:
        runners["torch"] = torch_step

    times: dict[str, list[float]] = {name: [] for name in runners}
    for round_index in range(args.warmup + args.steps):
        # Alternate who goes first so neither always runs right after the other's cache use.
        order = list(runners) if round_index % 2 == 0 else list(reversed(runners))
        for name in order:
            start = time.perf_counter()
            runners[name]()
            elapsed = time.perf_counter() - start
            if round_index >= args.warmup:
                times[name].append(elapsed)

    print(f"cpu: {cpu_model()}, numpy {np.__version__}, blas: {blas_info()}")
    print(f"lenet5 training step, batch {args.batch}, float32, 1 thread, {args.steps} rounds")
    medians = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    for name, median in medians.items():
        print(f"  {name:7s} median {median:7.2f} ms")
    if "torch" in medians:
        print(f"  ratio minips/torch {medians['minips'] / medians['torch']:.2f}")
    else:
        print("  torch not importable: no reference timing")


if __name__ == "__main__":
    main()
