"""The evaluator (minips/results/evaluator.py) leaves the run it watched: also when it is
interrupted while its hello's reply is read (the server registered it already)."""

from __future__ import annotations

import pytest
from test_server_support import InterruptedAfterFirstReplyFrame, running_server

from minips.results.evaluator import run_evaluator
from minips.results.metrics import MetricsLog
from minips.worker.client import PSClient


def test_an_evaluator_interrupted_while_its_hello_is_answered_says_bye(tmp_path):
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with PSClient(server.endpoint, timeout=5, retries=0) as client:
            client._socket = InterruptedAfterFirstReplyFrame(client._connect())
            with MetricsLog(tmp_path / "eval.jsonl") as metrics, pytest.raises(KeyboardInterrupt):
                run_evaluator(client, metrics)
            assert server.membership.observers_seen == 1  # the hello reached the server
            rows = {row["worker"]: row for row in client.stats()["workers"]}
        assert not rows[client.worker_id]["alive"], rows
