"""tests/ mirrors minips/: tests/<package>/test_*.py for each package, the whole (layout,
docs, examples, CI) at the top. Shared helpers (test_server_support.py, ...) and the test
modules others reuse are imported by name, so every folder of tests/ is on the path."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
for folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name.isidentifier())]:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
