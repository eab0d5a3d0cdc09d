"""The run's configuration is defined once (minips.run.config): everything else derives from it."""

import json
import subprocess
import sys
import threading
from dataclasses import make_dataclass, replace

import msgpack
import pytest
from click.testing import CliRunner

from minips.cli import COMMANDS, cli
from minips.cli.ps_cmd import run_command, server_command, server_config
from minips.errors import ConfigError
from minips.nn import build_model
from minips.rules import RULES
from minips.run.build import make_server
from minips.run.config import RunConfig, TrainConfig
from minips.run.settings import setting
from minips.server.server import ServerOptions
from minips.worker.client import PSClient

FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05, "momentum": 0.5, "rule": "asgd"}
RUN_OWN = (
    "out",
    "eval_interval",
    "force",
    "dashboard",
    "dashboard_listen",
    "quiet",
)  # `minips run`'s options that are not the config's
SERVER_OWN = ("config_file", "endpoint_file", "updates_log", "t0", "verbose")


def _parsed(command, args, own):
    """The config a command builds from `args` (as its callback does)."""
    values = command.make_context(command.name, list(args)).params
    for name in own:
        values.pop(name)
    return values


def _served(config_class, args) -> RunConfig:
    """The config `minips server ARGS` serves, built as its callback builds it."""
    command = server_command(config_class)
    context = command.make_context(command.name, list(args), auto_envvar_prefix="MINIPS_SERVER")
    with context:
        values = dict(context.params)
        config_file = values["config_file"]
        for name in SERVER_OWN:
            values.pop(name)
        return server_config(config_class, config_file, values)


def _help(command) -> str:
    result = CliRunner().invoke(command, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())  # one line: wrapping aside


def _hello_config(config) -> dict:
    """The `config` map a worker gets in hello from a real server built from `config`."""
    server = make_server(config)
    loop = threading.Thread(target=server.run, daemon=True)
    loop.start()
    try:
        with PSClient(server.endpoint, timeout=10) as client:
            reply = client.hello({"role": "observer"})
            client.bye()
    finally:
        server.request_stop()
        loop.join(timeout=10)
        server.close()
    return reply["config"]


def test_a_field_added_at_runtime_reaches_the_cli_config_json_the_server_and_hello(tmp_path):
    extended = make_dataclass(
        "Extended",
        [("warmup_steps", int, setting(0, "Steps of learning-rate warmup.", to_workers=True,
                                       minimum=0))],
        bases=(RunConfig,),
        frozen=True,
    )  # fmt: skip
    run, server = run_command(extended), server_command(extended)
    for command in (run, server):
        assert "--warmup-steps INTEGER RANGE Steps of learning-rate warmup. [default: 0; x>=0]" in (
            _help(command)
        )
    config = extended.from_options(
        _parsed(run, ["--warmup-steps", "7", "--workers", "3", *_fast_args()], RUN_OWN)
    )
    assert config.warmup_steps == 7 and config.workers == 3
    assert json.loads(config.to_json())["warmup_steps"] == 7
    # The server process reads it from the run's config.json, back to the same config.
    (tmp_path / "config.json").write_text(config.to_json())
    assert _served(extended, ["--config", str(tmp_path / "config.json")]) == config
    assert (
        extended.from_options(_parsed(server, ["--warmup-steps", "7"], SERVER_OWN)).warmup_steps
        == 7
    )
    # Its declared range holds for the CLI (a usage error) and for code alike.
    result = CliRunner().invoke(run, ["--warmup-steps", "-1"])
    assert result.exit_code == 2 and "--warmup-steps" in result.output
    with pytest.raises(ConfigError, match="warmup steps must be >= 0, got -1"):
        extended(warmup_steps=-1, **FAST).validate()
    # Workers receive it in hello, through a real server.
    served = extended(warmup_steps=7, bind="tcp://127.0.0.1:*", **FAST)
    assert _hello_config(served)["warmup_steps"] == 7


def _fast_args() -> list[str]:
    return [
        "--model",
        "mlp",
        "--dataset",
        "synthetic",
        "--lr",
        "0.05",
        "--momentum",
        "0.5",
        "--rule",
        "asgd",
    ]


def test_hello_config_keeps_its_keys_and_their_order():
    config = RunConfig(workers=2, hetero=[1.0, 2.5], data_dir="/data", epochs=3, seed=4, **FAST)
    spec = build_model("mlp", seed=4).spec
    # These keys in this order: msgpack keeps the order, so hello's bytes depend on it.
    expected = {
        "model": spec, "dataset": "synthetic", "data_dir": "/data", "epochs": 3,
        "batch_size": 64, "seed": 4, "hetero": [1.0, 2.5], "lr": 0.05,
    }  # fmt: skip
    assert msgpack.packb(config.hello_config(spec)) == msgpack.packb(expected)
    served = _hello_config(RunConfig(bind="tcp://127.0.0.1:*", **FAST))
    sent = RunConfig(**FAST).hello_config(build_model("mlp", seed=0).spec)
    # (an observer's rank is world_size)
    assert served == {**sent, "rank": 2, "world_size": 2, "rule": {"name": "asgd"}}


def _every_kind_of_field() -> RunConfig:
    return RunConfig(
        epochs=3, batch_size=32, lr=0.1234567891234, momentum=0.25, weight_decay=1e-4, seed=7,
        rule="dasgd", rule_options={"schedule": "exp", "beta": 0.3}, workers=3,
        hetero=[1.0, 1.5, 4.0], data_dir="/somewhere", heartbeat_timeout=2.5,
        checkpoint="/tmp/x.npz", checkpoint_every=10, max_samples=5000, browser=1,
        bind="tcp://127.0.0.1:6000", model="mlp", dataset="synthetic", bandwidth="100mbit",
    )  # fmt: skip


def test_the_server_serves_config_json_exactly_and_the_options_given_beside_it(
    tmp_path, monkeypatch
):
    config = _every_kind_of_field()
    path = tmp_path / "config.json"
    path.write_text(config.to_json())
    assert RunConfig.from_json(path) == config
    assert _served(RunConfig, ["--config", str(path)]) == config
    # Options given on the command line change it (a restarted server: --resume, --bind) ...
    (tmp_path / "c.npz").write_bytes(b"")
    args = ["--config", str(path), "--bind", "tcp://127.0.0.1:6001", "--resume",
            str(tmp_path / "c.npz"), "--dasgd-schedule", "inverse"]  # fmt: skip
    changed = _served(RunConfig, args)
    assert changed.bind == "tcp://127.0.0.1:6001" and changed.resume == str(tmp_path / "c.npz")
    assert changed.rule_options == {"schedule": "inverse", "beta": 0.3}
    assert replace(changed, bind=config.bind, resume=None, rule_options=config.rule_options) == (
        config
    )
    # ... but not their defaults, nor variables of the environment (which do set the options
    # of a server started without a file).
    monkeypatch.setenv("MINIPS_SERVER_WORKERS", "9")
    assert _served(RunConfig, ["--config", str(path)]) == config
    assert _served(RunConfig, []).workers == 9


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "not a configuration file"),
        ("[1, 2]", "not a JSON object"),
        ('{"workers": 2, "wrokers": 3}', "unknown configuration field(s) wrokers"),
        ('{"workers": "two"}', "workers must be int, got 'two'"),
        ('{"hetero": 1.5}', "hetero must be list, got 1.5"),
        ('{"auth": 1}', "auth must be bool, got 1"),
    ],
)
def test_a_config_file_that_is_not_one_is_refused_in_one_line(tmp_path, text, error):
    path = tmp_path / "config.json"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "minips", "server", "--config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {path}: ") and error in lines[0]


def test_a_float_field_takes_a_hand_written_whole_number(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"lr": 1, "model": "mlp"}')
    assert RunConfig.from_json(path) == RunConfig(lr=1.0, model="mlp")


def test_server_options_come_from_the_config_and_defaults_from_one_place():
    options = RunConfig(workers=3, heartbeat_timeout=2.0, checkpoint="c.npz").server_options()
    assert (options.world_size, options.heartbeat_timeout, options.checkpoint_path) == (
        3,
        2.0,
        "c.npz",
    )
    # The server's own default is the CLI's: run and server show the same heartbeat.
    default = ServerOptions().heartbeat_timeout
    for command in (run_command(), server_command()):
        assert f"dead. [default: {default}; x>0]" in _help(command)


def test_rule_flags_come_from_the_rules_and_show_their_defaults():
    text = _help(run_command())
    declared = [option for rule in RULES.values() for option in rule.options]
    assert len(declared) >= 9
    for option in declared:
        assert f"{option.flag} " in text
        assert f"{option.help} [default: {option.default}]" in text


def test_train_takes_the_training_fields_and_its_own():
    names = [f for f in TrainConfig.__dataclass_fields__]
    assert names == [
        "model", "dataset", "data_dir", "epochs", "batch_size", "seed", "lr", "momentum",
        "weight_decay", "resume", "eval_every",
    ]  # fmt: skip
    assert TrainConfig().lr == RunConfig().lr
    with pytest.raises(ConfigError, match="eval every must be >= 0"):
        TrainConfig(eval_every=-1).validate()


def test_minips_help_lists_the_commands_without_importing_them():
    code = (
        "import sys\nfrom minips.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(sys.modules)))"
    )

    def modules(*args):
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout, set(proc.stdout.splitlines()[-1].split())

    out, loaded = modules("--help")
    assert not {"numpy", "zmq", "msgpack", "minips.cli.ps_cmd", "minips.run.config"} & loaded
    listing = " ".join(out.split())
    for name, (_, line) in COMMANDS.items():
        assert (f"{name} {line}" in listing) if line else (name not in listing), name
    _, loaded = modules("run", "--help")  # the command itself is imported when asked for
    assert {"minips.cli.ps_cmd", "minips.run.config", "numpy"} <= loaded


def test_the_command_table_matches_the_commands():
    ctx = cli.make_context("minips", ["--help"], resilient_parsing=True)
    for name, (path, line) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command.name == name, path
        assert command.hidden == (line is None), name
        if line is not None:
            assert command.help.strip().splitlines()[0] == line, name


def test_a_shard_index_and_a_plan_batch_are_checked_at_their_exact_limits():
    """--shard K-1 is the last shard of --servers K, --shard K none; --plan auto times
    batches of at most MAX_PLAN_BATCH (minips.run.plan_measure) samples."""
    from minips.run.plan_measure import MAX_PLAN_BATCH

    base = RunConfig(model="mlp", dataset="synthetic")
    replace(base, servers=2, shard=1, root="tcp://127.0.0.1:5555").validate()
    with pytest.raises(ConfigError, match=r"--shard 2 is not a shard of --servers 2 \(0\.\.1\)"):
        replace(base, servers=2, shard=2, root="tcp://127.0.0.1:5555").validate()
    replace(base, plan="auto", batch_size=MAX_PLAN_BATCH).validate()
    with pytest.raises(ConfigError, match=f"at most {MAX_PLAN_BATCH}, got {MAX_PLAN_BATCH + 1}"):
        replace(base, plan="auto", batch_size=MAX_PLAN_BATCH + 1).validate()
