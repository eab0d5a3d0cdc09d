"""A URL minips prints answers the moment it is printed: the dashboard's (`minips
dashboard`, `minips run --dashboard`, its projector view) and the browser seats' page
(`minips run --browser`), each fetched as soon as its line is read. Real processes."""

from __future__ import annotations

import os
import re
import select
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fetch_each_printed_url(argv: list[str], prefixes: list[str]) -> dict[str, int]:
    """Run `argv`; for each line starting with a prefix, GET the URL in it at once (no
    retry: a refused connection fails). The HTTP status of each, by prefix."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    statuses: dict[str, int] = {}
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while len(statuses) < len(prefixes) and time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 0.5)[0]:
                continue
            line = proc.stdout.readline()
            assert line, f"the process ended first: {seen}"
            seen.append(line.rstrip("\n"))
            for prefix in prefixes:
                if line.startswith(prefix) and prefix not in statuses:
                    url = re.search(r"http://\S+", line).group(0)
                    with urllib.request.urlopen(url, timeout=30) as reply:
                        statuses[prefix] = reply.status
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert len(statuses) == len(prefixes), seen
    return statuses


def test_the_dashboards_urls_answer_when_printed():
    argv = [sys.executable, "-m", "minips", "dashboard", "--listen", "127.0.0.1:0",
            "--connect", f"tcp://127.0.0.1:{_free_port()}"]  # fmt: skip
    statuses = _fetch_each_printed_url(argv, ["dashboard for ", "projector view: "])
    assert set(statuses.values()) == {200}


def test_a_runs_printed_urls_answer_when_printed(tmp_path):
    pytest.importorskip("websockets", reason="browser seats need pip install '.[web]'")
    argv = [sys.executable, "-m", "minips", "run", "--model", "mlp", "--dataset", "synthetic",
            "--workers", "2", "--browser", "1", "--epochs", "1", "--listen", "127.0.0.1:0",
            "--join-wait", "3", "--heartbeat-timeout", "3", "--dashboard",
            "--dashboard-listen", "127.0.0.1:0", "--quiet",
            "--out", str(tmp_path / "run")]  # fmt: skip
    prefixes = ["1 browser slot(s): open ", "dashboard: ", "projector view: "]
    assert set(_fetch_each_printed_url(argv, prefixes).values()) == {200}
