"""Browser slots of `minips run --browser N`: what the launcher needs to know about them.

`--workers` counts every worker; `--browser N` of them are *slots* that browsers fill by
opening the worker page (the other workers are NumPy processes). The launcher starts the
gateway (`minips web`) beside the server, prints the page's URL, and, with
`--browser-headless`, fills the slots itself with tabs of a headless Chromium
(minips.web.headless). The run is over for the browsers once every slot has been taken and
no browser worker is alive any more (each said `bye`, or closed its tab and was declared
dead); the server's own stop (a sample budget) ends it too.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from minips.errors import ConfigError

BROWSER_AGENT = "browser"  # the `agent` a browser worker puts in its hello's info


def find_chromium() -> str | None:
    """The path of a Chromium binary on PATH (Debian's `chromium`), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def check_browser_options(listen: str, headless: bool) -> None:
    """ConfigError (one line) when browser slots cannot be served here as asked."""
    from minips.web.gateway import check_installed, parse_listen

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
    argv = [sys.executable, "-m", "minips.web.headless", url, "--tabs", str(tabs)]
    return argv + ["--profile", str(profile)]


def browsers_pending(stats: dict[str, Any] | None, slots: int) -> bool:
    """True while the browser slots still train: not all taken yet, or one still alive.

    stats: the server's latest `stats` reply (None before the first). A slot counts as
    taken once a browser worker registered with its rank; a rank whose tab was closed is
    free again for another browser, and still counts as taken (the run does not wait for
    a replacement that may never come).
    """
    if slots == 0:
        return False
    rows = [w for w in (stats or {}).get("workers", []) if _is_browser(w)]
    taken = {w["rank"] for w in rows}
    return len(taken) < slots or any(w["alive"] for w in rows)


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
