"""Time one LeNet-5 training step in minips.nn side by side with the same network in PyTorch.

A step is forward, softmax cross-entropy, backward and a plain SGD update, batch 64, float32,
one BLAS/OpenMP thread each. The two frameworks run in alternating rounds in the same
process, so machine noise (other jobs, frequency changes) hits both alike; each prints the
median of its rounds, by the wall clock and by the thread's CPU clock, and the ratio
minips / torch (target <= 0.7).

    python tools/bench_nn.py [--steps 40] [--warmup 5] [--batch 64] [--layers]

--layers adds each layer's median forward and backward time, for minips (each layer's own
forward/backward, in the order Sequential runs them) and for torch (module hooks), timed in
the same rounds; the headline medians then include that bookkeeping (about a microsecond a
layer).

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
from minips.state.store import SGD  # noqa: E402


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


LayerTimes = dict[tuple[str, str], list[float]]  # (layer, "forward"|"backward") -> seconds


def time_minips_layers(model, times: LayerTimes) -> None:
    """Wrap each layer's forward and backward so every call appends its duration to times."""
    for name, layer in model.layers.items():
        for direction in ("forward", "backward"):
            method = getattr(layer, direction)

            def timed(*args, _method=method, _key=(name, direction), **kwargs):
                start = time.perf_counter()
                result = _method(*args, **kwargs)
                times.setdefault(_key, []).append(time.perf_counter() - start)
                return result

            setattr(layer, direction, timed)


def time_torch_modules(net, times: LayerTimes) -> None:
    """Module hooks that append each module's forward and backward durations to times."""
    counters: dict[str, int] = {}
    for index, module in enumerate(net):
        prefix = type(module).__name__.lower()
        counters[prefix] = counters.get(prefix, 0) + 1
        # The first module computes no input gradient: autograd runs its weight gradient
        # outside any module backward hook, so only the step's total counts it.
        add_timing_hooks(module, f"{prefix}{counters[prefix]}", times, backward=index > 0)


def add_timing_hooks(module, name: str, times: LayerTimes, backward: bool) -> None:
    """Time one torch module: a pre-hook notes the start, the hook after it the duration."""
    starts: dict[str, float] = {}

    def start(direction: str) -> None:
        starts[direction] = time.perf_counter()

    def stop(direction: str) -> None:
        times.setdefault((name, direction), []).append(time.perf_counter() - starts[direction])

    module.register_forward_pre_hook(lambda *_: start("forward"))
    module.register_forward_hook(lambda *_: stop("forward"))
    if backward:
        module.register_full_backward_pre_hook(lambda *_: start("backward"))
        module.register_full_backward_hook(lambda *_: stop("backward"))


def minips_step_fn(x: np.ndarray, y: np.ndarray, layer_times: LayerTimes | None = None):
    """A closure running one minips training step (forward, loss, backward, SGD)."""
    model = lenet5(seed=0)
    if layer_times is not None:
        time_minips_layers(model, layer_times)
    opt = SGD(model.params, lr=0.01)
    grads = model.grads

    def step() -> float:
        loss, dlogits = softmax_cross_entropy(model.forward(x), y)
        model.backward(dlogits)
        opt.step(grads)
        return loss

    return step


def torch_step_fn(x: np.ndarray, y: np.ndarray, layer_times: LayerTimes | None = None):
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
    if layer_times is not None:
        time_torch_modules(net, layer_times)
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
    parser.add_argument("--layers", action="store_true", help="also time every layer")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32)  # (N, 1, 28, 28)
    y = rng.integers(0, 10, size=args.batch).astype(np.int64)  # (N,)
    layer_times: dict[str, LayerTimes] = {"minips": {}, "torch": {}}
    per_layer = layer_times if args.layers else {"minips": None, "torch": None}
    runners = {"minips": minips_step_fn(x, y, per_layer["minips"])}
    torch_step = torch_step_fn(x, y, per_layer["torch"])
    if torch_step is not None:
        runners["torch"] = torch_step

    # Wall time, and the CPU time of this thread (both frameworks compute in it): on a shared
    # machine the second leaves out the time the thread waited for a core.
    clocks = {"wall": time.perf_counter, "thread cpu": time.thread_time}
    times = {(name, clock): [] for name in runners for clock in clocks}
    for round_index in range(args.warmup + args.steps):
        # Alternate who goes first so neither always runs right after the other's cache use.
        order = list(runners) if round_index % 2 == 0 else list(reversed(runners))
        for name in order:
            starts = {clock: read() for clock, read in clocks.items()}
            runners[name]()
            if round_index >= args.warmup:
                for clock, read in clocks.items():
                    times[name, clock].append(read() - starts[clock])

    print(f"cpu: {cpu_model()}, numpy {np.__version__}, blas: {blas_info()}")
    print(f"lenet5 training step, batch {args.batch}, float32, 1 thread, {args.steps} rounds")
    for clock in clocks:
        medians = {name: statistics.median(times[name, clock]) * 1e3 for name in runners}
        figures = "  ".join(f"{name} {median:7.2f} ms" for name, median in medians.items())
        if "torch" in medians:
            figures += f"  ratio minips/torch {medians['minips'] / medians['torch']:.2f}"
        print(f"  {clock:10s} median  {figures}")
    if "torch" not in runners:
        print("  torch not importable: no reference timing")
    if args.layers:
        for name in runners:
            print_layer_table(name, layer_times[name], skip=args.warmup)


def print_layer_table(framework: str, times: LayerTimes, skip: int) -> None:
    """Median forward and backward milliseconds per layer, warm-up calls left out."""
    print(f"{framework} per layer (median ms, forward / backward):")
    layers = list(dict.fromkeys(name for name, _ in times))
    total = 0.0
    for name in layers:
        cells = []
        for direction in ("forward", "backward"):
            calls = times.get((name, direction), [])[skip:]
            median = statistics.median(calls) * 1e3 if calls else 0.0
            total += median
            cells.append(f"{median:6.2f}" if calls else "     -")
        print(f"  {name:9s} {cells[0]} / {cells[1]}")
    print(f"  sum of layers {total:.2f} ms")


if __name__ == "__main__":
    main()
