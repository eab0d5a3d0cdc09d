"""A run's results: metrics, the run directory, reports, plots, the trace."""
