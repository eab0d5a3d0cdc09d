"""`minips keys` and CURVE: key files (provision/keyfiles.py), the allow-list (guard/curve.py),
the sender's key on each frame (protocol/auth.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import zmq

from minips.guard import curve
from minips.ops.server_ops import ServerOps
from minips.protocol import auth
from minips.provision import keyfiles


def test_keys_command_writes_a_key_directory(tmp_path):
    result = subprocess.run([sys.executable, "-m", "minips", "keys", str(tmp_path / "k")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    server = keyfiles.load_server_keys(tmp_path / "k")
    worker = keyfiles.load_client_keys(tmp_path / "k", "worker")
    operator = keyfiles.load_client_keys(tmp_path / "k", "operator")
    assert worker.server_public == server.pair.public
    assert {worker.pair.public, operator.pair.public} == server.allowed
    assert server.operators == {operator.pair.public}
    assert (tmp_path / "k" / "worker.key_secret").stat().st_mode & 0o077 == 0
    again = subprocess.run([sys.executable, "-m", "minips", "keys", str(tmp_path / "k")],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode == 2 and again.stderr.startswith("error: key files already exist")


def test_missing_keys_are_one_line_errors(tmp_path):
    with pytest.raises(keyfiles.AuthError, match="no secret key file"):
        keyfiles.load_server_keys(tmp_path)
    keyfiles.make_keys(tmp_path, clients=("w1",), operators=())
    with pytest.raises(keyfiles.AuthError, match="no secret key file .*operator.key_secret"):
        keyfiles.load_client_keys(tmp_path, "operator")


def test_a_client_named_server_is_refused_and_nothing_is_written(tmp_path):
    """A client `server` would overwrite the server's key pair (and be allowed in with it)."""
    with pytest.raises(keyfiles.AuthError, match="cannot name key files"):
        keyfiles.make_keys(tmp_path, clients=("worker", "server"), operators=())
    assert list(tmp_path.iterdir()) == []
    keyfiles.check_client_names(("worker", "server2", "my.server"))  # only the exact name clashes


def test_only_allowed_keys_get_through_and_carry_their_key(tmp_path):
    keyfiles.make_keys(tmp_path, clients=("worker", "operator", "banned"))
    (tmp_path / "allowed" / "banned.key").unlink()
    keys = keyfiles.load_server_keys(tmp_path)
    context = zmq.Context()
    gatekeeper = curve.start_gatekeeper(context, keys)
    sockets = []
    try:
        server = context.socket(zmq.ROUTER)
        sockets.append(server)
        curve.make_curve_server(server, keys)
        server.bind("tcp://127.0.0.1:*")
        endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)

        def client(name: str | None) -> zmq.Socket:
            sock = context.socket(zmq.DEALER)
            sockets.append(sock)
            if name is not None:
                curve.make_curve_client(sock, keyfiles.load_client_keys(tmp_path, name))
            sock.connect(endpoint)
            sock.send(name.encode() if name else b"plain")
            return sock

        client("banned"), client(None), client("worker")
        frames = server.recv_multipart(copy=False)
        assert frames[-1].bytes == b"worker"  # the only one that got through
        assert auth.sender_key(frames[-1]) == keyfiles.load_pair(tmp_path / "worker.key").public
        assert not server.poll(300)  # the banned key and the plain client sent nothing
    finally:
        for sock in sockets:
            sock.close(0)
        gatekeeper.stop()
        context.term()


def test_the_start_line_says_whether_the_server_is_authenticated(tmp_path, caplog):
    import logging

    from minips.rules import make_rule
    from minips.server.server import ParameterServer, ServerOptions
    from minips.state.store import SGD

    keyfiles.make_keys(tmp_path, clients=("worker", "operator"))
    lines = {}
    for name, keys in (("open", None), ("keyed", keyfiles.load_server_keys(tmp_path))):
        params = {"w": np.zeros((2, 2), np.float32)}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="minips.server"):
            options = ServerOptions(bind="tcp://127.0.0.1:*", keys=keys)
            server = ParameterServer(params, make_rule("asgd"), SGD(params), options,
                                     operations=ServerOps)  # fmt: skip
            server.close()
        lines[name] = next(r.getMessage() for r in caplog.records if "serving" in r.getMessage())
    assert "authenticated" not in lines["open"]
    assert lines["keyed"].endswith("authenticated (CURVE keys)"), lines


def test_the_core_sockets_are_secured_by_the_keys_they_are_given(tmp_path):
    """The core asks only `keys.secure(...)`: a server's keys start the gatekeeper and make
    its ROUTER a CURVE server; a client's make its DEALER a client of that server."""
    from minips.ops import request_checks
    from minips.server.router import open_router

    keyfiles.make_keys(tmp_path)
    keys, worker = keyfiles.load_server_keys(tmp_path), keyfiles.load_client_keys(tmp_path)
    context = zmq.Context()
    router, gatekeeper = open_router(context, keys)
    dealer = context.socket(zmq.DEALER)
    try:
        assert router.curve_server and gatekeeper is not None
        router.bind("tcp://127.0.0.1:*")
        worker.secure(dealer)
        dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
        dealer.send(b"hello")
        assert router.poll(10_000)
        frames = router.recv_multipart(copy=False)
        assert auth.sender_key(frames[-1]) == worker.pair.public
        plain, none = open_router(context, None)
        is_plain = not plain.curve_server
        plain.close(0)
        assert none is None and is_plain  # no keys: a plain socket, no gatekeeper
    finally:
        dealer.close(0)
        router.close(0)
        gatekeeper.stop()
        context.term()
    assert request_checks.require_operator is curve.require_operator  # the server's check
