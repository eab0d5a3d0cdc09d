"""Put minips's core and its operations in separate folders: every move a `git mv`, every
reference to a moved module or file rewritten by pattern.

Run it once, from a checkout's root, on a clean tree:

    python tools/restructure.py            # moves, rewrites, then ruff (imports sorted, format)
    python tools/restructure.py --dry-run  # prints the resolved moves, changes nothing

MOVES below is the whole plan: a folder moves with everything in it (a module added to it
later moves too); a module moves alone, renamed when its name would clash. A module added
later beside the moved ones is placed by FOLDER_RULES (by its name's prefix). References are
rewritten by pattern in every tracked text file, never by a list of call sites:
  - dotted module names anywhere (`from minips.server.store import`, `import minips.run.x`,
    "minips.server.server.ParameterServer" in a patch string, `python -m minips.x`);
  - `from minips.pkg import module` when `module` moved (split per new package; `as old` kept
    when the module was renamed);
  - file paths `minips/server/store.py`, folder paths `minips/web/`, the same paths relative
    to minips/ (`server/store.py` in a doc, `web/static/*` in setup.cfg), and paths built
    from literals (`ROOT / "minips" / "exercise"`).
The script is meant to be deleted once its result is on main.
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

# old path (relative to the checkout) -> new path; a folder ends in "/"
MOVES: list[tuple[str, str]] = [
    # --- core: transmission, the layer-aware idea: what a plan is, the codecs, the planner
    # (the worker's sender stays in worker/, the pull encoder in server/: each drives its end)
    ("minips/codecs/", "minips/transmission/codecs/"),
    ("minips/protocol/plan.py", "minips/transmission/plan.py"),
    ("minips/run/planner.py", "minips/transmission/planning/planner.py"),
    ("minips/run/plan_costs.py", "minips/transmission/planning/plan_costs.py"),
    ("minips/run/plan_samples.py", "minips/transmission/planning/plan_samples.py"),
    # --- core: the server's state, which the rules read ---
    ("minips/server/registry.py", "minips/state/registry.py"),
    ("minips/server/store.py", "minips/state/store.py"),
    # --- operations: checks, limits, failures, telemetry, checkpoints ---
    ("minips/server/checks.py", "minips/ops/request_checks.py"),
    ("minips/server/overflow.py", "minips/ops/overflow.py"),
    ("minips/server/inflow.py", "minips/ops/inflow.py"),
    ("minips/server/failures.py", "minips/ops/failures.py"),
    ("minips/server/collapse.py", "minips/ops/collapse.py"),
    ("minips/server/telemetry.py", "minips/ops/telemetry.py"),
    ("minips/server/checkpoints.py", "minips/ops/checkpoints.py"),
    ("minips/server/checkpoint_file.py", "minips/ops/checkpoint_file.py"),
    ("minips/server/checkpoint_keep.py", "minips/ops/checkpoint_keep.py"),
    ("minips/server/group_checkpoints.py", "minips/ops/group_checkpoints.py"),
    # --- operations: the server group ---
    ("minips/server/group.py", "minips/group/shard.py"),
    ("minips/worker/group.py", "minips/group/fanout.py"),
    ("minips/worker/group_root.py", "minips/group/root.py"),
    ("minips/worker/connections.py", "minips/group/connections.py"),
    # --- operations: results (metrics, reports, plots, the evaluator, the trace) ---
    ("minips/run/metrics.py", "minips/results/metrics.py"),
    ("minips/run/rundir.py", "minips/results/rundir.py"),
    ("minips/run/versions.py", "minips/results/versions.py"),
    ("minips/run/report.py", "minips/results/report.py"),
    ("minips/run/report_text.py", "minips/results/report_text.py"),
    ("minips/run/plot.py", "minips/results/plot.py"),
    ("minips/worker/evaluator.py", "minips/results/evaluator.py"),
    ("minips/worker/trace.py", "minips/results/trace.py"),
    # --- operations: the classroom ---
    ("minips/web/", "minips/classroom/web/"),
    ("minips/dashboard/", "minips/classroom/dashboard/"),
    ("minips/exercise/", "minips/classroom/exercise/"),
    # --- operations: the CLI (a name of its own: minips.server has its options.py) ---
    ("minips/run/plan_table.py", "minips/cli/plan_table.py"),
    ("minips/cli/options.py", "minips/cli/click_options.py"),
]

# A module added later, in a folder some of whose modules move: where it goes by its name.
# (folder, glob, new folder); the first match wins; explicit MOVES come first.
FOLDER_RULES: list[tuple[str, str, str]] = [
    ("minips/server/", "checkpoint*.py", "minips/ops/"),
    ("minips/server/", "group_checkpoint*.py", "minips/ops/"),
    ("minips/server/", "group*.py", "minips/group/"),
    ("minips/worker/", "group*.py", "minips/group/"),
    ("minips/run/", "plan_*.py", "minips/transmission/planning/"),
    ("minips/run/", "planner*.py", "minips/transmission/planning/"),
    ("minips/run/", "report*.py", "minips/results/"),
]

# The new packages, each with the first line of its docstring.
NEW_PACKAGES: dict[str, str] = {
    "minips/transmission": "Transmission: what a plan is, the codecs, the planner.",
    "minips/transmission/planning": "The transmission planner: a plan's costs, the plan chosen.",
    "minips/state": "The server's state: the parameter store and the worker registry.",
    "minips/ops": "Operations beside the server's path: checks, limits, failures, telemetry, "
    "checkpoints.",
    "minips/group": "A server group: what a shard adds to a server, and the client's fan-out.",
    "minips/results": "A run's results: metrics, the run directory, reports, plots, the trace.",
    "minips/classroom": "The classroom: the browser gateway, the dashboard, the exercises.",
}

TEXT_SUFFIXES = {
    ".py", ".md", ".toml", ".cfg", ".json", ".txt", ".ini", ".yml", ".yaml", ".sh", ".js",
    ".html", ".rst", ".in", ".mjs", ".cjs", ".wat", ".css",
}  # fmt: skip
SELF = "tools/restructure.py"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def resolve_moves() -> list[tuple[str, str]]:
    """MOVES with the FOLDER_RULES applied to the modules now in those folders; a missing
    source is reported (a helper may have removed it) and left out."""
    tracked = set(git("ls-files").splitlines())
    moves, explicit = [], {old for old, _ in MOVES}
    for old, new in MOVES:
        present = any(p.startswith(old) for p in tracked) if old.endswith("/") else old in tracked
        if present:
            moves.append((old, new))
        else:
            print(f"warning: {old} is not in this checkout: not moved", file=sys.stderr)
    for folder, pattern, target in FOLDER_RULES:
        for path in sorted(Path(folder).glob(pattern)):
            old = path.as_posix()
            if old not in explicit and old in tracked and not any(o == old for o, _ in moves):
                moves.append((old, target + path.name))
                print(f"rule: {old} -> {target + path.name} ({folder}{pattern})")
    return moves


def dotted(path: str) -> str:
    """minips/server/store.py -> minips.server.store; minips/web/ -> minips.web"""
    return path.removesuffix("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")


class Rewriter:
    """The references to the moved modules and files, rewritten by longest prefix."""

    def __init__(self, moves: list[tuple[str, str]]) -> None:
        self.modules = {dotted(old): dotted(new) for old, new in moves}
        self.paths = {old.removesuffix("/"): new.removesuffix("/") for old, new in moves}
        # minips/-relative forms: server/store.py, web (only as `web/...`)
        self.relative = {
            old.removeprefix("minips/"): new.removeprefix("minips/")
            for old, new in self.paths.items()
        }
        names = sorted(self.modules, key=len, reverse=True)
        self.dotted_re = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?![\w])")
        full = sorted(self.paths, key=len, reverse=True)
        self.path_re = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, full)) + r")(?=/|\b|$)")
        rel = sorted(self.relative, key=len, reverse=True)
        # a relative folder only with its slash (`web/`), so the word "web" stays a word
        self.relative_re = re.compile(
            r"(?<![\w./-])("
            + "|".join(re.escape(r) + (r"(?![\w])" if r.endswith(".py") else "(?=/)") for r in rel)
            + r")"
        )
        self.from_re = re.compile(
            r"^([ \t]*)from (minips(?:\.\w+)*) import (\([^)]*\)|[^\n]*?)([ \t]*#[^\n]*)?$",
            re.M,
        )
        self.chain_re = re.compile(r'"[\w.]+"(?:[ \t]*/[ \t]*"[\w.]+")+')

    def module(self, name: str) -> str:
        """A dotted name under its new path (a moved module's attribute too)."""
        match = self.dotted_re.match(name)
        if not match or match.end() != len(name) and name[match.end()] != ".":
            return name
        return self.modules[match.group(1)] + name[match.end() :]

    def from_import(self, match: re.Match) -> str:
        """`from minips.x import a, b`: each imported module that moved to its new package."""
        indent, package, names, comment = match.groups()
        comment = comment or ""
        inner = names.strip()
        parens = inner.startswith("(")
        items = [n.strip() for n in inner.strip("()").replace("\n", " ").split(",") if n.strip()]
        groups: dict[str, list[str]] = {}
        for item in items:
            name, _, alias = item.partition(" as ")
            old = f"{package}.{name.strip()}"
            new = self.module(old)
            if new == old or name.strip()[:1].isupper():
                groups.setdefault(self.module(package), []).append(item)
                continue
            parent, _, base = new.rpartition(".")
            if base != name.strip() and not alias:
                item = f"{base} as {name.strip()}"
            elif base != name.strip():
                item = f"{base} as {alias.strip()}"
            groups.setdefault(parent, []).append(item)
        if list(groups) == [package]:
            return match.group(0)
        if len(groups) == 1 and not any(" as " in i for i in groups[next(iter(groups))]):
            (parent,) = groups
            return match.group(0).replace(f"from {package} import", f"from {parent} import", 1)
        lines = []
        for parent, group in groups.items():
            body = ", ".join(group)
            lines.append(f"{indent}from {parent} import {'(' + body + ')' if parens else body}")
        lines[0] += comment
        return "\n".join(lines)

    def path(self, match: re.Match) -> str:
        return self.paths[match.group(1)]

    def relative_path(self, match: re.Match) -> str:
        return self.relative[match.group(1)]

    def chain(self, match: re.Match) -> str:
        """`ROOT / "minips" / "web"`: the literals of a path, joined, rewritten, split."""
        parts = [p.strip().strip('"') for p in match.group(0).split("/")]
        joined = "/".join(parts)
        new = self.path_re.sub(self.path, joined)
        if new == joined and parts[0] != "minips":
            new = self.relative_re.sub(self.relative_path, joined)
        if new == joined:
            return match.group(0)
        return " / ".join(f'"{p}"' for p in new.split("/"))

    def text(self, text: str, python: bool) -> str:
        if python:
            text = self.from_re.sub(self.from_import, text)
            text = self.chain_re.sub(self.chain, text)
        text = self.dotted_re.sub(lambda m: self.modules[m.group(1)], text)
        text = self.path_re.sub(self.path, text)
        return self.relative_re.sub(self.relative_path, text)


def move(moves: list[tuple[str, str]]) -> None:
    for package in NEW_PACKAGES:
        Path(package).mkdir(parents=True, exist_ok=True)
    for old, new in moves:
        Path(new.removesuffix("/")).parent.mkdir(parents=True, exist_ok=True)
        git("mv", old.removesuffix("/"), new.removesuffix("/"))
        print(f"git mv {old} {new}")
    for package, line in NEW_PACKAGES.items():
        init = Path(package) / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{line}"""\n')
            git("add", str(init))


def rewrite(rewriter: Rewriter) -> list[str]:
    changed = []
    for name in git("ls-files").splitlines():
        path = Path(name)
        if name == SELF or not path.is_file():
            continue
        if path.suffix not in TEXT_SUFFIXES and not name.startswith(".ci/"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = rewriter.text(text, python=path.suffix == ".py")
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(name)
    return changed


def prose_lines(text: str) -> set[int]:
    """The 0-based lines of a module that are prose: a comment alone on its line, or a line
    of a docstring (a string statement spanning several lines)."""
    lines: set[int] = set()
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    previous = None
    for token in tokens:
        if token.type == tokenize.COMMENT and token.line.strip().startswith("#"):
            lines.add(token.start[0] - 1)
        elif token.type == tokenize.STRING and token.string[-3:] in ('"""', "'''"):
            if previous in (None, tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE):
                lines.update(range(token.start[0] - 1, token.end[0]))
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
    return lines


MARKER = re.compile(r"(->|[-*]|\d+\.) ")


def wrap_prose(path: Path, width: int = 100) -> None:
    """A comment or docstring line the longer paths pushed past `width`: its last words go
    to the next line when that line continues it (same indent, no list marker) and they fit,
    else to a line of their own with the paragraph's indent (code lines are ruff format's)."""
    text = path.read_text(encoding="utf-8")
    prose = prose_lines(text)
    lines = text.split("\n")
    for index in range(len(lines)):
        line = lines[index]
        if index not in prose or len(line) <= width or " " not in line.strip():
            continue
        indent = line[: len(line) - len(line.lstrip())]
        comment = line.lstrip().startswith("#")
        lead = indent + ("# " if comment else "")
        body = line[len(lead) :]
        marker = MARKER.match(body)
        cut = line.rfind(" ", len(lead) + (marker.end() if marker else 0) + 1, width + 1)
        if cut < 0:
            continue
        head, rest = line[:cut].rstrip(), line[cut + 1 :]
        after = lines[index + 1] if index + 1 < len(lines) else ""
        after_lead = after[: len(after) - len(after.lstrip())]
        after_body = after.lstrip()
        if comment:
            after_lead += "# " if after_body.startswith("# ") else "#"
            after_body = after_body[2:] if after_body.startswith("# ") else ""
        hanging = lead + " " * (marker.end() if marker else 0)
        continues = (
            index + 1 in prose
            and after_body.strip()
            and after_body.startswith("#") is False
            and not MARKER.match(after_body)
            and after_lead.rstrip("# ") == hanging.rstrip("# ")
            and len(after_lead) >= len(hanging.rstrip("# ")) + (2 if comment else 0)
        )
        if continues and len(after_lead + rest + " " + after_body) <= width:
            lines[index : index + 2] = [head, after_lead + rest + " " + after_body]
        else:
            lines[index : index + 1] = [head, hanging + rest]
    new = "\n".join(lines)
    if new != text:
        path.write_text(new, encoding="utf-8")


def tidy(changed: list[str]) -> None:
    """Imports sorted and formatted as the project's ruff has them; lines ruff cannot wrap
    (a comment or docstring grown past 100 characters) are listed for a hand edit."""
    python = [name for name in changed if name.endswith(".py") and Path(name).exists()]
    if not python or not shutil.which("ruff"):
        print("ruff not found: imports not sorted", file=sys.stderr)
        return
    subprocess.run(["ruff", "check", "--select", "I", "--fix", "-q", *python], check=False)
    subprocess.run(["ruff", "format", "-q", *python], check=False)
    for name in python:
        wrap_prose(Path(name))
    subprocess.run(["ruff", "format", "-q", *python], check=False)
    subprocess.run(["ruff", "check", "-q", *python], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    args = parser.parse_args()
    if not Path("minips/__init__.py").exists():
        sys.exit("error: run from the checkout's root")
    if git("status", "--porcelain", "--untracked-files=no").strip() and not args.dry_run:
        sys.exit("error: the tree has uncommitted changes: commit them first")
    moves = resolve_moves()
    if args.dry_run:
        for old, new in moves:
            print(f"{old} -> {new}")
        return
    rewriter = Rewriter(moves)
    move(moves)
    changed = rewrite(rewriter)
    tidy(changed)
    print(f"{len(moves)} moves, {len(changed)} files rewritten; review `git diff --stat`")


if __name__ == "__main__":
    main()
