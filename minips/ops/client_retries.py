"""RetryingClient: the core's PSClient (minips/worker/client.py) as users and launchers get it,
which checks its address first (minips/guard/addresses.py) and every reply
(minips/guard/wire_checks.py), says hello again when the server forgot it, waits
`first_wait` for a first reply and says in one line why nothing may answer, and warns of
a reply timeout that outlasts the server's heartbeat. minips.PSClient
(minips/run/assembly.py) is this client with a way to reach a server group.

No reply at all to a first request gets one line that says what may cause it (no server
there yet, a wrong address, CURVE keys). A ZeroMQ client cannot tell "nothing listens"
from "a server that drops our handshake": a server started with --keys silently ignores a
client without its keys, and a server without keys ignores a CURVE client. So the line
names the keys whenever they may be why.
"""

from __future__ import annotations

import logging
from typing import Any

from minips.guard.addresses import normalize_connect
from minips.guard.wire_checks import decode_reply
from minips.protocol import auth, wire
from minips.protocol.wire import Message
from minips.worker.client import PSClient
from minips.worker.replies import ServerError, ServerUnavailable

log = logging.getLogger("minips.client")


class RetryingClient(PSClient):
    """A PSClient (same arguments) that keeps its registration and explains silence; its
    address is checked and resolved first (AddressError, one line, not a silent hang).

    first_wait: s the first request waits in one attempt, then one ServerUnavailable saying
    why (None: off). A request that needs registration and meets `unknown_worker` (the
    server declared this worker dead, or restarted) says hello again with the last hello's
    info and is sent again, at most `retries` times.
    """

    def __init__(
        self,
        address: str,
        timeout: float = 5.0,
        retries: int = 3,
        *args: Any,
        first_wait: float | None = None,
        **kwargs: Any,
    ) -> None:
        if timeout <= 0 or retries < 0 or (first_wait is not None and first_wait <= 0):
            raise ValueError("timeout and first_wait must be > 0 and retries >= 0")
        # checked and resolved now: ZeroMQ would wait in silence on a bad address
        super().__init__(normalize_connect(address), timeout, retries, *args, **kwargs)
        self.first_wait = first_wait
        self._hello_info: dict[str, Any] | None = None  # set once hello succeeded
        self._first = False  # the request under way is the first one, waiting first_wait

    def _read_reply(self, frames: list[Any]) -> Message:
        """A reply's frames as a message once every check of its frames and fields passed."""
        return decode_reply(frames, self.limits)

    def hello(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """PSClient.hello, remembered for saying hello again."""
        reply = super().hello(info)
        warn_if_not_below_heartbeat(self.timeout, reply["heartbeat_timeout"])
        self._hello_info = dict(info or {})
        return reply

    def bye(self, finished: bool = True) -> None:
        """PSClient.bye; the hello is forgotten first, so a sender thread's late push never
        says hello again."""
        with self._lock:
            self._hello_info = None
            super().bye(finished)

    def _worker_request(
        self, header: dict[str, Any], parts: list[wire.WirePart] | None = None
    ) -> Message:
        """A request that needs registration: re-register whenever the server forgot us.

        Each lost reply can get us declared dead again (a heartbeat shorter than our timeout),
        so this may repeat, at most `retries` times; a push keeps its `seq` throughout, and
        the server answers a retry of an applied push from memory (exactly once).
        """
        forgotten = 0
        while True:
            try:
                return self._request(header, parts)
            except ServerError as exc:
                if exc.code != "unknown_worker" or self._hello_info is None:
                    raise
                if forgotten == self.retries:
                    raise
            forgotten += 1
            log.warning(
                "server does not know worker %s any more: saying hello again", self.worker_id
            )
            self.hello(self._hello_info)

    def _attempts(self) -> tuple[int, float]:
        # Before any reply a resend cannot help (a late server still gets the request).
        self._first = self.first_wait is not None and not self._answered
        return (1, self.first_wait) if self._first else super()._attempts()

    def _send_wait(self) -> float:
        return max(self.timeout, self.first_wait or 0)

    def _no_reply(self, op: str, attempt: int) -> None:
        if self._first:
            self._close_socket()
            raise nothing_answers(self.address, self.first_wait, self.keys)
        super()._no_reply(op, attempt)


def keys_hint(keys: auth.ClientSocketKeys | None) -> str:
    """What to check about CURVE keys, for a client given `keys` (None: none given)."""
    if keys is None:
        return (
            "If the server was started with --keys (CURVE authentication), give this client "
            "the run's key directory too: --keys DIR"
        )
    return (
        "Check that --keys holds this server's server.key and a key pair it admits "
        "(a server started without keys does not answer a CURVE client either)"
    )


def nothing_answers(
    address: str, waited: float, keys: auth.ClientSocketKeys | None
) -> ServerUnavailable:
    """The error of a first request that got no reply in `waited` seconds."""
    return ServerUnavailable(
        f"nothing answers at {address} (no reply in {waited:g} s): is the server started, "
        f"and is the address right? {keys_hint(keys)}"
    )


def warn_if_not_below_heartbeat(timeout: float, heartbeat_timeout: float) -> None:
    """A reply timeout not below the server's heartbeat timeout (docs/protocol.md 7)."""
    if timeout >= heartbeat_timeout:
        log.warning("reply timeout %g s is not below the server's heartbeat timeout %g s: "
                    "a lost reply gets this worker declared dead before it retries",
                    timeout, heartbeat_timeout)  # fmt: skip
