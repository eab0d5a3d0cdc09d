"""A worker or an evaluator sent SIGTERM (the launcher stopping its run, `kill`, a
scheduler) says bye before it ends, as on Ctrl-C (minips.cli.terminate): the server's
table shows it gone at once, not alive until its heartbeat timeout, so a stopping server
does not wait out its grace for it. It still ends by SIGTERM. Real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq
from test_server_support import (
    InterruptedAfterFirstFrame,
    InterruptedAfterFirstReplyFrame,
    make_params,
    running_server,
    worker_rows,
)
from test_web_support import server_process

from minips.worker.client import PSClient

SERVER = ("--model", "mlp", "--dataset", "synthetic", "--epochs", "500", "--workers", "1")


def _rows(endpoint: str) -> list[dict]:
    with PSClient(endpoint, timeout=10, retries=1) as operator:
        return operator.stats()["workers"]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_a_worker_and_an_evaluator_sent_sigterm_say_bye(tmp_path):
    with server_process(tmp_path, *SERVER) as endpoint:
        clients = [
            subprocess.Popen([sys.executable, "-m", "minips", *argv, "--connect", endpoint],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for argv in (["worker", "--quiet"],
                         ["evaluate", "--metrics", str(tmp_path / "eval.jsonl")])
        ]  # fmt: skip
        try:
            evals = tmp_path / "eval.jsonl"  # each in its loop: training, testing
            _wait(lambda: evals.exists() and evals.read_text().strip(), 60, "a test")
            _wait(lambda: any(r["pushes"] >= 3 for r in _rows(endpoint)), 60, "training")
            said = []
            for proc in clients:
                proc.send_signal(signal.SIGTERM)
                said.append(proc.communicate(timeout=30)[1])
                assert proc.returncode == -signal.SIGTERM, proc.args
            # the server reads the byes when it is scheduled; within 20 s, less than the
            # heartbeat timeout (30 s), only a bye it got marks a worker gone
            deadline = time.monotonic() + 20
            while [r["alive"] for r in _rows(endpoint)] != [False, False]:
                assert time.monotonic() < deadline, (_rows(endpoint), said)
                time.sleep(0.1)
        finally:
            for proc in clients:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()


def test_a_bye_after_a_push_interrupted_between_its_frames_reaches_the_server():
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with PSClient(server.endpoint, timeout=5, retries=0) as client:
            client.hello()
            sock = client._connect()
            client._socket = InterruptedAfterFirstFrame(sock)
            grads = {name: np.zeros_like(a) for name, a in make_params().items()}
            with pytest.raises(KeyboardInterrupt):
                client.push(grads, base=0)
            client.bye(finished=False)  # what the worker says on its way out
            rows = worker_rows(client)
        assert not rows[client.worker_id]["alive"], rows
        assert server.store.version == 0  # the half push applied nothing


def test_a_bye_after_a_pull_reply_interrupted_between_its_frames_reaches_the_server():
    """The rest of a reply whose first frame an interrupt lost is not read as the bye's
    reply (it would be garbage, and the bye lost with the socket): the interrupted socket
    is closed, the bye goes on a new one."""
    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with PSClient(server.endpoint, timeout=5, retries=0) as client:
            client.hello()
            client._socket = InterruptedAfterFirstReplyFrame(client._connect())
            with pytest.raises(KeyboardInterrupt):
                client.pull()  # its reply: a header and one frame per parameter
            client.bye(finished=False)
            rows = worker_rows(client)
        assert not rows[client.worker_id]["alive"], rows


def test_a_worker_interrupted_while_its_hello_is_answered_says_bye():
    """Ctrl-C while the hello's reply is read: the server registered the worker, which
    never learnt its rank; it says bye all the same, so no ghost holds a rank."""
    from minips.cli.client_cmd import _train_worker

    with running_server(rule="asgd", heartbeat_timeout=60.0) as server:
        with PSClient(server.endpoint, timeout=5, retries=0) as client:
            client._socket = InterruptedAfterFirstReplyFrame(client._connect())
            with pytest.raises(KeyboardInterrupt):
                _train_worker(client, None, None, None, None, quiet=True)
            assert client.rank is None  # the reply was lost
            rows = worker_rows(client)
        assert [row["alive"] for row in rows.values() if row["worker"] == client.worker_id] == [
            False
        ], rows


def test_closing_a_client_with_a_socket_a_ctrl_c_left_half_made_does_not_hang():
    """pyzmq's `Context.socket` makes the socket, then records it: a Ctrl-C between the two
    leaves a socket `destroy` cannot close, and `term` would wait for it forever (a launcher
    stopping its run hung there). A socket made outside `Context.socket` is such a one."""
    client = PSClient("tcp://127.0.0.1:1", timeout=0.2, retries=0)
    half_made = zmq.Socket(client._context, zmq.DEALER)
    closer = threading.Thread(target=client.close, daemon=True)
    start = time.monotonic()
    closer.start()
    closer.join(10)
    try:
        assert not closer.is_alive(), "close() waits for a socket it cannot close"
        assert time.monotonic() - start < 5
    finally:
        half_made.close(linger=0)  # the context's own end then finishes
