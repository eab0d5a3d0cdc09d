"""Simulated browser tabs for the gateway tests (no tests here): asyncio WebSocket clients
that speak the browser protocol (docs/protocol.md 14.2) as the reference page does: hello,
pull, then steps of a dense push, each request retried after a timeout with a new `rid`
and the same `seq` (section 8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

from minips.classroom.web.framing import pack_frames, unpack_frames
from minips.guard import wire_checks
from minips.protocol import wire


def ws_url(http_url: str) -> str:
    """The gateway's WebSocket address from its page's."""
    return http_url.replace("http", "ws", 1) + "ws"


class Tab:
    """One simulated tab on its own WebSocket: `request` sends and waits like the page's
    Connection.request (a reply with another rid is a late one, dropped)."""

    def __init__(self, url: str, worker: str, timeout: float = 60.0, retries: int = 3) -> None:
        self.url, self.worker, self.timeout, self.retries = url, worker, timeout, retries
        self.rid = 0
        self.ws: Any = None
        self.attempts: list[float] = []  # when each request (retries too) was sent

    async def open(self) -> Tab:
        self.ws = await connect(self.url, max_size=None, open_timeout=60, ping_interval=None)
        return self

    async def close(self) -> None:
        await self.ws.close()

    async def request(
        self, header: dict[str, Any], parts: list[wire.WirePart] = ()
    ) -> wire.Message:
        for _ in range(1 + self.retries):
            self.rid += 1
            frames = wire.encode_parts({**header, "worker": self.worker, "rid": self.rid}, parts)
            self.attempts.append(time.monotonic())
            await self.ws.send(pack_frames(frames))
            deadline = time.monotonic() + self.timeout
            try:
                while True:
                    left = deadline - time.monotonic()
                    raw = await asyncio.wait_for(self.ws.recv(), max(left, 0.001))
                    reply = wire_checks.decode_reply([bytes(f) for f in unpack_frames(raw)])
                    if reply.header.get("rid") == self.rid:
                        return reply
            except asyncio.TimeoutError:
                continue
        raise TimeoutError(f"tab {self.worker}: no reply to {header['op']}")

    async def hello(self) -> dict[str, Any]:
        return (await self.request({"op": "hello", "info": {"agent": "browser"}})).header

    async def push(self, seq: int, base: int, grads: Mapping[str, np.ndarray]) -> dict[str, Any]:
        parts = [
            wire.WirePart(name, np.ascontiguousarray(g, np.float32)) for name, g in grads.items()
        ]
        header = {"op": "push", "seq": seq, "base": base, "last": True, "samples": 1}
        return (await self.request(header, parts)).header


async def ssgd_rounds(url: str, tabs: int, rounds: int, grads: Mapping[str, np.ndarray],
                      timeout: float = 60.0) -> list[float]:  # fmt: skip
    """`tabs` tabs say hello and pull, then push `rounds` steps each (an ssgd round is
    every tab's push); when each round was answered to every tab (s after the first push)."""
    opened = [await Tab(url, f"tab-{i}", timeout=timeout, retries=0).open() for i in range(tabs)]
    try:
        await asyncio.gather(*(tab.hello() for tab in opened))
        await asyncio.gather(*(tab.request({"op": "pull", "since": None}) for tab in opened))
        start, done = time.monotonic(), []
        versions = [0] * tabs
        for seq in range(rounds):
            replies = await asyncio.gather(
                *(tab.push(seq, versions[i], grads) for i, tab in enumerate(opened))
            )
            versions = [reply["version"] for reply in replies]
            done.append(time.monotonic() - start)
        return done
    finally:
        await asyncio.gather(*(tab.close() for tab in opened), return_exceptions=True)
