"""Running and reading runs: the one definition of a run's configuration (config.py), local
runs (launch.py) and their recovery (recovery.py), shaped links (netem.py), the planner
(planner.py), the run log (metrics.py, runlog.py), reports (report.py) and plots (plot.py)."""
