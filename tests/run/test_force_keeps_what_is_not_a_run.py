"""`--force` replaces a previous run's files only: a folder holding files but no minips run
is refused in one line with nothing removed, and the files the command reads (--plan,
--resume, --keys, --data-dir) stay wherever they lie in --out (minips/run/prepare.py)."""

from __future__ import annotations

import json

import pytest

from minips.cli import main
from minips.errors import RunDirError
from minips.results.rundir import RunDir
from minips.run.config import RunConfig
from minips.run.prepare import claim_run_dir, holds_a_run, run_inputs
from minips.run.runlock import LOCK_NAME

TINY_RUN = ["--model", "mlp", "--dataset", "synthetic", "--epochs", "1", "--workers", "1"]


def _someone_elses_folder(folder):
    """An application's folder whose files bear a run's file names."""
    (folder / "logs").mkdir(parents=True)
    (folder / "config.json").write_text('{"my": "app config"}')
    (folder / "logs" / "app.log").write_text("important log\n")
    (folder / "summary.json").write_text("notes\n")
    (folder / "checkpoint.npz").write_text("x\n")
    (folder / "src").mkdir()
    (folder / "src" / "main.py").write_text("code\n")
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


def test_force_refuses_a_folder_that_holds_no_run_and_removes_nothing(tmp_path, capsys):
    folder = tmp_path / "proj"
    before = _someone_elses_folder(folder)
    assert not holds_a_run(folder)
    with pytest.raises(RunDirError, match="holds files but no minips run"):
        claim_run_dir(folder, force=True)
    with pytest.raises(SystemExit) as leaving:
        main(["run", *TINY_RUN, "--quiet", "--force", "--out", str(folder)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert leaving.value.code == 2 and len(lines) == 1, lines
    assert lines[0] == (
        f"error: --out {folder} holds files but no minips run (no {LOCK_NAME}, no minips "
        "config.json): --force replaces only a run's files; choose a new directory"
    )
    after = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}
    assert after == before  # not even a run.lock


def test_a_runs_folder_is_replaced_and_the_users_own_files_in_it_stay(tmp_path):
    """A folder a run claimed (its run.lock), or a run's config.json without it: --force
    removes the run's files, not the others."""
    for sign in ("lock", "config"):
        folder = tmp_path / sign
        _someone_elses_folder(folder)
        if sign == "lock":
            (folder / LOCK_NAME).write_text("pid 1: minips run\n")
        else:
            (folder / "config.json").write_text(RunConfig(model="mlp").to_json())
        assert holds_a_run(folder)
        with claim_run_dir(folder, force=True):
            left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            assert left == [LOCK_NAME, "src/main.py"]


def test_force_keeps_the_plan_file_it_was_given_in_out(tmp_path, capsys):
    """`minips plan --json exp1/plan.json`, then `minips run --plan exp1/plan.json --out
    exp1 --force`: the plan is read, not removed first (twice: the second time exp1 holds
    the first run)."""
    out = tmp_path / "exp1"
    out.mkdir()
    plan = out / "plan.json"
    main(["plan", "--model", "mlp", "--bandwidth", "100mbit", "--json", str(plan)])
    given = json.loads(plan.read_text())
    for _ in range(2):
        main(["run", *TINY_RUN, "--quiet", "--force", "--out", str(out), "--plan", str(plan)])
        assert json.loads(plan.read_text()) == given
        assert json.loads((out / "summary.json").read_text())["ended"] == "finished"
    capsys.readouterr()


def test_the_inputs_in_out_are_kept_by_claiming_and_by_clearing_outputs(tmp_path):
    out = tmp_path / "run"
    (out / "keys").mkdir(parents=True)
    (out / "data" / "logs").mkdir(parents=True)
    (out / "data" / "logs" / "x.log").write_text("a data file, named like a log\n")
    (out / "summary.json").write_text('{"format": 1, "params": {}}')  # a plan, oddly named
    (out / "checkpoint.npz").write_text("the model to resume\n")
    (out / LOCK_NAME).write_text("")
    (out / "eval.jsonl").write_text("{}\n")  # the previous run's: goes
    inputs = {
        "plan": "summary.json",
        "resume": "checkpoint.npz",
        "keys": "keys",
        "data_dir": "data",
    }
    config = RunConfig(model="mlp", **{option: str(out / name) for option, name in inputs.items()})
    assert {p.name for p in run_inputs(config)} == {
        "summary.json",
        "checkpoint.npz",
        "keys",
        "data",
    }
    with claim_run_dir(out, force=True, keep=run_inputs(config)):
        RunDir(out).clear_outputs(keep=run_inputs(config))
        left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
        assert left == ["checkpoint.npz", "data/logs/x.log", LOCK_NAME, "summary.json"]
