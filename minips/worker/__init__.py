"""The worker's side: a worker's step and loop (worker.py), its client (client.py: hello,
pull, push over a DEALER socket, retries), a step's pushes by a plan (transmit.py), link
limits (netlimit.py), Chrome traces (trace.py) and the read-only evaluator (evaluator.py)."""
