"""What the server refuses from a client it cannot trust, and the optional clipping.

    clip_gradients(grads, max_norm)  the optional --clip-norm: g <- g * min(1, c / ||g||)
    check_info(info), require_operator(origin, keys)
                                     hello's `info` small and shallow; `stop` and
                                     `checkpoint` need an operator key: the checks of
                                     who sent a request, minips.state.requests
    OverflowCheck, step_stays_finite  no update writes a non-finite value: its own module,
                                     minips.ops.overflow (all re-exported here)

Every check raises ProtocolError before anything is booked or applied (docs/protocol.md
section 9: an error changes nothing). That a live worker id answers only to the client
that registered it is the registry's check (WorkerState.check_owner).
"""

from __future__ import annotations

import numpy as np

from minips.ops.overflow import OverflowCheck, step_stays_finite
from minips.state.requests import (
    MAX_INFO_BYTES,
    MAX_INFO_DEPTH,
    check_info,
    depth,
    require_operator,
)

__all__ = ["MAX_INFO_BYTES", "MAX_INFO_DEPTH", "OverflowCheck", "check_info", "clip_gradients",
           "depth", "require_operator", "step_stays_finite"]  # fmt: skip


def clip_gradients(grads: dict[str, np.ndarray], max_norm: float) -> dict[str, np.ndarray]:
    """Scale a push's gradients together so their global L2 norm is at most `max_norm`.

    g <- g * min(1, max_norm / ||g||), ||g|| over every array of the push (Pascanu et al.,
    "On the difficulty of training recurrent neural networks", ICML 2013). 0: no clipping.
    """
    if not max_norm:
        return grads
    norm = float(np.sqrt(sum(float(np.dot(g.reshape(-1), g.reshape(-1))) for g in grads.values())))
    if norm <= max_norm:
        return grads
    factor = np.float32(max_norm / norm)
    return {name: g * factor for name, g in grads.items()}
