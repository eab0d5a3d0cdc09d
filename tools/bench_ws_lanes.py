"""Round trips of one MLP step's bytes between a headless-Chromium page and an echo server,
over 1 WebSocket or split over K of them (lanes) at once.

The question it answers: is a browser worker's push + pull bound by Chromium moving the
bytes through one socket (its renderer handing a message to its network service in
pieces, one after another), so that K sockets carrying 1/K each would move them sooner?
The echo server is a bare `websockets` asyncio server on loopback (no gateway, no
ZeroMQ, no parameter server): what it measures is Chromium's WebSocket stack and one
Python echo. Each lane count is timed in its own block of round trips after a warm-up;
the blocks repeat, and each lane count's figure is the median over the repeats of each
block's median.

    python tools/bench_ws_lanes.py --bytes 940584 --trips 100 --repeats 3

Needs chromium and the `websockets` package (pip install '.[web]').
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import websockets

from minips.classroom.web.headless import CHROMIUM_FLAGS, remove_profile
from minips.classroom.web.slots import find_chromium

PAGE = """<!doctype html><html><body><script>
const query = new URLSearchParams(location.search);
const [port, size, trips, repeats] = ["port", "bytes", "trips", "repeats"].map(
  (key) => Number(query.get(key)));
const laneCounts = query.get("lanes").split(",").map(Number);

async function openLanes(count) {
  const sockets = [];
  for (let i = 0; i < count; i++) {
    const socket = new WebSocket(`ws://127.0.0.1:${port}/echo`);
    socket.binaryType = "arraybuffer";
    await new Promise((resolve) => (socket.onopen = resolve));
    sockets.push(socket);
  }
  return sockets;
}

function roundTrip(sockets, parts) {
  return Promise.all(sockets.map((socket, i) => new Promise((resolve) => {
    socket.onmessage = (event) => resolve(event.data.byteLength);
    socket.send(parts[i]);
  })));
}

async function medianTrip(count) {
  const sockets = await openLanes(count);
  const bytes = new Uint8Array(size).map((_, i) => i & 255);
  const share = Math.ceil(size / count);
  const parts = sockets.map((_, i) => bytes.subarray(i * share, Math.min(size, (i + 1) * share)));
  for (let i = 0; i < 10; i++) await roundTrip(sockets, parts);
  const times = [];
  for (let i = 0; i < trips; i++) {
    const started = performance.now();
    await roundTrip(sockets, parts);
    times.push(performance.now() - started);
  }
  sockets.forEach((socket) => socket.close());
  times.sort((a, b) => a - b);
  return times[times.length >> 1];
}

(async () => {
  const blocks = [];
  for (let repeat = 0; repeat < repeats; repeat++) {
    for (const lanes of laneCounts) blocks.push({ lanes, ms: await medianTrip(lanes) });
  }
  const report = new WebSocket(`ws://127.0.0.1:${port}/result`);
  report.onopen = () => report.send(JSON.stringify(blocks));
})();
</script></body></html>
"""


async def measure(size: int, trips: int, repeats: int, lanes: str, timeout: float) -> list[dict]:
    """Serve the echo, open the page in headless Chromium, return its blocks."""
    result: asyncio.Future = asyncio.get_running_loop().create_future()

    async def handler(socket) -> None:
        async for message in socket:
            if socket.request.path == "/result":
                result.set_result(json.loads(message))
                return
            await socket.send(message)

    folder = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
    page = folder / "lanes.html"
    page.write_text(PAGE)
    profile = folder / "profile"
    async with websockets.serve(handler, "127.0.0.1", 0, max_size=None, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        query = f"?port={port}&bytes={size}&trips={trips}&repeats={repeats}&lanes={lanes}"
        flags = [flag for flag in CHROMIUM_FLAGS if "remote-debugging" not in flag]
        chromium = subprocess.Popen(
            [find_chromium(), *flags, f"--user-data-dir={profile}", page.as_uri() + query],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return await asyncio.wait_for(result, timeout)
        finally:
            chromium.terminate()
            chromium.wait()
            remove_profile(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=940_584, help="each way (the MLP's step)")
    parser.add_argument("--trips", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lanes", default="1,2,4,8")
    args = parser.parse_args()
    blocks = asyncio.run(measure(args.bytes, args.trips, args.repeats, args.lanes, 600))
    one_lane = None
    for lanes in (int(count) for count in args.lanes.split(",")):
        figures = [block["ms"] for block in blocks if block["lanes"] == lanes]
        median = statistics.median(figures)
        one_lane = one_lane or median
        print(
            json.dumps(
                {
                    "lanes": lanes,
                    "bytes_each_way": args.bytes,
                    "round_trip_ms_median": round(median, 2),
                    "blocks_ms": figures,
                    "over_one_lane": round(median / one_lane, 3),
                }
            )
        )


if __name__ == "__main__":
    main()
