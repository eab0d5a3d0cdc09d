"""gemm.wasm and kernels.wasm are the builds of gemm.wat and kernels.wat: tools/build_wasm.py,
with its pinned wat2wasm (npm's wabt, tools/wasm/package-lock.json), reproduces each
shipped file byte for byte.

Skipped, with the reason shown, only where that tool cannot be had: no node or npm, or no
way to reach the npm registry (the script's exit code 3).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "minips" / "classroom" / "web" / "static"


@pytest.fixture(scope="module")
def tool_dir(tmp_path_factory):
    """A fresh install of the pinned wabt, shared by this module's tests."""
    return tmp_path_factory.mktemp("wabt")


def _build(tool_dir: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "build_wasm.py"), "--tool-dir", str(tool_dir), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode == 3:
        pytest.skip(f"the pinned wat2wasm cannot be had here: {done.stderr.strip()}")
    return done


def test_the_shipped_wasm_files_are_the_builds_of_their_sources(tool_dir):
    done = _build(tool_dir, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("gemm", "kernels"):
        assert f"static/{name}.wasm is the build of {name}.wat" in done.stdout


def test_the_check_fails_on_a_wasm_that_is_not_the_build(tool_dir, tmp_path):
    shutil.copyfile(STATIC / "kernels.wat", tmp_path / "kernels.wat")
    data = bytearray((STATIC / "kernels.wasm").read_bytes())
    data[-1] ^= 0xFF  # one byte of the code section changed
    (tmp_path / "kernels.wasm").write_bytes(bytes(data))
    done = _build(tool_dir, "--check", str(tmp_path / "kernels.wat"))
    assert done.returncode == 1 and "differs from the build of kernels.wat" in done.stderr


def test_a_source_that_does_not_assemble_is_a_one_line_error(tool_dir, tmp_path):
    source = tmp_path / "broken.wat"
    source.write_text('(module (func (export "f") (f32x4.nonsense)))\n')
    done = _build(tool_dir, str(source))
    assert done.returncode != 0 and done.stderr.startswith("error: broken.wat does not assemble")
    assert "Traceback" not in done.stderr and not (tmp_path / "broken.wasm").exists()


def test_the_build_tool_is_pinned_by_exact_version_and_hash():
    pins = ROOT / "tools" / "wasm"
    wanted = json.loads((pins / "package.json").read_text())["dependencies"]["wabt"]
    locked = json.loads((pins / "package-lock.json").read_text())["packages"]["node_modules/wabt"]
    assert wanted[0].isdigit() and locked["version"] == wanted  # no range: one version
    assert locked["integrity"].startswith("sha512-")
