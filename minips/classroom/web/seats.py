"""A browser's seat: the gateway gives it back for the browser when its WebSocket closes.

A tab that is reloaded, closed or loses its network never says `bye`; without help the
server would hold its rank until the heartbeat timeout (30 s by default), and a student
reloading the page would find the class full. So the gateway reads two things of what a
browser sends (docs/protocol.md §14.3): the `worker` id of its `hello` and whether it said
`bye`. When the WebSocket closes after a hello and before a bye, the gateway says `bye`
with `finished: false` for it, on the browser's own DEALER socket (so the server sees the
same client), and the rank is free at once: for the same browser coming back with the
same worker id (it gets that rank again), or for the next student.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from minips.protocol.wire import DEFAULT_LIMITS

GATEWAY_RID = 1 << 62  # the rid of the gateway's own bye; a browser counts its rids from 1


def peek_header(frame: bytes | memoryview) -> dict[str, Any]:
    """The msgpack header of a browser's message, {} when it cannot be read (the server
    answers such a message with an error; the gateway only relays it)."""
    if len(frame) > DEFAULT_LIMITS.max_header_bytes:
        return {}
    try:
        header = msgpack.unpackb(frame, raw=False)
    except Exception:  # anything unreadable is the server's to refuse
        return {}
    return header if isinstance(header, dict) else {}


@dataclass
class Seat:
    """What the gateway knows of one WebSocket's worker: its id, and whether it left."""

    worker_id: str | None = None  # from its last hello (None: an observer, or no hello)
    left: bool = False  # it said bye itself

    def watch(self, frames: list[memoryview]) -> None:
        """Note a hello (the worker id) or a bye in a message on its way to the server."""
        header = peek_header(frames[0])
        worker = header.get("worker")
        if not isinstance(worker, str):
            return
        if header.get("op") == "hello":
            info = header.get("info")
            observer = isinstance(info, dict) and info.get("role") == "observer"
            self.worker_id, self.left = (None if observer else worker), False
        elif header.get("op") == "bye" and worker == self.worker_id:
            self.left = True

    def goodbye(self) -> bytes | None:
        """The header frame of the `bye` the gateway sends for a worker that did not say
        it (None: nothing to give back)."""
        if self.worker_id is None or self.left:
            return None
        header = {"v": 1, "op": "bye", "rid": GATEWAY_RID, "worker": self.worker_id}
        return msgpack.packb({**header, "finished": False})
