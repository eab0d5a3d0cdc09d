"""Steps per second of a browser worker (headless Chromium, JavaScript) vs a NumPy worker.

Each worker trains alone against its own `minips server` (asgd, one worker), on the same
model, dataset and batch size, for the same number of steps; the figure is steps over the
time of the training loop (pushes and pulls included, data loading excluded):
- NumPy: `minips worker --max-steps N`, steps / (compute_s + comm_s) from its report;
- browser: the page's own `stepsPerSecond` (first pull to last step), accuracy checks off.

    python tools/bench_web.py --model lenet5 --dataset sample --steps 40

Needs chromium and pip install '.[web]'. Prints one JSON line per worker and the ratio.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_web_support import Chromium, quiet_env, server_process, wait_for  # noqa: E402

from minips.web import start_gateway  # noqa: E402


def numpy_worker(tmp: Path, server_args: list[str], steps: int) -> dict:
    with server_process(tmp, *server_args) as endpoint:
        report = tmp / "numpy.json"
        subprocess.run(
            [sys.executable, "-m", "minips", "worker", "--connect", endpoint, "--quiet"]
            + ["--max-steps", str(steps), "--report", str(report)],
            env=quiet_env(),
            check=True,
        )
    result = json.loads(report.read_text())
    loop_s = result["compute_s"] + result["comm_s"]
    return {"worker": "numpy", "steps": result["steps"], "steps_per_s": result["steps"] / loop_s}


def browser_worker(tmp: Path, server_args: list[str], steps: int) -> dict:
    chromium = Chromium(tmp)
    try:
        with server_process(tmp, *server_args) as endpoint, start_gateway(endpoint) as gateway:
            _, session = chromium.open(f"{gateway.url}?steps={steps}&evalsec=1e9&eval=100")

            def finished():
                status = chromium.status(session)
                if status.get("state") == "failed":
                    raise RuntimeError(status.get("error"))
                return status if status.get("state") == "done" else None

            status = wait_for(finished, 600, "the browser worker")
    finally:
        chromium.close()
    return {
        "worker": "browser",
        "steps": status["steps"],
        "steps_per_s": status["stepsPerSecond"],
        "user_agent": "chromium headless",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--dataset", default="sample")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    server_args = ["--workers", "1", "--rule", "asgd", "--model", args.model]
    server_args += ["--dataset", args.dataset, "--batch-size", str(args.batch_size)]
    print(json.dumps({"machine": platform.processor() or platform.machine(), **vars(args)}))
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            numpy = numpy_worker(Path(tmp), server_args, args.steps)
            browser = browser_worker(Path(tmp), server_args, args.steps)
        print(json.dumps(numpy))
        print(json.dumps(browser))
        ratio = browser["steps_per_s"] / numpy["steps_per_s"]
        print(json.dumps({"repeat": repeat, "browser_over_numpy": round(ratio, 3)}))


if __name__ == "__main__":
    main()
