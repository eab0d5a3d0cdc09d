"""The gateway's keepalive: a ping every `ping_interval` seconds, and a browser that then
sends nothing, neither the pong nor any other byte, for `ping_timeout` seconds is gone
(closed, 1011, and its seat given back).

websockets' own keepalive closes a WebSocket whose pong is late, whatever else arrives.
But frames on one WebSocket travel in order, so a browser uploading one large message (a
dense LeNet-5 push is 1.7 MB: 3 s at 5 Mbit/s, far longer for a class sharing a slow link,
or a gateway short of CPU) can send its pong only once the message is through: the pong is
late while the browser is plainly alive. Here the bytes of that message count as a sign of
life too.
"""

from __future__ import annotations

import asyncio
import time

try:  # the optional extra: pip install 'minips[web]'
    from websockets.asyncio.server import ServerConnection
    from websockets.exceptions import ConnectionClosed
    from websockets.frames import CloseCode
except ImportError:  # pragma: no cover - reported by gateway.check_installed()
    ServerConnection = object  # never instantiated then


class PatientKeepalive(ServerConnection):
    """A server-side WebSocket whose keepalive counts any byte received as the browser's
    sign of life, the pong being only the one an idle browser sends."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.heard_at = time.monotonic()

    def data_received(self, data: bytes) -> None:
        self.heard_at = time.monotonic()
        super().data_received(data)

    async def keepalive(self) -> None:
        """Ping every `ping_interval` seconds; close once `ping_timeout` seconds passed
        since both the ping and the last byte received, with no pong."""
        try:
            while True:
                await asyncio.sleep(self.ping_interval)
                pinged_at, pong = time.monotonic(), await self.ping()
                while not await self._pong_within(pong, pinged_at):
                    if time.monotonic() >= max(pinged_at, self.heard_at) + self.ping_timeout:
                        async with self.send_context():  # waits for connection_lost
                            self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
                        return
        except ConnectionClosed:
            return

    async def _pong_within(self, pong: asyncio.Future, pinged_at: float) -> bool:
        """Whether `pong` came before the browser had been silent `ping_timeout` seconds."""
        deadline = max(pinged_at, self.heard_at) + self.ping_timeout
        done, _ = await asyncio.wait({pong}, timeout=max(0.0, deadline - time.monotonic()))
        return bool(done)
