"""The gateway's keepalive (minips.classroom.web.keepalive) on a real gateway and a raw
socket speaking WebSocket by hand, so the test decides exactly when each byte is sent and
whether a ping is ever answered."""

import base64
import os
import socket
import time

import msgpack
import pytest
from test_server_support import running_server

from minips.classroom.web.admission import Admission
from minips.classroom.web.framing import pack_frames, unpack_frames

pytest.importorskip("websockets")

from minips.classroom.web import start_gateway  # noqa: E402

QUICK = Admission(ping_interval=0.5, ping_timeout=1.0)  # gone 1.5 s after its last byte
BINARY, CLOSE, PING = 0x2, 0x8, 0x9


def _handshake(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(1)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def _binary_frame(payload: bytes) -> bytes:
    """One final binary frame from a client, masked with the all-zero key (the payload as is)."""
    n = len(payload)
    if n < 126:
        length = bytes([0x80 | n])
    elif n < 1 << 16:
        length = bytes([0x80 | 126]) + n.to_bytes(2, "big")
    else:
        length = bytes([0x80 | 127]) + n.to_bytes(8, "big")
    return bytes([0x80 | BINARY]) + length + b"\x00" * 4 + payload


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _next_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The next frame from the gateway (unmasked): its opcode and payload."""
    head = _exactly(sock, 2)
    n = head[1] & 0x7F
    if n >= 126:
        n = int.from_bytes(_exactly(sock, 2 if n == 126 else 8), "big")
    return head[0] & 0x0F, _exactly(sock, n)


def _first_frame_not_a_ping(sock: socket.socket) -> tuple[int, bytes]:
    while True:
        opcode, payload = _next_frame(sock)
        if opcode != PING:
            return opcode, payload


def test_a_browser_uploading_a_message_slowly_is_kept_though_its_pong_waits_behind_it():
    # The message takes 4 s, past ping interval + timeout (1.5 s), and the pings are only
    # read after it, as a browser's pong can only follow the message it is sending.
    message = pack_frames([msgpack.packb({"v": 1, "op": "stats", "rid": 1, "pad": "x" * 40_000})])
    frame = _binary_frame(message)
    with running_server() as server, start_gateway(server.endpoint, admission=QUICK) as gw:
        sock = _handshake(gw.url)
        try:
            pieces = [frame[i : i + 1024] for i in range(0, len(frame), 1024)]
            pause = 4.0 / len(pieces)
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(pause)
            opcode, payload = _first_frame_not_a_ping(sock)
        finally:
            sock.close()
    assert opcode == BINARY, (opcode, payload[:2])
    assert msgpack.unpackb(unpack_frames(payload)[0])["op"] == "stats"


def test_a_browser_that_sends_nothing_is_closed_within_interval_and_timeout():
    with running_server() as server, start_gateway(server.endpoint, admission=QUICK) as gw:
        sock = _handshake(gw.url)
        try:
            started = time.monotonic()
            opcode, payload = _first_frame_not_a_ping(sock)  # never answered
            waited = time.monotonic() - started
        finally:
            sock.close()
    assert opcode == CLOSE and int.from_bytes(payload[:2], "big") == 1011, (opcode, payload)
    assert waited >= QUICK.ping_interval + QUICK.ping_timeout - 0.1
