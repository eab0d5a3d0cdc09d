"""A misspelled MINIPS_* variable is named in one warning line, not silently ignored."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _minips(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("MINIPS_")}
    return subprocess.run(
        [sys.executable, "-m", "minips", *args], env={**full, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_misspelled_option_variable_is_named_with_the_one_it_resembles():
    done = _minips(["run", "--help"], {"MINIPS_RUN_WORKRS": "4"})
    assert done.returncode == 0
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: MINIPS_RUN_WORKRS is ignored: no option of `minips run` reads it "
        "(did you mean MINIPS_RUN_WORKERS?)"
    ]


@pytest.mark.parametrize(
    "variable",
    ["MINIPS_RUN_WORKERS", "MINIPS_WORKER_CONNECT", "MINIPS_DATA", "MINIPS_NETEM_NAME",
     "MINIPS_SYSTEM_DATA"],
)  # fmt: skip
def test_variables_something_reads_give_no_warning(variable):
    done = _minips(["run", "--help"], {variable: "2"})
    assert "warning" not in done.stderr


def test_a_variable_no_command_reads_is_named():
    done = _minips(["data", "list"], {"MINIPS_WROKERS": "4"})
    assert "warning: MINIPS_WROKERS is ignored: nothing reads it" in done.stderr


def test_a_group_commands_subcommand_options_are_known():
    from minips.cli import cli
    from minips.cli.environment import unknown_variables

    command = cli.get_command(None, "data")
    names = list(cli.table)
    assert unknown_variables({"MINIPS_DATA_DOWNLOAD_BASE_URL": "1"}, "data", command, names) == []
    assert unknown_variables({"MINIPS_DATA_DOWNLOAD_BASE_ULR": "1"}, "data", command, names)


def _launch_blas_threads(env: dict[str, str]) -> str:
    code = (
        "import os, sys\n"
        "from minips.cli import cli\n"
        "assert 'numpy' not in sys.modules\n"
        "cli.get_command(None, 'launch')\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'))\n"
    )
    import os

    clean = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_launch_pins_blas_to_one_thread_before_numpy_loads_unless_the_user_set_it():
    assert _launch_blas_threads({}) == "1 1"
    assert _launch_blas_threads({"OPENBLAS_NUM_THREADS": "3"}) == "3 1"
