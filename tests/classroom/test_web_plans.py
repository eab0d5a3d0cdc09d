"""Browser workers under transmission plans, in real `minips run`s with headless Chromium.

- `--plan auto --bandwidth 20mbit` with a NumPy worker and a browser: the browser's pushes
  are applied, it makes every step it makes under `--plan dense` (its whole shard), and its
  bytes per step on the server's counters are the plan's;
- a plan file naming every codec, pull encoding and a push interval, one browser alone: the
  server's gradient bytes are exactly what the plan says, step by step, and it trains.
"""

import json
import math
import subprocess
import sys

import pytest
from test_web_support import quiet_env, require_browser

from minips.nn import build_model
from minips.results.loading import load_run
from minips.transmission.planning.planner import pull_bytes, push_bytes

pytestmark = pytest.mark.slow
# 2000 synthetic training examples: a shard of 1000 is 16 steps of 64 (the last one 40).
FAST = ["--model", "mlp", "--dataset", "synthetic", "--rule", "asgd", "--lr", "0.05"]
FAST += ["--momentum", "0.5"]


def _run(tmp_path, name, *args):
    require_browser()
    out = tmp_path / name
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet"]
    argv += ["--browser-headless", "--listen", "127.0.0.1:0", "--join-wait", "120", *FAST, *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=quiet_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _final_stats(out) -> dict:
    """The server's last `stats`, written to its update log as it exits."""
    records = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    return next(r["stats"] for r in records if r["event"] == "server")


def _browser_row(out):
    stats = _final_stats(out)
    rows = [w for w in stats["workers"] if (w.get("info") or {}).get("agent") == "browser"]
    assert len(rows) == 1, rows
    return rows[0], stats


def _applied(out, rank: int) -> int:
    updates = [json.loads(line) for line in (out / "updates.jsonl").read_text().splitlines()]
    return sum(r["workers"].count(rank) for r in updates if r["event"] == "update")


def test_a_browser_follows_the_auto_plan_of_a_limited_link(tmp_path):
    common = ["--workers", "2", "--browser", "1", "--epochs", "1"]
    # Dense bytes do not depend on the link: unlimited, its run does not wait 20 s for it.
    dense = _run(tmp_path, "dense", *common, "--plan", "dense")
    auto = _run(tmp_path, "auto", *common, "--bandwidth", "20mbit", "--plan", "auto")
    plan = json.loads((auto / "plan.json").read_text())
    assert plan["params"], "20 Mbit/s should make the planner compress"
    (dense_row, _), (row, stats) = _browser_row(dense), _browser_row(auto)
    # Every step of its shard, as under dense; each applied by the server.
    assert row["clock"] == dense_row["clock"] == 16
    assert _applied(auto, row["rank"]) == 16 and stats["updates"] == 32
    # Its bytes per step, as the server counted them: the plan's array bytes plus the
    # messages' headers (a few hundred bytes), against ~940 KB dense.
    predicted = plan["predicted"]
    per_push = (row["bytes_in"] - 1000) / row["pushes"]  # hello, pull, bye: < 1000 bytes
    assert predicted["up_bytes_per_step"] <= per_push <= predicted["up_bytes_per_step"] + 1500
    assert dense_row["bytes_in"] / dense_row["pushes"] > 940_000 > 20 * per_push
    shard_dense = 4 * sum(p.size for p in build_model("mlp").params.values())
    down = (row["bytes_out"] - shard_dense) / row["pushes"]  # the first pull is dense
    # A delta's first `warmup_pulls` replies carry it whole as fp16: here all 16 steps.
    assert predicted["warmup_pulls"] >= 16
    assert down <= predicted["down_bytes_per_step_warmup"] + 1500
    assert load_run(auto).summary["accuracy"] > 0.8


EVERY_CODEC = {
    "format": 1,
    "wait_free": True,
    "params": {
        "fc1.w": {
            "push": {"codec": "topk", "ratio": 0.02, "dtype": "float16"},
            "pull": {"codec": "delta", "ratio": 0.05, "dtype": "float16"},
        },
        "fc1.b": {"push": "fp16", "pull": "fp16"},
        "fc2.w": {"push": {"codec": "sf", "dtype": "float16"}, "every": 2},
        "fc2.b": {"every": 2, "priority": -1},
        "fc3.w": {"push": {"codec": "lowrank", "rank": 2}, "pull": "fp16"},
    },
}


def _expected_grad_bytes(batches: list[int]) -> int:
    """The gradient bytes of EVERY_CODEC's pushes over steps of these batch sizes."""
    shapes = {name: p.shape for name, p in build_model("mlp").params.items()}
    total = 0
    for step in range(len(batches)):
        for name, shape in shapes.items():
            entry = EVERY_CODEC["params"].get(name, {})
            spec, every = entry.get("push", "dense"), entry.get("every", 1)
            if (step + 1) % every:
                continue  # summed locally, sent with the next step
            rows = sum(batches[step + 1 - every : step + 1])  # sf: the factors stacked
            total += push_bytes(spec, shape, rows)
    return total


def test_a_browser_speaks_every_codec_of_a_plan_file(tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(EVERY_CODEC))
    out = _run(tmp_path, "codecs", "--workers", "1", "--browser", "1", "--epochs", "2",
               "--plan", str(plan_file))  # fmt: skip
    row, stats = _browser_row(out)
    shard = 2000  # the only worker: the whole training set, 31 batches of 64 and one of 16
    batches = [64] * (shard // 64) + [shard % 64]
    assert row["clock"] == stats["updates"] == 2 * len(batches)  # every push applied
    assert stats["grad_bytes_in"] == _expected_grad_bytes(batches * 2)
    # Down: the first pull dense, then each parameter as the plan says (a delta at most).
    shapes = {name: p.shape for name, p in build_model("mlp").params.items()}
    per_step = sum(pull_bytes(EVERY_CODEC["params"].get(n, {}).get("pull", "dense"), s)
                   for n, s in shapes.items())  # fmt: skip
    dense = sum(4 * math.prod(s) for s in shapes.values())
    assert row["bytes_out"] <= dense + row["pushes"] * (per_step + 1500)
    assert load_run(out).summary["accuracy"] > 0.8
