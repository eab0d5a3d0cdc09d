"""Whether a client's connection to its server dropped while it waited for a reply.

A server process that exits (killed, crashed, restarted by `minips run`) closes its end of
every connection, and a request it had received is lost with it: no reply will ever come.
Lazy Pirate (docs/protocol.md 8) would find out only when the reply timeout runs out (10 s
for a worker); a socket monitor hears the close at once, so the client retries then, on a
new socket that reaches the restarted server as soon as it listens. A server machine that
is lost without closing anything is still found out by the timeout.
"""

from __future__ import annotations

import zmq

# While a reply is awaited, how often the client looks at the monitor: a drop is acted on
# within this many seconds (a reply that comes earlier is read without any look).
LOOK_EVERY = 0.25


class DropWatch:
    """A monitor of one DEALER socket's disconnections (ZMQ_EVENT_DISCONNECTED).

    `sending()` just before a request is sent forgets the drops before it (the socket
    reconnects by itself, and a request sent while it was away waits for the reconnection);
    `dropped()` then says whether the connection dropped since, so that request is lost (a
    drop just before the send is counted too: a retry too many, never a wait too long).
    """

    def __init__(self, socket: zmq.Socket) -> None:
        self.socket = socket
        self.monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def sending(self) -> None:
        """A request is about to be sent: the drops so far are older than it."""
        self._drain()

    def dropped(self) -> bool:
        """Whether the connection dropped since the last `sending()` (never waits)."""
        return self._drain()

    def _drain(self) -> bool:
        seen = False
        while True:
            try:
                self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return seen
            seen = True

    def close(self) -> None:
        """Stop watching (before the socket itself is closed)."""
        try:
            self.socket.disable_monitor()
        except zmq.ZMQError:  # the socket's context is being torn down already
            pass
        self.monitor.close(linger=0)
