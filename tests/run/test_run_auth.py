"""An authenticated `minips run`: CURVE keys made by the launcher for its own
processes; no key or a wrong key gets nothing; a worker key cannot stop the run, an
operator key can. And `--clip-norm` from the command line to the server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from click.testing import CliRunner
from run_support import assert_clean_exits

from minips.cli.ps_cmd import server_command
from minips.guard import curve, wire_checks
from minips.protocol import wire
from minips.provision import keyfiles
from minips.run.build import make_server
from minips.run.config import RunConfig
from minips.worker.client import PSClient, ServerError, ServerUnavailable

FAST = (
    "--rule",
    "asgd",
    "--model",
    "mlp",
    "--dataset",
    "synthetic",
    "--lr",
    "0.05",
    "--momentum",
    "0.5",
)


def _start_run(out: Path, *args: str) -> subprocess.Popen:
    code = "from minips.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, "run", "--out", str(out), "--quiet", *FAST, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_until_training(out: Path, key_name: str, timeout: float = 60) -> str:
    """The run's endpoint, once its server has applied updates (asked with key `key_name`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        endpoint = (out / "endpoint").read_text().strip() if (out / "endpoint").exists() else ""
        if endpoint:  # written after the keys: the server was started with them
            keys = keyfiles.load_client_keys(out / "keys", key_name)
            with PSClient(endpoint, timeout=5, keys=keys) as operator:
                if operator.stats()["updates"] > 0:
                    return endpoint
        time.sleep(0.2)
    raise AssertionError("the run did not start training")


def _unanswered(client: PSClient) -> None:
    """Every request of `client` goes unanswered: no reply, not even an error."""
    with client:
        for call in (client.stats, client.stop, lambda: client.hello({"role": "worker"})):
            with pytest.raises(ServerUnavailable):
                call()


def _refused_as(endpoint: str, keys: curve.ClientKeys, victim: str) -> list[str]:
    """The codes a second client with `keys` gets for hello, ping, pull, a push with seq
    2^62 and bye under worker id `victim`."""
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    curve.make_curve_client(peer, keys)
    peer.connect(endpoint)
    grads = {"fc1.b": np.ones(256, np.float32)}
    requests = [({"op": "hello", "worker": victim}, None), ({"op": "ping", "worker": victim}, None),
                ({"op": "pull", "worker": victim}, None),
                ({"op": "push", "worker": victim, "seq": 2**62, "base": 0}, grads),
                ({"op": "bye", "worker": victim}, None)]  # fmt: skip
    codes = []
    try:
        for header, arrays in requests:
            peer.send_multipart(wire.encode(header, arrays))
            assert peer.poll(10_000), f"no reply to {header['op']}"
            codes.append(wire_checks.decode_reply(peer.recv_multipart()).header.get("code"))
    finally:
        peer.close()
        context.term()
    return codes


def test_an_authenticated_run_trains_and_only_its_operator_key_stops_it(tmp_path):
    out = tmp_path / "run"
    proc = _start_run(out, "--auth", "--epochs", "300")
    try:
        keys_dir = out / "keys"
        endpoint = _wait_until_training(out, keyfiles.OPERATOR)
        operator_keys = keyfiles.load_client_keys(keys_dir, keyfiles.OPERATOR)
        # No key at all, then a key pair the server never allowed (it knows the server's key).
        _unanswered(PSClient(endpoint, timeout=0.5, retries=0, worker_id="intruder"))
        keyfiles.make_keys(tmp_path / "other")
        stranger = keyfiles.load_client_keys(tmp_path / "other", keyfiles.OPERATOR)
        wrong = curve.ClientKeys(stranger.pair, operator_keys.server_public)
        _unanswered(PSClient(endpoint, timeout=0.5, retries=0, worker_id="intruder", keys=wrong))
        # A worker's key connects, but cannot stop the run.
        worker_keys = keyfiles.load_client_keys(keys_dir, keyfiles.WORKER)
        with PSClient(endpoint, timeout=5, keys=worker_keys) as worker:
            with pytest.raises(ServerError) as refused:
                worker.stop()
            assert refused.value.code == "operator"
            victims = [row["worker"] for row in worker.stats()["workers"] if row["alive"]]
        # Nor can it act as one of the run's workers, whose key it holds: a worker id is
        # bound to the connection that said hello with the key, not to the key alone.
        for victim in victims:
            assert _refused_as(endpoint, worker_keys, victim) == ["not_owner"] * 5
        with PSClient(endpoint, timeout=5, keys=operator_keys) as operator:
            stats = operator.stats()
            assert not stats["stopping"]  # nothing above changed the run
            assert "intruder" not in {row["worker"] for row in stats["workers"]}
            operator.stop()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert stdout.strip().splitlines()[-1].startswith("test accuracy: ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates"] > 0 and summary["samples"] < 300 * 2000  # stopped early
    assert_clean_exits(summary, out)
    assert json.loads((out / "config.json").read_text())["keys"] == str(keys_dir)
    workers_log = (out / "logs" / "worker.0.log").read_text()
    assert "Traceback" not in workers_log


def test_clip_norm_is_an_option_that_reaches_the_server(tmp_path):
    values = server_command().make_context("server", ["--clip-norm", "0.5"]).params
    for own in ("config_file", "endpoint_file", "updates_log", "t0", "verbose"):
        values.pop(own)
    config = RunConfig.from_options(values)
    assert config.clip_norm == 0.5 and config.server_options().clip_norm == 0.5
    assert "--clip-norm" in CliRunner().invoke(server_command(), ["--help"]).output
    # A live server built from it: a huge gradient moves the parameters by lr * 0.5 at most.
    lr = 0.1
    config = RunConfig(model="mlp", dataset="synthetic", lr=lr, momentum=0.0, clip_norm=0.5,
                       workers=1, bind="tcp://127.0.0.1:*")  # fmt: skip
    server = make_server(config)
    before = {name: value.copy() for name, value in server.store.params.items()}
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    try:
        with PSClient(server.endpoint, timeout=10) as client:
            client.hello({"role": "worker"})
            pulled = client.pull()
            huge = {name: np.full_like(value, 1e6) for name, value in pulled.params.items()}
            assert client.push(huge, base=pulled.version).applied
            client.bye()
    finally:
        server.request_stop()
        loop.join(timeout=10)
        server.close()
    moved = np.sqrt(sum(np.sum((server.store.params[n] - before[n]) ** 2) for n in before))
    assert moved == pytest.approx(lr * 0.5, rel=1e-3)
