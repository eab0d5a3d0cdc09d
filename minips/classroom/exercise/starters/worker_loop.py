"""Exercise worker-loop (about 30 minutes).

Goal: write the loop at the heart of every data-parallel worker (minips/worker/worker.py), on the
Python client of the protocol, minips.worker.client.PSClient (docs/protocol.md, section 5):

    hello -> repeat { pull -> compute gradients -> push } -> bye

run_worker gets a connected PSClient `ps`, a function `compute_gradients(params)` that
returns (grads, n_samples) for a dict of parameters (name -> array), and a number of steps.

Things the check verifies (against a real server it starts for you):
- every step computes on the server's *latest* parameters: keep a dict of parameters and
  update it from each pull's `reply.params`; pass `since=` the version you already have,
  so the server only sends what changed;
- each push says which version the gradient was computed at (`base=`): the server measures
  staleness tau = t - base from it, so a wrong base makes every push look stale;
- each push reports its `samples=` (the server counts them, and stops at its budget);
- the loop ends early when a reply says `stop` (pull's or push's);
- the worker says `bye` at the end.

Check:  minips exercise check worker-loop --file worker_loop.py
"""

from collections.abc import Callable

import numpy as np

from minips.worker.client import PSClient


def run_worker(
    ps: PSClient,
    compute_gradients: Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], int]],
    steps: int,
) -> None:
    """Register, train for `steps` steps (or until the server says stop), leave."""
    # TODO 1: say hello
    # TODO 2: for each step: pull (since=...), update your params, compute, push (base=...,
    #         samples=...); stop when a reply says so
    # TODO 3: say bye
    raise NotImplementedError
