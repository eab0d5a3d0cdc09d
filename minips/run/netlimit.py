"""A bandwidth limit on one worker's link: a token bucket per direction, portable, no root.

`--bandwidth 100mbit` gives a worker a `Link`; its client calls `link.up.wait(n)` before it
sends an n-byte request and `link.down.wait(n)` after it received an n-byte reply. Each
call sleeps until the bytes would have crossed a link of that rate, so a 1.72 MB push at
100 Mbit/s takes ~138 ms however fast loopback is.

This emulates one worker's own link (per-worker limit). A bottleneck shared by every
worker, as at a real server's NIC, needs a real shaped link: minips/run/netem.py.

The token bucket (Turner 1986; the algorithm of Linux tc's `tbf`): tokens (bytes) flow in
at `rate` per second up to `burst`; sending n bytes takes n tokens. We let the level go
negative ("debt") instead of refusing messages larger than the bucket: a caller takes its
n tokens at once and sleeps until the level is back to zero, i.e. for

    delay = max(0, (n - level) / rate)

so callers are served in the order they asked and a message larger than `burst` is simply
paced at `rate`. Because the level is recomputed from the monotonic clock on every call,
a sleep that oversleeps is not lost: the next call finds those tokens in the bucket
(capped at `burst`), so the long-run rate stays exact.
"""

from __future__ import annotations

import math
import threading
import time

from minips.errors import ConfigError
from minips.run.plan_measure import parse_rate

# Default burst: 2 ms of traffic (25 kB at 100 Mbit/s, near minips/run/netem.py's tbf burst of
# 32 KiB), but at least one Ethernet frame. Small on purpose: a real link never sends faster
# than its rate; an idle bucket refills to `burst`, which a request/reply client collects
# once per direction per round trip (10 ms would flatter a 1.7 MB round trip by 7%).
DEFAULT_BURST_SECONDS = 0.002
MIN_BURST_BYTES = 1500


class TokenBucket:
    """Paces bytes at `rate_bytes_per_s`, allowing bursts of `burst_bytes`; thread-safe.

    `wait(n)` blocks the caller (time.sleep, no busy loop) until n more bytes fit the rate.
    Several threads may share one bucket (a sender thread and the main thread on one
    link); each takes its tokens under a lock and sleeps outside it.
    """

    def __init__(self, rate_bytes_per_s: float, burst_bytes: float | None = None) -> None:
        if not (rate_bytes_per_s > 0 and math.isfinite(rate_bytes_per_s)):
            raise ConfigError(f"bad rate {rate_bytes_per_s!r} bytes/s: must be positive")
        if burst_bytes is None:
            burst_bytes = max(MIN_BURST_BYTES, rate_bytes_per_s * DEFAULT_BURST_SECONDS)
        if not burst_bytes >= 0:
            raise ConfigError(f"bad burst {burst_bytes!r} bytes: must be >= 0")
        self.rate = float(rate_bytes_per_s)
        self.burst = float(burst_bytes)
        self._level = self.burst  # starts full, as tc's tbf does
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.total_wait = 0.0  # seconds callers were told to sleep (for accounting)

    def reserve(self, nbytes: int) -> float:
        """Take `nbytes` tokens now; return how long the caller must wait (seconds, >= 0)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            now = time.monotonic()
            self._level = min(self.burst, self._level + (now - self._last) * self.rate)
            self._last = now
            self._level -= nbytes
            delay = max(0.0, -self._level / self.rate)
            self.total_bytes += nbytes
            self.total_wait += delay
        return delay

    def wait(self, nbytes: int) -> float:
        """Block until `nbytes` have crossed the link at its rate; return the seconds slept."""
        delay = self.reserve(nbytes)
        if delay > 0:
            try:
                time.sleep(delay)
            except BaseException:  # interrupted (Ctrl-C): the bytes never left
                self._refund(nbytes)
                raise
        return delay

    def _refund(self, nbytes: int) -> None:
        """Give back the tokens of bytes that were never sent, so that what is sent next
        (a goodbye after Ctrl-C) does not wait out their debt."""
        with self._lock:
            self._level = min(self.burst, self._level + nbytes)
            self.total_bytes -= nbytes


class Link:
    """A worker's link: `up` paces what the worker sends, `down` what it receives.

    Both buckets have the same rate (a full-duplex link, as Ethernet is) and are
    independent: a push going up does not slow a pull coming down.
    """

    def __init__(self, rate: str | float, burst_bytes: float | None = None) -> None:
        rate_bytes = parse_rate(rate) if isinstance(rate, str) else float(rate)
        self.rate = rate_bytes  # bytes per second, each direction
        self.up = TokenBucket(rate_bytes, burst_bytes)
        self.down = TokenBucket(rate_bytes, burst_bytes)

    @classmethod
    def from_option(cls, rate: str | None) -> Link | None:
        """The link for a `--bandwidth` option: None (unlimited) when the option is unset."""
        return None if rate in (None, "", "unlimited") else cls(rate)

    def __repr__(self) -> str:
        return f"Link({self.rate * 8 / 1e6:g} Mbit/s each way)"
