"""The server's loop: the loop and the push path (server.py), who joins and leaves
(membership.py), answering pulls (pulls.py), a retried push (retries.py), the socket and
replies (router.py), the stop state (stop.py), the jobs of every turn (timers.py) and how a
server runs (options.py). The state it keeps is minips.state; the operations beside its
path (checks, limits, failures, counters, checkpoints) attach at the named points of
seams.py, assembled in minips/ops/server_ops.py."""
