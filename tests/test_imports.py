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


# --- layer rules -------------------------------------------------------------------------------

# The package's layers, lowest first: a module may import its own layer and any layer below it,
# never one above (docs/design.md draws the same picture). Top-level modules are layers of their
# own: ``options`` (the options objects) sits below the objectives that take them, ``demo`` above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("codl_tvm.core",),
    ("codl_tvm.runtime",),
    ("codl_tvm.frontend",),
    ("codl_tvm.schedules",),
    ("codl_tvm.passes",),
    ("codl_tvm.build",),
    ("codl_tvm.rpc",),
    ("codl_tvm.cost_model",),
    ("codl_tvm.profiling",),
    ("codl_tvm.planner",),
    ("codl_tvm.options",),
    ("codl_tvm.objectives", "codl_tvm.artifact"),
    ("codl_tvm.demo",),
    ("codl_tvm.cli",),
)


def _layer(module: str) -> int | None:
    """The rank of ``module``'s layer (None for the package root ``codl_tvm`` itself)."""
    for rank, heads in enumerate(LAYERS):
        if any(module == h or module.startswith(h + ".") for h in heads):
            return rank
    return None


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if m != "codl_tvm" and _layer(m) is None)
    assert not missing, "modules outside every layer (add them to LAYERS):\n" + "\n".join(missing)


def test_layers_import_only_downwards():
    """Lower layers never import higher ones, even inside a function: runtime imports only core,
    passes and schedules no planner, cost model or objectives, and so on up."""
    bad = sorted(
        f"{mod} ({LAYERS[_layer(mod)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
        for mod, targets in import_graph().items()
        if _layer(mod) is not None
        for t in targets
        if _layer(t) is not None and _layer(t) > _layer(mod)
    )
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_runtime_imports_only_core():
    """A runtime-only TVM (a phone, a board) loads artifacts with codl_tvm.runtime alone."""
    bad = sorted(
        f"{mod} imports {t}"
        for mod, targets in import_graph().items()
        if mod.startswith("codl_tvm.runtime")
        for t in targets
        if not (t.startswith("codl_tvm.runtime") or t.startswith("codl_tvm.core"))
        and t != "codl_tvm"
    )
    assert not bad, "\n".join(bad)


def _package(module: str) -> str:
    """``codl_tvm.X`` for every module below ``codl_tvm.X``."""
    return ".".join(module.split(".")[:2])


def test_no_package_level_cycles():
    """No cycle between subpackages, through function-level imports too: a cycle between two
    packages means neither is a layer."""
    graph: dict[str, set[str]] = {}
    for mod, targets in import_graph().items():
        graph.setdefault(_package(mod), set()).update(
            _package(t) for t in targets if _package(t) != _package(mod)
        )
    cycles = _cycles(graph)
    assert not cycles, "package cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _private_imports(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``from m import _x`` and ``m._x`` where ``m`` is another codl_tvm module."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    aliases: dict[str, str] = {}
    found = []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if not mod.startswith("codl_tvm"):
                continue
            for a in node.names:
                full = f"{mod}.{a.name}"
                if full in modules:
                    aliases[a.asname or a.name] = full
                elif _is_private(a.name) and mod != name:
                    found.append(f"{where}:{node.lineno}: {mod}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("codl_tvm") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _is_private(node.attr)
            and aliases[node.value.id] != name
        ):
            found.append(f"{where}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return found


def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__")


def test_no_private_names_across_modules():
    """A name with a leading underscore belongs to its module: another module that needs it
    needs a public name for it."""
    modules = _modules()
    bad = [line for name, path in modules.items() for line in _private_imports(name, path, modules)]
    assert not bad, "private names imported across modules:\n" + "\n".join(sorted(bad))


def test_private_import_finder_sees_both_forms(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("from codl_tvm.core.plan import _x\nfrom codl_tvm.core import plan\nplan._y\n")
    found = _private_imports("codl_tvm.other", mod_path := mod, {"codl_tvm.core.plan": mod_path})
    assert [f.split(": ")[1] for f in found] == ["codl_tvm.core.plan._x", "codl_tvm.core.plan._y"]


# --- sizes and wording -------------------------------------------------------------------------

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_PARAMETERS = 12


def test_modules_and_functions_stay_small():
    """A module holds one concern and a function one step: long ones hide several."""
    bad = []
    for path in _modules().values():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            bad.append(f"{rel}: {len(text.splitlines())} lines")
        for fn in ast.walk(ast.parse(text, str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = fn.end_lineno - fn.lineno + 1
            a = fn.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            n = len(params) + bool(a.vararg) + bool(a.kwarg)
            n -= bool(params) and params[0].arg in ("self", "cls")
            if lines > MAX_FUNCTION_LINES:
                bad.append(f"{rel}:{fn.lineno} {fn.name}: {lines} lines")
            if n > MAX_PARAMETERS:
                bad.append(f"{rel}:{fn.lineno} {fn.name}: {n} parameters")
    assert not bad, "\n".join(bad)


def test_few_modules_at_the_top():
    """The top of codl_tvm/ is the public surface; everything else lives in a layer's package."""
    top = sorted(p.name for p in (ROOT / "codl_tvm").glob("*.py"))
    assert len(top) <= 12, top


def test_library_speaks_to_users():
    """The library names hardware, not the lab it was measured in, and logs instead of taking
    ``log=print`` callbacks."""
    bad = []
    for path in _modules().values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "device machine" in line.lower() or "log=print" in line.replace(" ", ""):
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)
