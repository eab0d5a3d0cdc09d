"""Solution of exercise dasgd-scale."""

import math


def dasgd_scale(tau, schedule, beta=0.2, power=0.5, tau_max=8):
    if schedule == "inverse":
        return 1.0 / max(1, tau)
    if schedule == "exp":
        return math.exp(-beta * tau)
    if schedule == "poly":
        return (1.0 + tau) ** -power
    return 1.0 if tau <= tau_max else 0.0
