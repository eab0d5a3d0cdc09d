"""Gradient codecs: how each parameter's gradient travels from a worker to the server.

One class per codec (`CODEC_CLASSES`): `dense` Identity, `fp16` Fp16, `topk` TopK, `sf`
SufficientFactors, `lowrank` LowRank; their parts and sizes are docs/protocol.md 13.1.

Worker side, an `Encoder` turns a step's gradients into wire parts by a plan and keeps each
parameter's codec state (top-k's residual). Server side, `decode_gradients(message)` turns
a decoded push back into float32 dense gradients, before anything is checked against the
model's parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from minips.protocol.wire import Message, WirePart
from minips.transmission.codecs.base import Codec, Factors, Gradient
from minips.transmission.codecs.dense import Fp16, Identity
from minips.transmission.codecs.factors import LowRank, SufficientFactors
from minips.transmission.codecs.topk import TopK, top_k_indices

__all__ = [
    "CODEC_CLASSES",
    "Codec",
    "Encoder",
    "Factors",
    "Fp16",
    "Gradient",
    "Identity",
    "LowRank",
    "Spec",
    "SufficientFactors",
    "TopK",
    "decode_gradients",
    "make_codec",
    "parse_spec",
    "top_k_indices",
]

CODEC_CLASSES: dict[str, type[Codec]] = {
    cls.name: cls for cls in (Identity, Fp16, TopK, SufficientFactors, LowRank)
}

EXTRA_PREFIX = "extra/"

Spec = str | Mapping[str, Any]
"""A codec spec: "fp16", or {"codec": "topk", "ratio": 0.01, ...} (options of its class)."""


def parse_spec(spec: Spec) -> tuple[str, dict[str, Any]]:
    """A spec as (codec name, options): "fp16" -> ("fp16", {}); {"codec": "topk", "ratio":
    0.01} -> ("topk", {"ratio": 0.01}). A run checks a spec it is given once, before it
    starts (minips.run.plan_checks.check_spec); each codec checks its options' values."""
    if isinstance(spec, str):
        return spec, {}
    return spec["codec"], {k: v for k, v in spec.items() if k != "codec"}


def make_codec(spec: Spec) -> Codec:
    """A fresh codec object (with empty state) for one parameter."""
    name, options = parse_spec(spec)
    return CODEC_CLASSES[name](**options)


class Encoder:
    """Worker side: encodes gradients by per-parameter specs and keeps each codec's state.

    One Encoder per worker (PSClient owns one). A parameter's codec object is created on
    first use and kept while its spec stays the same; a new spec starts a new codec
    (top-k's residual of the old one is then dropped). Not thread-safe on its own: the
    client calls it under its lock.

        encoder = Encoder()
        parts = encoder.encode({"fc1.w": Factors(x, dy), "fc1.b": g_b},
                               {"fc1.w": {"codec": "sf", "dtype": "float16"}})
    """

    def __init__(self) -> None:
        self._codecs: dict[str, tuple[Spec, tuple[str, str], Codec]] = {}  # name -> codec
        self.bytes_sent: dict[str, int] = {}  # parameter -> array bytes encoded, all steps

    def codec(self, name: str, spec: Spec) -> Codec:
        """The (stateful) codec object of parameter `name` for `spec`."""
        held = self._codecs.get(name)
        if held is not None and held[0] == spec:  # the common case: the spec of last time
            return held[2]
        codec_name, options = parse_spec(spec)
        key = (codec_name, repr(sorted(options.items())))  # the same codec written otherwise
        same = held is not None and held[1] == key
        codec = held[2] if same else CODEC_CLASSES[codec_name](**options)
        self._codecs[name] = (spec if isinstance(spec, str) else dict(spec), key, codec)
        return codec

    def count(self, parts: Iterable[WirePart]) -> None:
        """Add the parts' array bytes to `bytes_sent`, each under its parameter's name."""
        for part in parts:
            self.bytes_sent[part.name] = self.bytes_sent.get(part.name, 0) + part.array.nbytes

    def encode(
        self, grads: Mapping[str, Gradient], specs: Mapping[str, Spec] | None = None
    ) -> list[WirePart]:
        """The wire parts of all `grads` (name -> array or Factors), "dense" when no spec.

        Counts each parameter's array bytes in `bytes_sent`. The parts may be views of the
        given arrays (dense float32, sf float32): keep those unchanged until sent.
        """
        specs = specs or {}
        parts: list[WirePart] = []
        for name, grad in grads.items():
            encoded = self.codec(name, specs.get(name, "dense")).encode(name, grad)
            self.count(encoded)
            parts.extend(encoded)
        return parts


def decode_gradients(message: Message) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Server side: a decoded push -> (float32 dense gradients by name, extras by name).

    Gradients are every tensor not named "extra/..." whatever its codec, in message order;
    extras are returned as sent (dense) or decoded to float32 (any other codec). Raises
    ProtocolError (`shape`, `bad_field`, `dtype`, `nonfinite`) for a payload its codec
    cannot decode (wire.decode already bounded every `of` by the frame size limit).
    Checking names and shapes against the model is the caller's job.
    """
    grads: dict[str, np.ndarray] = {}
    extras: dict[str, np.ndarray] = {}
    for name, codec_name in message.codecs.items():
        is_extra = name.startswith(EXTRA_PREFIX)
        if name in message.arrays:
            if is_extra and codec_name == "dense":
                extras[name] = message.arrays[name]
                continue
            parts, of = {None: message.arrays[name]}, None
        else:
            parts, of = message.parts[name], message.dense_shapes[name]
        decoded = CODEC_CLASSES[codec_name].decode(name, parts, of)
        (extras if is_extra else grads)[name] = decoded
    return grads, extras
