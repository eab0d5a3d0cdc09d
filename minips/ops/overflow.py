"""The overflow check, beside the path: no update writes a non-finite value.

Finite gradients can still overflow float32: 3e38 twice makes a weight -inf, and under
momentum the velocity v' = m v + g overflows first. Everything an update writes is
checked before it is written: the new weights w', the optimizer's velocity v'
(minips.state.store.SGD), and the largest move |w' - w| of one coordinate where a rule
keeps its square (Gap-Aware's running mean square: `Rule.max_move`).

    OverflowCheck(store, max_move).check(grads, sq_norms)
                         before a push is accepted: `nonfinite` if its gradients, applied
                         as one full step (scale 1), would write a non-finite value
    OverflowCheck.refused(steps)
                         before an update is written (the rule's steps, their scales): the
                         first parameter it would make non-finite, or None
    OverflowCheck.step_finite(name, grad), .velocity_finite(name, new, old, total)
                         a rule's own state (the FiniteCheck the server's operations set
                         as `Rule.finite`, minips.rules.base): DC-ASGD's compensated step,
                         DANA's velocities and their running sum
    step_stays_finite(store, name, grad, ...), sum_stays_finite(total, old, new)
                         one step's check and one running sum's, norms measured afresh

Cheap first, exact where that cannot tell. The cheap test is the triangle inequality on
the step (no entry exceeds its array's L2 norm):

    ||v'|| <= m ||v|| + |scale| (||g|| + wd ||w||)      (v' = that without momentum)
    ||w'|| <= ||w|| + lr ||v'||,   |w' - w| <= lr ||v'||

When ||g|| + wd ||w||, ||v'|| and ||w'|| are below FLOAT32_SAFE and lr ||v'|| below
max_move, no entry can overflow (`bounded`). Only past that is the step computed into
temporaries, bit for bit as the optimizer will (SGD.preview), and looked at
(`exact_step_finite`). Nothing is changed either way.

The norms cost no pass over the arrays on the way of a push: ||g|| is what the wire's
finiteness check measured (guard.wire_checks.decode_request, Message.sq_norms), and ||w||, ||v|| are
upper bounds carried from version to version (`norm_bounds_after`), measured exactly
only for a version the check has not seen carried (the first push, a version past
RETIGHTEN). A bound holds for one array object, the parameter's version it was computed
for: the store publishes each version as a new array (minips.state.store), so a bound is
never mistaken for another version's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from minips.protocol.wire import ProtocolError, all_finite, sum_of_squares
from minips.rules.base import FLOAT32_SAFE, SQUARE_SAFE_MOVE

if TYPE_CHECKING:
    from minips.state.store import SGD, ParameterStore

# Carried bounds only grow (the triangle inequality); past this they are measured again,
# far below float32's 3.4e38, where the check needs them tight.
RETIGHTEN = 1e30


class OverflowCheck:
    """The server's overflow check (module docstring), with the norm bounds it carries.

    max_move: the largest |w' - w| of one coordinate the rule's own state can take (inf:
    the rule keeps no function of the move that could overflow).
    """

    def __init__(self, store: ParameterStore, max_move: float = math.inf) -> None:
        self.store = store
        self.max_move = max_move
        self._bounds: dict[str, tuple[np.ndarray, float, float]] = {}  # name -> (w, |w|, |v|)
        self._known: dict[str, tuple[np.ndarray, float]] = {}  # name -> (g, ||g||^2 bound)

    def check(self, grads: dict[str, np.ndarray], sq_norms: dict[str, float]) -> None:
        """Refuse `grads` (name -> float32, the parameter's shape) with `nonfinite` if a full
        step of them would write a non-finite value.

        sq_norms: name -> ||g||^2 where known (the wire measured it); an upper bound is
        enough, so a gradient clipped since may keep its norm from before.
        """
        for name, grad in grads.items():
            sq_g = sq_norms[name] if name in sq_norms else sum_of_squares(grad)
            self._known[name] = (grad, sq_g)
            if not self._stays_finite(name, grad, 1.0, sq_g):
                raise ProtocolError(
                    f"gradient {name!r} would make the parameter non-finite", "nonfinite"
                )

    def refused(self, steps: list[tuple[str, np.ndarray, float]]) -> str | None:
        """The first parameter an update's `steps` [(name, grad, scale)] would make
        non-finite (its weight, its velocity, a move past max_move); None: write it."""
        for name, grad, scale in steps:
            known = self._known.get(name)
            sq_g = known[1] if known and known[0] is grad else sum_of_squares(grad)
            self._known[name] = (grad, sq_g)  # for `carry`, after the write
            if not self._stays_finite(name, grad, scale, sq_g):
                return name
        return None

    def carry(self, steps: list[tuple[str, np.ndarray, float]]) -> None:
        """After the store wrote an update's `steps`: the bounds of each new version, from
        those of the version it replaced and ||grad|| (known from `check` or `refused`
        when the step's gradient is the array they saw, else measured now)."""
        params = self.store.params
        for name, grad, scale in steps:
            replaced = self._bounds.get(name)
            if replaced is None:
                continue  # measured when a push for it is next checked
            known = self._known.get(name)
            sq_g = known[1] if known and known[0] is grad else sum_of_squares(grad)
            bounds = norm_bounds_after(
                self.store.optimizer, replaced[1], replaced[2], math.sqrt(sq_g), scale
            )
            self._bounds[name] = (params[name], *bounds)

    def norm_bounds(self, name: str) -> tuple[float, float]:
        """Upper bounds on ||w|| and ||v|| (its momentum buffer; 0 without) of parameter
        `name` at its current version: carried, or measured exactly (inf: overflowed)."""
        array, cached = self.store.params[name], self._bounds.get(name)
        if cached is not None and cached[0] is array and cached[1] <= RETIGHTEN:
            return cached[1], cached[2]
        velocity = self.store.optimizer.velocity.get(name)
        sq_v = 0.0 if velocity is None else sum_of_squares(velocity)
        bounds = math.sqrt(sum_of_squares(array)), math.sqrt(sq_v)
        self._bounds[name] = (array, *bounds)
        return bounds

    def _stays_finite(self, name: str, grad: np.ndarray, scale: float, sq_g: float) -> bool:
        norm_w, norm_v = self.norm_bounds(name)
        opt = self.store.optimizer
        if bounded(opt, name, norm_w, norm_v, math.sqrt(sq_g), scale, self.max_move):
            return True
        return exact_step_finite(self.store, name, grad, scale, self.max_move)

    def step_finite(self, name: str, grad: np.ndarray) -> bool:
        """A rule's step of `grad` on parameter `name` (as `step_stays_finite`, moving no
        coordinate past max_move): the FiniteCheck of minips.rules.base."""
        return step_stays_finite(self.store, name, grad, max_move=self.max_move)

    def velocity_finite(
        self, name: str, new: np.ndarray, old: np.ndarray | None, total: np.ndarray | None
    ) -> bool:
        """A worker's new velocity `new` (DANA's v_i') finite, the running sum total + (new
        - old) finite (`sum_stays_finite`; total None: none yet), and the optimizer's step
        of `new` finite, moving no coordinate past max_move. ||new||^2 is measured once."""
        sq_new = sum_of_squares(new)
        if not math.isfinite(sq_new) and not all_finite(new):
            return False
        if total is not None and not sum_stays_finite(total, old, new, sq_new):
            return False
        return step_stays_finite(self.store, name, new, max_move=self.max_move, sq_g=sq_new)


def norm_bounds_after(
    opt: SGD, norm_w: float, norm_v: float, norm_g: float, scale: float = 1.0
) -> tuple[float, float]:
    """Upper bounds on ||w'|| and ||v'|| after `opt`'s step_one, from bounds on ||w||, ||v||
    and ||grad|| before it: the triangle inequality on step_one's formula,

        ||scale (grad + wd w)|| <= |scale| (||grad|| + wd ||w||)
        ||v'|| <= m ||v|| + that,   ||w'|| <= ||w|| + lr ||v'||   (v' = that, m = 0)

    so the check needs no pass over the parameters. (For a `plain` parameter, v' = that
    exactly, and the bound with momentum is still an upper bound.)
    """
    step = abs(scale) * (norm_g + opt.weight_decay * norm_w)
    if opt.momentum:
        norm_v = opt.momentum * norm_v + step
        step = norm_v
    return norm_w + opt.lr * step, norm_v


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


def refusal(name: str) -> ProtocolError:
    """The error of an update refused because it would make parameter `name` (its weight,
    its velocity, or the rule's state) non-finite."""
    return ProtocolError(f"the update of {name!r} would make the parameter non-finite", "nonfinite")


__all__ = ["FLOAT32_SAFE", "RETIGHTEN", "SQUARE_SAFE_MOVE", "OverflowCheck", "refusal",
           "bounded", "exact_step_finite", "norm_bounds_after", "step_stays_finite",
           "sum_stays_finite"]  # fmt: skip
