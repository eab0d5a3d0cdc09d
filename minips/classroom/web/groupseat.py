"""One browser in front of a server group, on a thread of its own (docs/protocol.md 14.5).

A GroupRelay's calls block: a pull or a push waits for every shard's reply, and under
`ssgd` a push waits at the shards' barrier until every worker of the round has pushed. So
each browser's relay runs on a thread of its own, never on a pool shared by the browsers:
with a pool of P threads, P pushes held at a barrier would keep every other browser's push
from being made, and with it the round they all wait for. A browser's requests are made
in the order they came, one at a time, as one connection to a server answers them.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from minips.classroom.web.grouprelay import GroupRelay


class GroupSeat:
    """A GroupRelay for one browser (its WebSocket) and the one thread that runs its calls.

    root: the group's root ("tcp://HOST:PORT"); keys: the client keys under --auth.
    """

    def __init__(self, root: str, keys: Any = None) -> None:
        self.relay = GroupRelay(root, keys)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minips-seat")

    async def handle(self, frames: list[Any]) -> list[Any] | None:
        """The reply frames to one request (GroupRelay.handle), made on this seat's thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._thread, self.relay.handle, frames
        )

    async def close(self) -> bool:
        """After the browser's last request: say `bye` for it if it left without one
        (14.3), close the relay's sockets, end the thread. Whether a bye was said for it."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, self.relay.leave)
        finally:
            self._thread.shutdown(wait=False)
