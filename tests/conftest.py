"""tests/ mirrors minips/: tests/<package>/test_*.py for each package, the whole (layout,
docs, examples, CI) at the top. Shared helpers (test_server_support.py, ...) and the test
modules others reuse are imported by name, so every folder of tests/ is on the path."""

import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_configure(config) -> None:
    """Compile minips to bytecode once, before any test. The suite starts many hundreds of
    Python processes (servers, workers, evaluators, launchers: 60 for the 14 tests of
    test_launch.py and test_recovery_faults.py), and where PYTHONDONTWRITEBYTECODE is set
    (this machine and CI set it) each would compile the modules it imports again: 80 ms of
    a server's 0.5 s start, measured on 2 cores. They are left only to read the bytecode."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall

    import minips

    compileall.compile_dir(Path(minips.__file__).parent, quiet=2)


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: two test processes per core. Most tests wait on real processes (a run's
    server, workers, a browser) and on timeouts for much of their time, which other tests
    fill. Three per core measured 432 s against 483 s with two (2 cores, one tree), but two
    of its three quiet runs had a test fail on timing, so two it is until those are found."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 * (cores or 1)


def pytest_collection_modifyitems(config, items) -> None:
    """Start the slowest tests first (the list in tests/slowest.txt, as `--durations` prints
    it). With pyproject's `--maxschedchunk 1` xdist hands each test process one test at a
    time, so the long ones (a run with kills, a browser class) run side by side from the start
    instead of one of them starting last and holding the suite's end while the other test
    processes sit idle. A test the list does not name keeps its place after them.
    KEEP_TEST_ORDER=1 keeps the order the command line gives (tools/mutate.py: a
    mutant's own fast tests first, so a killed one is decided in seconds)."""
    if os.environ.get("KEEP_TEST_ORDER"):
        return
    seconds = {}
    for line in (TESTS / "slowest.txt").read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "call" and fields[0].endswith("s"):
            seconds[fields[2]] = float(fields[0].removesuffix("s"))
    items.sort(key=lambda item: -seconds.get(item.nodeid, 0.0))
