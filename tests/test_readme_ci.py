"""CI runs the README's test command as written, in a fresh venv with nothing upgraded, and
the test extra holds what the suite needs there (a fresh Python 3.11 venv has pip 23.2 and
setuptools 65.5, and no `wheel`)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^python3 -m venv .*pip install '\.\[test\]'.*$", readme, re.M)
    return command


def test_ci_runs_the_readmes_test_command_and_upgrades_nothing():
    command = _readme_test_command()
    venv_half, _, test_half = command.partition(" && pip install")
    assert venv_half == "python3 -m venv .venv && . .venv/bin/activate"
    script = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert f"pip install{test_half}" in lines  # verbatim
    assert 'python3 -m venv "$VENV" && . "$VENV/bin/activate"' in lines  # the venv's place
    assert not [line for line in lines if "--upgrade" in line or " -U " in line]


def test_the_test_extra_holds_wheel_for_the_handout_tests_wheel_build():
    """tests/classroom/test_exercise_handout.py builds a wheel with `pip wheel
    --no-build-isolation`: setuptools < 70.1 (65.5 in a fresh venv) needs the `wheel`
    package for that."""
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    extra = setup["options.extras_require"]["test"].split()
    assert "wheel" in [re.split(r"[<>=!~ ]", requirement)[0] for requirement in extra]
