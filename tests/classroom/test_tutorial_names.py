"""docs/tutorial.md names the code's classes and methods: each `Class.method` it names exists."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import minips

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
SKIP = (
    "minips.classroom.web",
    "minips.classroom.dashboard",
    "minips.classroom.exercise",
    "minips.__main__",
)


def _classes() -> dict[str, list[type]]:
    """Every minips class by name (a name may be used twice in different packages)."""
    found: dict[str, list[type]] = {}
    for info in pkgutil.walk_packages(minips.__path__, "minips."):
        if info.name.startswith(SKIP):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__.startswith("minips"):
                found.setdefault(name, []).append(value)
    return found


def test_every_class_method_the_tutorial_names_exists():
    classes = _classes()
    named = set(re.findall(r"`([A-Z][A-Za-z]+)\.([a-z_]+[a-z0-9_]*)", TUTORIAL.read_text()))
    assert len(named) > 20  # the test reads the tutorial, not nothing
    missing = [f"{cls}.{attr}" for cls, attr in sorted(named)
               if not any(hasattr(c, attr) for c in classes.get(cls, []))]  # fmt: skip
    assert not missing, f"docs/tutorial.md names what the code does not have: {missing}"
