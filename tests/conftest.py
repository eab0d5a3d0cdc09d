"""tests/ mirrors minips/: tests/<package>/test_*.py for each package, the whole (layout,
docs, examples, CI) at the top. Shared helpers (test_server_support.py, ...) and the test
modules others reuse are imported by name, so every folder of tests/ is on the path."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: two test processes per core. Most tests wait on real processes (a run's
    server, workers, a browser) for about half their time, so a second test per core fills
    that wait: on 2 cores the suite measured 644 s with 4 against 730 s with 2."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 * (cores or 1)
