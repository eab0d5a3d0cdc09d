"""A plug-in rule's mistakes are one `error:` line, exit 2, like a built-in rule's: a bad
option value, a constructor that raises, a module that fails as it is imported, a file
that does not exist, a name that is not a Rule (minips.run.rule_plugins.make_rule)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from minips.errors import ConfigError
from minips.run.rule_plugins import make_rule

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "03_new_rule.py"

PLUGINS = """
from minips.rules import Outcome, Rule

class Boom(Rule):
    def __init__(self):
        raise RuntimeError("boom\\nand a second line")

class Fussy(Rule):
    def __init__(self, level=1):
        if level > 3:
            raise LookupError(f"level {level} is past 3")
"""


@pytest.fixture
def plugins(tmp_path):
    (tmp_path / "plugins.py").write_text(PLUGINS)
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    return tmp_path


def test_the_examples_bad_option_is_one_line_naming_it(tmp_path):
    """`minips run --rule examples/03_new_rule.py:Damped --rule-option gamma=abc`."""
    argv = [sys.executable, "-m", "minips", "run", "--rule", f"{EXAMPLE}:Damped",
            "--rule-option", "gamma=abc", "--out", str(tmp_path / "run")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "gamma='abc'" in lines[0] and "could not convert string to float" in lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was made


@pytest.mark.parametrize(
    ("spec", "options", "words"),
    [
        ("{dir}/plugins.py:Boom", {}, "could not be made (RuntimeError: boom)"),
        ("{dir}/plugins.py:Fussy", {"level": 5}, "level=5 refused (LookupError: level 5 is"),
        ("{dir}/broken.py:X", {}, "cannot import rule module {dir}/broken.py: ZeroDivisionError"),
        ("{dir}/missing.py:X", {}, "rule file {dir}/missing.py not found"),
        ("{dir}/plugins.py:Outcome", {}, "has no Rule subclass Outcome"),
    ],
)
def test_every_plugin_failure_is_one_config_error_line(plugins, spec, options, words):
    with pytest.raises(ConfigError) as caught:
        make_rule(spec.format(dir=plugins), **options)
    assert words.format(dir=plugins) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_declared_number_option_that_is_not_a_number_is_named():
    with pytest.raises(ConfigError, match="option staleness='abc' is not an integer"):
        make_rule("ssp", staleness="abc")
    with pytest.raises(ConfigError, match="is not an integer"):
        make_rule("ssp", staleness=True)
