"""Browser slots of `minips run --browser N`: what the launcher needs to know about them.

`--workers` counts every worker; `--browser N` of them are *slots* that browsers fill by
opening the worker page (the other workers are NumPy processes). The launcher starts the
gateway (`minips web`) beside the server, prints the page's URL, and, with
`--browser-headless`, fills the slots itself with tabs of a headless Chromium
(minips.classroom.web.headless). SeatWatch says how long the run waits for the seats: a seat never
taken, or left by its browser before its shard was done, is waited for a limited time
(the join wait), after which the run goes on without it or ends, as the teacher chose;
the server's own stop (every rank finished, a sample budget) ends it too.
"""

from __future__ import annotations

import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minips.errors import ConfigError

BROWSER_AGENT = "browser"  # the `agent` a browser worker puts in its hello's info
# The browser names a user agent string gives away, most specific first (Edge and Opera
# also say Chrome, Chrome also says Safari).
_BROWSERS = [
    ("Edge", r"Edg/(\d+)"),
    ("Opera", r"OPR/(\d+)"),
    ("Firefox", r"Firefox/(\d+)"),
    ("Chrome", r"(?:Headless)?Chrome/(\d+)"),
    ("Safari", r"Version/(\d+)[.\d]* Safari"),
]


def agent_name(info: dict[str, Any]) -> str:
    """ "numpy", or the browser's name and major version ("Chrome 120") for a browser."""
    if info.get("agent") != "browser":
        return str(info.get("agent", "numpy"))
    ua = str(info.get("ua", ""))
    for name, pattern in _BROWSERS:
        if match := re.search(pattern, ua):
            return f"{name} {match.group(1)}"
    return "browser"


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH (Debian's `chromium`), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def check_browser_options(listen: str, headless: bool) -> None:
    """ConfigError (one line) when browser slots cannot be served here as asked."""
    from minips.classroom.web.gateway import check_installed, parse_listen

    parse_listen(listen)
    check_installed()
    if headless and find_chromium() is None:
        raise ConfigError(
            "--browser-headless needs chromium on PATH (Debian: apt-get install chromium)"
        )


def gateway_argv(endpoint: str, listen: str, url_file: Path, data_dir: str | None) -> list[str]:
    """The `minips web` command that relays the slots' browsers to the server at `endpoint`."""
    argv = [sys.executable, "-m", "minips", "web", "--connect", endpoint, "--listen", listen]
    argv += ["--url-file", str(url_file), "--verbose"]
    return argv + (["--data-dir", data_dir] if data_dir else [])


def headless_argv(url: str, tabs: int, profile: Path) -> list[str]:
    """The command that opens `tabs` worker pages at `url` in a headless Chromium whose
    profile directory is `profile` (removed when it exits)."""
    argv = [sys.executable, "-m", "minips.classroom.web.headless", url, "--tabs", str(tabs)]
    return argv + ["--profile", str(profile)]


@dataclass
class SeatWatch:
    """The launcher's view of the browser seats, from the server's `stats`: whether the run
    still waits for browsers, and what to tell the teacher about empty seats.

    A seat is waited for while a browser trains on it, while it was never taken and the
    server answered its first stats less than `join_wait` seconds ago, and for
    `join_wait` seconds after its browser left unfinished (a reloaded tab comes back within
    seconds, a student who closed hers may open the page again; minips.classroom.web.seats
    gives the rank back at once). Past that the run goes on without the seat, or, with
    `end_if_empty`, ends: `update()` says so in one line, once per seat. A seat whose
    browser said `bye` after its shard is done.
    """

    slots: int
    join_wait: float
    end_if_empty: bool = False
    # When a page could first take a seat: the server's first stats (None: not yet). A run
    # slow to start (a loaded machine) gives its students the whole wait all the same.
    started: float | None = None
    _left_at: dict[int, float] = field(default_factory=dict)  # rank -> when seen gone
    _given_up: set[int] = field(default_factory=set)  # ranks announced as not waited for
    _untaken_told: bool = False
    end_run: bool = False  # set by update(): the teacher chose to end on an empty seat

    def update(self, stats: dict[str, Any] | None, now: float | None = None) -> list[str]:
        """Follow the latest stats; the one-line notices to print (empty: nothing new)."""
        now = time.monotonic() if now is None else now
        if self.slots == 0:
            return []
        if self.started is None and stats is not None:
            self.started = now
        seats = browser_seats(stats)
        notices = self._untaken(len(seats), now)
        for rank, seat in sorted(seats.items()):
            if seat != "left":
                self._left_at.pop(rank, None)
                self._given_up.discard(rank)
                continue
            left = self._left_at.setdefault(rank, now)
            if now - left >= self.join_wait and rank not in self._given_up:
                self._given_up.add(rank)
                what = f"the browser on rank {rank} left and did not come back within"
                notices.append(self._notice(f"{what} {self.join_wait:g} s"))
        return notices

    def pending(self, stats: dict[str, Any] | None, now: float | None = None) -> bool:
        """True while the run waits for a browser seat (after `update()` with these stats)."""
        now = time.monotonic() if now is None else now
        if self.slots == 0 or self.end_run:
            return False
        seats = browser_seats(stats)
        if "training" in seats.values():
            return True
        if len(seats) < self.slots and self._age(now) < self.join_wait:
            return True
        left = [rank for rank, seat in seats.items() if seat == "left"]
        return any(now - self._left_at.get(rank, now) < self.join_wait for rank in left)

    def free_seats(self, stats: dict[str, Any] | None, now: float | None = None) -> dict:
        """The ranks no live or finished worker holds, split in two: `waited` (a seat not
        taken yet within the join wait, or left less than the join wait ago) and `given_up`
        (past it: the run goes on without them). Empty without browser seats."""
        now = time.monotonic() if now is None else now
        free: dict[str, list[int]] = {"waited": [], "given_up": []}
        if self.slots == 0 or not stats:
            return free
        seats = browser_seats(stats)
        for rank in free_ranks(stats):
            since = self._left_at.get(rank, now) if seats.get(rank) == "left" else self._start(now)
            waited = now - since < self.join_wait and not self.end_run
            free["waited" if waited else "given_up"].append(rank)
        return free

    def waiting(self, stats: dict[str, Any] | None, now: float | None = None) -> dict | None:
        """What the run waits for now, for the progress line (None: no seat is waited for):
        `seats` ("1 of 4 browser seats (free: rank 3)"; the free ranks may include a NumPy
        worker's that has not joined yet), `left_s` (the seconds until the first of them is
        given up) and `then` (what happens then)."""
        now = time.monotonic() if now is None else now
        waited = self.free_seats(stats, now)["waited"]
        seats = browser_seats(stats)
        count = min(len(waited), self.slots - sum(seat != "left" for seat in seats.values()))
        if count <= 0:
            return None
        names = ", ".join(
            f"rank {r}" + (" (its browser left)" if seats.get(r) == "left" else "") for r in waited
        )
        since = [self._left_at.get(r, now) if seats.get(r) == "left" else self._start(now)
                 for r in waited]  # fmt: skip
        noun = "browser seat" if self.slots == 1 else "browser seats"
        then = "the run ends" if self.end_if_empty else "the run goes on without them"
        return {"seats": f"{count} of {self.slots} {noun} (free: {names})",
                "left_s": max(0.0, self.join_wait - (now - min(since))), "then": then}  # fmt: skip

    def progress_total(
        self,
        stats: dict[str, Any] | None,
        epoch_samples: int,
        epochs: int,
        budget: int | None,
        now: float | None = None,
    ) -> int | None:
        """The samples the run will train, by the seats actually taken: every rank's shard
        for `epochs` epochs, but a given-up seat only what it trained (nothing for one
        never taken); at most `budget`. None without browser seats (the total is fixed)."""
        if self.slots == 0 or not stats:
            return None
        world = int(stats.get("world_size") or 0)
        given_up = set(self.free_seats(stats, now)["given_up"])
        trained: dict[int, int] = {}
        for row in stats.get("workers", []):
            if not row.get("observer"):
                trained[row["rank"]] = trained.get(row["rank"], 0) + row["samples"]
        total = sum(
            trained.get(r, 0) if r in given_up else epochs * shard_size(epoch_samples, r, world)
            for r in range(world)
        )  # fmt: skip
        return min(total, budget) if budget else total

    def _untaken(self, taken: int, now: float) -> list[str]:
        if self._untaken_told or taken >= self.slots or self._age(now) < self.join_wait:
            return []
        self._untaken_told = True
        empty = self.slots - taken
        seats = "1 browser seat was" if empty == 1 else f"{empty} browser seats were"
        return [self._notice(f"{seats} not taken within {self.join_wait:g} s")]

    def _start(self, now: float) -> float:
        """When the wait began (`now` while the server has not answered yet)."""
        return now if self.started is None else self.started

    def _age(self, now: float) -> float:
        return now - self._start(now)

    def _notice(self, what: str) -> str:
        if self.end_if_empty:
            self.end_run = True
            return f"{what}: the run ends, as --empty-seats end asks"
        return f"{what}: the run goes on with the workers it has"


def browser_seats(stats: dict[str, Any] | None) -> dict[int, str]:
    """Each browser rank seen in `stats`: "training" (a browser on it is live),
    "finished" (its browser said bye after its shard), else "left". A rank can have several
    rows (a closed tab's and its replacement's): the live one counts."""
    order = ["left", "finished", "training"]  # the later wins
    seats: dict[int, str] = {}
    for row in (stats or {}).get("workers", []):
        if _is_browser(row):
            seat = "training" if row["alive"] else "finished" if row.get("finished") else "left"
            if order.index(seat) >= order.index(seats.get(row["rank"], "left")):
                seats[row["rank"]] = seat
    return seats


def free_ranks(stats: dict[str, Any] | None) -> list[int]:
    """The ranks below the world size that no live worker holds and none finished: the
    seats a browser (or a replacement worker) may still take."""
    stats = stats or {}
    held = {row["rank"] for row in stats.get("workers", [])
            if not row.get("observer") and (row["alive"] or row.get("finished"))}  # fmt: skip
    return [rank for rank in range(int(stats.get("world_size") or 0)) if rank not in held]


def shard_size(n: int, rank: int, world_size: int) -> int:
    """How many of `n` training examples rank `rank` of `world_size` trains per epoch
    (Dataset.shard: [rank*n//W, (rank+1)*n//W))."""
    return (rank + 1) * n // world_size - rank * n // world_size


def _is_browser(row: dict[str, Any]) -> bool:
    return not row.get("observer") and (row.get("info") or {}).get("agent") == BROWSER_AGENT


def student_url(url: str) -> str:
    """The address students type: `url` itself, or, when the gateway listens on every
    interface (0.0.0.0 / ::), the URL with this machine's name in place of that address
    (no name lookup is made: `hostname -I` shows the addresses to use if the name does not
    resolve on the lab network)."""
    scheme, rest = url.split("//", 1)
    host, port = rest.rstrip("/").rsplit(":", 1)
    if host not in ("0.0.0.0", "[::]"):
        return url
    return f"{scheme}//{socket.gethostname()}:{port}/"
