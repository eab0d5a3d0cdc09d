"""One ZeroMQ multipart message <-> one binary WebSocket message (docs/protocol.md §14.2).

    uint32 n                        number of frames, n >= 1
    uint32 len[0] .. len[n-1]       each frame's length in bytes
    frame 0 bytes, frame 1 bytes, ...

All integers little-endian; nothing else before, between or after. The gateway does not
look inside the frames: the header and array frames are exactly protocol.md's.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from minips.errors import MinipsError

# A push carries at most 4096 arrays (protocol.md §10) after its header frame.
MAX_FRAMES = 1 + 4096


class FramingError(MinipsError):
    """A WebSocket message that is not a well-formed frame list."""


def pack_frames(frames: Sequence[bytes | memoryview]) -> bytes:
    """Frames -> one WebSocket message: count, lengths, then the frames back to back."""
    lengths = [len(frame) for frame in frames]
    prefix = struct.pack(f"<{1 + len(lengths)}I", len(lengths), *lengths)
    return b"".join([prefix, *frames])


def unpack_frames(message: bytes, max_frames: int = MAX_FRAMES) -> list[memoryview]:
    """One WebSocket message -> its frames (views into `message`, no copy).

    FramingError (one line) for a count of 0 or above max_frames, a truncated prefix, or
    lengths that do not add up to the message's size exactly.
    """
    view = memoryview(message)
    if len(view) < 4:
        raise FramingError(f"message of {len(view)} bytes has no frame count")
    (count,) = struct.unpack_from("<I", view, 0)
    if not 1 <= count <= max_frames:
        raise FramingError(f"frame count {count} outside 1..{max_frames}")
    start = 4 + 4 * count
    if len(view) < start:
        raise FramingError(f"message of {len(view)} bytes is shorter than its {count} lengths")
    lengths = struct.unpack_from(f"<{count}I", view, 4)
    if start + sum(lengths) != len(view):
        raise FramingError(
            f"frame lengths add up to {sum(lengths)} bytes but {len(view) - start} follow"
        )
    frames = []
    for length in lengths:
        frames.append(view[start : start + length])
        start += length
    return frames
