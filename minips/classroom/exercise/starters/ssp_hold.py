"""Exercise ssp-hold (about 10 minutes).

Goal: the one condition that makes Stale Synchronous Parallel (Ho et al., NIPS 2013) what it
is (minips/rules/classic.py, SSP). Each worker's *clock* counts its finished steps. With a
staleness bound s, the server answers a worker's pull only if that worker is at most s
clocks ahead of the slowest live worker; otherwise it holds the pull until the slowest
catches up.

may_pull(my_clock, clocks, s): `clocks` are the clocks of all live workers, this one
included. Return True when the pull may be answered now.

Questions: what is s = 0? What would s = infinity be? Why does a fast worker under SSP
still lose time when one worker is 4x slower?

Check:  minips exercise check ssp-hold --file ssp_hold.py
"""


def may_pull(my_clock: int, clocks: list[int], s: int) -> bool:
    """True when a worker at `my_clock` may read the parameters now (bound s)."""
    # TODO
    raise NotImplementedError
