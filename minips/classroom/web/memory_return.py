"""The gateway gives the memory of a burst of large messages back to the system.

Relaying a browser's message costs a few copies of it at once (the WebSocket library's
read buffer, the frame read out of it, the frame unmasked), and a burst of them (a class
pushing LeNet-5 steps, four tabs refused at a message's bound) costs some tens of MB.
Python frees them, but glibc keeps what it freed for reuse: the first large block freed
raises its mmap threshold to that block's size, so the next ones come from the heap,
which goes back to the system only from its top. The gateway's resident size would stay
near the peak of its largest burst (measured: 72-84 MB after the bounds test's bursts,
43 MB at start). So once a burst is over, QUIET seconds without a byte from any browser
after at least BURST bytes since the last return, the gateway hands the freed memory back
(glibc's malloc_trim, as the server does for a message of many frames; nothing happens
where it does not exist). A class training steadily reuses what it freed and never goes
quiet, so it is never trimmed in the middle of its steps.
"""

from __future__ import annotations

import asyncio

from minips.classroom.web.admission import MemoryBudget
from minips.ops.inflow import give_back_freed_memory

QUIET = 1.0  # seconds without a byte from any browser: the burst is over
BURST = 16 << 20  # bytes received since the last return worth giving back


async def return_memory_after_bursts(
    budget: MemoryBudget, quiet: float = QUIET, burst: int = BURST
) -> None:
    """Run until cancelled: after each burst of at least `burst` bytes received (the
    budget's `received`) followed by `quiet` seconds of none, give freed memory back."""
    returned = seen = budget.received
    while True:
        await asyncio.sleep(quiet)
        now = budget.received
        if now == seen and now - returned >= burst:
            await asyncio.to_thread(give_back_freed_memory)
            returned = now
        seen = now
