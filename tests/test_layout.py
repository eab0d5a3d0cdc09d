"""minips's folders keep their layout (docs/architecture.md, its first line): the core imports
nothing from the operations, no two packages import each other, no two modules share a name.

Every import counts, at the top, in a function or under `if TYPE_CHECKING:`. What the code
does not yet keep is listed below, each entry today's: the lists may only shrink (a test
fails on an entry that no longer holds, so it is struck when it is fixed).
"""

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minips"
DOC = ROOT / "docs" / "architecture.md"

CORE = ("nn", "data", "protocol", "state", "rules", "transmission", "server", "worker")
OPERATIONS = ("guard", "ops", "group", "run", "results", "classroom", "cli", "provision")

# The core's imports of an operation, (importer, imported): none. What the core is not
# (a server's operations, a client's way to a group) it is given by whoever builds it.
KNOWN_CORE_TO_OPERATIONS: set[tuple[str, str]] = set()

# Pairs of packages that import each other (sorted pairs): none.
KNOWN_PACKAGE_CYCLES: set[tuple[str, str]] = set()

# Module file names held by more than one package (base.py and __init__.py aside).
KNOWN_SHARED_NAMES: set[str] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str, paths: dict[str, Path]) -> str:
    """The package a module belongs to: itself for a package's __init__.py."""
    return module if paths[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The minips modules `path` imports anywhere in it; `from minips.x import y` counts
    x.y when y is a module, else x."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules or {base})
    return found & modules


def _graph() -> tuple[dict[str, Path], dict[str, set[str]]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return paths, {name: _imports(path, set(paths)) for name, path in paths.items()}


def _folder(module: str) -> str | None:
    """The top folder under minips/ that holds a module (None for minips's own modules)."""
    parts = module.split(".")
    return (
        parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in CORE + OPERATIONS) else None
    )


def test_every_folder_is_core_or_an_operation():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(CORE + OPERATIONS), "place a new package in CORE or OPERATIONS"
    assert not set(CORE) & set(OPERATIONS)


def test_the_architecture_map_begins_with_the_core():
    first = DOC.read_text().splitlines()[0]
    assert first == "Core: " + ", ".join(f"minips/{name}" for name in CORE)


def test_the_core_imports_no_operation():
    _, graph = _graph()
    found = {
        (importer, imported)
        for importer, imports in graph.items()
        if _folder(importer) in CORE
        for imported in imports
        if _folder(imported) in OPERATIONS
    }
    new = sorted(found - KNOWN_CORE_TO_OPERATIONS)
    assert not new, f"the core imports an operation (give it to the core instead): {new}"
    gone = sorted(KNOWN_CORE_TO_OPERATIONS - found)
    assert not gone, f"no longer imported: strike from KNOWN_CORE_TO_OPERATIONS: {gone}"


def test_no_two_packages_import_each_other():
    paths, graph = _graph()
    edges = {
        (_package(importer, paths), _package(imported, paths))
        for importer, imports in graph.items()
        for imported in imports
        if _folder(importer) and _folder(imported)
    }
    found = {tuple(sorted(pair)) for pair in edges if pair[0] != pair[1] and pair[::-1] in edges}
    new = sorted(found - KNOWN_PACKAGE_CYCLES)
    assert not new, f"packages importing each other: {new}"
    gone = sorted(KNOWN_PACKAGE_CYCLES - found)
    assert not gone, f"no longer a cycle: strike from KNOWN_PACKAGE_CYCLES: {gone}"


def test_minips_own_modules_stay_few_and_errors_import_nothing():
    """minips/ itself holds the public API (__init__.py), the entry point, the errors every
    package raises (a leaf), the stop signals held while a child starts (a leaf: run/ and
    classroom/ both start children) and the single-process trainer; everything else is in
    a folder."""
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert top <= {"__init__.py", "__main__.py", "errors.py", "held_signals.py", "trainer.py"}, top
    _, graph = _graph()
    assert not graph["minips.errors"]
    assert not graph["minips.held_signals"]


def test_no_two_modules_share_a_name():
    names = Counter(
        path.name for path in PACKAGE.rglob("*.py") if path.name not in ("__init__.py", "base.py")
    )
    found = {name for name, count in names.items() if count > 1}
    new = sorted(found - KNOWN_SHARED_NAMES)
    assert not new, f"module names held twice: {new}"
    gone = sorted(KNOWN_SHARED_NAMES - found)
    assert not gone, f"no longer shared: strike from KNOWN_SHARED_NAMES: {gone}"


def test_the_parser_sees_the_imports():
    _, graph = _graph()
    assert "minips.state.registry" in graph["minips.rules.base"]
    assert re.match(r"minips\.", next(iter(graph["minips.server.server"])))


# Tests of the whole at the top of tests/: the layout, the docs' examples, CI.
WHOLE_TESTS = {"test_architecture.py", "test_examples.py", "test_layout.py", "test_raw_ps.py",
               "test_readme_ci.py", "test_tiny_ps.py"}  # fmt: skip


def test_the_tests_mirror_the_packages():
    tests = ROOT / "tests"
    misplaced = []
    for path in tests.rglob("test_*.py"):
        folder = path.parent.relative_to(tests).as_posix()
        if path.stem.endswith("_support") and folder == ".":
            continue  # shared helpers, for every folder
        if folder == "." and path.name in WHOLE_TESTS:
            continue
        if folder not in CORE + OPERATIONS:
            misplaced.append(path.relative_to(tests).as_posix())
    assert not misplaced, f"put each under tests/<package>/, the package it tests: {misplaced}"
    assert {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set()


def test_every_source_file_the_docs_name_exists():
    """A path such as minips/ops/checkpoint_file.py in the docs (broken over a line or not)
    names a file that is there: a module that moved takes its mentions with it."""
    named = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        for match in re.finditer(r"minips/(?:[a-z_]+/)*\n?\s*[a-z_]+\.py\b", text):
            named.add((doc.name, re.sub(r"\s+", "", match.group(0))))
    assert len(named) > 20  # the pattern still finds the docs' paths
    assert [(doc, path) for doc, path in sorted(named) if not (ROOT / path).exists()] == []
