"""docs/architecture.md stays true to the code: its reading order of one gradient's path
(each function there, reached from the ones above it, the path no longer than it says),
the size of the path's classes, and minips's imports (no cycle)."""

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| (\S+) \| (\S+) \|", re.M)


def _rows():
    section = DOC.read_text().split("<!-- reading-order -->")[1].split("\n\n")[0]
    return [(int(n), path, name) for n, path, name in ROW.findall(section)]


def _module(path: str):
    return importlib.import_module(
        path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    )


def _function(path: str, qualname: str):
    obj = _module(path)
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


def _names_used(function) -> set[str]:
    """The functions a function's body calls by name, and every attribute it mentions
    (method calls, bound methods put in a table like `handlers`); not its variables."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    return calls | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def _definitions(paths: set[str]) -> dict[str, list]:
    """Every function and method of the modules at `paths`, by its short name."""
    found: dict[str, list] = {}
    for path in paths:
        module = _module(path)
        for _, obj in inspect.getmembers(module):
            if getattr(obj, "__module__", None) != module.__name__:
                continue
            members = inspect.getmembers(obj) if inspect.isclass(obj) else [(obj.__name__, obj)]
            for name, member in members:
                member = getattr(member, "__func__", member)
                if inspect.isfunction(member) and member.__module__ == module.__name__:
                    found.setdefault(name, []).append(member)
    return found


def test_every_function_of_the_reading_order_exists_and_is_reached_in_that_order():
    """Each row's function exists in its file and is used by a row above it, directly or
    through helpers the table leaves out (their names say what they do); only the worker's
    first step and the server's first function, across the network from it, start afresh."""
    rows = _rows()
    assert [n for n, *_ in rows] == list(range(1, len(rows) + 1)), "rows numbered 1..n"
    functions = [_function(path, name) for _, path, name in rows]
    for (_, path, name), function in zip(rows, functions, strict=True):
        assert Path(inspect.getsourcefile(function)).as_posix().endswith(path), (name, path)
    listed = set(functions)
    helpers = {
        short: [f for f in found if f not in listed]
        for short, found in _definitions({path for _, path, _ in rows}).items()
    }
    first_on_server = next(i for i, (_, path, _) in enumerate(rows) if "/server/" in path)
    for index, (_, _, name) in enumerate(rows):
        if index in (0, first_on_server):
            continue
        start = first_on_server if index > first_on_server else 0
        reached, pending = set(), list(functions[start:index])
        for _, row_path, row_name in rows[start:index]:  # an object's wiring: its __init__
            if "." in row_name:
                pending.append(_function(row_path, row_name.rsplit(".", 1)[0]).__init__)
        seen: set = set()
        while pending:
            function = pending.pop()
            if function in seen or not inspect.isfunction(function):
                continue
            seen.add(function)
            used = _names_used(function)
            reached |= used
            pending += [helper for short in used for helper in helpers.get(short, [])]
        assert name.rsplit(".", 1)[-1] in reached, (
            f"row {index + 1}, {name}, is not reached from the rows above it"
        )


def test_the_path_is_as_short_as_the_document_says():
    rows = _rows()
    flat = DOC.read_text().replace("\n", " ")
    claim = re.search(r"That is (\d+) functions, about (\d+) lines of code, in (\d+) files", flat)
    functions, lines, files = (int(group) for group in claim.groups())
    assert len(rows) == functions
    assert len({path for _, path, _ in rows}) == files
    code = sum(_code_lines(_function(path, name)) for _, path, name in rows)
    assert code <= lines * 1.1, f"the path has {code} lines of code, the document says {lines}"
    assert code >= lines * 0.9, f"the path has {code} lines of code: say so in the document"


def test_no_class_on_the_path_is_over_about_300_lines():
    classes = {_function(path, name.rsplit(".", 1)[0]) for _, path, name in _rows() if "." in name}
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
