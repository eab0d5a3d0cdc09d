"""Digest of every frame a deterministic exchange sends: is the protocol byte-for-byte the same?

One client talks to an in-process server under asgd, ssp, dcasgd, ssgd and dasgd: hello,
pull, six fused pushes (asgd's last three with topk and fp16 codecs), a pull after each and
a push of the wrong shape (an error reply). Every frame sent by either side (the ROUTER's
routing frames left out) goes into one SHA-256, and the final parameters into another.
Run it on two checkouts; equal digests mean the same bytes on the wire and the same model:

    PYTHONPATH=<old checkout> python tools/frames_digest.py
    python tools/frames_digest.py
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import zmq

RULES = [("asgd", 0.9), ("ssp", 0.0), ("dcasgd", 0.9), ("ssgd", 0.5), ("dasgd", 0.0)]


def spy_on_frames(digest) -> list[int]:
    """Wrap Socket.send_multipart so every sent frame also goes into `digest`."""
    count = [0]
    send = zmq.Socket.send_multipart

    def spying(self, frames, *args, **kwargs):
        body = list(frames)
        if self.socket_type == zmq.ROUTER:  # the peer's routing id (and delimiters) vary
            body = body[1:]
            while body and len(body[0]) == 0:
                body = body[1:]
        for frame in body:
            data = frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)
            digest.update(len(data).to_bytes(8, "little") + data)
        count[0] += 1
        return send(self, frames, *args, **kwargs)

    zmq.Socket.send_multipart = spying
    return count


def exchange(rule: str, momentum: float, params_digest) -> None:
    """The scripted exchange under one rule; the final parameters into `params_digest`."""
    from test_server_support import running_server, snapshot

    from minips.worker.client import PSClient, ServerError

    with running_server(rule, momentum=momentum) as server:
        with PSClient(server.endpoint, worker_id="w-fixed") as client:
            client.hello()
            version = client.pull().version
            rng = np.random.default_rng(1)
            for step in range(6):
                grads = {"fc.w": rng.standard_normal((3, 4)).astype(np.float32),
                         "fc.b": rng.standard_normal(4).astype(np.float32)}  # fmt: skip
                codecs = None
                if step >= 3 and rule == "asgd":
                    codecs = {"fc.w": {"codec": "topk", "ratio": 0.5}, "fc.b": "fp16"}
                reply = client.push(grads, version, codecs=codecs, samples=8, pull_since=version)
                version = reply.version
                client.pull(since=None)
                try:
                    client.push({"fc.w": np.zeros((2, 2), np.float32)}, version)
                except ServerError:
                    pass
        for _, data in sorted(snapshot(server).items()):
            params_digest.update(data)


def main() -> None:
    import minips  # the checkout under test: its tests' helpers too

    sys.path.insert(0, str(Path(minips.__file__).resolve().parents[1] / "tests"))
    frames, params = hashlib.sha256(), hashlib.sha256()
    count = spy_on_frames(frames)
    for rule, momentum in RULES:
        exchange(rule, momentum, params)
    print(f"messages {count[0]}  frames {frames.hexdigest()}  params {params.hexdigest()}")


if __name__ == "__main__":
    main()
