"""The gateway's limits at the limit and one past it, and each form of what it reads.

The memory bound is met through a real gateway and server: one message whose WebSocket
bytes are exactly the bound is relayed, one byte more closes that WebSocket (1009). The
admission settings, the `Origin` forms and what a seat reads of a browser's messages are
checked on their own (minips.classroom.web.admission, minips.classroom.web.seats), in every form a
browser or another program may send.
"""

import msgpack
import pytest
from test_server_support import running_server

from minips.classroom.web.admission import FRAME_OVERHEAD, Admission, MemoryBudget
from minips.classroom.web.framing import pack_frames, unpack_frames
from minips.classroom.web.seats import GATEWAY_RID, Seat
from minips.errors import ConfigError

websockets = pytest.importorskip(
    "websockets", reason="websockets not installed: pip install '.[web]'"
)
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from minips.classroom.web import start_gateway  # noqa: E402

MiB = 1 << 20


def test_the_memory_budget_at_and_past_its_limit():
    budget = MemoryBudget(100)
    assert budget.take(60) and budget.take(40)  # exactly the limit
    assert not budget.take(1) and budget.held == 100
    budget.give_back(40)
    assert budget.take(40) and budget.peak == 100


def _one_message(gw, payload_bytes: int):
    """Send one binary message of `payload_bytes` (a minips framing of one frame) on a fresh
    WebSocket: the reply's header, or the close code."""
    body = b"\x00" * (payload_bytes - len(pack_frames([b""])))
    message = pack_frames([body])
    assert len(message) == payload_bytes
    with connect(gw.url.replace("http", "ws") + "ws", max_size=None) as ws:
        ws.send(message)
        try:
            return msgpack.unpackb(unpack_frames(ws.recv(timeout=20))[0])
        except ConnectionClosed as closed:
            return closed.rcvd.code


def test_a_message_of_exactly_the_memory_bound_is_relayed_one_byte_more_is_refused():
    # A client's frame of 64 KiB or more has a 14-byte header (RFC 6455 5.2, masked): the
    # bound counts the bytes as they arrive, header included.
    with running_server() as server:
        with start_gateway(server.endpoint, admission=Admission(max_memory=MiB)) as gw:
            at = _one_message(gw, MiB - FRAME_OVERHEAD)
            assert isinstance(at, dict) and at["op"] == "error"  # the server's answer: relayed
            assert _one_message(gw, MiB - FRAME_OVERHEAD + 1) == 1009
            assert gw.gateway.budget.held == 0
            again = _one_message(gw, MiB - FRAME_OVERHEAD)  # the bound was given back
            assert isinstance(again, dict)


def test_admission_settings_at_and_past_their_minimum():
    assert Admission(max_browsers=1, max_memory=MiB).max_browsers == 1
    with pytest.raises(ConfigError, match="--max-browsers must be at least 1, got 0"):
        Admission(max_browsers=0)
    with pytest.raises(ConfigError, match="--max-memory must be at least 1 MiB"):
        Admission(max_memory=MiB - 1)
    admission = Admission(max_browsers=2)
    assert admission.full_refusal(1) is None
    assert "2 browsers connected" in admission.full_refusal(2)


@pytest.mark.parametrize(
    ("origin", "host", "let_in"),
    [
        (None, "127.0.0.1:8000", True),  # not a browser: no Origin
        ("http://127.0.0.1:8000", "127.0.0.1:8000", True),  # the page's own
        ("HTTP://LocalHost:8000/", "LOCALHOST:8000", True),  # written in capitals
        ("http://localhost:8000", "localhost:8001", False),  # another port
        ("https://127.0.0.1:8000", "127.0.0.1:8000", False),  # another scheme
        ("http://127.0.0.1:8000/page", "127.0.0.1:8000", False),  # not an origin: a path
        ("null", "127.0.0.1:8000", False),  # a file or a sandboxed page
        ("https://class.example.org", "127.0.0.1:8000", True),  # allowed (a proxy)
        ("http://127.0.0.1:8000", None, False),  # no Host: no page of its own
    ],
)
def test_each_form_of_origin(origin, host, let_in):
    admission = Admission(allow_origins=["https://Class.Example.org/"])
    assert (admission.origin_refusal(origin, host) is None) is let_in


def test_an_allowed_origin_must_be_an_origin():
    for bad in ("class.example.org", "ftp://x.org", "https://x.org/class", "https://"):
        with pytest.raises(ConfigError, match="--allow-origin wants an origin"):
            Admission(allow_origins=[bad])


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_the_methods_answered(method):
    assert Admission().method_refusal(method) is None


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "get"])
def test_the_methods_refused(method):
    assert "answers GET and HEAD only" in Admission().method_refusal(method)


def _frames(header: dict) -> list[memoryview]:
    return [memoryview(msgpack.packb({"v": 1, **header}))]


def _goodbye(seat: Seat) -> dict | None:
    frame = seat.goodbye()
    return None if frame is None else msgpack.unpackb(frame)


def test_a_seat_gives_back_a_worker_that_said_hello_and_not_bye():
    seat = Seat()
    assert _goodbye(seat) is None  # no hello: nothing to give back
    seat.watch(_frames({"op": "hello", "worker": "tab-1", "info": {"pad": "x" * 900}}))
    assert _goodbye(seat) == {"v": 1, "op": "bye", "rid": GATEWAY_RID, "worker": "tab-1",
                              "finished": False}  # fmt: skip
    seat.watch(_frames({"op": "bye", "worker": "someone-else"}))
    assert _goodbye(seat)["worker"] == "tab-1"  # another id's bye is not this seat's
    seat.watch(_frames({"op": "bye", "worker": "tab-1"}))
    assert _goodbye(seat) is None  # it said bye itself
    seat.watch(_frames({"op": "hello", "worker": "tab-1"}))
    assert _goodbye(seat)["worker"] == "tab-1"  # back again: a seat again


def test_an_observer_tab_holds_no_seat_and_unreadable_messages_change_nothing():
    seat = Seat()
    seat.watch(_frames({"op": "hello", "worker": "viewer", "info": {"role": "observer"}}))
    assert _goodbye(seat) is None
    seat.watch(_frames({"op": "hello", "worker": "tab", "info": {"role": "worker"}}))
    seat.watch([memoryview(b"\xc1 not msgpack")])
    seat.watch(_frames({"op": "bye", "worker": 7}))
    assert _goodbye(seat)["worker"] == "tab"
