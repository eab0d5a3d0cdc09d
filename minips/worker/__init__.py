"""The worker's side: a worker's step and loop (worker.py), its client (client.py: hello,
pull, push over a DEALER socket, retries), a step's pushes by a plan (transmit.py), its
replies (replies.py) and what it is given: the session hello chooses (session.py: one
server or a group), progress, trace and the conditions a run emulates (hooks.py). The
read-only evaluator and the Chrome trace are minips.results; a server group's fan-out is
minips.group."""
