"""A hello reply's `group` checked before the client connects anywhere it names
(minips/group/group_checks.py): a hostile or broken server's malformed `group` is one
line naming the field, never a traceback, and no address that fails the check is tried.
A ROUTER built by hand answers every hello; the real `minips worker` and the public
`minips.PSClient` say hello to it."""

import re
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager

import pytest
import zmq

from minips.group.group_checks import checked_group
from minips.guard import wire_checks
from minips.protocol import wire
from minips.protocol.wire import ProtocolError

CONFIG = {"model": {"name": "lenet5"}, "dataset": "sample", "epochs": 1, "batch_size": 64,
          "seed": 0, "rule": {"name": "asgd"}}  # fmt: skip
HELLO = {"rank": 0, "world_size": 1, "config": CONFIG, "version": 0, "heartbeat_timeout": 10}
ROOT = "tcp://127.0.0.1:1"  # an address the checks accept (no case connects there)

# (group, the field the line names)
MALFORMED = [
    ("a string", "group"),
    ([1, 2], "group"),
    (5, "group"),
    ({"addresses": 5}, "group.servers"),
    ({"shard": 0, "addresses": [ROOT, ROOT]}, "group.servers"),
    ({"shard": 0, "servers": "2", "addresses": [ROOT, ROOT]}, "group.servers"),
    ({"shard": 0, "servers": 1, "addresses": [ROOT]}, "group.servers"),
    ({"shard": 0, "servers": True, "addresses": [ROOT]}, "group.servers"),
    ({"servers": 2, "addresses": [ROOT, ROOT]}, "group.shard"),
    ({"shard": 2, "servers": 2, "addresses": [ROOT, ROOT]}, "group.shard"),
    ({"shard": -1, "servers": 2, "addresses": [ROOT, ROOT]}, "group.shard"),
    ({"shard": 0, "servers": 2}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": 5}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": "tcp://127.0.0.1:1"}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": {"0": ROOT}}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT]}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT] * 5000}, "group.addresses"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, None]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, 5]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, ["x"]]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, "not-an-endpoint"]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, "127.0.0.1:5555"]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, "udp://127.0.0.1:1"]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, "tcp://127.0.0.1:0"]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, "tcp://h:99999"]}, "group.addresses[1]"),
    ({"shard": 0, "servers": 2, "addresses": [ROOT, " tcp://h:1"]}, "group.addresses[1]"),
    ({"shard": 1, "servers": 2, "addresses": ["", ROOT]}, "group.addresses[0]"),
    ({"shard": 1, "servers": 2, "addresses": ["ipc://", ROOT]}, "group.addresses[0]"),
]


@contextmanager
def answering_hello(group):
    """A ROUTER on a free port that answers every hello with HELLO and `group`, and every
    other request as stats carrying `group`; its address."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if router.poll(50):
                routing, *frames = router.recv_multipart()
                header = wire_checks.decode_request(frames).header
                reply = {"op": header["op"], "rid": header["rid"]}
                if header["op"] == "hello":
                    reply.update(HELLO, worker=header["worker"], group=group)
                else:  # stats, as a group's root answers an operator (16.7)
                    reply["stats"] = {"version": 0, "updates": 0, "group": group}
                router.send_multipart([routing, *wire.encode(reply)])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join()
        router.close()
        context.term()


def _worker(address: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "minips", "worker", "--connect", address, "--timeout", "2",
            "--quiet"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("group, field", MALFORMED)
def test_a_malformed_group_is_refused_naming_its_field(group, field):
    with pytest.raises(
        ProtocolError, match="^" + re.escape(f"the server's hello: {field} must be ")
    ):
        checked_group({"group": group})


@pytest.mark.parametrize("group, field", MALFORMED[::3])
def test_minips_worker_given_a_malformed_group_says_one_line(group, field):
    with answering_hello(group) as address:
        done = _worker(address)
    err = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr  # as every hello check's refusal
    assert len(err) == 1 and err[0].startswith(f"error: the server's hello: {field} must be "), err


@pytest.mark.parametrize("group, field", MALFORMED[::4])
def test_the_public_client_given_a_malformed_group_raises_one_line(group, field):
    from minips import PSClient

    with answering_hello(group) as address, PSClient(address, timeout=2.0) as client:
        with pytest.raises(
            ProtocolError, match="^" + re.escape(f"the server's hello: {field} must be ")
        ):
            client.hello()


def test_no_address_of_a_refused_group_is_connected_to():
    """The shard's address is well formed, the group is not (3 servers, 2 addresses): the
    listener there sees no connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(1.0)
    shard = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    try:
        for group in ({"shard": 0, "servers": 3, "addresses": [ROOT, shard]},
                      {"shard": 1, "servers": 2, "addresses": [shard, "x"]}):  # fmt: skip
            with answering_hello(group) as address:
                done = _worker(address)
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
            with pytest.raises(TimeoutError):
                listener.accept()
    finally:
        listener.close()


@pytest.mark.parametrize("group, field", MALFORMED[2::4])  # no nil address among them
def test_an_operators_stats_given_a_malformed_group_raises_one_line(group, field):
    from minips import PSClient

    with answering_hello(group) as address, PSClient(address, timeout=2.0) as client:
        with pytest.raises(
            ProtocolError, match="^" + re.escape(f"the server's stats: {field} must be ")
        ):
            client.stats()


def test_an_operator_takes_a_shard_not_joined_yet_as_nil():
    from minips import PSClient

    group = {"shard": 0, "servers": 2, "addresses": [ROOT, None]}
    with answering_hello(group) as address, PSClient(address, timeout=2.0) as client:
        assert client.stats()["shards"] == [{"version": 0, "updates": 0, "group": group}, None]
    with pytest.raises(ProtocolError, match=re.escape("group.addresses[1] must be an address")):
        checked_group({"group": group})  # a hello's group names every shard
