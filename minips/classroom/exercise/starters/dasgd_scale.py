"""Exercise dasgd-scale (about 15 minutes).

Goal: the heart of delay-aware ASGD (minips/rules/delay.py; docs/algorithms.md). A push
computed at version `base` arrives when the server is at version t; its clock staleness is
tau = t - base, and DASGD applies  w <- w - lr * f(tau) * g  with one of four schedules:

    inverse   f(tau) = 1 / tau, except that a fresh push (tau 0) is not penalised either
    exp       f(tau) = exp(-beta * tau)
    poly      f(tau) = (1 + tau) ** (-power)
    cutoff    f(tau) = 1 while tau <= tau_max, 0 past it (the push is dropped)

Questions to answer on paper: which schedule punishes a push of staleness 1 most? Which
one never reaches 0? Why would you prefer cutoff on a cluster with one very slow machine?

Check:  minips exercise check dasgd-scale --file dasgd_scale.py
"""


def dasgd_scale(
    tau: int, schedule: str, beta: float = 0.2, power: float = 0.5, tau_max: int = 8
) -> float:
    """f(tau) for `schedule` in "inverse", "exp", "poly", "cutoff"."""
    # TODO: one formula per schedule
    raise NotImplementedError
