"""Addresses are checked before any socket sees them; bind errors are one line with the fix.
The core takes an address as given: the server's and the client's builders check it."""

from __future__ import annotations

import logging
import socket

import pytest
import zmq
from test_server_support import make_params

import minips
from minips.guard.addresses import (
    AddressError,
    bind,
    is_loopback,
    normalize_bind,
    normalize_connect,
    still_listening,
)
from minips.state.store import SGD
from minips.worker.client import PSClient as CoreClient


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:5555", "tcp://127.0.0.1:5555"),
        ("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5555"),
        ("localhost:80", "tcp://localhost:80"),
        ("[::1]:5555", "tcp://[::1]:5555"),
        ("ipc:///tmp/minips.sock", "ipc:///tmp/minips.sock"),
    ],
)
def test_connect_addresses_are_normalized(given, expected):
    assert normalize_connect(given) == expected


@pytest.mark.parametrize(
    ("given", "words"),
    [
        ("127.0.0.1", "needs a host and a port"),
        ("udp://127.0.0.1:5", "transport must be"),
        ("127.0.0.1:0", "not a port number"),
        ("127.0.0.1:70000", "not a port number"),
        ("127.0.0.1:*", "not a port number"),  # a client cannot connect to "any port"
        ("tcp://no-such-host.invalid:5555", "cannot resolve host 'no-such-host.invalid'"),
    ],
)
def test_bad_connect_addresses_are_one_line_errors(given, words):
    with pytest.raises(AddressError, match=words) as info:
        normalize_connect(given)
    assert "\n" not in str(info.value)


def test_bind_accepts_wildcards():
    assert normalize_bind("127.0.0.1:*") == "tcp://127.0.0.1:*"
    assert normalize_bind("*:5555") == "tcp://*:5555"


def test_loopback_is_recognised():
    assert is_loopback("tcp://127.0.0.1:5") and is_loopback("tcp://[::1]:5")
    assert is_loopback("ipc:///tmp/x") and is_loopback("tcp://localhost:5")
    assert not is_loopback("tcp://*:5") and not is_loopback("tcp://0.0.0.0:5")


def test_bind_errors_say_what_to_do():
    context = zmq.Context()
    first, second = context.socket(zmq.ROUTER), context.socket(zmq.ROUTER)
    try:
        endpoint = bind(first, "tcp://127.0.0.1:*")
        with pytest.raises(AddressError, match="already in use.*another port"):
            bind(second, endpoint)
        with pytest.raises(AddressError, match="not an address of this machine"):
            bind(second, "tcp://192.0.2.1:5555")  # TEST-NET-1: never local
    finally:
        first.close(0)
        second.close(0)
        context.term()


def test_the_public_client_checks_its_address_and_the_core_takes_it_as_given():
    with pytest.raises(AddressError, match="'nonsense' needs a host and a port"):
        minips.PSClient("nonsense")
    with minips.PSClient("127.0.0.1:9") as public, CoreClient("tcp://127.0.0.1:9") as core:
        assert public.address == core.address == "tcp://127.0.0.1:9"


def test_the_usual_server_operations_check_bind_and_warn_off_loopback(caplog):
    params = make_params()
    with caplog.at_level(logging.WARNING, logger="minips.server"):
        server = minips.ParameterServer(params, minips.make_rule("asgd"), SGD(params),
                                        minips.ServerOptions(bind="0.0.0.0:*"))  # fmt: skip
    try:
        assert server.endpoint.startswith("tcp://0.0.0.0:")
        assert f"UNAUTHENTICATED: anyone who can reach {server.endpoint}" in caplog.text
        with pytest.raises(AddressError, match="--bind 'nonsense' needs a host and a port"):
            server.ops.bind(server.socket, "nonsense")
    finally:
        server.close()


def test_a_server_refuses_an_ipc_path_a_live_server_accepts_on_and_takes_a_dead_ones(tmp_path):
    """ZeroMQ's bind of an ipc path replaces its socket file: a second server (a copied
    config's) would take a live one's address over, its new clients reaching the second."""
    where = f"ipc://{tmp_path}/server.sock"
    params = make_params()
    live = minips.ParameterServer(params, minips.make_rule("asgd"), SGD(params),
                                  minips.ServerOptions(bind=where))  # fmt: skip
    try:
        inode = (tmp_path / "server.sock").stat().st_ino
        assert still_listening(where)
        other = make_params()
        with pytest.raises(AddressError) as refused:  # (closed, should it bind)
            minips.ParameterServer(other, minips.make_rule("asgd"), SGD(other),
                                   minips.ServerOptions(bind=where)).close()  # fmt: skip
        assert str(refused.value) == (f"--bind {where} is in use by a live server: stop it "
                                      "first, or bind another address")  # fmt: skip
        assert (tmp_path / "server.sock").stat().st_ino == inode  # its file left in place
    finally:
        live.close()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a dead server's file
    stale.bind(str(tmp_path / "dead.sock"))
    stale.close()
    assert not still_listening(f"ipc://{tmp_path}/dead.sock")
    dead = f"ipc://{tmp_path}/dead.sock"
    again = minips.ParameterServer(params, minips.make_rule("asgd"), SGD(params),
                                   minips.ServerOptions(bind=dead))  # fmt: skip
    again.close()
