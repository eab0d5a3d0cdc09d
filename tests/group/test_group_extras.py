"""Everything else with a server group: CURVE keys, the dashboard's shard rows (in a real
Chromium), `minips report`'s shard table, the planner's K links, and a browser that joins
a group through the gateway (its frames relayed as one server's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
from group_support import running_group
from test_dashboard import chromium_page, dashboard
from test_web_support import quiet_env, require_browser

from minips.classroom.dashboard.collector import Collector
from minips.classroom.web.grouprelay import GroupRelay
from minips.group.partition import group_gain
from minips.group.root import GROUPS
from minips.guard import wire_checks
from minips.nn import build_model
from minips.protocol import wire
from minips.worker.client import PSClient

MLP = build_model("mlp").params
FAST = [
    "--model",
    "mlp",
    "--dataset",
    "synthetic",
    "--rule",
    "asgd",
    "--lr",
    "0.05",
    "--momentum",
    "0.5",
]


def test_an_authenticated_group_trains_and_reports_its_shards(tmp_path):
    """--auth: the shards share the server's key pair; a shard's join needs an operator
    key; the workers and the evaluator reach every shard with the server's public key."""
    out = tmp_path / "auth"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--auth",
            "--servers", "2", "--workers", "2", "--epochs", "1", *FAST]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 2000 and [r["updates"] for r in summary["shards"]] == [32, 32]
    report = subprocess.run([sys.executable, "-m", "minips", "report", str(out)],
                            capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    assert "server group of 2 shards" in report
    rows = [line.split() for line in report.splitlines() if line.strip()[:2] in ("0 ", "1 ")]
    assert [row[:2] for row in rows[-2:]] == [["0", "32"], ["1", "32"]]


def test_a_client_without_a_key_gets_nothing_from_a_shard(tmp_path):
    from minips.provision.keyfiles import make_keys

    make_keys(tmp_path / "keys")
    with running_group(2, workers=1, keys=str(tmp_path / "keys")) as group:
        with PSClient(group.servers[1].endpoint, groups=GROUPS, timeout=0.5, retries=0) as stranger:
            with pytest.raises(Exception, match="no reply"):
                stranger.stats()


def test_the_dashboard_shows_one_row_per_shard(tmp_path):
    require_browser()
    with running_group(3, workers=1) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        version = ps.pull().version
        grads = {
            n: np.full(a.shape, 1e-4, np.float32) for n, a in build_model("mlp").params.items()
        }
        for _ in range(5):
            version = ps.push(grads, base=version, pull_since=version).pull.version
        collector = Collector(group.root.endpoint, None, interval=0.2)
        collector._publish(collector_stats(group.root.endpoint))
        rows = collector.snapshot()["shards"]
        assert [(r["shard"], r["updates"]) for r in rows] == [(0, 5), (1, 5), (2, 5)]
        with (
            dashboard(group.root.endpoint, tmp_path / "none.jsonl") as url,
            chromium_page(url) as tools,
        ):
            read = """JSON.stringify([...document.querySelectorAll("#shards tbody tr")]
                .map(tr => Object.fromEntries([...tr.children]
                    .map(td => [td.dataset.key, td.dataset.value]))))"""
            deadline = time.monotonic() + 60
            while not (shown := json.loads(tools.evaluate(read) or "[]")):
                assert time.monotonic() < deadline, "the page shows no shard rows"
                time.sleep(0.3)
        assert [int(r["shard"]) for r in shown] == [0, 1, 2]
        assert all(int(r["updates"]) == 5 for r in shown)


def collector_stats(address: str) -> dict:
    with PSClient(address, groups=GROUPS, timeout=30) as operator:
        return operator.stats()


def test_the_planner_counts_k_links(tmp_path):
    """Under --netem each shard has a link of its own (minips.run.netem): a worker's share
    grows by group_gain; a worker's own link (--bandwidth) carries every shard's part."""
    model = build_model("lenet5")
    assert group_gain(model, 1) == 1.0
    assert 1.9 < group_gain(model, 2) <= 2 and 3.5 < group_gain(model, 4) <= 4
    plan = [sys.executable, "-m", "minips", "plan", "--repeats", "1", "--json"]
    rates = {}
    for link in ("--netem", "--bandwidth"):
        for servers in ("1", "4"):
            path = tmp_path / f"plan{link}{servers}.json"
            argv = [*plan, str(path), link, "100mbit", "--servers", servers]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            if link == "--netem" and servers == "4":
                assert "4 shards each behind such a link" in done.stdout
            rates[link, servers] = json.loads(path.read_text())["predicted"]["rate_bytes_per_s"]
    assert rates["--netem", "4"] == pytest.approx(rates["--netem", "1"] * group_gain(model, 4))
    assert rates["--bandwidth", "4"] == rates["--bandwidth", "1"]


def _request(relay: GroupRelay, header: dict, parts=()) -> wire.Message:
    frames = relay.handle(list(wire.encode_parts(header, list(parts))))
    return wire_checks.decode_reply(frames)


def test_the_gateway_relays_a_browser_to_a_group_as_to_one_server():
    grads = build_model("mlp").params
    with running_group(2, workers=1) as group:
        relay = GroupRelay(group.root.endpoint)
        try:
            hello = _request(relay, {"v": 1, "op": "hello", "rid": 1, "worker": "tab1"}).header
            assert hello["rank"] == 0 and "group" not in hello and hello["version"] == 0
            full = _request(
                relay, {"v": 1, "op": "pull", "rid": 2, "worker": "tab1", "since": None}
            )
            assert {n: a.shape for n, a in full.arrays.items()} == {
                n: a.shape for n, a in grads.items()
            }
            parts = [wire.WirePart(n, np.full(a.shape, 1e-3, np.float32)) for n, a in grads.items()]
            push = {"v": 1, "op": "push", "rid": 3, "worker": "tab1", "seq": 0, "base": 0}
            first = _request(relay, push, parts).header
            assert first["applied"] and first["version"] == 1 and first["staleness"] == 0
            again = _request(relay, {**push, "rid": 4}, parts).header  # a retry: applied once
            assert again["version"] == 1 and [s.store.version for s in group.servers] == [1, 1]
            changed = _request(
                relay, {"v": 1, "op": "pull", "rid": 5, "worker": "tab1", "since": 0}
            )
            assert changed.header["version"] == 1 and set(changed.arrays) == set(grads)
            stale = _request(relay, {"v": 1, "op": "push", "rid": 6, "worker": "tab1", "seq": 1,
                                     "base": 0}, parts).header  # fmt: skip
            assert stale["staleness"] == 1 and stale["version"] == 2
            unknown = [*parts[:1], wire.WirePart("nope", np.ones(2, np.float32))]
            error = _request(relay, {"v": 1, "op": "push", "rid": 7, "worker": "tab1", "seq": 2,
                                     "base": 2}, unknown)  # fmt: skip
            assert error.op == "error" and error.header["code"] == "unknown_param"
            assert error.header["rid"] == 7
        finally:
            relay.close()


@pytest.mark.slow
def test_a_headless_browser_trains_in_a_group_through_the_gateway(tmp_path):
    require_browser()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--servers", "2",
            "--workers", "2", "--browser", "1", "--browser-headless", "--listen", "127.0.0.1:0",
            "--epochs", "2", "--join-wait", "120", *FAST]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240,
                          env={**quiet_env(), "TMPDIR": str(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples"] == 2 * 2000 and [r["updates"] for r in summary["shards"]] == [64, 64]
    browser = [json.loads(p.read_text()) for p in out.glob("worker-*.json")]
    assert sorted(r.get("agent", "numpy") for r in browser) == ["browser", "numpy"]
    assert all(r["samples"] == 2000 for r in browser)


def test_every_shard_watches_the_training_loss_for_a_collapse():
    """A step's loss goes to every shard with its samples: a diverging loss is a collapse
    every shard finds (its `stats` say so), as a lone server does."""
    with running_group(2, workers=1) as group, PSClient(group.root.endpoint, groups=GROUPS) as ps:
        ps.hello()
        version = ps.pull().version
        grads = {n: np.zeros(a.shape, np.float32) for n, a in build_model("mlp").params.items()}
        for _ in range(20):  # the watch's window: 20 losses far above 10 ln 10
            reply = ps.push(grads, base=version, samples=1, pull_since=version, loss=1e6)
            version = reply.pull.version
        shards = ps.stats()["shards"]
    assert [shard["collapse"]["sign"] for shard in shards] == ["loss", "loss"], shards
