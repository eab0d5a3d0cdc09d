"""Fuzz a real `minips server` process: hostile requests among valid traffic, checked.

    python tools/fuzz_server.py --seed 1 --messages 20000

Starts `minips server` (mlp, asgd, no momentum, 2 workers) and registers its two workers
itself: w0 on a DEALER, w1 on a REQ socket; a third DEALER, a stranger, never says hello.
It sends random valid requests of every op but `stop` (pull with every kind of `since`,
push in every codec, fused push + pull, ping, stats, checkpoint, bye and hello again) and,
mostly, mutants of them: fields of the wrong msgpack type or value (huge, negative, NaN
numbers; seq, base, since out of range), descriptors bent (shapes that disagree with the
bytes, wrong dtypes, unknown codecs and parts, duplicate names), then frames with bits
flipped, cut, grown, dropped, repeated, NaN written in, an empty frame in front.

Checked, per request: one reply, that decodes, never `internal`, an error for every
request the fuzzer meant as valid. Per batch: the process is alive and answers a valid
ping, a full pull equals bit for bit a NumPy replay of every push the server accepted (a
mutant too: decoded here from docs/protocol.md 13 alone, w <- w + g * -lr in float32; a
`last: false` push kept for its step), no traceback in the server's log. A mutant that
would be a valid `bye` or `stop` is not sent (the run would rightly end). Exit 1 on any
finding; the same seed sends the same messages.
"""

from __future__ import annotations

import argparse
import copy
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from minips.guard import wire_checks
from minips.protocol import wire

LR = np.float32(0.01)
AWKWARD = [-1, -(2**63), 2**63, 2**64 - 1, 2**32, 1.5, float("nan"), float("inf"), -0.0, True,
           False, None, "", "x" * 300, b"\x00\xff", [], {}, [1, 2], {"a": 1}, "1"]  # fmt: skip
COUNTERS = [0, 1, 2**32, 2**63, 2**64 - 1, -1, True, float("nan"), float("inf"), 1e308]
DESC_VALUES = [["fc1.b"], [3], [0], [2**31, 2], [1] * 9, [0, 2**63], "int8", "float64",
               "delta", "dense", "topk", "values", "x", "fc9.w", "fc1.b", "extra/x", None, 7,
               "é" * 40]  # fmt: skip
OPS = ["hello", "pull", "push", "ping", "stats", "checkpoint", "join", "x"]


def start_server(tmp: Path, rule: str = "asgd") -> tuple[subprocess.Popen, str, Path]:
    """`minips server` on a free loopback port: (process, endpoint, its log)."""
    log, out = tmp / "server.log", tmp / "server.out"
    cmd = [sys.executable, "-m", "minips", "server", "--model", "mlp", "--dataset", "synthetic",
           "--rule", rule, "--momentum", "0", "--lr", str(LR), "--workers", "2",
           "--bind", "tcp://127.0.0.1:*", "--checkpoint", str(tmp / "ck.npz")]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=log.open("w"), stdout=out.open("w"))
    for _ in range(600):
        if found := re.search(r"on (tcp://\S+),", out.read_text()):
            return proc, found.group(1), log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit(f"error: the server did not start:\n{log.read_text()}")


class Peer:
    """One socket with a fixed routing id (a reconnection is the same client)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, kind: int, ident: bytes, worker: str):
        self.ctx, self.endpoint, self.kind, self.ident = ctx, endpoint, kind, ident
        self.worker = worker
        self.open()

    def open(self) -> None:
        self.sock = self.ctx.socket(self.kind)
        self.sock.setsockopt(zmq.ROUTING_ID, self.ident)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.endpoint)

    def delimited(self, frames: list[bytes]) -> bool:
        """A DEALER's message that begins with an empty frame: the server takes it for a REQ
        delimiter (protocol.md 1), echoes it, and reads the rest."""
        return self.kind == zmq.DEALER and len(frames) > 1 and frames[0] == b""

    def ask(self, frames: list[bytes], timeout_ms: int = 5000) -> list[bytes] | None:
        """Send one message; its reply's frames (None: none in time, the socket reopened)."""
        self.sock.send_multipart(frames)
        if not self.sock.poll(timeout_ms):
            self.sock.close()
            self.open()
            return None
        reply = self.sock.recv_multipart()
        return reply[1:] if self.delimited(frames) and reply[:1] == [b""] else reply


def spec_gradients(header: dict, frames: list[bytes], shapes: dict) -> dict[str, np.ndarray]:
    """A push's dense float32 gradients as protocol.md 4 and 13 define them (extras left
    out). ValueError (or KeyError, TypeError) for what the document refuses."""
    dtypes = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int64": "<i8"}
    descs, tensors, out = header.get("arrays", []), {}, {}
    if len(descs) != len(frames):
        raise ValueError("frame count")
    for desc, frame in zip(descs, frames, strict=True):
        array = np.frombuffer(frame, dtypes[desc["dtype"]]).reshape(desc["shape"])
        tensors.setdefault(desc["name"], []).append((desc, array))
    for name, got in tensors.items():
        arrays = [a.astype(np.float32) if a.dtype.kind == "f" else a for _, a in got]
        codec = got[0][0]["codec"]
        of = tuple(got[0][0]["of"]) if codec in ("topk", "sf", "lowrank") else None
        if name.startswith("extra/"):
            continue
        if not all(np.isfinite(a).all() for a in arrays if a.dtype.kind == "f"):
            raise ValueError("nonfinite")
        if codec in ("dense", "fp16") and len(got) == 1:
            grad = arrays[0]
        elif codec == "topk":
            idx, values = arrays
            if len(idx) and (np.any(np.diff(idx) <= 0) or idx[0] < 0 or idx[-1] >= np.prod(of)):
                raise ValueError("topk indices")
            grad = np.zeros(int(np.prod(of)), np.float32)
            grad[idx] = values
            grad = grad.reshape(of)
        elif codec == "sf":
            grad = arrays[0].T @ arrays[1]
        elif codec == "lowrank":
            grad = (arrays[0] @ arrays[1].T).reshape(of)
        else:
            raise ValueError(f"codec {codec}")
        if grad.dtype != np.float32 or grad.shape != shapes[name] or not np.isfinite(grad).all():
            raise ValueError(f"{name}: {grad.dtype} {grad.shape}")
        out[name] = grad
    if not out:
        raise ValueError("no gradient")
    return out


def valid_push(rng: random.Random, shapes: dict, worker: str, seq: int, base: int) -> tuple:
    """A valid push (header, parts) of 1..3 parameters in random codecs, maybe fused."""
    header = {"op": "push", "worker": worker, "seq": seq, "base": base, "rid": rng.getrandbits(30)}
    if rng.random() < 0.3:
        header["pull_since"] = rng.choice([None, base])
    parts, nprng = [], np.random.default_rng(rng.getrandbits(30))
    for name in rng.sample(["fc1.b", "fc2.b", "fc3.w", "fc3.b", "fc2.w"], rng.randint(1, 3)):
        shape = shapes[name]
        grad = nprng.standard_normal(shape).astype(np.float32)
        codec = rng.choice(["dense", "fp16", "topk"] + ["sf", "lowrank"] * (len(shape) == 2))
        if codec in ("dense", "fp16"):
            parts.append(
                wire.WirePart(name, grad.astype("<f2") if codec == "fp16" else grad, codec)
            )
        elif codec == "topk":
            idx = np.sort(nprng.choice(grad.size, grad.size // 10, replace=False)).astype("<i4")
            values = grad.reshape(-1)[idx]
            parts += [wire.WirePart(name, idx, "topk", "indices", shape),
                      wire.WirePart(name, values, "topk", "values", shape)]  # fmt: skip
        else:  # two factors, the first float32, the second float16: sf x, dy; lowrank p, q
            k, (n, m) = rng.randint(1, 4), shape
            a, b = ((k, n), (k, m)) if codec == "sf" else ((n, k), (m, k))
            first, second = ("x", "dy") if codec == "sf" else ("p", "q")
            a, b = nprng.standard_normal(a).astype("<f4"), nprng.standard_normal(b).astype("<f2")
            parts += [wire.WirePart(name, a, codec, first, shape),
                      wire.WirePart(name, b, codec, second, shape)]  # fmt: skip
    return header, parts


def mutate(rng: random.Random, header: dict, frames: list[bytes], version: int) -> list[bytes]:
    """One to three mutations of a message's header (as a map), then up to two of its frames."""
    head, frames = copy.deepcopy(header), list(frames)
    descs = head.get("arrays") or [{}]
    for _ in range(rng.randint(1, 3)):
        kind, desc = rng.randrange(6), rng.choice(descs)
        if kind == 0:  # a field of the wrong type or value
            key = rng.choice([*head, "v", "op", "rid", "worker", "info", "arrays"])
            head[key] = rng.choice(AWKWARD)
        elif kind == 1 and head:
            del head[rng.choice(list(head))]
        elif kind == 2:  # counters out of range: seq, base, since in the future or far past
            key = rng.choice(["seq", "base", "since", "pull_since", "samples", "last", "loss"])
            head[key] = rng.choice([version + 1, version + 10**6, *COUNTERS])
        elif kind == 3 and isinstance(desc, dict):  # a descriptor bent
            desc[rng.choice(["name", "dtype", "shape", "codec", "part", "of"])] = rng.choice(
                DESC_VALUES
            )
        elif kind == 4 and len(descs) > 1:  # duplicate names
            descs[1]["name"] = descs[0].get("name")
        elif kind == 5:  # the op changes under the fields
            head["op"] = rng.choice(OPS)
    frames[0] = msgpack.packb(head, use_bin_type=rng.random() < 0.5)
    for _ in range(rng.randint(0, 2)):
        kind, i = rng.randrange(5), rng.randrange(len(frames))
        raw = bytearray(frames[i])
        if kind == 0 and raw:  # bits flipped
            for _ in range(rng.randint(1, 3)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        elif kind == 1:  # cut, grown, or replaced by random bytes
            raw = rng.choice([raw[: rng.randrange(len(raw) + 1)], raw + b"\0" * 4,
                              rng.randbytes(len(raw))])  # fmt: skip
        elif kind == 2 and i > 0 and len(raw) >= 4:  # NaN / Inf at the end of a float frame
            raw[-4:] = rng.choice([b"\0\0\xc0\x7f", b"\0\0\x80\x7f", b"\0\x7e\0\x7c"])
        elif kind == 3 and len(frames) > 1 and rng.random() < 0.5:  # a frame dropped
            frames.pop(i)
            continue
        elif kind >= 3:  # a frame repeated, or an empty frame in front
            frames.insert(i, bytes(raw)) if kind == 3 else frames.insert(0, b"")
            continue
        frames[i] = bytes(raw)
    return frames


def ends_the_run(frames: list[bytes]) -> bool:
    """A mutant the server may rightly obey by ending the run: a valid `bye` or `stop`."""
    try:
        return wire_checks.decode_request(frames).op in ("bye", "stop")
    except Exception:
        return False


class Fuzz:
    """The two workers and the stranger, and the NumPy replay of what the server accepted."""

    def __init__(self, endpoint: str, seed: int, rule: str) -> None:
        self.rng, self.ctx, self.rule = random.Random(seed), zmq.Context(), rule
        self.peers = [Peer(self.ctx, endpoint, zmq.DEALER, b"fz-w0", "w0"),
                      Peer(self.ctx, endpoint, zmq.REQ, b"fz-w1", "w1"),
                      Peer(self.ctx, endpoint, zmq.DEALER, b"fz-st", "stranger")]  # fmt: skip
        self.seq, self.pending = {"w0": 0, "w1": 0}, {"w0": {}, "w1": {}}  # pending: last false
        self.codes: dict[str, int] = {}
        self.findings: list[str] = []
        self.sent = self.mutants = self.accepted = self.tracebacks = 0
        self.version, self.params = -1, {}
        for peer in self.peers[:2]:
            self.hello(peer)
        reply = self.send(self.peers[0], {"op": "pull", "worker": "w0"}, [])
        self.version, self.params = reply.header["version"], dict(reply.arrays)
        self.shapes = {name: array.shape for name, array in self.params.items()}

    def hello(self, peer: Peer) -> None:
        self.send(peer, {"op": "hello", "worker": peer.worker, "info": {"fuzz": True}}, [])

    def send(self, peer: Peer, header: dict, parts: list, mutant: bool = False) -> wire.Message:
        """A valid request or its mutant: send, read the reply, account for it."""
        frames = [bytes(f) for f in wire.encode_parts(header, parts)]
        if mutant:
            frames = mutate(self.rng, msgpack.unpackb(frames[0]), frames, self.version)
            if ends_the_run(frames[1:] if peer.delimited(frames) else frames):
                return None
        self.sent, self.mutants = self.sent + 1, self.mutants + mutant
        raw = peer.ask(frames)
        if raw is None:
            return self.find(f"no reply to {frames[0][:120]!r} ({len(frames)} frames)")
        try:
            reply = wire_checks.decode_reply(raw)
        except wire.ProtocolError as exc:
            return self.find(f"a reply that breaks the protocol ({exc}): {raw[0][:200]!r}")
        code = reply.header["code"] if reply.op == "error" else reply.op
        self.codes[code] = self.codes.get(code, 0) + 1
        if code == "internal" or (not mutant and reply.op == "error"):
            return self.find(f"{code}: {reply.header.get('reason')} <- {frames[0][:160]!r}")
        if reply.op != "error":
            self.accepted += mutant
            self.account(peer, frames[1:] if peer.delimited(frames) else frames, reply)
        return reply

    def account(self, peer: Peer, frames: list[bytes], reply: wire.Message) -> None:
        """Bring the replay up to date with a success reply; check the arrays it carries."""
        worker, answer = peer.worker, reply.header
        if reply.op == "hello" and answer["worker"] == worker:
            self.pending[worker] = {}  # a re-registration drops a step kept unfinished
            if answer["rank"] == answer["world_size"]:  # a mutant made it an observer
                self.hello(peer)
        if reply.op == "push" and worker in self.seq and answer["seq"] >= self.seq[worker]:
            try:  # (a lower seq is a retry, answered from memory whatever it carries)
                grads = spec_gradients(msgpack.unpackb(frames[0]), frames[1:], self.shapes)
            except (ValueError, KeyError, TypeError) as exc:
                grads = self.find(f"accepted what protocol.md refuses ({exc}): {frames[0][:200]!r}")
            if answer["version"] == self.version + 1 and grads is not None:  # applied
                for name, grad in self.pending[worker].items():
                    grads[name] = grad + grads[name] if name in grads else grad
                self.params.update({n: (g * -LR) + self.params[n] for n, g in grads.items()})
                self.version, self.pending[worker] = self.version + 1, {}
            elif answer["version"] == self.version and grads:  # last: false, kept for its step
                kept = self.pending[worker]
                for name, grad in grads.items():
                    kept[name] = kept[name] + grad if name in kept else grad
            else:
                self.find(f"push reply {answer} at version {self.version}")
            self.seq[worker] = answer["seq"] + 1
        if reply.arrays and worker in self.seq and answer["version"] == self.version:
            for name, array in reply.arrays.items():
                if not (np.array_equal(array, self.params[name]) or self.rule != "asgd"):
                    self.find(f"{reply.op} reply: {name} is not the replay's at {self.version}")

    def find(self, text: str) -> None:
        if not any(text[:60] == seen[:60] for seen in self.findings):  # each kind printed once
            print("FINDING:", text, flush=True)
        self.findings.append(text)

    def request(self, peer: Peer, mutant: bool) -> None:
        """One request of a random op, as `peer`, sent as is or as a mutant."""
        worker, seq = peer.worker, self.seq.get(peer.worker, 0)
        op = self.rng.choice(["push"] * 5 + ["pull", "ping", "stats", "checkpoint", "bye"])
        if seq >= 2**62:  # a mutant's seq left no room for the next one: start afresh
            op, mutant = "bye", False
        header, parts = {"op": op, "worker": worker, "finished": False}, []
        if op == "push":
            header, parts = valid_push(self.rng, self.shapes, worker, seq, self.version)
        elif op == "pull":
            since = [None, 0, self.version, self.version + 9]  # +9: in the future
            header = {"op": "pull", "worker": worker, "since": self.rng.choice(since)}
        self.send(peer, header, parts, mutant)
        if op == "bye" and not mutant and worker in self.seq:  # back as a new client
            peer.sock.close()
            peer.ident = b"fz-%d" % self.rng.getrandbits(30)
            peer.open()
            self.seq[worker], self.pending[worker] = 0, {}
            self.hello(peer)

    def check(self, proc: subprocess.Popen, log: Path) -> None:
        """Alive, answering, the parameters exactly the replay's, no traceback in the log."""
        if proc.poll() is not None:
            sys.exit(f"FINDING: the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        self.send(self.peers[0], {"op": "ping", "worker": "w0"}, [])
        reply = self.send(self.peers[0], {"op": "pull", "worker": "w0", "since": None}, [])
        if reply is not None and reply.header["version"] != self.version:
            self.find(f"server at version {reply.header['version']}, replay at {self.version}")
        if reply is not None and not all(np.isfinite(a).all() for a in reply.arrays.values()):
            self.find(f"a parameter is not finite at version {self.version}")
        if (text := log.read_text()).count("Traceback") > self.tracebacks:
            self.tracebacks = text.count("Traceback")
            self.find("a traceback in the server log: " + text[text.rindex("Traceback") :][-600:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--messages", type=int, default=20000, help="mutants to send")
    parser.add_argument("--batch", type=int, default=100, help="requests between checks")
    rules = "dasgd, dcasgd, gap, dana, dana-gap"  # the others hold requests
    parser.add_argument("--rule", default="asgd",
                        help=f"asgd (replayed) or {rules} (parameters kept finite)")  # fmt: skip
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # `timeout`: stop what it started too
    with tempfile.TemporaryDirectory(prefix="fuzz_server-") as tmp:
        proc, endpoint, log = start_server(Path(tmp), args.rule)
        try:
            fuzz, started = Fuzz(endpoint, args.seed, args.rule), time.monotonic()
            while fuzz.mutants < args.messages:
                for _ in range(args.batch):
                    peer = fuzz.rng.choice(fuzz.peers)
                    fuzz.request(peer, mutant=peer.worker == "stranger" or fuzz.rng.random() < 0.7)
                fuzz.check(proc, log)
            print(f"seed {args.seed}: {fuzz.sent} requests, {fuzz.mutants} of them mutants "
                  f"({fuzz.accepted} accepted), in {time.monotonic() - started:.0f} s; "
                  f"version {fuzz.version}; {len(fuzz.findings)} findings")  # fmt: skip
            print("replies:", dict(sorted(fuzz.codes.items(), key=lambda kv: -kv[1])))
        finally:
            proc.terminate()
            proc.wait(30)
    return 1 if fuzz.findings else 0


if __name__ == "__main__":
    sys.exit(main())
