"""What the gateway lets in (docs/protocol.md §14.4): methods, origins, how many browsers,
and how many bytes it holds for them.

The gateway serves a class on a network it does not control, so each check sits here, named
for what it refuses, beside the relay rather than inside it:

- HTTP: only GET and HEAD (405 otherwise);
- WebSocket: only from the gateway's own page (the `Origin` a browser sends must be the
  origin of the page it loaded from this gateway, or one the teacher allowed: a page on
  another site that a student opens cannot join the class); a request without `Origin`
  is not a browser's and is let in (any program can send any header: the check protects
  students' browsers, it is not authentication);
- at most `max_browsers` WebSockets at once (close 1013 beyond, the relay unharmed);
- at most `max_memory` bytes received from browsers and not yet handed to ZeroMQ, over
  all WebSockets together (the WebSocket whose bytes would pass it is closed, 1009).

How large one message may be is derived from the model: minips.classroom.web.bounds.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from minips.errors import ConfigError

ALLOWED_METHODS = ("GET", "HEAD")
CLOSE_FULL = 1013  # RFC 6455 "try again later": the gateway has max_browsers WebSockets
CLOSE_MEMORY = 1009  # RFC 6455 "message too big": the gateway's memory bound is reached
FRAME_OVERHEAD = 14  # the largest header of one masked WebSocket frame (RFC 6455 §5.2)
FDS_PER_BROWSER = 4  # its TCP socket, and the DEALER's TCP or ipc socket, mailbox, signaler


def normalise_origin(origin: str) -> str:
    """ "HTTP://Host:80/" -> "http://host:80": scheme://host[:port], lower case, no path.

    ConfigError (one line) for anything that is not an http(s) origin."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
        raise ConfigError(
            f"--allow-origin wants an origin like https://class.example.org, got {origin!r}"
        )
    return f"{parts.scheme}://{parts.netloc.lower()}"


@dataclass
class Admission:
    """The gateway's limits. allow_origins: origins let in besides the page's own (a class
    behind a reverse proxy: the address the students type)."""

    max_browsers: int = 256
    max_memory: int = 512 << 20  # bytes: two whole-size messages (protocol.md §10) fit
    allow_origins: list[str] = field(default_factory=list)
    # Keepalive: a browser whose network went away (Wi-Fi lost, laptop asleep) sends
    # nothing, no pong and no other byte, for ping_timeout seconds after a ping: it is seen
    # gone within ping_interval + ping_timeout seconds, and its seat given back then
    # (minips.classroom.web.keepalive).
    ping_interval: float = 5.0
    ping_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.max_browsers < 1:
            raise ConfigError(f"--max-browsers must be at least 1, got {self.max_browsers}")
        if self.max_memory < 1 << 20:
            raise ConfigError(f"--max-memory must be at least 1 MiB, got {self.max_memory}")
        self.allow_origins = [normalise_origin(origin) for origin in self.allow_origins]

    def method_refusal(self, method: str) -> str | None:
        """Why an HTTP request with `method` is refused (None: it is not)."""
        if method in ALLOWED_METHODS:
            return None
        return f"method {method} not allowed: this gateway answers GET and HEAD only"

    def origin_refusal(self, origin: str | None, host: str | None) -> str | None:
        """Why a WebSocket handshake from `origin` (its `Origin` header, None when absent)
        to `host` (its `Host` header) is refused (None: it is not).

        The page's own origin is http://HOST, HOST as the browser wrote it to load the
        page (a name or an address, with the port)."""
        if origin is None:
            return None
        try:
            claimed = normalise_origin(origin)
        except ConfigError:
            claimed = repr(origin)  # "null" (a file or sandboxed page), or not a URL at all
        own = f"http://{host.lower()}" if host else None
        if claimed == own or claimed in self.allow_origins:
            return None
        allowed = ", ".join([own or "(no Host header)", *self.allow_origins])
        return (
            f"origin {claimed} may not join: open the page from this gateway ({allowed}); "
            "behind a proxy, start the gateway with --allow-origin"
        )

    def full_refusal(self, open_now: int) -> str | None:
        """Why one more WebSocket is refused when `open_now` are open (None: it is not)."""
        if open_now < self.max_browsers:
            return None
        return f"the gateway is full: {self.max_browsers} browsers connected; try again later"

    def raise_fd_limit(self) -> None:
        """Raise this process's open-file limit (soft, up to hard) to what max_browsers
        WebSockets need, so the relay never fails for want of a file descriptor."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = FDS_PER_BROWSER * self.max_browsers + 64
        if soft != resource.RLIM_INFINITY and soft < wanted:
            new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


class MemoryBudget:
    """Bytes received from browsers and not yet handed to ZeroMQ, over every WebSocket.

    A WebSocket counts what arrives (`take`) and gives it back once the message it made
    was relayed (`give_back`) or the WebSocket closed; `take` fails when the total would
    pass `limit`, and the gateway then closes that WebSocket (CLOSE_MEMORY).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most ever held at once (tests and the log read it)
        self.received = 0  # every byte taken so far (minips.classroom.web.memory_return)

    def take(self, n: int) -> bool:
        if self.held + n > self.limit:
            return False
        self.held += n
        self.received += n
        self.peak = max(self.peak, self.held)
        return True

    def give_back(self, n: int) -> None:
        self.held -= n

    def refusal(self) -> str:
        mib = self.limit / (1 << 20)
        return f"the gateway's memory bound ({mib:g} MiB of messages in flight) is reached"
