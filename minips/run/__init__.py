"""Running and reading runs: the one definition of a run's configuration (config.py), the
server built from it (build.py), local runs (launch.py) with their processes (processes.py)
and the server's recovery (recovery.py), shaped links (netem.py), the planner (planner.py),
metrics logs (metrics.py), the run directory (rundir.py), reports (report.py) and plots
(plot.py)."""
