"""A request lost with its server (the process exited before answering: a crash, a kill) is
sent again as soon as the connection drops, to the server that takes the address over,
not after the client's whole reply timeout (minips.worker.drops); one server and a shard
of a group alike. The servers here are bare ROUTER sockets: one receives the request and
closes, as an exiting process does, and the next answers it."""

from __future__ import annotations

import threading
import time

import zmq

from minips.group.connections import Connection, exchange
from minips.protocol import wire
from minips.worker.client import PSClient

TIMEOUT = 10.0  # the client's reply timeout: the retry must come long before it


def _lost_then_answered(address: str, context: zmq.Context) -> float:
    """Receive one request and close without answering, then bind a new server on the same
    address and answer the retry; return the seconds from the close to the retry."""
    first = context.socket(zmq.ROUTER)
    first.bind(address)
    assert first.poll(5000), "the request never came"
    first.recv_multipart()
    first.close(linger=0)  # the server exits with the request unanswered
    closed = time.monotonic()
    second = context.socket(zmq.ROUTER)
    second.bind(address)
    try:
        assert second.poll(int(TIMEOUT * 1000)), "no retry"
        retried = time.monotonic() - closed
        identity, *body = second.recv_multipart()
        request = wire.decode_request(body)
        header = {"op": request.op, "rid": request.header["rid"], "version": 0, "stop": False}
        second.send_multipart([identity, *wire.encode_parts(header, [])])
        time.sleep(0.2)  # the reply leaves before the socket closes
    finally:
        second.close(linger=0)
    return retried


def test_a_ping_lost_with_its_server_is_sent_again_when_the_connection_drops(tmp_path):
    address = f"ipc://{tmp_path}/server.sock"
    context = zmq.Context()
    answers: list[bool] = []
    with PSClient(address, timeout=TIMEOUT, retries=3) as client:
        asking = threading.Thread(target=lambda: answers.append(client.ping()))
        asking.start()
        retried = _lost_then_answered(address, context)
        asking.join(TIMEOUT)
    context.term()
    assert answers == [False]
    assert retried < TIMEOUT / 2, f"the retry came {retried:.1f} s after the drop"


def test_a_shards_request_lost_with_it_is_sent_again_when_the_connection_drops(tmp_path):
    address = f"ipc://{tmp_path}/shard.sock"
    context = zmq.Context()
    connection = Connection(context, address, b"\x01" + bytes(15), wire.DEFAULT_LIMITS)
    replies: list[dict] = []
    request = ({"op": "ping", "worker": "w"}, [])
    asking = threading.Thread(
        target=lambda: replies.append(exchange([connection], {0: request}, TIMEOUT, 3))
    )
    asking.start()
    retried = _lost_then_answered(address, context)
    asking.join(TIMEOUT)
    connection.abandon()
    context.term()
    assert [r[0].op for r in replies] == ["ping"]
    assert retried < TIMEOUT / 2, f"the retry came {retried:.1f} s after the drop"
