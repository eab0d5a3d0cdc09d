"""Fuzz the web gateway (`minips web`) and the dashboard (`minips dashboard`), for real.

    python tools/fuzz_web.py --seed 1 --rounds 200

Starts `minips server` (as tools/fuzz_server.py does), `minips web --max-memory 16` and
`minips dashboard` in front of it, then sends, round after round:

- to the gateway's WebSocket (docs/protocol.md 14.2): a text message (must close 1003),
  bytes that are no frame list (a count of 0 or 4098, lengths that do not add up, random
  bytes: 1007), a well-framed message of mutated frames (tools/fuzz_server.py's mutants:
  the server's reply comes back framed), a message past the memory bound (1009), a hello
  left without bye (the gateway gives the seat back);
- to both HTTP servers: requests of random methods, paths (traversals, bad shard numbers,
  non-ASCII, very long), query strings, huge or many headers, and bytes that are no HTTP.

After each round: both processes alive, the page served (GET / is 200), a browser's
session works (hello, then bye: a seat is free), `stats` answered, and every refusal seen
is a status with a one-line `error: ...` body (14.1) or, where the HTTP library itself
refuses a request it cannot parse, a status of 400-499 / a closed connection. Exit 1 on
any finding; the same seed sends the same requests.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
from fuzz_server import mutate, start_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from minips.classroom.web.framing import pack_frames, unpack_frames
from minips.guard import wire_checks
from minips.protocol import wire

PATHS = ["/", "/index.html", "/static/app.js", "/static/../../etc/passwd", "/static/%2e%2e/x",
         "/data/sample/info", "/data/sample/train/0/2/images", "/data/sample/train/1/2/labels",
         "/data/sample/train/2/2/images", "/data/sample/train/-1/2/images",
         "/data/sample/train/0/0/images", "/data/sample/train/٣/9/images",
         "/data/sample/train/²/2/images", "/data/sample/train/0/99999999999/images",
         "/data/sample/test/images", "/data/nope/info", "/data/SAMPLE/info", "/peer", "/ws",
         "/snapshot.json", "/events", "//", "/%00", "/\x7f", "/" + "a" * 70000, "*",
         "http://evil/", "/é"]  # fmt: skip
QUERIES = ["", "?", "?%ff", "?a=&&&=", "?x=%00", "?" + "q" * 9000, "?a=1#frag"]
METHODS = ["GET", "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "FOO", "get", "G\x00T", ""]


def start(cmd: list[str], out: Path, pattern: str) -> tuple[subprocess.Popen, str]:
    """A process whose stdout (or --url-file) names its URL once it serves."""
    proc = subprocess.Popen(cmd, stdout=out.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        if found := re.search(pattern, out.read_text()):
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"error: {cmd[3]} did not start:\n{out.read_text()}")


def http(address: tuple[str, int], raw: bytes) -> bytes:
    """Send raw bytes, read what comes back until the peer closes (or 3 s pass: an
    event stream does not end)."""
    chunks, deadline = [], time.monotonic() + 3
    with socket.create_connection(address, timeout=3) as sock:
        try:
            sock.sendall(raw)
            while (chunk := sock.recv(65536)) and time.monotonic() < deadline:
                chunks.append(chunk)
        except OSError:  # reset by a peer that refused before reading it all, or silent
            pass
    return b"".join(chunks)


def http_request(rng: random.Random) -> bytes:
    """A random, often hostile, HTTP request."""
    method, path = rng.choice(METHODS), rng.choice(PATHS) + rng.choice(QUERIES)
    headers = ["Host: fuzz"] + rng.choice([[], [f"X-Big: {'b' * 100_000}"],
               [f"X-{i}: {i}" for i in range(300)], ["Content-Length: -1"],
               ["Content-Length: 99999999999"], ["Transfer-Encoding: chunked"],
               ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: x"],
               ["Origin: http://evil.example"], ["Bad header line"]])  # fmt: skip
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    raw = head.encode("utf-8", "surrogateescape")
    return rng.randbytes(rng.randrange(200)) if rng.random() < 0.05 else raw


class WebFuzz:
    def __init__(self, seed: int, gateway: str, dashboard: str) -> None:
        self.rng, self.findings, self.counts = random.Random(seed), [], {}
        self.gateway, self.dashboard = gateway, dashboard
        self.ws_url = gateway.replace("http://", "ws://") + "ws"

    def find(self, text: str) -> None:
        if not any(text[:50] == seen[:50] for seen in self.findings):
            print("FINDING:", text, flush=True)
        self.findings.append(text)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def session(self, messages: list[bytes | str], expect_close: int | None) -> None:
        """One WebSocket: send `messages`, read until closed or a reply per message."""
        try:
            with connect(self.ws_url, max_size=None, open_timeout=10, close_timeout=2) as ws:
                for message in messages:
                    ws.send(message)
                if expect_close is None:
                    for _ in messages:
                        self.check_reply(ws.recv(timeout=10))
                    self.count("ws replied")
                    return
                message = ws.recv(timeout=10)  # ConnectionClosed, as it should be
                self.find(f"not closed ({expect_close}) but answered: {message[:80]!r}")
        except ConnectionClosed as closed:
            code = closed.rcvd.code if closed.rcvd else None
            self.count(f"ws closed {code}")
            if code != expect_close:
                self.find(f"WebSocket closed {code} ({closed.rcvd}), not {expect_close}")
        except TimeoutError:
            self.find(f"no answer on the WebSocket to {[m[:40] for m in messages]}")

    def check_reply(self, message: bytes | str) -> None:
        try:
            frames = [bytes(f) for f in unpack_frames(message)]
            if len(frames) > 1 and frames[0] == b"":  # an empty first frame sent, echoed (1)
                frames = frames[1:]
            wire_checks.decode_reply(frames)
        except Exception as exc:
            self.find(f"a reply the gateway relayed does not decode: {exc}")

    def websocket_round(self) -> None:
        rng = self.rng
        hello = [msgpack.packb({"v": 1, "op": "hello", "worker": "probe", "rid": 1})]
        framed = pack_frames(hello)
        kind = rng.randrange(6)
        if kind == 0:
            self.session(["a text message"], 1003)
        elif kind == 1:
            too_many = (4098).to_bytes(4, "little") + b"\0" * 16392  # 4098 empty frames
            bad = rng.choice([b"", b"\0\0\0\0", too_many, framed[:-1], framed + b"!", framed[:6],
                              rng.randbytes(40)])  # fmt: skip
            self.session([bad], 1007)
        elif kind == 2:  # well framed, hostile inside: relayed, the server's error comes back
            header = {"op": rng.choice(["hello", "pull", "ping", "push", "stats"]),
                      "worker": f"m{rng.randrange(4)}", "seq": 0, "base": 0}  # fmt: skip
            frames = [bytes(f) for f in wire.encode_parts(header, [])]
            frames = mutate(rng, msgpack.unpackb(frames[0]), frames, 0)
            self.session([pack_frames(frames)], None)
        elif kind == 3:  # past the gateway's memory bound (--max-memory 16)
            self.session([pack_frames([hello[0], b"\0" * (20 << 20)])], 1009)
        elif kind == 4:  # a hello left without bye: the gateway gives its seat back
            worker = f"left{rng.randrange(1 << 20)}"
            self.session([pack_frames([msgpack.packb({"v": 1, "op": "hello", "worker": worker})])],
                         None)  # fmt: skip
        else:
            self.session([framed, pack_frames([msgpack.packb({"v": 1, "op": "stats"})])], None)

    def http_round(self, url: str, name: str) -> None:
        host, port = url.removeprefix("http://").rstrip("/").split(":")
        raw = http_request(self.rng)
        answer = http((host, int(port)), raw)
        status = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
        self.count(f"{name} {status.group(1).decode() if status else 'closed'}")
        if status and int(status.group(1)) >= 500 and int(status.group(1)) != 503:
            self.find(f"{name}: {answer[:300]!r} <- {raw[:200]!r}")
        body = answer.split(b"\r\n\r\n", 1)[-1] if status else b""
        if status and int(status.group(1)) >= 400 and not raw.startswith(b"HEAD "):
            # the gateway's HTTP layer refuses what it cannot read in its own words (14.1)
            own = name == "gateway" and status.group(1) in (b"414", b"431")
            one_line = body.startswith(b"" if own else b"error: ") and body.count(b"\n") == 1
            if not one_line:
                self.find(f"{name}: a refusal without a one-line error: {answer[:300]!r} "
                          f"<- {raw[:120]!r}")  # fmt: skip

    def check(self, procs: list[subprocess.Popen]) -> None:
        """Everyone alive; the page served; a browser's hello + bye works."""
        for proc in procs:
            if proc.poll() is not None:
                sys.exit(f"FINDING: {proc.args[3]} exited with {proc.returncode}")
        for url in (self.gateway, self.dashboard):
            host, port = url.removeprefix("http://").rstrip("/").split(":")
            answer = http((host, int(port)), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            if not re.match(rb"HTTP/1\.[01] 200", answer):
                self.find(f"{url} does not serve its page: {answer[:200]!r}")
        for _ in range(50):  # a seat left by the last round is given back within a moment
            with connect(self.ws_url, open_timeout=10) as ws:
                ws.send(pack_frames([msgpack.packb({"v": 1, "op": "hello", "worker": "ok"})]))
                reply = wire_checks.decode_reply(
                    [bytes(f) for f in unpack_frames(ws.recv(timeout=10))]
                )
                if reply.op == "hello":
                    bye = {"v": 1, "op": "bye", "worker": "ok", "finished": False}
                    ws.send(pack_frames([msgpack.packb(bye)]))
                    ws.recv(timeout=10)
                    return
            time.sleep(0.1)
        self.find(f"a browser cannot join: {reply.header}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `timeout`: stop what it started too
    with tempfile.TemporaryDirectory(prefix="fuzz_web-") as tmp:
        server, endpoint, _ = start_server(Path(tmp))
        py = [sys.executable, "-m", "minips"]
        listen = ["--connect", endpoint, "--listen", "127.0.0.1:0"]
        web, gateway = start([*py, "web", *listen, "--max-memory", "16"], Path(tmp) / "web.out",
                             r"open (http://\S+/)")  # fmt: skip
        dash, dashboard = start([*py, "dashboard", *listen], Path(tmp) / "dash.out",
                                r"on (http://\S+/)")  # fmt: skip
        procs, started = [server, web, dash], time.monotonic()
        try:
            fuzz = WebFuzz(args.seed, gateway, dashboard)
            for _ in range(args.rounds):
                fuzz.websocket_round()
                fuzz.http_round(gateway, "gateway")
                fuzz.http_round(dashboard, "dashboard")
                fuzz.check(procs)
            print(f"seed {args.seed}: {args.rounds} rounds in {time.monotonic() - started:.0f} s; "
                  f"{len(fuzz.findings)} findings")  # fmt: skip
            print("answers:", dict(sorted(fuzz.counts.items())))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    return 1 if fuzz.findings else 0


if __name__ == "__main__":
    sys.exit(main())
