"""Samples per second of a browser worker (headless Chromium) against a NumPy worker.

Each worker trains alone against its own `minips server` (asgd, one worker), on the same
model, dataset and batch size, for the same number of steps, one after the other; a repeat
runs the NumPy worker, then the browser with each engine (wasm-simd, js), so machine noise
hits them alike, and the summary gives medians over the repeats. The figure is samples over
the time of the training loop (pushes and pulls included, data loading and startup
excluded), split into compute (forward + backward) and communication (push + pull,
encoding and decoding included), each per step:
- NumPy: `minips worker --max-steps N` (one BLAS thread), from its --report;
- browser: the page's own status (first pull to last step), accuracy checks off.
`wall_samples_per_s` counts startup too: the worker process from its start to its exit,
the page from its opening to its "done" (data download and the engine's warm-up included).

    python tools/bench_web.py --model lenet5 --dataset sample --steps 40 --repeats 3

`--plan FILE` gives both servers a transmission plan (`minips plan --json`), which the NumPy
worker and the page both follow; without it both send and receive every parameter dense.

Needs chromium and pip install '.[web]'. Prints one JSON line per run, then one line per
worker with the medians and their ratio to the NumPy worker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_web_support import Chromium, quiet_env, server_process, wait_for  # noqa: E402

from minips.classroom.web import start_gateway  # noqa: E402
from minips.classroom.web.headless import remove_profile  # noqa: E402


def numpy_worker(tmp: Path, server_args: list[str], steps: int) -> dict:
    with server_process(tmp, *server_args) as endpoint:
        report = tmp / "numpy.json"
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "minips", "worker", "--connect", endpoint, "--quiet"]
            + ["--max-steps", str(steps), "--report", str(report)],
            env=quiet_env(),
            check=True,
        )
        wall = time.monotonic() - started
    result = json.loads(report.read_text())
    return _figures(
        "numpy", result["steps"], result["samples"], result["compute_s"], result["comm_s"], wall
    )


def browser_worker(tmp: Path, server_args: list[str], steps: int, engine: str) -> dict:
    chromium = Chromium(tmp)
    try:
        with server_process(tmp, *server_args) as endpoint, start_gateway(endpoint) as gateway:
            query = f"?steps={steps}&evalsec=1e9&eval=100&engine={engine}"
            started = time.monotonic()
            _, session = chromium.open(gateway.url + query)

            def finished():
                status = chromium.status(session)
                if status.get("state") == "failed":
                    raise RuntimeError(status.get("error"))
                return status if status.get("state") == "done" else None

            status = wait_for(finished, 600, "the browser worker", interval=0.05)
            wall = time.monotonic() - started
    finally:
        chromium.close()
    figures = _figures(
        f"browser {status['engine']}",
        status["steps"],
        status["samples"],
        status["computeSeconds"],
        status["commSeconds"],
        wall,
    )
    return {**figures, "steps_per_s_page": round(status["stepsPerSecond"], 3)}


def _figures(
    worker: str, steps: int, samples: int, compute_s: float, comm_s: float, wall_s: float
) -> dict:
    loop_s = compute_s + comm_s
    return {
        "worker": worker,
        "steps": steps,
        "samples_per_s": round(samples / loop_s, 1),
        "wall_samples_per_s": round(samples / wall_s, 1),
        "compute_ms": round(1000 * compute_s / steps, 2),
        "comm_ms": round(1000 * comm_s / steps, 2),
    }


def summary(runs: list[dict]) -> list[dict]:
    """Per worker: medians over the repeats, and the median samples/s over NumPy's."""
    medians = {}
    for worker in dict.fromkeys(run["worker"] for run in runs):
        mine = [run for run in runs if run["worker"] == worker]
        medians[worker] = {
            key: round(statistics.median(run[key] for run in mine), 2)
            for key in ("samples_per_s", "wall_samples_per_s", "compute_ms", "comm_ms")
        }
    reference = medians["numpy"]["samples_per_s"]
    wall_reference = medians["numpy"]["wall_samples_per_s"]
    return [
        {
            "worker": worker,
            "runs": sum(run["worker"] == worker for run in runs),
            **figures,
            "over_numpy": round(figures["samples_per_s"] / reference, 3),
            "wall_over_numpy": round(figures["wall_samples_per_s"] / wall_reference, 3),
        }
        for worker, figures in medians.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--dataset", default="sample")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--engines", default="wasm,js", help="browser engines, comma-separated: wasm, js"
    )
    parser.add_argument("--plan", help="a plan JSON file for both workers (default: dense)")
    args = parser.parse_args()
    engines = args.engines.split(",")
    if not set(engines) <= {"wasm", "js"}:
        parser.error(f"--engines takes wasm and js, got {args.engines!r}")
    server_args = ["--workers", "1", "--rule", "asgd", "--model", args.model]
    server_args += ["--dataset", args.dataset, "--batch-size", str(args.batch_size)]
    if args.plan:
        server_args += ["--plan", str(Path(args.plan).resolve())]
    load = os.getloadavg()[0]
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                **vars(args),
                "load_1min": round(load, 2),
            }
        )
    )
    runs = []
    for repeat in range(args.repeats):
        tmp = Path(tempfile.mkdtemp(prefix="bench-web-"))
        try:
            runs.append(numpy_worker(tmp, server_args, args.steps))
            print(json.dumps({"repeat": repeat, **runs[-1]}), flush=True)
            for engine in engines:
                runs.append(browser_worker(tmp, server_args, args.steps, engine))
                print(json.dumps({"repeat": repeat, **runs[-1]}), flush=True)
        finally:
            # Chromium's helpers may still write in its profile here for a moment
            remove_profile(tmp)
    for line in summary(runs):
        print(json.dumps({"median": True, **line}))
    print(json.dumps({"load_1min_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
