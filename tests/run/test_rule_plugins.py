"""`--rule MODULE:CLASS`: a rule class outside minips, loaded by make_rule (and by the server
process of `minips run`, which examples/03_new_rule.py and tests/test_examples.py run), and
the public `minips.make_rule` is that one."""

import sys

import pytest

import minips
from minips.errors import ConfigError
from minips.rules import RULES, Rule
from minips.run.rule_plugins import make_rule, rule_momentum

RULE_SOURCE = """
from minips.rules import Outcome, Rule

class Halved(Rule):
    name = "halved"
    def __init__(self, factor=0.5):
        self.factor = factor
    def on_push(self, push):
        return Outcome.update_now(push, scale=self.factor)

NOT_A_RULE = 3
"""


@pytest.fixture
def rule_file(tmp_path):
    path = tmp_path / "my_rules.py"
    path.write_text(RULE_SOURCE)
    return path


def test_a_py_file_rule_is_built_with_its_options(rule_file):
    rule = make_rule(f"{rule_file}:Halved", factor=0.25)
    assert isinstance(rule, Rule) and rule.name == "halved" and rule.factor == 0.25
    assert "halved" not in RULES  # loading one does not change the registry
    assert minips.make_rule is make_rule


def test_a_plug_ins_own_momentum_is_the_servers_default(rule_file):
    rule_file.write_text(
        RULE_SOURCE.replace('name = "halved"', 'name = "halved"\n    default_momentum = 0.5')
    )
    assert rule_momentum(f"{rule_file}:Halved") == 0.5
    assert rule_momentum("dana") == 0.0 and rule_momentum("asgd") == 0.9
    assert rule_momentum("nosuchrule") == 0.9 and rule_momentum(None) == 0.9


def test_a_dotted_module_rule_is_imported_from_the_path(rule_file, monkeypatch):
    monkeypatch.syspath_prepend(str(rule_file.parent))
    monkeypatch.delitem(sys.modules, "my_rules", raising=False)
    assert make_rule("my_rules:Halved").factor == 0.5


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nosuchrule", "unknown update rule 'nosuchrule'"),
        ("{dir}/missing.py:Halved", "missing.py not found"),
        ("no_such_module_xyz:Halved", "cannot import rule module no_such_module_xyz"),
        ("{file}:Nope", "has no Rule subclass Nope"),
        ("{file}:NOT_A_RULE", "has no Rule subclass NOT_A_RULE"),
        ("{file}:", "unknown update rule"),
    ],
)
def test_bad_specs_are_one_line_config_errors(rule_file, spec, words):
    spec = spec.format(dir=rule_file.parent, file=rule_file)
    with pytest.raises(ConfigError, match=words) as caught:
        make_rule(spec)
    assert "\n" not in str(caught.value)


def test_bad_options_of_an_external_rule_name_it(rule_file):
    with pytest.raises(ConfigError, match="bad options for rule .*Halved"):
        make_rule(f"{rule_file}:Halved", speed=2)


def test_a_syntax_error_in_the_rule_file_is_a_config_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("class Oops(:\n")
    with pytest.raises(ConfigError, match="cannot import rule module"):
        make_rule(f"{broken}:Oops")
