"""The worker's side: a worker's step and loop (worker.py), its client (client.py: hello,
pull, push over a DEALER socket, retries), a step's pushes by a plan (transmit.py), its
replies (replies.py) and link limits (netlimit.py). The read-only evaluator and the Chrome
trace are minips.results; a server group's fan-out is minips.group."""
