"""The gateway in front of a server group (docs/protocol.md 14.5): many tabs under ssgd
complete every round (a tab's request held at the barrier holds only its own seat), and a
tab's retried push is applied once on every shard."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from group_support import running_group
from test_web_support import quiet_env, require_browser, wait_for

websockets = pytest.importorskip(
    "websockets", reason="websockets not installed: pip install '.[web]'"
)
from web_tabs import Tab, ssgd_rounds, ws_url  # noqa: E402

from minips.classroom.web import start_gateway  # noqa: E402
from minips.classroom.web.grouprelay import GroupRelay  # noqa: E402
from minips.guard import wire_checks  # noqa: E402
from minips.nn import build_model  # noqa: E402
from minips.protocol import wire  # noqa: E402

GRADS = {name: np.full(a.shape, 1e-3, np.float32) for name, a in build_model("mlp").params.items()}


@pytest.mark.parametrize("tabs", [8, 24])
def test_tabs_complete_every_ssgd_round_against_a_two_shard_group(tabs):
    # Each tab's push waits at both shards' barrier until every tab pushed: the gateway
    # must hold `tabs` requests at once without running out of threads.
    rounds = 3
    with running_group(2, workers=tabs, rule="ssgd", heartbeat_timeout=60.0) as group:
        with start_gateway(group.root.endpoint) as gateway:
            done = asyncio.run(ssgd_rounds(ws_url(gateway.url), tabs, rounds, GRADS, timeout=15))
        assert [s.store.version for s in group.servers] == [rounds, rounds]
    assert len(done) == rounds and done[-1] < 15 * rounds, done


def _frames(header: dict, grads=None) -> list:
    parts = [wire.WirePart(n, g) for n, g in (grads or {}).items()]
    return list(wire.encode_parts({"v": 1, **header}, parts))


def _reply(frames) -> wire.Message | None:
    return None if frames is None else wire_checks.decode_reply([bytes(f) for f in frames])


def test_a_retried_push_is_applied_once_on_every_shard():
    # Tab a's push waits at both shards' ssgd barrier longer than the relay waits: the
    # relay gives up (the tab hears nothing) and the tab retries with the same seq, twice.
    # Tab b's push then completes the round: one update per shard, with a's gradient once.
    a_grads = {n: np.full(g.shape, 1.0, np.float32) for n, g in GRADS.items()}
    b_grads = {n: np.full(g.shape, 3.0, np.float32) for n, g in GRADS.items()}
    with running_group(2, workers=2, rule="ssgd", lr=0.1, momentum=0.0,
                       heartbeat_timeout=60.0) as group:  # fmt: skip
        start = [{n: a.copy() for n, a in s.store.params.items()} for s in group.servers]
        a, b = GroupRelay(group.root.endpoint), GroupRelay(group.root.endpoint)
        try:
            for relay, tab in ((a, "tab-a"), (b, "tab-b")):
                assert _reply(relay.handle(_frames({"op": "hello", "rid": 1, "worker": tab})))
            a.client.timeout, a.client.retries = 0.3, 0  # the relay gives up on a's pushes
            push = {"op": "push", "worker": "tab-a", "seq": 0, "base": 0, "last": True}
            for rid in (2, 3):  # held, given up on; the tab's retry: held, given up on
                assert a.handle(_frames({**push, "rid": rid}, a_grads)) is None
            b_push = {**push, "worker": "tab-b", "rid": 2}
            answered = _reply(b.handle(_frames(b_push, b_grads))).header
            assert answered["applied"] and answered["version"] == 1, answered
            a.client.timeout = 30.0  # this retry is answered: waiting for it is no verdict
            again = _reply(a.handle(_frames({**push, "rid": 4}, a_grads))).header
            assert again["applied"] and again["version"] == 1, again  # answered, not applied
            assert [s.store.version for s in group.servers] == [1, 1]
            for server, before in zip(group.servers, start, strict=True):
                for name, value in server.store.params.items():  # the mean of 1 and 3, once
                    np.testing.assert_allclose(value, before[name] - 0.1 * 2.0, rtol=1e-6)
        finally:
            a.close()
            b.close()


def test_a_retried_fused_push_is_answered_with_its_pull_half_afresh():
    with running_group(2, workers=1) as group:
        relay = GroupRelay(group.root.endpoint)
        try:
            assert _reply(relay.handle(_frames({"op": "hello", "rid": 1, "worker": "tab"})))
            push = {"op": "push", "worker": "tab", "seq": 0, "base": 0, "pull_since": None}
            first = _reply(relay.handle(_frames({**push, "rid": 2}, GRADS)))
            bytes_in = [s.ops.counters.bytes_in for s in group.servers]
            again = _reply(relay.handle(_frames({**push, "rid": 3}, GRADS)))
            # answered from the relay's memory: only the pull half went on, not the gradient
            grown = [s.ops.counters.bytes_in - before
                     for s, before in zip(group.servers, bytes_in, strict=True)]  # fmt: skip
            assert all(0 < size < 1024 for size in grown), grown  # a header; a slice: ~470 kB
            assert first.header["version"] == again.header["version"] == 1
            assert set(again.arrays) == set(first.arrays) == set(GRADS)  # its pull half
            for name, array in first.arrays.items():
                np.testing.assert_array_equal(again.arrays[name], array)
            assert [s.store.version for s in group.servers] == [1, 1]  # applied once
        finally:
            relay.close()


def test_a_tab_closed_without_bye_gives_its_seat_back_on_every_shard():
    # Heartbeat timeout 60 s: without the gateway's bye for tab b, tab a's push would wait
    # a minute at the barrier for b's.
    async def scenario(url: str) -> dict:
        a, b = await Tab(url, "tab-a", timeout=20, retries=0).open(), await Tab(url, "tab-b").open()
        try:
            await asyncio.gather(a.hello(), b.hello())
            await b.close()  # a reload: no bye from the page
            reply = await a.push(0, 0, GRADS)
            await a.request({"op": "bye"})  # a says it: nothing to give back for a
            return reply
        finally:
            await a.close()

    with running_group(2, workers=2, rule="ssgd", heartbeat_timeout=60.0) as group:
        with start_gateway(group.root.endpoint) as gateway:
            reply = asyncio.run(scenario(ws_url(gateway.url)))
            # The shards answer b's bye (releasing a's barrier) before the gateway's thread
            # returns from saying it and counts it.
            stats = gateway.gateway.stats
            wait_for(lambda: stats.seats_given_back >= 1, 10, "the gateway counting b's bye")
            assert stats.seats_given_back == 1
        assert reply["applied"] and [s.store.version for s in group.servers] == [1, 1]
        for server in group.servers:
            rows = {w["worker"]: w for w in server.stats()["workers"]}
            assert not rows["tab-b"]["alive"] and not rows["tab-b"].get("finished")


def _run_bounded(argv: list[str], timeout: float, env: dict) -> subprocess.CompletedProcess:
    """Run `argv` in a session of its own; past `timeout` s, end it and everything it
    started (servers, gateway, Chromium) and fail."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # minips run stops what it started
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
            os.killpg(proc.pid, signal.SIGKILL)  # and what did not stop
        proc.communicate()
        raise AssertionError(f"{' '.join(argv[2:4])} did not end within {timeout:g} s") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.slow
def test_eight_headless_chromium_tabs_complete_every_ssgd_round_of_a_group(tmp_path):
    # More tabs than a shared pool of 2 cores + 4 threads: each round is every tab's push,
    # held at both shards' barrier until the last one came.
    require_browser()
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "minips", "run", "--out", str(out), "--quiet", "--servers", "2",
            "--workers", "8", "--browser", "8", "--browser-headless", "--listen", "127.0.0.1:0",
            "--epochs", "1", "--join-wait", "120", "--model", "mlp", "--dataset", "synthetic",
            "--rule", "ssgd", "--lr", "0.05"]  # fmt: skip
    done = _run_bounded(argv, 300, {**quiet_env(), "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    # 2000 samples over 8 ranks of batch 64: 4 steps each, 4 rounds on each shard.
    assert summary["samples"] == 2000 and [r["updates"] for r in summary["shards"]] == [4, 4]
    workers = [json.loads(p.read_text()) for p in out.glob("worker-*.json")]
    assert len(workers) == 8 and all(w.get("agent") == "browser" for w in workers)
