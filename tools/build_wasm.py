"""Build the browser engine's .wasm files (minips/classroom/web/static/gemm.wasm, kernels.wasm) from
their .wat sources with a pinned wat2wasm.

The tool is wabt's wat2wasm from the npm package `wabt` (a WebAssembly build of WABT that
runs on Node), at the version and integrity hash of tools/wasm/package-lock.json, installed
with `npm ci` into --tool-dir. Its output depends on the .wat source and wabt's version
only, so each shipped .wasm can be rebuilt byte for byte anywhere; it sits beside its
source, X.wat -> X.wasm:

    python tools/build_wasm.py            # writes minips/classroom/web/static/{gemm,kernels}.wasm
    python tools/build_wasm.py --check    # exit 1 if a shipped file differs from its build
    python tools/build_wasm.py --check DIR/X.wat   # that source and DIR/X.wasm only

Needs node and npm (Debian: apt-get install nodejs npm) and the npm registry. Exit codes:
0 built (or, with --check, identical), 1 the shipped file differs, 2 usage, a source that
does not assemble or an install that fails (a lock whose hash does not match, say), 3 the
tool cannot be had here (no node or npm, or the registry cannot be reached).
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "minips" / "classroom" / "web" / "static"
SOURCES = [STATIC / "gemm.wat", STATIC / "kernels.wat"]
PINS = Path(__file__).resolve().parent / "wasm"  # package.json + package-lock.json
DEFAULT_TOOL_DIR = Path.home() / ".cache" / "minips" / "wabt"


# What npm says when it cannot reach the registry at all (as opposed to refusing a package).
NETWORK_ERRORS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ECONNRESET",
    "ETIMEDOUT",
    "ENETUNREACH",
)


class ToolMissing(Exception):
    """wat2wasm cannot be had on this machine (exit code 3)."""


def install_wat2wasm(tool_dir: Path) -> Path:
    """`npm ci` the pinned wabt into tool_dir (once per lock file); the wat2wasm script."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise ToolMissing("node and npm are needed (Debian: apt-get install nodejs npm)")
    lock = (PINS / "package-lock.json").read_bytes()
    stamp = tool_dir / "installed-lock.sha256"
    script = tool_dir / "node_modules" / "wabt" / "bin" / "wat2wasm"
    digest = hashlib.sha256(lock).hexdigest()
    if script.is_file() and stamp.is_file() and stamp.read_text() == digest:
        return script
    tool_dir.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(PINS / name, tool_dir / name)
    done = subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=tool_dir,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not script.is_file():
        output = (done.stderr + done.stdout).strip()
        reason = f"npm ci of the pinned wabt failed: {' / '.join(output.splitlines()[-3:])}"
        if any(code in output for code in NETWORK_ERRORS):
            raise ToolMissing(reason)
        raise SystemExit(f"error: {reason}")
    stamp.write_text(digest)
    return script


def assemble(script: Path, source: Path, out: Path) -> None:
    """wat2wasm source -o out (no debug names: the output depends on the code alone)."""
    done = subprocess.run(
        [shutil.which("node") or "node", str(script), str(source), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"error: {source.name} does not assemble: {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare a build with the shipped file"
    )
    parser.add_argument(
        "--tool-dir",
        type=Path,
        default=DEFAULT_TOOL_DIR,
        help=f"where the pinned wabt is installed (default {DEFAULT_TOOL_DIR})",
    )
    parser.add_argument(
        "sources",
        nargs="*",
        type=Path,
        default=SOURCES,
        help="the .wat files (default: the shipped ones)",
    )
    args = parser.parse_args(argv)
    try:
        script = install_wat2wasm(args.tool_dir)
    except ToolMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return max(build(script, source, args.check) for source in args.sources)


def build(script: Path, source: Path, check: bool) -> int:
    """Assemble source; write source.wasm, or (check) compare with it. 0, or 1 if it differs."""
    wasm = source.with_suffix(".wasm")
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(tmp) / "built.wasm"
        assemble(script, source, built)
        data = built.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    if not check:
        wasm.write_bytes(data)
        print(f"wrote {wasm}: {len(data)} bytes, sha256 {digest}...")
        return 0
    if wasm.is_file() and wasm.read_bytes() == data:
        print(f"{wasm} is the build of {source.name}: {len(data)} bytes, sha256 {digest}...")
        return 0
    print(
        f"error: {wasm} differs from the build of {source.name} (sha256 {digest}...): "
        "run python tools/build_wasm.py",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
