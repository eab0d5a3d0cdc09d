"""Where a browser worker's push + pull goes: the page's stamps beside the gateway's.

One headless-Chromium page trains alone against its own `minips server` (asgd, as
tools/bench_web.py) through a gateway in this process whose relay is stamped: each chunk
of a browser's message as it arrives, the whole message read (WebSocket frame parsed,
unmasked), its frames handed to the DEALER, the server's reply back on it, and the reply
written to the WebSocket. The page runs with `?stamps=1` (worker.js stamps its start,
encoding, send, the reply's arrival, decoding and the parameters applied). Both clocks are
the wall clock of this machine, in ms. Prints the median of each stage over the steps
after the first --skip:

    python tools/profile_messaging.py --model mlp --steps 200

Stages, in the order a step goes through them:
  page_encode    the push encoded into the outgoing buffer and handed to WebSocket.send
  to_gateway     from send() returning to the first bytes at the gateway
  gateway_read   the first bytes to the whole message parsed (the browser's sending pace
                 and the gateway's reading)
  gateway_relay  the message's frames to the server's DEALER
  server         the server's round trip as the gateway sees it (a NumPy worker's too)
  gateway_write  the reply framed and written to the WebSocket (until its buffer drains)
  to_page        from then to the reply's message event in the page
  page_decode    the header read, the parameters copied in
Needs chromium and pip install '.[web]'.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zmq.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_web_support import Chromium, server_process, wait_for  # noqa: E402

import minips.classroom.web.gateway as gateway_module  # noqa: E402
from minips.classroom.web.running import RunningGateway  # noqa: E402

STAGES = ("page_encode", "to_gateway", "gateway_read", "gateway_relay", "server",
          "gateway_write", "to_page", "page_decode")  # fmt: skip


def wall_ms() -> float:
    return time.time() * 1000


class Stamps:
    """The gateway's stamps, one list per event, in the order they happen."""

    def __init__(self) -> None:
        self.chunks: list[float] = []  # bytes arrived from the browser
        self.read: list[float] = []  # a whole message parsed
        self.relayed: list[float] = []  # its frames sent on the DEALER
        self.replied: list[float] = []  # the server's reply received
        self.written: list[float] = []  # the reply written to the WebSocket


def stamped_gateway(connect: str, stamps: Stamps) -> gateway_module.Gateway:
    """A Gateway whose relay notes each event in `stamps` (its code is the real one: the
    stamps wrap the calls it makes)."""
    connection = gateway_module.BoundedConnection
    receive, send = connection.data_received, connection.send
    unpack = gateway_module.unpack_frames

    def data_received(self, data: bytes) -> None:
        stamps.chunks.append(wall_ms())
        receive(self, data)

    async def send_stamped(self, message, *args, **kwargs):
        await send(self, message, *args, **kwargs)  # only replies: pings are not sends
        stamps.written.append(wall_ms())

    def unpack_frames(message, *args):
        stamps.read.append(wall_ms())
        return unpack(message, *args)

    class Socket(zmq.asyncio.Socket):
        async def send_multipart(self, frames, *args, **kwargs):
            done = await super().send_multipart(frames, *args, **kwargs)
            stamps.relayed.append(wall_ms())
            return done

        async def recv_multipart(self, *args, **kwargs):
            frames = await super().recv_multipart(*args, **kwargs)
            stamps.replied.append(wall_ms())
            return frames

    connection.data_received, connection.send = data_received, send_stamped
    gateway_module.unpack_frames = unpack_frames
    gateway = gateway_module.Gateway(connect, "127.0.0.1", 0)
    gateway._context._socket_class = Socket
    return gateway


def stages(page: list[dict], stamps: Stamps) -> list[dict]:
    """Per step, the ms of each stage: the page's stamps matched with the gateway's events
    in order (one message each way per step; the first ones are hello and pull)."""
    offset = len(stamps.read) - len(page) - 1  # hello, pull before; the bye after
    rows = []
    for i, step in enumerate(page):
        j = offset + i
        previous = stamps.written[j - 1] if j > 0 else 0.0
        first = next(t for t in stamps.chunks if t > previous)
        rows.append({
            "page_encode": step["sent"] - step["start"],
            "to_gateway": first - step["sent"],
            "gateway_read": stamps.read[j] - first,
            "gateway_relay": stamps.relayed[j] - stamps.read[j],
            "server": stamps.replied[j] - stamps.relayed[j],
            "gateway_write": stamps.written[j] - stamps.replied[j],
            "to_page": step["arrived"] - stamps.written[j],
            "page_decode": step["applied"] - step["arrived"],
            "total": step["applied"] - step["start"],
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=["lenet5", "mlp"])
    parser.add_argument("--dataset", default="sample")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--skip", type=int, default=10, help="first steps not counted")
    parser.add_argument("--engine", default="wasm", choices=["wasm", "js"])
    args = parser.parse_args()
    print(json.dumps({**vars(args), "load_1min": round(os.getloadavg()[0], 2)}))
    server_args = ["--workers", "1", "--rule", "asgd", "--model", args.model]
    server_args += ["--dataset", args.dataset, "--batch-size", "64"]
    stamps = Stamps()
    # Chromium's helpers may still be writing its profile as the directory goes
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        chromium = Chromium(Path(tmp))
        try:
            with server_process(Path(tmp), *server_args) as endpoint:
                with RunningGateway(stamped_gateway(endpoint, stamps)).start() as gateway:
                    query = f"?steps={args.steps}&evalsec=1e9&eval=100&engine={args.engine}"
                    _, session = chromium.open(gateway.url + query + "&stamps=1")

                    def finished():
                        status = chromium.status(session)
                        if status.get("state") == "failed":
                            raise SystemExit(f"error: the page failed: {status.get('error')}")
                        return status if status.get("state") == "done" else None

                    status = wait_for(finished, 600, "the browser worker", interval=0.05)
        finally:
            chromium.close()
    rows = stages(status["stamps"], stamps)[args.skip :]
    medians = {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}
    per_step = {key: round(1000 * status[f"{key}Seconds"] / status["steps"], 2)
                for key in ("compute", "comm")}  # fmt: skip
    print(json.dumps({"steps": len(rows), "ms_per_step": per_step, "median_ms": medians}))
    print(json.dumps({"load_1min_after": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
