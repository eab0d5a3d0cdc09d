"""A seeded generator of hostile minips requests: valid templates, then mutated.

Used by tests/protocol/test_fuzz.py (and usable from a shell to replay a seed). Every message starts
as a well-formed request of some op and codec, then gets one to three mutations: header
bytes flipped, a field replaced by an awkward value (huge integers, deep nesting, long
strings, wrong types), a field removed or added, an array descriptor bent (shapes such as
[0, 2^63], nine dimensions, unknown codecs and parts), frames dropped, repeated, cut or
filled with random bytes.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np

from minips.guard import wire_checks
from minips.protocol import wire

WORKER = "fuzz"
SHAPES = {"fc.w": (3, 4), "fc.b": (4,)}


def deep(depth: int, leaf: Any = 0) -> Any:
    """A value nested `depth` levels deep (maps and lists alternating)."""
    value = leaf
    for level in range(depth):
        value = {"x": value} if level % 2 else [value]
    return value


AWKWARD = [0, 1, -1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 1.5, -0.0,
           float("nan"), float("inf"), 3e38, "", "x", "x" * 257, "é" * 300, b"", b"\x00" * 9,
           True, False, None, [], {}, [0, 2**63], [2**64 - 1], [1] * 9, [-1], ["a"],
           {"role": "observer"}, {"role": "observer", "x": deep(200)}, deep(30),
           {"k" * 300: 1}, list(range(100))]  # fmt: skip
SHAPE_VALUES = [[0, 2**63], [2**63, 0], [2**64 - 1], [1] * 9, [0] * 9, [-1], [4.0], "4", 4,
                None, [], [2**31, 2**31], [3, 4], [4], [1, 4], [[4]], [True]]  # fmt: skip


def templates(rng: random.Random) -> list[tuple[dict[str, Any], list[wire.WirePart]]]:
    """One valid request of each kind: (header, parts)."""
    w = np.asarray(np.linspace(-1, 1, 12), np.float32).reshape(3, 4)
    b = np.ones(4, np.float32)
    push = {"op": "push", "worker": WORKER, "seq": rng.randrange(1 << 20), "base": 0}
    return [
        ({"op": "hello", "worker": WORKER, "info": {"role": "worker"}}, []),
        ({"op": "hello", "worker": f"obs{rng.randrange(4)}", "info": {"role": "observer"}}, []),
        ({"op": "pull", "worker": WORKER, "since": None}, []),
        ({"op": "ping", "worker": WORKER}, []),
        ({"op": "stats"}, []),
        ({"op": "bye", "worker": WORKER}, []),
        ({"op": "checkpoint"}, []),
        (push, [wire.WirePart("fc.b", b), wire.WirePart("fc.w", w)]),
        (push, [wire.WirePart("fc.b", b.astype(np.float16), "fp16")]),
        (push, [wire.WirePart("fc.w", np.array([1, 5], np.int32), "topk", "indices", (3, 4)),
                wire.WirePart("fc.w", np.array([1, 2], np.float32), "topk", "values", (3, 4))]),
        (push, [wire.WirePart("fc.w", np.ones((2, 3), np.float32), "sf", "x", (3, 4)),
                wire.WirePart("fc.w", np.ones((2, 4), np.float32), "sf", "dy", (3, 4))]),
        (push, [wire.WirePart("fc.w", np.ones((3, 1), np.float32), "lowrank", "p", (3, 4)),
                wire.WirePart("fc.w", np.ones((4, 1), np.float32), "lowrank", "q", (3, 4))]),
        (push, [wire.WirePart("fc.b", b), wire.WirePart("extra/sample/fc.b", b)]),
    ]  # fmt: skip


def mutate(rng: random.Random, header: dict[str, Any], frames: list[bytes]) -> list[bytes]:
    """Apply one random mutation to a message (header as a map, frames as bytes)."""
    kind = rng.randrange(9)
    if kind == 0:  # a header field gets an awkward value
        header[rng.choice([*header, "v", "op", "rid", "worker", "info"])] = rng.choice(AWKWARD)
    elif kind == 1 and header:  # a field disappears
        header.pop(rng.choice(list(header)))
    elif kind == 2 and isinstance(header.get("arrays"), list) and header["arrays"]:
        desc = rng.choice(header["arrays"])
        key = rng.choice(["name", "dtype", "shape", "codec", "part", "of"])
        if isinstance(desc, dict):
            if rng.random() < 0.2:
                desc.pop(key, None)
            elif key in ("shape", "of"):
                desc[key] = rng.choice(SHAPE_VALUES)
            else:
                desc[key] = rng.choice(AWKWARD + ["float64", "int8", "topk", "sf", "values", "x"])
    elif kind == 3 and len(frames) > 1:  # an array frame is cut, extended or replaced
        index = rng.randrange(1, len(frames))
        frame = frames[index]
        frames[index] = rng.choice([frame[: rng.randrange(len(frame) + 1)], frame + b"\x00" * 4,
                                    rng.randbytes(len(frame))])  # fmt: skip
    elif kind == 4:  # a frame is dropped or repeated
        index = rng.randrange(len(frames))
        if rng.random() < 0.5 and len(frames) > 1:
            del frames[index]
        else:
            frames.insert(index, frames[index])
    elif kind == 5:  # random frames instead of the message
        frames[:] = [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
    elif kind == 6:  # the op changes under the fields
        header["op"] = rng.choice([*wire.REQUEST_OPS, "error", "PUSH", ""])
    elif kind == 7 and isinstance(header.get("arrays"), list) and header["arrays"]:
        index = rng.randrange(len(header["arrays"]))  # a zero-size shape of huge dimensions
        if isinstance(header["arrays"][index], dict) and index + 1 < len(frames):
            huge = rng.choice([[0, 2**63], [2**64 - 1, 0], [0, 2**62, 8]])
            header["arrays"][index]["shape"] = huge
            frames[index + 1] = b""
    elif kind == 8:  # the header is replaced by a non-map
        header.clear()
        header["__not_a_map__"] = rng.choice(AWKWARD)
    return frames


def deep_info_hello(depth: int, worker: str) -> bytes:
    """A `hello` whose info nests `depth` levels deep (built by hand: msgpack-python refuses
    to pack more than 512 levels, but a peer in another language need not)."""
    marker = "@" * 16
    head = msgpack.packb({"v": 1, "op": "hello", "worker": worker, "info": marker})
    info = b"\x82" + msgpack.packb("role") + msgpack.packb("observer") + msgpack.packb("x")
    info += b"\x91" * depth + b"\x00"
    return head.replace(msgpack.packb(marker), info)


def message(rng: random.Random) -> list[bytes]:
    """One generated request (a list of frames) with a `rid` when its header has one."""
    if rng.random() < 0.005:
        depth = rng.choice([200, 600, 1000, 1015, 1020, 1022, 1500])
        return [deep_info_hello(depth, f"deep{rng.randrange(8)}")]
    header, parts = rng.choice(templates(rng))
    frames = [bytes(f) for f in wire.encode_parts(header, parts)]
    head = msgpack.unpackb(frames[0])
    for _ in range(rng.randrange(1, 4)):
        frames = mutate(rng, head, frames)
    if "__not_a_map__" in head:
        frames[0] = msgpack.packb(head["__not_a_map__"])
    elif head or rng.random() < 0.5:
        frames[0] = msgpack.packb(head)
    if rng.random() < 0.05:  # a few bytes of the header flipped
        raw = bytearray(frames[0])
        for _ in range(rng.randrange(1, 4)):
            if raw:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        frames[0] = bytes(raw)
    return frames


def changes_state(frames: list[bytes]) -> bool:
    """True for a message that a correct server may legitimately apply: a valid push or
    a valid `stop` (the fuzz test keeps parameters unchanged, so it never sends these)."""
    try:
        request = wire_checks.decode_request(frames)
    except wire.ProtocolError:
        return False
    except Exception:  # the decoder's own bugs are the server's to report, not ours
        return False
    return request.op in ("push", "stop")
