"""The server's side: the loop and the push path (server.py), who joins and leaves
(membership.py), answering pulls (pulls.py), the socket and replies (router.py), the stop
state (stop.py), checkpoints (checkpoints.py), the worker registry (registry.py), the
parameters and their optimizer (store.py), the checks beside the path (checks.py,
inflow.py), the counters (telemetry.py) and how a server runs (options.py)."""
