"""Handouts without solutions: the wheel holds every starter and no solution, and
`minips exercise handout DIR` run from that wheel, installed in a fresh venv with no clone
in sight, writes the starters that `minips exercise check` then checks there."""

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from minips.classroom.exercise import EXERCISES, STARTERS, handout
from minips.errors import MinipsError

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = Path(__file__).resolve().parents[1] / "exercise_solutions"
STARTER_FILES = sorted(p.name for p in STARTERS.iterdir() if p.is_file())


@pytest.fixture(autouse=True)
def no_pythonpath(monkeypatch):
    """The fresh venv's processes see only what the wheel installed, even when the suite
    itself runs with PYTHONPATH pointing at a work tree."""
    monkeypatch.delenv("PYTHONPATH", raising=False)


def _wheel(tmp: Path) -> Path:
    """A wheel built from a copy of the source (the work tree gets no build files)."""
    source = tmp / "source"
    shutil.copytree(
        ROOT / "minips", source / "minips", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp / "dist").glob("minips-*.whl")
    return wheel


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new venv with only the wheel's minips installed; numpy, pyzmq, msgpack and click
    are this interpreter's (a path line in a .pth: the editable minips stays invisible)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
def test_the_wheel_hands_out_every_starter_and_no_solution(tmp_path):
    wheel = _wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n.rsplit("/", 1)[1] for n in names if "/exercise/starters/" in n) == (
        STARTER_FILES
    )
    assert not [n for n in names if "solution" in n or n.startswith("tests/")]
    venv = _fresh_venv(tmp_path, wheel)
    home = tmp_path / "student"  # no clone here: only what the wheel installed
    home.mkdir()

    def minips(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(venv / "bin" / "minips"), *args], cwd=home, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import minips; print(minips.__file__)"],
        cwd=home, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(venv)), where  # the wheel's minips, not the work tree's
    done = minips("exercise", "handout", "exercises")
    assert done.returncode == 0, done.stderr
    handed = home / "exercises"
    assert sorted(p.name for p in handed.iterdir()) == STARTER_FILES
    for name in STARTER_FILES:
        assert (handed / name).read_bytes() == (STARTERS / name).read_bytes()
        if (SOLUTIONS / name).exists():  # the starter is not the solution
            assert (handed / name).read_bytes() != (SOLUTIONS / name).read_bytes()
    starter = minips("exercise", "check", "ssp-hold", "--file", "exercises/ssp_hold.py")
    assert starter.returncode == 1 and "WRONG: may_pull() is not written yet" in starter.stdout
    shutil.copy(SOLUTIONS / "ssp_hold.py", handed / "ssp_hold.py")  # the student's answer
    answer = minips("exercise", "check", "ssp-hold", "--file", "exercises/ssp_hold.py")
    assert answer.returncode == 0 and "PASSED" in answer.stdout
    again = minips("exercise", "handout", "exercises")  # the student's work is kept
    assert again.returncode == 2 and again.stderr.startswith("error: exercises already holds ")
    assert (handed / "ssp_hold.py").read_bytes() == (SOLUTIONS / "ssp_hold.py").read_bytes()


def test_handout_writes_every_starter_and_keeps_existing_work(tmp_path):
    written = handout(tmp_path / "h")
    assert sorted(p.name for p in written) == STARTER_FILES
    assert {EXERCISES[name].starter for name in EXERCISES} <= set(STARTER_FILES)
    (tmp_path / "h" / "dense_backward.py").write_text("mine")
    with pytest.raises(MinipsError, match="already holds"):
        handout(tmp_path / "h")
    assert (tmp_path / "h" / "dense_backward.py").read_text() == "mine"
    handout(tmp_path / "h", force=True)
    assert (tmp_path / "h" / "dense_backward.py").read_bytes() == (
        STARTERS / "dense_backward.py"
    ).read_bytes()


def test_check_without_file_looks_in_the_current_directory_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "minips", "exercise", "check", "ssp-hold"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: no ssp_hold.py in {tmp_path}; give the file with")
    assert "minips exercise handout DIR" in done.stderr
