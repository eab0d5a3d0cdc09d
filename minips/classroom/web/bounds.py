"""What one WebSocket may hold (docs/protocol.md 14.4): the size of one message, derived
from the model, and its share of the gateway's memory budget.

A browser's largest legitimate message is a push of the model's gradients: the dense
float32 step is D = 4 x (the model's parameter count) bytes (1.7 MB for LeNet-5), a
top-k step at ratio 1 twice that, VSGD's samples at most D more. So once the server's
`hello` reply has named the model (its `config.model`), a message may hold

    bound = BOUND_FACTOR x D + HEADER_ROOM      (BOUND_FACTOR = 4)

HEADER_ROOM being one header frame of the protocol's limit (section 10) and the framing
of the most frames a message may have (14.2). Before that reply, a browser sends only
headers (hello, or an operator's stats), so a message may hold HEADER_ROOM. A model the
gateway cannot build (not one of the zoo's) leaves the protocol's whole-message limit.
A message over the bound is refused by the `websockets` library when the frame that takes
it over begins (close code 1009, with a reason), before that frame is buffered.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from minips.classroom.web.admission import CLOSE_MEMORY, MemoryBudget
from minips.classroom.web.framing import MAX_FRAMES
from minips.classroom.web.keepalive import PatientKeepalive
from minips.classroom.web.seats import peek_header
from minips.protocol.wire import DEFAULT_LIMITS

try:  # the optional extra: pip install 'minips[web]'
    from websockets.exceptions import PayloadTooBig
    from websockets.protocol import State
except ImportError:  # pragma: no cover - reported by gateway.check_installed()
    pass

log = logging.getLogger("minips.classroom.web")

BOUND_FACTOR = 4
HEADER_ROOM = DEFAULT_LIMITS.max_header_bytes + 4 + 4 * MAX_FRAMES
# The protocol's own limit: a whole message (section 10) and one header.
MAX_WS_MESSAGE = DEFAULT_LIMITS.max_message_bytes + DEFAULT_LIMITS.max_header_bytes


def dense_bytes(spec: Any) -> int | None:
    """D: the bytes of one float32 copy of the parameters of the zoo model `spec` (hello's
    `config.model`); None for a model the zoo cannot build."""
    from minips.errors import MinipsError
    from minips.group.fanout import model_shapes

    try:
        shapes = model_shapes(spec)
    except (MinipsError, KeyError, TypeError, ValueError):
        return None
    return 4 * sum(math.prod(shape) for shape in shapes.values())


def message_bound(spec: Any) -> int:
    """The largest WebSocket message (bytes) a browser training the model `spec` may send."""
    dense = dense_bytes(spec)
    if dense is None:
        log.warning("the gateway does not know the model %r: messages are bounded by the "
                    "protocol's limit, %d bytes", spec, MAX_WS_MESSAGE)  # fmt: skip
        return MAX_WS_MESSAGE
    return BOUND_FACTOR * dense + HEADER_ROOM


class MessageBounds:
    """The bound of each model the gateway has seen (computed once: building a model
    takes a while), by its spec."""

    def __init__(self) -> None:
        self._known: dict[str, int] = {}

    def known(self, spec: Any) -> int | None:
        """The bound of `spec` if it was computed before (None: call `of`)."""
        return self._known.get(json.dumps(spec, sort_keys=True, default=str))

    def of(self, spec: Any) -> int:
        """The bound of `spec`, computed the first time (building the model: slow)."""
        key = json.dumps(spec, sort_keys=True, default=str)
        if key not in self._known:
            self._known[key] = message_bound(spec)
        return self._known[key]


class BoundedConnection(PatientKeepalive):
    """A WebSocket within the gateway's bounds: each message within the model's bound
    (`bound_to`, once a hello reply named the model), and its received bytes counted
    against the gateway's MemoryBudget: what arrives is taken from it, a relayed message
    gives its bytes back (`release`), and so does closing; the WebSocket whose bytes would
    pass the budget is closed (1009).
    """

    memory: MemoryBudget  # set by Gateway.serve on a subclass, with
    refusals: list[str]  # where the gateway counts why it closed connections

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.sized = False  # its bound is the model's (a hello reply has come)
        self.too_big = False  # a message over the bound was refused

    def hello_config(self, header_frame: bytes | memoryview) -> dict[str, Any] | None:
        """The run's `config` if the reply whose first frame is `header_frame` is a hello's
        and this WebSocket still has no model's bound (None: nothing to do)."""
        if self.sized:
            return None
        header = peek_header(header_frame)
        config = header.get("config") if header.get("op") == "hello" else None
        return config if isinstance(config, dict) else None

    def bound_to(self, size: int) -> None:
        """From now on, a message on this WebSocket may hold `size` bytes."""
        self.protocol.max_message_size = size
        self.sized = True

    def data_received(self, data: bytes) -> None:
        if self.protocol.state is State.OPEN:
            if self.memory.take(len(data)):
                self.in_flight += len(data)
            else:  # close now; the closing protocol discards whatever else arrives
                reason = self.memory.refusal()
                log.warning("closing browser %s: %s", self.remote_address, reason)
                self.refusals.append(reason)
                self.protocol.fail(CLOSE_MEMORY, reason[:120])
                self._drop_refused()
                data = b""
        super().data_received(data)
        if isinstance(self.protocol.parser_exc, PayloadTooBig) and not self.too_big:
            self._refused_too_big(self.protocol.parser_exc)

    def _refused_too_big(self, exc: PayloadTooBig) -> None:
        """The library refused a message over the bound (and closed, 1009, saying why):
        counted and logged once, as the gateway's other refusals."""
        self.too_big = True
        reason = f"a message over this WebSocket's bound of {exc.max_size} bytes"
        log.warning("closing browser %s: %s", self.remote_address, reason)
        self.refusals.append(reason)
        exc.with_traceback(None)  # its traceback holds the parser, and the last frame read
        self._drop_refused()

    def _drop_refused(self) -> None:
        """Let go of the message being refused now: its fragments received so far (up to
        the bound) would otherwise wait, with its budget, until the TCP connection is gone,
        which takes reading and discarding all the browser still had in flight (seconds
        for a slow gateway). A whole message received before it is still relayed."""
        self.recv_messages.close()
        self.release(self.in_flight)

    def release(self, n: int) -> None:
        """Give back `n` bytes (a relayed message and its frame header) to the budget."""
        n = min(n, self.in_flight)
        self.in_flight -= n
        self.memory.give_back(n)

    def connection_lost(self, exc: Exception | None) -> None:
        self.release(self.in_flight)
        super().connection_lost(exc)
