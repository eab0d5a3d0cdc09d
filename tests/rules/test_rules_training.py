"""The new rules train for real: workers over sockets, and `minips run` from the CLI."""

import json

import pytest
from test_server_support import train_two_workers

from minips.cli import main
from minips.cli.ps_cmd import run_command
from minips.data import load_dataset
from minips.nn import build_model
from minips.results.metrics import read_metrics
from minips.run.config import RunConfig
from minips.trainer import evaluate

FAST = {"model": "mlp", "dataset": "synthetic", "lr": 0.05, "momentum": 0.5}


@pytest.mark.parametrize(
    "rule, options",
    [
        ("dasgd", {}),
        ("dasgd", {"schedule": "cutoff", "tau_max": 1}),
        ("vsgd", {"rho": 0.02}),
        ("dcasgd", {"lam": 0.04}),
    ],
    ids=["dasgd", "dasgd-cutoff", "vsgd", "dcasgd"],
)
def test_two_workers_converge_with_each_new_rule(rule, options):
    spec = RunConfig(
        epochs=1, workers=2, rule=rule, rule_options=options, bind="tcp://127.0.0.1:*", **FAST
    )
    params, records, reports, stats = train_two_workers(spec)

    model = build_model("mlp", seed=0)
    model.set_params(params)
    data = load_dataset("synthetic")
    accuracy, _ = evaluate(model, data.x_test, data.y_test)
    assert accuracy >= 0.9
    assert sum(report.samples for report in reports) == 2000
    applied = [r for r in records if not r["dropped"]]
    assert len(applied) == stats["updates"] and len(records) == stats["updates"] + stats["dropped"]
    assert all(r["rule"] == rule for r in records)
    if rule == "vsgd":
        assert all(set(r["value_staleness"]) == {"fc1", "fc2", "fc3"} for r in records)
        # The samples cost about rho of the gradients' bytes (plus the floor for biases).
        ratio = stats["extra_bytes_in"] / stats["grad_bytes_in"]
        assert 0.02 <= ratio < 0.03
        assert sum(report.extra_bytes for report in reports) == stats["extra_bytes_in"]
    else:
        assert stats["extra_bytes_in"] == 0


def test_minips_run_vsgd_from_the_cli(tmp_path, capsys):
    main(
        ["run", "--rule", "vsgd", "--vsgd-rho", "0.05", "--vsgd-min-samples", "16",
         "--model", "mlp", "--dataset", "synthetic", "--lr", "0.05", "--momentum", "0.5",
         "--epochs", "2", "--out", str(tmp_path), "--quiet", "--eval-interval", "0.5"]
    )  # fmt: skip
    assert "test accuracy" in capsys.readouterr().out
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["rule"] == "vsgd" and config["rule_options"] == {"rho": 0.05, "min_samples": 16}
    records = read_metrics(tmp_path / "metrics.jsonl")
    updates = [r for r in records if r["event"] == "update"]
    assert updates and all(r["rule"] == "vsgd" for r in updates)
    assert all(set(r["value_staleness"]) == {"fc1", "fc2", "fc3"} for r in updates)
    for r in updates:  # a fresh push is 0 behind in value; a stale one is behind in value
        fresh = r["staleness"] == [0]
        assert all((d == 0) == fresh for d in r["value_staleness"].values()), r
    assert records[-1]["accuracy"] >= 0.9


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rule", "asgd", "--beta", "0.3"], "--beta only applies to --rule dasgd"),
        (["--rule", "vsgd", "--dc-lambda", "0.1"], "--dc-lambda only applies to --rule dcasgd"),
        (["--rule", "dasgd", "--vsgd-rho", "0.1"], "--vsgd-rho only applies to --rule vsgd"),
        (["--rule", "ssp", "--tau-max", "3"], "--tau-max only applies to --rule dasgd"),
        (
            ["--rule", "asgd", "--vsgd-step-decay", "0.5"],
            "--vsgd-step-decay only applies to --rule vsgd",
        ),
        (["--rule", "dasgd", "--power", "2"], "power only applies to schedule 'poly'"),
        (["--rule", "vsgd", "--rule-option", "rho=7"], "rho must be in (0, 1]"),
        (
            ["--rule", "dcasgd", "--rule-option", "lambda=1"],
            "rule 'dcasgd' has no option 'lambda': its options are lam",
        ),
        (
            ["--rule", "ringmaster", "--rule-option", "R=4"],
            "rule 'ringmaster' has no option 'R': its options are delay_threshold",
        ),
        (
            ["--rule", "dana-gap", "--rule-option", "gamma=0.9"],
            "rule 'dana-gap' has no option 'gamma': its options are momentum, decay",
        ),
        (
            ["--rule", "asgd", "--rule-option", "lr=1"],
            "rule 'asgd' has no option 'lr': it takes no options",
        ),
    ],
)
def test_rule_options_with_the_wrong_rule_are_one_line_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as info:
        main(["run", "--out", str(tmp_path), "--quiet", *args])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not (tmp_path / "logs").exists()  # refused before any process started


def test_named_rule_options_reach_the_rule():
    def spec(rule, *flags):
        # The options exactly as `minips run` parses them from the command line.
        args = ["--rule", rule, "--model", "mlp", "--dataset", "synthetic", *flags]
        values = run_command().make_context("run", args).params
        for own in ("out", "eval_interval", "force", "dashboard", "dashboard_listen", "quiet"):
            values.pop(own)
        return RunConfig.from_options(values).rule_options

    assert spec("dasgd", "--dasgd-schedule", "exp", "--beta", "0.3") == {
        "schedule": "exp",
        "beta": 0.3,
    }
    assert spec("dasgd", "--dasgd-schedule", "cutoff", "--tau-max", "2") == {
        "schedule": "cutoff",
        "tau_max": 2,
    }
    assert spec("vsgd", "--vsgd-rho", "0.1", "--vsgd-min-samples", "8") == {
        "rho": 0.1,
        "min_samples": 8,
    }
    assert spec("vsgd", "--vsgd-step-decay", "0.5") == {"step_decay": 0.5}
    assert spec("dcasgd", "--dc-lambda", "0.5") == {"lam": 0.5}
    assert spec("ssp", "--staleness", "2") == {"staleness": 2}
    # A named flag wins over the same option given as --rule-option.
    assert spec("ssp", "--rule-option", "staleness=5", "--staleness", "1") == {"staleness": 1}
