"""Running runs: the one definition of a run's configuration (config.py), the server built
from it (build.py), local runs (launch.py) with their processes (processes.py) and the
server's recovery (recovery.py), cluster launch (cluster.py), shaped links (netem.py) and
what a worker is made to emulate (conditions.py: slowdown schedules, speeds.py; its own
link, netlimit.py)."""
