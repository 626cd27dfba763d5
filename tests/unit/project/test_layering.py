"""The package's architecture as a test: imports point downward only.

Every ``import`` of every module (module level and deferred ones alike) is read
with :mod:`ast`; each module belongs to an area (its subpackage, or the top-level
module's name) and may import only the areas below it. A new upward import, or a
doit import below the doit integration, fails here with the module and the line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "metrale_orch"

#: Shared helpers every area may import; they import nothing of the package but errors
#: and the ownership check (standard library only, the one test of a file's owner), and
#: extras (what a missing optional part becomes).
SHARED = frozenset(
    {
        "errors",
        "paths",
        "fsutil",
        "proc",
        "manifest",
        "cache_schema",
        "canonical",
        "ownership",
        "extras",
    }
)

#: What each area may import besides :data:`SHARED` (and itself).
ALLOWED: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "paths": frozenset(),
    "fsutil": frozenset(),
    "ownership": frozenset(),
    "extras": frozenset(),
    "proc": frozenset(),
    "manifest": frozenset(),
    "cache_schema": frozenset(),
    "canonical": frozenset(),
    "config": frozenset(),
    "tree": frozenset(),
    "defaults": frozenset(),
    "cache": frozenset({"config", "remote"}),
    # The REAPI client (grpc, protobuf: the optional `remote` extra, loaded lazily);
    # the remote executor and the REAPI cache tier sit on it.
    "remote": frozenset(),
    "executor": frozenset({"remote", "config"}),
    "toolchain": frozenset({"tree"}),
    "steps": frozenset({"tree", "defaults", "cache", "config", "executor", "toolchain"}),
    "smoke": frozenset({"tree", "config"}),
    "resources": frozenset({"steps", "toolchain", "smoke", "tree", "config"}),
    # The SASS diff: the report's target selection and ptxas lookup, the artefact readers.
    "sass": frozenset({"resources", "toolchain", "smoke", "tree"}),
    "matrix": frozenset({"steps", "toolchain", "tree"}),
    # The release gate (coverage): reads builds with the smoke readers and resources' ptxas.
    "gate": frozenset({"resources", "steps", "toolchain", "smoke", "tree", "config"}),
    # The build graph without doit: generation, a run's selection and scope, the task
    # cache and its key, readiness (the whole-tree check runs smoke's and the defaults'
    # own validators).
    "graph": frozenset({"steps", "toolchain", "config", "tree", "smoke", "defaults"}),
    # The doit adapter: turns the graph into doit's task dicts, runs and reports them.
    "tasks": frozenset(
        {
            "graph",
            "steps",
            "toolchain",
            "executor",
            "cache",
            "config",
            "defaults",
            "smoke",
            "tree",
            "gate",
        }
    ),
    "dodo": frozenset({"tasks", "graph"}),
    # The edit loop (metrale-orch watch): doit's run in this process, cycle after cycle,
    # on the graph, with the smoke checks of what each cycle built; its watcher on the
    # event loop the compiles run on (executor's, sized by steps' session).
    "watch": frozenset({"tasks", "graph", "smoke", "config", "executor", "steps"}),
    # Views of the build without a doit task (status, why, rdeps, compdb).
    "views": frozenset({"tasks", "graph", "steps", "toolchain", "config", "tree"}),
    "cli": frozenset(
        {
            "watch",
            "views",
            "tasks",
            "graph",
            "steps",
            "executor",
            "toolchain",
            "cache",
            "config",
            "defaults",
            "matrix",
            "resources",
            "sass",
            "gate",
            "smoke",
            "tree",
        }
    ),
    # The command's entry point: the CLI.
    "__main__": frozenset({"cli"}),
    "__init__": frozenset(),
}

#: Areas that run without doit (STYLE: a build step is callable without doit).
WITHOUT_DOIT = frozenset(ALLOWED) - {"tasks", "views", "watch", "dodo", "cli", "__main__"}


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        yield ".".join(rel.parts).removesuffix(".__init__"), path


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in the file, deferred ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            if node.module == "metrale_orch":  # `from metrale_orch import tree`
                for alias in node.names:
                    yield node.lineno, f"metrale_orch.{alias.name}"


MODULES = sorted(_modules())


def test_every_area_is_known() -> None:
    assert {_area(m) for m, _ in MODULES} <= set(ALLOWED)


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_downward(module: str, path: Path) -> None:
    area = _area(module)
    allowed = ALLOWED[area] | SHARED | {area}
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {area} imports {target}"
        for line, target in _imports(path)
        if target.startswith("metrale_orch.") and _area(target) not in allowed
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("module", "path"),
    [(m, p) for m, p in MODULES if _area(m) in WITHOUT_DOIT],
    ids=[m for m, _ in MODULES if _area(m) in WITHOUT_DOIT],
)
def test_only_the_doit_integration_imports_doit(module: str, path: Path) -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}"
        for line, target in _imports(path)
        if target == "doit" or target.startswith("doit.")
    ]
    assert not found, "\n".join(found)


def test_the_graph_imports_neither_doit_nor_the_doit_adapter() -> None:
    """issue 46: the build graph (``metrale_orch/graph``) is usable without doit around
    it; neither doit nor :mod:`metrale_orch.tasks` may be imported there, deferred
    imports included."""
    graph = [(m, p) for m, p in MODULES if _area(m) == "graph"]
    assert {m for m, _ in graph} >= {
        "metrale_orch.graph.cached",
        "metrale_orch.graph.generate",
        "metrale_orch.graph.scope",
        "metrale_orch.graph.selection",
        "metrale_orch.graph.taskcache",
        "metrale_orch.graph.taskkey",
    }
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}"
        for _module, path in graph
        for line, target in _imports(path)
        if target in ("doit", "metrale_orch.tasks")
        or target.startswith(("doit.", "metrale_orch.tasks."))
    ]
    assert not found, "\n".join(found)


def test_the_shared_helpers_import_nothing_of_the_package_but_errors() -> None:
    for module, path in MODULES:
        if _area(module) in SHARED | {"config"}:
            used = {_area(t) for _, t in _imports(path) if t.startswith("metrale_orch.")} - {
                "errors",
                "ownership",
                _area(module),
            }
            assert not used, f"{module} imports {sorted(used)}"


# ------------------------------------------------------------------ function size

#: STYLE.md, "Functions and state": no function over this many code lines.
MAX_CODE_LINES = 100

#: Functions still over the limit, each with why it is allowed for now. A new offender
#: fails; so does an entry here that is no longer over (drop it then).
OVER_THE_LIMIT = frozenset({})


def _code_lines(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Non-blank, non-comment lines of the body after the docstring (nested defs included)."""
    first = node.body[0]
    has_doc = ast.get_docstring(node, clean=False) is not None
    start = (first.end_lineno or first.lineno) + 1 if has_doc else first.lineno
    body = lines[start - 1 : node.end_lineno]
    return sum(1 for line in body if line.strip() and not line.lstrip().startswith("#"))


def _function_sizes(path: Path) -> Iterator[tuple[str, int]]:
    """(qualified name, code lines) of every function in the file, nested ones included."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{child.name}", _code_lines(lines, child)
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(text), "")


def _over_the_limit() -> dict[str, int]:
    return {
        f"{path.relative_to(PACKAGE.parent).as_posix()}:{name}": n
        for _module, path in MODULES
        for name, n in _function_sizes(path)
        if n > MAX_CODE_LINES
    }


def test_no_function_is_over_100_code_lines() -> None:
    over = _over_the_limit()
    new = [
        f"{where} ({n} lines)" for where, n in sorted(over.items()) if where not in OVER_THE_LIMIT
    ]
    assert not new, f"over {MAX_CODE_LINES} code lines; split into named steps:\n" + "\n".join(new)


def test_the_allow_list_holds_only_functions_still_over() -> None:
    stale = sorted(OVER_THE_LIMIT - set(_over_the_limit()))
    assert not stale, "no longer over the limit; drop from OVER_THE_LIMIT:\n" + "\n".join(stale)


def test_code_lines_skip_the_docstring_blanks_and_comments() -> None:
    source = "\n".join(
        [
            "def f():",
            '    """Doc.',
            "",
            '    More."""',
            "    # note",
            "",
            "    x = 1",
            "    def g():",
            "        return x",
            "    return g",
        ]
    )
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    assert _code_lines(source.splitlines(), node) == 4


# ------------------------------------------------------------------ import circles


def _runtime_imports(path: Path) -> Iterator[str]:
    """The package modules ``path`` imports when it runs (deferred imports included;
    ``if TYPE_CHECKING:`` blocks left out: they never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    known = {m for m, _ in MODULES}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            if name in known:
                yield name
                break


def test_no_import_circle() -> None:
    """No module reaches itself through the modules it imports (Tarjan's components)."""
    graph = {m: sorted(set(_runtime_imports(p)) - {m}) for m, p in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, circles


# ------------------------------------------------------------------ module size

#: STYLE.md: a module past ~500 lines is usually several ideas; none may pass this.
MAX_MODULE_LINES = 600

#: Modules still over the limit (generated code is not counted: remote/_proto).
OVER_600: frozenset[str] = frozenset()


def test_no_module_is_over_600_lines() -> None:
    over = {
        path.relative_to(PACKAGE.parent).as_posix()
        for _module, path in MODULES
        if "_proto" not in path.parts
        and len(path.read_text(encoding="utf-8").splitlines()) > MAX_MODULE_LINES
    }
    assert over == OVER_600, f"over {MAX_MODULE_LINES} lines: {sorted(over - OVER_600)}"


# ------------------------------------------------------------------ deferred imports

#: Modules on a start-up path (every doit run imports them, every CLI command registers
#: them) whose functions import what only they need, when they run: a no-op run or
#: ``metrale-orch --help`` never loads the build, the cache or the tree package.
START_UP_PATHS: tuple[str, ...] = (
    "metrale_orch.dodo",
    "metrale_orch.graph.cached",
    "metrale_orch.tasks.actions",
    "metrale_orch.tasks.creators",
    "metrale_orch.tasks.reporter",
    "metrale_orch.tasks.run",
    "metrale_orch.tasks.smoke",
    "metrale_orch.cli._",
)

#: Packages imported where they are used, anywhere: optional extras (``remote``: grpc and
#: protobuf behind :mod:`metrale_orch.remote`; ``gpu``: CuPy and NumPy behind
#: :mod:`metrale_orch.smoke.dtypes`; the protobuf generator) and heavy libraries that
#: most runs never need (fsspec's stores, cryptography's signatures, rich's live line,
#: the shared log handler, platformdirs' lookups).
DEFERRED_ANYWHERE: frozenset[str] = frozenset(
    {
        "metrale_orch.remote",
        "metrale_orch.smoke.dtypes",
        "cupy",
        "grpc_tools",
        "fsspec",
        "cryptography",
        "rich",
        "concurrent_log_handler",
        "platformdirs",
    }
)


def _deferred_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import inside a function (``TYPE_CHECKING`` blocks aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    yield from ((node.lineno, alias.name) for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    yield node.lineno, node.module


def test_deferred_imports_only_where_they_keep_start_up_light() -> None:
    """An import inside a function is for the start-up paths and the optional or heavy
    packages above; anywhere else it belongs at the top, where a reader looks."""
    found = []
    for module, path in MODULES:
        if module.startswith(START_UP_PATHS) or "._proto" in module:
            continue
        for line, name in _deferred_imports(path):
            if not any(name == d or name.startswith(f"{d}.") for d in DEFERRED_ANYWHERE):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {name}")
    assert not found, "\n".join(found)
