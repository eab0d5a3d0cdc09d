"""Open N worker pages in a headless Chromium: `python -m minips.classroom.web.headless URL --tabs
N`.

What `minips run --browser N --browser-headless` starts to fill its browser slots without
anyone at a keyboard (tests, benchmarks, CI). Headless Chromium takes one URL on its command
line, so it starts on about:blank with a DevTools endpoint on loopback and each tab is opened
through that endpoint's HTTP interface (`PUT /json/new?URL`). SIGTERM (the launcher's
stop) closes Chromium first, so no browser process outlives the run; should this process
die without closing it (SIGKILL), the kernel sends Chromium SIGTERM. Chromium's profile is
`--profile DIR` (`minips run`: RUN_DIR/logs/chromium-profile), emptied before Chromium
starts and removed at exit (a SIGTERM while Chromium starts waits until it is known:
minips.held_signals); should this process be killed before it could remove it (a
launcher out of patience), it is left where the next run clears it, not in /tmp. Chromium's
TMPDIR is a folder made for it (`minips-chr-*`, in TMPDIR or /tmp) and removed with the
profile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import NoReturn

from minips.classroom.web.slots import find_chromium
from minips.held_signals import end_with_the_launcher, held_during_start, released_in_child

# Flags for unattended tabs: no sandbox (CI runs as root), no GPU, and no throttling of
# tabs in the background: every tab is a worker that must keep its pace.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def devtools_port(profile: Path, chromium: subprocess.Popen, timeout: float = 90.0) -> int:
    """The DevTools port Chromium chose, from the DevToolsActivePort file it writes."""
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = active.read_text().splitlines() if active.exists() else []
        if lines and lines[0].isdigit():
            return int(lines[0])
        if chromium.poll() is not None:
            raise SystemExit(f"chromium exited with code {chromium.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"chromium did not open its DevTools port within {timeout:g} s")


def open_tab(port: int, url: str) -> None:
    """Open one tab at `url` through the DevTools HTTP interface (Chromium on loopback)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?{url}", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as reply:
        reply.read()


def _stop_on_sigterm(_signum: int, _frame: object) -> NoReturn:
    raise SystemExit(0)  # unwinds through the `finally` that closes Chromium


# Chromium makes its singleton socket in TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket
# and aborts ("Socket path too long") when that passes a Unix socket path's 107 bytes; its
# TMPDIR is a folder of its own (SCRATCH_PREFIX + 8 random characters) in the one chosen.
SCRATCH_PREFIX = "minips-chr-"
SOCKET_SUFFIX = len(f"/{SCRATCH_PREFIX}XXXXXXXX/org.chromium.Chromium.XXXXXX/SingletonSocket")
SUN_PATH_MAX = 107


def chromium_tmpdir() -> str:
    """Where Chromium's own TMPDIR is made, short enough for its singleton socket: this
    process's TMPDIR when it is, else the system's /tmp (a deep TMPDIR, as a test runner's,
    would abort it)."""
    own = tempfile.gettempdir()
    return own if len(own) + SOCKET_SUFFIX <= SUN_PATH_MAX else "/tmp"


def run_tabs(binary: str, url: str, tabs: int, profile: Path) -> None:
    """Start Chromium with `profile`, open `tabs` pages at `url`, wait until Chromium exits
    (or SIGTERM arrives); Chromium is closed and the profile removed either way, and so is
    the TMPDIR made for it (Chromium leaves org.chromium.Chromium.* folders in its TMPDIR
    when it is stopped)."""
    command = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"]
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=chromium_tmpdir()))
    chromium: subprocess.Popen | None = None
    try:
        # A SIGTERM inside Popen would leave Chromium started and unknown here, so never
        # closed: it is held until `chromium` is set, then raised where `finally` closes it.
        with held_during_start():
            chromium = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "TMPDIR": str(scratch)},
                preexec_fn=released_in_child(end_with_the_launcher()),
            )
        port = devtools_port(profile, chromium)
        for _ in range(tabs):
            open_tab(port, url)
        print(f"opened {tabs} tab(s) at {url}", flush=True)
        chromium.wait()
    finally:
        if chromium is not None:
            close_chromium(chromium)
            remove_profile(profile)
        remove_profile(scratch)


def close_chromium(chromium: subprocess.Popen, patience: float = 10.0) -> None:
    """Terminate Chromium (it closes its helper processes), killed after `patience` s."""
    chromium.terminate()
    try:
        chromium.wait(patience)
    except subprocess.TimeoutExpired:
        chromium.kill()
        chromium.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the worker page, e.g. http://127.0.0.1:8080/")
    parser.add_argument("--tabs", type=int, default=1, help="how many pages (workers) to open")
    parser.add_argument("--profile", type=Path, help="Chromium's profile directory (a new one)")
    args = parser.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        raise SystemExit("error: chromium not found (Debian: apt-get install chromium)")
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if args.profile is None:
        profile = Path(tempfile.mkdtemp(prefix="minips-chromium-"))
    else:
        profile = args.profile
        remove_profile(profile)  # a killed earlier run's leftovers
        profile.mkdir(parents=True)
    run_tabs(binary, args.url, args.tabs, profile)


def remove_profile(profile: Path, attempts: int = 20) -> None:
    """Remove Chromium's profile directory (or its TMPDIR); its helper processes may still
    be writing in it for a moment after the main process exited, so try again before
    giving up."""
    for _ in range(attempts):
        shutil.rmtree(profile, ignore_errors=True)
        if not profile.exists():
            return
        time.sleep(0.1)
    print(f"warning: could not remove {profile}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
