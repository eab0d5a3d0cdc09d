"""The server's side: the loop and the push/pull path (server.py), membership and operator
requests (control.py), the worker registry (registry.py), the parameters and their
optimizer (store.py), the checks beside the path (guard.py, inflow.py), pulls by a plan
(pulls.py) and the counters (telemetry.py)."""
