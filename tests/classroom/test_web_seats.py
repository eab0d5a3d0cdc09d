"""Seats that follow students, in real headless Chromium against a real `minips server`
process and gateway: a tab killed mid-run and a new one opened, a reload (F5), a tab that
only looked, and the words a student reads when the class is full or has ended.
"""

import asyncio
import json

import pytest
from test_web_browser import TRAIN, _done, _final_stats
from test_web_support import Chromium, require_browser, server_process, wait_for

from minips.classroom.web.gateway import Gateway
from minips.worker.client import PSClient

pytestmark = pytest.mark.slow
EPOCHS = 3
SHARD_STEPS = 16  # synthetic: 2000 examples, a shard of 1000 in batches of 64


@pytest.fixture
def browser(tmp_path):
    require_browser()
    chromium = Chromium(tmp_path)
    yield chromium
    chromium.close()


@pytest.fixture
def gateway_for():
    from minips.classroom.web import start_gateway

    running = []

    def start(endpoint):
        running.append(start_gateway(endpoint))
        return running[-1]

    yield start
    for gateway in running:
        gateway.close()


def _server_args(tmp_path, workers: int, epochs: int = EPOCHS) -> list[str]:
    # Heartbeat timeout 60 s: a seat that came back sooner was given back by the gateway.
    args = ["--workers", str(workers), "--rule", "asgd", "--epochs", str(epochs), *TRAIN]
    return args + ["--heartbeat-timeout", "60", "--updates-log", str(tmp_path / "updates.jsonl")]


def _text(browser, session, element: str) -> str:
    result = browser.call(
        "Runtime.evaluate",
        session,
        expression=f"document.getElementById({json.dumps(element)}).textContent",
        returnByValue=True,
    )
    return result["result"].get("value") or ""


def _rank_free(endpoint: str, rank: int) -> bool:
    """Whether no live worker holds `rank` (the server's `stats`, asked as an operator)."""
    with PSClient(endpoint, timeout=5.0) as operator:
        workers = operator.stats()["workers"]
    return not any(w["rank"] == rank and w["alive"] for w in workers)


def _crash(browser, session: str) -> None:
    """Kill the tab's renderer (DevTools Page.crash, which never answers): no bye is said."""
    browser._id += 1
    browser.ws.send(json.dumps({"id": browser._id, "method": "Page.crash", "sessionId": session}))


def test_a_killed_tab_is_replaced_by_a_new_one_on_its_rank(tmp_path, browser, gateway_for):
    with server_process(tmp_path, *_server_args(tmp_path, 2)) as endpoint:
        gateway = gateway_for(endpoint)
        (_, doomed), (_, staying) = [browser.open(gateway.url) for _ in range(2)]
        wait_for(lambda: browser.status(doomed).get("steps", 0) >= 5, 60, "steps in the tab",
                 detail=lambda: browser.status(doomed))  # fmt: skip
        lost_rank = browser.status(doomed)["rank"]
        _crash(browser, doomed)
        # The seat is free once the gateway saw the tab's WebSocket close and said its bye
        # (protocol.md 14.3); a tab opened before that is told the class is full (a loaded
        # gateway sees the close late), so the new tab comes once the server freed the rank.
        wait_for(lambda: _rank_free(endpoint, lost_rank), 60, "the killed tab's seat to be free")
        _, newcomer = browser.open(gateway.url)
        final = wait_for(lambda: _done(browser, newcomer), 120, "the new tab to finish")
        wait_for(lambda: _done(browser, staying), 120, "the other tab to finish")
    stats = _final_stats(tmp_path / "updates.jsonl")
    assert final["rank"] == lost_rank and final["outcome"] == "finished"
    assert final["steps"] == EPOCHS * SHARD_STEPS  # a new tab trains the shard from its start
    assert stats["samples"] >= 0.95 * EPOCHS * 2000, stats["samples"]
    assert gateway.gateway.stats.seats_given_back >= 1


def test_a_tab_reopened_before_the_gateway_freed_the_seat_waits_for_it(
    tmp_path, browser, gateway_for, monkeypatch
):
    """A loaded gateway notices a crashed tab late: its seat is given back 2 s after the new
    tab's hello. The new tab is patient with `full` for that long, and takes the seat."""
    give_back = Gateway._give_back_seat

    async def late(self, *args):
        await asyncio.sleep(2)
        await give_back(self, *args)

    monkeypatch.setattr(Gateway, "_give_back_seat", late)
    with server_process(tmp_path, *_server_args(tmp_path, 2)) as endpoint:
        gateway = gateway_for(endpoint)
        (_, doomed), (_, staying) = [browser.open(gateway.url) for _ in range(2)]
        wait_for(lambda: browser.status(doomed).get("steps", 0) >= 5, 60, "steps in the tab",
                 detail=lambda: browser.status(doomed))  # fmt: skip
        lost_rank = browser.status(doomed)["rank"]
        _crash(browser, doomed)
        _, newcomer = browser.open(gateway.url)  # at once: the seat is still taken
        final = wait_for(lambda: _done(browser, newcomer), 120, "the new tab to finish")
        wait_for(lambda: _done(browser, staying), 120, "the other tab to finish")
    assert final["rank"] == lost_rank and final["outcome"] == "finished", final


def test_a_reloaded_tab_keeps_its_rank_and_goes_on_where_it_was(tmp_path, browser, gateway_for):
    with server_process(tmp_path, *_server_args(tmp_path, 2)) as endpoint:
        gateway = gateway_for(endpoint)
        (_, reloaded), (_, other) = [browser.open(gateway.url) for _ in range(2)]
        wait_for(lambda: browser.status(reloaded).get("steps", 0) >= 10, 60, "steps in the tab")
        before = browser.status(reloaded)
        browser.call("Page.reload", reloaded)  # F5
        final = wait_for(lambda: _done(browser, reloaded), 120, "the reloaded tab to finish")
        wait_for(lambda: _done(browser, other), 120, "the other tab to finish")
    stats = _final_stats(tmp_path / "updates.jsonl")
    assert final["rank"] == before["rank"] and final["workerId"] == before["workerId"]
    assert final["outcome"] == "finished" and final["steps"] == EPOCHS * SHARD_STEPS
    # Every example of both shards trained once, plus at most the step in flight at the reload.
    assert EPOCHS * 2000 <= stats["samples"] <= EPOCHS * 2000 + 64, stats["samples"]
    hosts = {w["info"].get("host") for w in stats["workers"] if not w["observer"]}
    assert hosts == {"127.0.0.1"}  # the page's /peer: the address the gateway saw
    assert stats["updates"] - 2 * EPOCHS * SHARD_STEPS in (0, 1)


def test_a_tab_that_only_looked_holds_no_seat(tmp_path, browser, gateway_for):
    # One seat: the teacher opens the URL to check it and closes the tab; a student then
    # takes the seat and trains (before, the student was told the class was full).
    with server_process(tmp_path, *_server_args(tmp_path, 1)) as endpoint:
        gateway = gateway_for(endpoint)
        teachers, looking = browser.open(gateway.url)
        wait_for(lambda: browser.status(looking).get("rank") == 0, 60, "the look to join")
        browser.close_tab(teachers)
        _, student = browser.open(gateway.url)
        final = wait_for(lambda: _done(browser, student), 120, "the student's tab to finish")
        shown = _text(browser, student, "state")
    assert final["rank"] == 0 and final["steps"] == EPOCHS * 2 * SHARD_STEPS  # the whole set
    assert shown.startswith("done: this laptop's share is trained: final accuracy ")
    assert shown.endswith("Thank you! You can close this tab.")


def test_students_read_what_happened_and_what_to_do(tmp_path, browser, gateway_for):
    # Epochs enough that the first tab is still training when the gateway goes, however
    # long the second tab takes to open on a loaded machine (three take about 10 s).
    server = server_process(tmp_path, *_server_args(tmp_path, 1, epochs=1000))
    endpoint = server.__enter__()
    try:
        gateway = gateway_for(endpoint)
        _, first = browser.open(gateway.url)
        wait_for(lambda: browser.status(first).get("steps", 0) >= 2, 60, "the first tab training")
        _, second = browser.open(gateway.url)
        wait_for(lambda: browser.status(second).get("state") == "failed", 60, "a full class")
        assert _text(browser, second, "state") == "This class is full: every seat is taken."
        assert _text(browser, second, "error-what") == (
            "Ask your teacher for another seat, then reload this page."
        )
        assert "all 1 worker ranks are taken" in _text(browser, second, "error-details")
        gateway.close()  # the teacher's Ctrl-C: the gateway goes away mid-run
    finally:
        server.__exit__(None, None, None)
    wait_for(lambda: browser.status(first).get("state") == "failed", 60, "the first tab to stop")
    shown = _text(browser, first, "state")
    assert shown.startswith("The class has ended: the teacher's computer closed the connection.")
    assert "last test accuracy" in shown or browser.status(first).get("accuracy") is None
    assert _text(browser, first, "error-what").startswith("If your teacher says")
    page_text = _text(browser, first, "status") + _text(browser, second, "status")
    assert "server refused" not in page_text and "1001" not in page_text
