"""A browser that cannot follow a run says so: `bye` with `refused` (docs/protocol.md 5.6).

- the server keeps the reason in the worker's stats row, frees the rank, logs it;
- the page's own verdict (follow.js) on every kind of config, in Node;
- a real page asked for an engine its browser lacks (Chromium without a JIT) refuses
  at hello in a real `minips run`, whose output says so in one line, while the NumPy
  worker trains on.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_server_support import RawPeer, running_server
from test_web_support import Chromium, quiet_env, require_browser, wait_for

from minips.run.plan_checks import load_plan
from minips.run.refusals import Refusals
from minips.worker.client import PSClient

JS_TESTS = Path(__file__).resolve().parents[1] / "js"
NODE = shutil.which("node")
REASON = 'this page cannot encode codec "zstd"'


def test_a_refusing_worker_leaves_its_reason_in_stats_and_its_rank_free():
    with running_server(world_size=2) as server:
        address = server.endpoint
        with RawPeer(address) as peer:
            hello = peer.request({"v": 1, "op": "hello", "rid": 1, "worker": "page"})
            assert hello.header["rank"] == 0
            bye = {"v": 1, "op": "bye", "rid": 2, "worker": "page", "refused": REASON}
            assert peer.request(bye).op == "bye"
        with PSClient(address) as other:
            assert other.hello()["rank"] == 0  # the refused rank is free, not finished
            rows = {row["worker"]: row for row in other.stats()["workers"]}
            other.bye(finished=False)
    assert rows["page"]["refused"] == REASON and not rows["page"]["alive"]
    assert "refused" not in rows[other.worker_id]
    assert Refusals().update({"workers": list(rows.values())}) == [
        f"worker page (rank 0) refused this run: {REASON}"
    ]


def test_a_refusal_reason_must_be_a_string():
    with running_server() as server, RawPeer(server.endpoint) as peer:
        peer.request({"v": 1, "op": "hello", "rid": 1, "worker": "page"})
        reply = peer.request({"v": 1, "op": "bye", "rid": 2, "worker": "page", "refused": 3})
    assert reply.op == "error" and reply.header["code"] == "bad_field"


def test_the_launcher_says_each_refusal_once():
    refusals = Refusals()
    row = {"worker": "b1", "rank": 2, "refused": "no", "info": {"agent": "browser"}}
    assert refusals.update({"workers": [row]}) == ["browser b1 (rank 2) refused this run: no"]
    assert refusals.update({"workers": [row]}) == []  # said once
    assert (
        refusals.update(None) == []
        and refusals.update({"workers": [{**row, "refused": None}]}) == []
    )


def _verdicts(cases: list[dict]) -> list:
    done = subprocess.run([NODE, str(JS_TESTS / "follow.mjs"), json.dumps(cases)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(NODE is None, reason="node not found: JS tests need Node >= 18")
def test_the_page_knows_what_it_cannot_follow():
    mlp = {"name": "mlp", "kwargs": {"hidden": [32]}}
    every_codec = load_plan(
        {"params": {
            "fc1.w": {"push": {"codec": "topk", "ratio": 0.01, "warmup": 2, "dtype": "float16"},
                      "pull": {"codec": "delta", "ratio": 0.05, "dtype": "float16"}},
            "fc1.b": {"push": "fp16", "pull": "fp16", "every": 2},
            "fc2.w": {"push": {"codec": "sf", "dtype": "float16"}, "priority": 1},
            "fc2.b": {"push": {"codec": "lowrank", "rank": 2}},
        }, "wait_free": True}
    ).to_dict()  # fmt: skip
    cases = [
        {"config": {"model": mlp}, "engine": "js"},
        {"config": {"model": {"name": "lenet5"}, "plan": every_codec}, "engine": "wasm-simd"},
        {"config": {"model": {"name": "resnet18"}}, "engine": "js"},
        {"config": {"model": {"name": "mlp", "kwargs": {"dropout": 0.5}}}, "engine": "js"},
        {"config": {"model": mlp, "plan": {"params": {"fc1.w": {"push": "zstd"}}}}, "engine": "js"},
        {
            "config": {
                "model": mlp,
                "plan": {
                    "params": {"fc1.w": {"push": {"codec": "topk", "ratio": 0.1, "nesterov": True}}}
                },
            },
            "engine": "js",
        },  # noqa: E501
        {"config": {"model": mlp, "plan": {"params": {"fc1.w": {"pull": "lz4"}}}}, "engine": "js"},
        {"config": {"model": mlp, "plan": {"params": {"fc1.w": {"deadline": 3}}}}, "engine": "js"},
        {"config": {"model": mlp, "plan": {"format": 2}}, "engine": "js"},
        {"config": {"model": mlp}, "engine": "js", "asked": {"engine": "wasm"}},
        {"config": {"model": mlp}, "engine": "wasm-simd", "asked": {"engine": "wasm"}},
    ]
    verdicts = _verdicts(cases)
    assert verdicts[0] is None and verdicts[1] is None and verdicts[-1] is None
    expected = ["model \"resnet18\"", "no option(s) dropout", "cannot encode codec \"zstd\"",
                "topk has no option(s) nesterov", "cannot decode pull codec \"lz4\"",
                "key(s) deadline", "format 2", "WebAssembly SIMD"]  # fmt: skip
    for verdict, words in zip(verdicts[2:-1], expected, strict=True):
        assert words in verdict, (verdict, words)


@pytest.mark.slow
def test_a_page_without_the_engine_it_was_asked_for_refuses_in_a_real_run(tmp_path):
    """`minips run` with a browser seat; the tab opened in a Chromium without a JIT, hence
    without WebAssembly (as under a policy or a lockdown mode that turns it off), at
    ?engine=wasm: it refuses at hello, the run's output says why in one
    line, the page says it too, and the NumPy worker's run ends normally."""
    require_browser()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--workers", "2"]
    argv += ["--browser", "1", "--listen", "127.0.0.1:0", "--model", "mlp"]
    # The page takes its seat at hello and leaves it refusing: the run then waits the join
    # wait for it to come back before it ends (10 s, not the default 30). A late page is
    # still served: the NumPy worker's pulls are held until it comes (the server's
    # assembly, up to the heartbeat timeout, 30 s), whatever the join wait.
    argv += ["--dataset", "synthetic", "--epochs", "1", "--join-wait", "10"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=quiet_env())  # fmt: skip
    chromium = Chromium(tmp_path, flags=("--js-flags=--jitless",))
    try:
        url_file = out / "web-url"
        wait_for(lambda: url_file.exists() and url_file.read_text().strip(), 60, "the gateway")
        _, session = chromium.open(url_file.read_text().strip() + "?engine=wasm")
        page = wait_for(lambda: _failed(chromium, session), 60, "the page to refuse")
        stdout, stderr = run.communicate(timeout=120)
    finally:
        chromium.close()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr[-2000:]
    lines = [line for line in (stdout + stderr).splitlines() if "refused this run" in line]
    assert len(lines) == 1, stdout + stderr
    assert "WebAssembly SIMD engine the page was asked for" in lines[0]
    assert lines[0].startswith("browser browser-")
    assert "this page cannot follow this run: this browser cannot run" in page["error"]
    assert page["code"] == "cannot_follow"  # what the student reads (words.js), then why:
    assert page["message"].startswith("This browser cannot take part in this run")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 1000  # the NumPy worker's shard, trained without the page


def _failed(chromium, session):
    status = chromium.status(session)
    return status if status.get("state") == "failed" else None
