"""The package's import graph: no cycles, and the library never imports the CLI.

The graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` of a ``codl_tvm`` module, at module level and inside functions alike, since
a function-level import that closes a cycle is still a cycle in the design. ``passes/`` and
``schedules/`` are walked as ``codl_tvm.passes`` and ``codl_tvm.schedules``, as installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "codl_tvm": ROOT / "codl_tvm",
    "codl_tvm.passes": ROOT / "passes",
    "codl_tvm.schedules": ROOT / "schedules",
}


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    found: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            # codl_tvm/passes would shadow the mapped folder if it existed; the mapping wins
            found.setdefault(name, path)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` refers to: itself, or its longest prefix that is a module."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that ``name`` imports anywhere in its body (not under
    ``if TYPE_CHECKING:``, which never runs)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        else:
            continue
        for n in names:
            target = _resolve(n, modules)
            # a module's own packages are initialised before it runs: no edge to them
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
    # importing a.b.c runs a/__init__ and a/b/__init__ first: the parent packages of every
    # target are imported too (only those above, not the module's own packages)
    for t in list(targets):
        parts = t.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and not name.startswith(parent + ".") and parent != name:
                targets.add(parent)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a cycle
    through it for the message."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, comp) for comp in sccs]


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest cycle through the first module of ``comp`` (breadth-first inside it)."""
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_graph_is_read():
    graph = import_graph()
    assert "codl_tvm.core.errors" in graph and "codl_tvm.passes" in graph
    assert "codl_tvm.schedules" in graph
    # the walker sees function-level imports too
    assert "codl_tvm.core.errors" in graph["codl_tvm.artifact"]


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_library_never_imports_the_cli():
    bad = sorted(
        f"{mod} imports {t}"
        for mod, targets in import_graph().items()
        if not (mod == "codl_tvm.cli" or mod.startswith("codl_tvm.cli."))
        for t in targets
        if t == "codl_tvm.cli" or t.startswith("codl_tvm.cli.")
    )
    assert not bad, "\n".join(bad)


def _unexplained_deferred_imports(path: Path) -> list[int]:
    """Lines of the imports inside functions of ``path`` with no comment saying why: on the
    line, or above it (over blank lines and the imports of the same group)."""
    src = path.read_text().splitlines()
    tree = ast.parse("\n".join(src), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    deferred = [
        n
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(fn)
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip
    ]
    spans = {i for n in deferred for i in range(n.lineno - 1, n.end_lineno)}
    bad = []
    for n in deferred:
        if any("#" in src[i] for i in range(n.lineno - 1, n.end_lineno)):
            continue
        i = n.lineno - 2
        while i >= 0 and (i in spans or not src[i].strip()) and "#" not in src[i]:
            i -= 1
        if i < 0 or "#" not in src[i]:
            bad.append(n.lineno)
    return sorted(set(bad))


def test_deferred_imports_say_why():
    """An import inside a function defers a heavy optional dependency or TVM's compiler (for
    runtime-only devices), and a comment says which; anything else belongs at the top."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules().values()
        for line in _unexplained_deferred_imports(path)
    ]
    assert not bad, "function-level imports without a reason:\n" + "\n".join(bad)


def test_cycle_finder_finds_a_function_level_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
