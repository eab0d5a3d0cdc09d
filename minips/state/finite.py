"""What one optimizer step may write and stay finite in float32: the arithmetic the
server's overflow check (minips.ops.overflow) and the rules that keep their own state
(minips.rules.delay, gap, dana) share. Nothing here changes a parameter.

Finite gradients can still overflow float32: 3e38 twice makes a weight -inf, and under
momentum the velocity v' = m v + g overflows first. Cheap first, exact where that cannot
tell. The cheap test is the triangle inequality on the step (no entry exceeds its array's
L2 norm):

    ||v'|| <= m ||v|| + |scale| (||g|| + wd ||w||)      (v' = that without momentum)
    ||w'|| <= ||w|| + lr ||v'||,   |w' - w| <= lr ||v'||

When ||g|| + wd ||w||, ||v'|| and ||w'|| are below FLOAT32_SAFE and lr ||v'|| below
max_move, no entry can overflow (`bounded`). Only past that is the step computed into
temporaries, bit for bit as the optimizer will (SGD.preview), and looked at
(`exact_step_finite`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from minips.protocol.wire import all_finite, sum_of_squares

if TYPE_CHECKING:
    from minips.state.store import SGD, ParameterStore

FLOAT32_SAFE = 1e38  # below float32's largest finite value, 3.4e38, with room for rounding
# The largest move of one coordinate whose square stays below FLOAT32_SAFE (Gap-Aware).
SQUARE_SAFE_MOVE = math.sqrt(FLOAT32_SAFE)


def bounded(
    opt: SGD, name: str, norm_w: float, norm_v: float, norm_g: float, scale: float,
    max_move: float,
) -> bool:  # fmt: skip
    """True when the norms alone prove that `opt`'s step of a gradient of norm `norm_g`
    (times `scale`) on parameter `name` writes only finite values (the module docstring)."""
    decayed = norm_g + opt.weight_decay * norm_w  # g + wd w, before the scale
    velocity = abs(scale) * decayed
    if opt.momentum and name not in opt.plain:
        velocity += opt.momentum * norm_v
    move = opt.lr * velocity
    # Each comparison is False for NaN (0 * inf) too: then the exact check decides.
    return (
        decayed < FLOAT32_SAFE
        and velocity < FLOAT32_SAFE
        and norm_w + move < FLOAT32_SAFE
        and move < max_move
    )


def exact_step_finite(
    store: ParameterStore, name: str, grad: np.ndarray, scale: float = 1.0,
    max_move: float = math.inf,
) -> bool:  # fmt: skip
    """True when the optimizer's step of `grad` (times `scale`) on parameter `name`, computed
    into temporaries as it will be written (SGD.preview), leaves w' and v' finite and moves
    no coordinate by max_move or more. Nothing is changed."""
    weight, velocity = store.optimizer.preview(name, grad, scale)
    if not all_finite(weight) or (velocity is not None and not all_finite(velocity)):
        return False
    if math.isinf(max_move):
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        move = np.abs(weight - store.params[name])
    return float(move.max(initial=0.0)) < max_move  # in float64 (False for NaN)


def step_stays_finite(
    store: ParameterStore, name: str, grad: np.ndarray, scale: float = 1.0,
    max_move: float = math.inf, sq_g: float | None = None,
) -> bool:  # fmt: skip
    """True when the optimizer's step of `grad` (times `scale`) leaves parameter `name` and
    its velocity finite and moves no coordinate by max_move (nothing changed). The norms
    first, BLAS passes without temporaries (sq_g: ||grad||^2 when known); only when they
    cannot tell, the step computed exactly."""
    opt, weight = store.optimizer, store.params[name]
    velocity = opt.velocity.get(name) if opt.momentum and name not in opt.plain else None
    norm_w = math.sqrt(sum_of_squares(weight))
    norm_v = 0.0 if velocity is None else math.sqrt(sum_of_squares(velocity))
    norm_g = math.sqrt(sum_of_squares(grad) if sq_g is None else sq_g)
    if bounded(opt, name, norm_w, norm_v, norm_g, scale, max_move):
        return True
    return exact_step_finite(store, name, grad, scale, max_move)


def sum_stays_finite(
    total: np.ndarray, old: np.ndarray | None, new: np.ndarray, sq_new: float | None = None
) -> bool:
    """True when total + (new - old) (old None: total + new), a running sum a rule keeps
    (DANA's sum of the workers' velocities), stays finite: ||total|| + ||old|| + ||new||
    below FLOAT32_SAFE (sq_new: ||new||^2 when known), else computed into temporaries and
    looked at."""
    norm = math.sqrt(sum_of_squares(new) if sq_new is None else sq_new)
    for array in (total,) if old is None else (total, old):
        norm += math.sqrt(sum_of_squares(array))
    if norm < FLOAT32_SAFE:  # False for NaN too
        return True
    with np.errstate(over="ignore", invalid="ignore"):
        return all_finite(total + (new if old is None else new - old))
