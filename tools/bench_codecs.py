"""Encode and decode cost of each codec on LeNet-5's fc1 (800 x 500 = 400,000 floats, B = 64).

    python tools/bench_codecs.py [--repeats 30]

Prints, per codec, the bytes on the wire and the best-of-N milliseconds to encode (worker:
codec.encode) and to decode (server: wire_checks.decode_request + codecs.decode_gradients on the
frames as bytes), and the top-k selection alone against a full np.argpartition.
Best of N because the machine is shared: the minimum is the least disturbed run.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from minips.guard import wire_checks
from minips.protocol import wire
from minips.transmission.codecs import Factors, decode_gradients, make_codec, top_k_indices

PUSH = {"op": "push", "worker": "w", "seq": 0, "base": 0}


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 800)).astype(np.float32)
    dy = (rng.standard_normal((64, 500)) * 1e-3).astype(np.float32)
    grad = x.T @ dy
    specs = {
        "dense": "dense",
        "fp16": "fp16",
        "topk 1%": {"codec": "topk", "ratio": 0.01},
        "topk 1% fp16": {"codec": "topk", "ratio": 0.01, "dtype": "float16"},
        "sf": "sf",
        "sf fp16": {"codec": "sf", "dtype": "float16"},
        "lowrank r4": {"codec": "lowrank", "rank": 4},
    }
    print(
        f"# {platform.processor() or platform.machine()}, numpy {np.__version__}, "
        f"best of {args.repeats}"
    )
    print(f"{'codec':14} {'bytes':>10} {'encode ms':>10} {'decode ms':>10}")
    for label, spec in specs.items():
        codec = make_codec(spec)
        given = Factors(x, dy) if label.startswith("sf") else grad
        encode_ms = best_ms(lambda: codec.encode("fc1.w", given), args.repeats)  # noqa: B023
        frames = [bytes(f) for f in wire.encode_parts(PUSH, codec.encode("fc1.w", given))]
        decode_ms = best_ms(
            lambda: decode_gradients(wire_checks.decode_request(frames)),  # noqa: B023
            args.repeats,
        )
        nbytes = sum(len(f) for f in frames[1:])
        print(f"{label:14} {nbytes:>10,} {encode_ms:>10.2f} {decode_ms:>10.2f}")
    magnitude = np.abs(grad.reshape(-1))
    k = 4000
    full = best_ms(lambda: np.sort(np.argpartition(magnitude, -k)[-k:]), args.repeats)
    sampled = best_ms(lambda: top_k_indices(magnitude, k, rng), args.repeats)
    print(
        f"top-k selection of 4,000 of 400,000: argpartition {full:.2f} ms, "
        f"sampled threshold + argpartition {sampled:.2f} ms"
    )


if __name__ == "__main__":
    main()
