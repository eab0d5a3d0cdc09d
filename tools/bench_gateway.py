"""What the web gateway's relay costs a round trip: a WebSocket client through `minips web`
(Python's `websockets`, and a headless-Chromium page) against a ZeroMQ DEALER straight to
the same server, for messages of a step's size.

The server is a bare ZeroMQ ROUTER that answers each message with one of `--down` bytes
(a fused push + pull: the MLP's dense step is 940 KB each way); the gateway is a real
`minips web` process relaying to it; the WebSocket client is the `websockets` package's
(in this process, as the browser's would be in Chromium's). Interleaved blocks of
`--count` round trips each, alternating direct and gateway, medians over `--repeats`:

    python tools/bench_gateway.py --up 940584 --down 940584 --count 200 --repeats 5

Prints one JSON line per block, then the medians (ms per round trip) and their ratio.

With `--group-tabs N` it measures instead a server group's ssgd rounds through the gateway
(docs/protocol.md 14.5): a 2-shard group (in this process), a real `minips web` process in
front of it, and N simulated tabs (tests/web_tabs.py: WebSocket clients speaking the
browser protocol) each pushing the MLP's dense gradient once per round:

    python tools/bench_gateway.py --group-tabs 24 --rounds 10

prints one JSON line: when each round was answered to every tab (s), and the shards' versions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgpack
import zmq

# The array frames of the MLP's dense step (fc1.w, fc1.b, fc2.w, fc2.b, fc3.w, fc3.b), in
# bytes: 940,584 in all, the size of its push and of its pull.
MLP_FRAMES = (802_816, 1_024, 131_072, 512, 5_120, 40)


def message(size: int, rid: int) -> list[bytes]:
    """A header and array frames of `size` bytes in all, in the MLP's proportions."""
    header = msgpack.packb({"v": 1, "op": "push", "rid": rid})
    frames = [b"\x01" * (n * size // sum(MLP_FRAMES)) for n in MLP_FRAMES]
    frames[0] += b"\x01" * (size - sum(map(len, frames)))
    return [header, *frames]


def echo_server(address: str, down: int, stop: threading.Event) -> None:
    """A ROUTER that answers every message with a reply of `down` bytes (the same rid), and
    a `stats` request (the gateway's probe for a server group) with empty stats."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.ROUTER)
    sock.bind(address)
    reply = message(down, 0)[1:]
    while not stop.is_set():
        if not sock.poll(100):
            continue
        routing, *frames = sock.recv_multipart(copy=False)
        header = msgpack.unpackb(frames[0].bytes)
        if header.get("op") == "stats":  # the gateway asks whether this is a group's root
            answer = {"v": 1, "op": "stats", "rid": header["rid"], "stats": {}}
            sock.send_multipart([routing, msgpack.packb(answer)])
            continue
        answer = {"v": 1, "op": "push", "rid": header["rid"]}
        sock.send_multipart([routing, msgpack.packb(answer), *reply])
    sock.close(linger=0)


def direct(address: str, up: int, count: int) -> float:
    """ms per round trip over a DEALER."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    start = time.perf_counter()
    for rid in range(count):
        sock.send_multipart(message(up, rid), copy=False)
        sock.recv_multipart(copy=False)
    elapsed = time.perf_counter() - start
    sock.close(linger=0)
    return elapsed / count * 1e3


def through_gateway(url: str, up: int, count: int) -> float:
    """ms per round trip over a WebSocket to the gateway (framing of protocol.md §14.2)."""
    from websockets.sync.client import connect

    from minips.classroom.web.framing import pack_frames

    with connect(url.replace("http", "ws") + "ws", max_size=None, compression=None) as ws:
        start = time.perf_counter()
        for rid in range(count):
            ws.send(pack_frames(message(up, rid)))
            ws.recv()
        elapsed = time.perf_counter() - start
    return elapsed / count * 1e3


# In a page of the gateway's origin: `count` round trips of a framed message of UP bytes
# (the same frames as `message`), each reply awaited before the next send; ms per trip.
_PAGE_LOOP = """
(async () => {
  const ws = new WebSocket(location.href.replace(/^http/, "ws").replace(/static\\/.*$/, "ws"));
  ws.binaryType = "arraybuffer";
  await new Promise((resolve, reject) => { ws.onopen = resolve; ws.onerror = reject; });
  const sizes = SIZES, n = sizes.length;
  const total = 4 + 4 * n + sizes.reduce((a, b) => a + b, 0);
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, n, true);
  sizes.forEach((s, i) => view.setUint32(4 + 4 * i, s, true));
  out.set(HEADER, 4 + 4 * n); // msgpack {v: 1, op: "push", rid: 1}
  let replies = 0, wake = null;
  ws.onmessage = () => { replies++; if (wake) wake(); };
  const trip = async () => {
    const before = replies;
    ws.send(out);
    while (replies === before) await new Promise((r) => (wake = r));
  };
  for (let i = 0; i < 10; i++) await trip();
  const start = performance.now();
  for (let i = 0; i < COUNT; i++) await trip();
  const ms = (performance.now() - start) / COUNT;
  ws.close();
  return ms;
})()
"""


def in_chromium(chromium, url: str, up: int, count: int) -> float:
    """ms per round trip from a headless Chromium page over its WebSocket to the gateway."""
    frames = message(up, 1)
    script = (
        _PAGE_LOOP.replace("SIZES", json.dumps([len(f) for f in frames]))
        .replace("HEADER", json.dumps(list(frames[0])))
        .replace("COUNT", str(count))
    )
    _, session = chromium.open(url + "static/page.css")
    ready = "document.readyState === 'complete' && location.protocol === 'http:'"
    while not chromium.call("Runtime.evaluate", session, expression=ready,
                            returnByValue=True)["result"].get("value"):  # fmt: skip
        time.sleep(0.1)
    result = chromium.call("Runtime.evaluate", session, expression=script, awaitPromise=True,
                           returnByValue=True)  # fmt: skip
    return float(result["result"]["value"])


def group_rounds(tabs: int, rounds: int, tmp: Path) -> dict:
    """`rounds` ssgd rounds of `tabs` simulated tabs through `minips web` to a 2-shard
    group: when each was answered (s after the first push), and the shards' versions."""
    import asyncio

    import numpy as np

    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    from group_support import running_group
    from web_tabs import ssgd_rounds

    from minips.nn import build_model

    grads = {n: np.full(a.shape, 1e-3, np.float32) for n, a in build_model("mlp").params.items()}
    url_file = tmp / "web-url"
    with running_group(2, workers=tabs, rule="ssgd", heartbeat_timeout=60.0) as group:
        gateway = subprocess.Popen(
            [sys.executable, "-m", "minips", "web", "--connect", group.root.endpoint,
             "--listen", "127.0.0.1:0", "--url-file", str(url_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while not url_file.exists() or not url_file.read_text().strip():
                time.sleep(0.05)
            url = url_file.read_text().strip().replace("http", "ws", 1) + "ws"
            done = asyncio.run(ssgd_rounds(url, tabs, rounds, grads))
        finally:
            gateway.terminate()
            gateway.wait(30)
        versions = [server.store.version for server in group.servers]
    return {"tabs": tabs, "rounds_answered_s": [round(t, 3) for t in done], "versions": versions,
            "load": os.getloadavg()[0]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--up", type=int, default=940_584, help="bytes browser -> server")
    parser.add_argument("--down", type=int, default=940_584, help="bytes server -> browser")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-chromium", action="store_true", help="only the Python client")
    what = "measure ssgd rounds of this many tabs in front of a group"
    parser.add_argument("--group-tabs", type=int, default=0, help=what)
    parser.add_argument("--rounds", type=int, default=10, help="rounds, with --group-tabs")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    if args.group_tabs:
        try:
            print(json.dumps(group_rounds(args.group_tabs, args.rounds, tmp)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    chromium = None
    if not args.no_chromium:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from test_web_support import Chromium

        chromium = Chromium(tmp)
    address = f"ipc://{tmp}/server.sock"
    stop = threading.Event()
    server = threading.Thread(target=echo_server, args=(address, args.down, stop), daemon=True)
    server.start()
    url_file = tmp / "web-url"
    gateway = subprocess.Popen(
        [sys.executable, "-m", "minips", "web", "--connect", address, "--listen",
         "127.0.0.1:0", "--url-file", str(url_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not url_file.exists() or not url_file.read_text().strip():
            time.sleep(0.05)
        url = url_file.read_text().strip()
        through_gateway(url, args.up, 10)  # warm-up: connections, caches
        direct(address, args.up, 10)
        paths = {
            "direct": lambda: direct(address, args.up, args.count),
            "gateway": lambda: through_gateway(url, args.up, args.count),
        }
        if chromium is not None:
            paths["chromium"] = lambda: in_chromium(chromium, url, args.up, args.count)
        figures: dict[str, list[float]] = {name: [] for name in paths}
        for repeat in range(args.repeats):
            for name, run in paths.items():
                figures[name].append(ms := run())
                print(
                    json.dumps({"repeat": repeat, "path": name, "ms_per_round_trip": round(ms, 3)})
                )
        medians = {name: round(statistics.median(values), 3) for name, values in figures.items()}
        ratios = {name: round(ms / medians["direct"], 2) for name, ms in medians.items()}
        print(json.dumps({"median_ms": medians, "over_direct": ratios, "load": os.getloadavg()[0],
                          "up": args.up, "down": args.down}))  # fmt: skip
    finally:
        if chromium is not None:
            chromium.close()
        gateway.terminate()
        gateway.wait(10)
        stop.set()
        server.join(5)
        shutil.rmtree(tmp, ignore_errors=True)  # the socket, Chromium's profile
    return 0


if __name__ == "__main__":
    sys.exit(main())
