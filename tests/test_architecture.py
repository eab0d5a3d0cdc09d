"""docs/architecture.md's reading order of one gradient's path stays true to the code."""

import ast
import importlib
import inspect
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| (\S+) \| (\S+) \| (\d+) \|", re.M)


def _rows():
    section = DOC.read_text().split("<!-- reading-order -->")[1]
    return [(int(n), path, name, int(lines)) for n, path, name, lines in ROW.findall(section)]


def _function(path: str, qualname: str):
    module = importlib.import_module(
        path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    )
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)  # AttributeError: a function named in the doc is gone
    return getattr(obj, "__func__", obj)


def _code_lines(function) -> int:
    """Lines of a function without its docstring and blank lines."""
    source = inspect.getsource(function)
    lines = source.splitlines()
    tree = ast.parse(inspect.cleandoc("\n" + source) if source[0] == " " else source)
    body = tree.body[0].body
    skip = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        skip = set(range(body[0].lineno - 1, body[0].end_lineno))
    return sum(1 for i, line in enumerate(lines) if i not in skip and line.strip())


def test_every_function_of_the_reading_order_exists_with_its_stated_length():
    rows = _rows()
    assert [n for n, *_ in rows] == list(range(1, len(rows) + 1)), "rows numbered 1..n"
    for _, path, name, stated in rows:
        function = _function(path, name)
        assert Path(inspect.getsourcefile(function)).as_posix().endswith(path), (name, path)
        actual = len(inspect.getsourcelines(function)[0])
        assert abs(actual - stated) <= max(3, stated // 5), (
            f"{path} {name} has {actual} lines, docs/architecture.md says {stated}: update it"
        )


def test_the_path_is_as_short_as_the_document_says():
    rows = _rows()
    flat = DOC.read_text().replace("\n", " ")
    files = {path for _, path, _, _ in rows}
    claimed_files = int(re.search(r"\(about \d+ without\), in (\d+) files", flat).group(1))
    assert len(files) == claimed_files
    with_docs = sum(stated for *_, stated in rows)
    without = sum(_code_lines(_function(path, name)) for _, path, name, _ in rows)
    claimed = re.search(r"about (\d+) lines with their docstrings \(about (\d+) without", flat)
    assert abs(with_docs - int(claimed.group(1))) <= 30, with_docs
    assert abs(without - int(claimed.group(2))) <= 30, without
    assert all(stated <= 55 for *_, stated in rows), "no function over ~50 lines on the path"


def test_no_class_on_the_path_is_over_about_300_lines():
    classes = {
        _function(path, name.rsplit(".", 1)[0]) for _, path, name, _ in _rows() if "." in name
    }
    for cls in classes:
        length = len(inspect.getsourcelines(cls)[0])
        assert length <= 300, f"{cls.__name__} has {length} lines (the path's classes stay ~300)"


PACKAGE = Path(__file__).resolve().parents[1] / "minips"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The minips modules `path` imports outside functions and classes: at the top, under
    `if TYPE_CHECKING:` or in a try; `from minips.x import y` counts x, and x.y when y is a
    module."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    pending = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for child in ("body", "orelse", "handlers", "finalbody"):
                pending.extend(getattr(node, child, None) or [])
    return found & modules


def test_no_module_level_import_cycle_in_minips():
    """Dependencies run one way (the server uses the rules, the rules read the registry and
    the store; a control object never imports its server): no cycle, TYPE_CHECKING
    imports included."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _module_level_imports(path, set(paths)) for name, path in paths.items()}
    assert graph["minips.server.server"] and graph["minips.rules.base"]  # the parser sees them
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = trail[trail.index(name) :] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
