"""A rule's options are checked where a run builds its rule (minips.run.rule_options): every
path a user takes says the same one line for a bad option, while the core's `make_rule`
leaves the names and kinds to the constructor."""

import pytest

import minips
from minips import rules
from minips.errors import ConfigError
from minips.run import rule_options, rule_plugins
from minips.run.config import RunConfig

BAD = [
    ({"foo": 1}, "rule 'ssp' has no option 'foo': its options are staleness"),
    ({"staleness": True}, "rule 'ssp': option staleness=True is not an integer"),
    ({"staleness": "x"}, "rule 'ssp': option staleness='x' is not an integer"),
]


@pytest.mark.parametrize(("options", "message"), BAD)
def test_every_user_path_says_the_same_line(options, message):
    with pytest.raises(ConfigError) as public:
        minips.make_rule("ssp", **options)
    with pytest.raises(ConfigError) as run:
        RunConfig(model="lenet5", rule="ssp", rule_options=options).validate()
    assert str(public.value) == str(run.value) == message


def test_the_run_paths_build_through_the_checks():
    # minips.make_rule and RunConfig.validate/make_server use the plug-ins' make_rule,
    # which builds through build_rule: were a builder to call the core's directly, the
    # names would reach the constructor unchecked (a TypeError, not a line).
    assert minips.make_rule is rule_plugins.make_rule
    assert rule_plugins.build_rule is rule_options.build_rule
    with pytest.raises(TypeError):
        rules.make_rule("ssp", foo=1)
