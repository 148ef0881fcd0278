"""No import circle anywhere in phalanx's packages, type-only imports included.

import-linter's contracts (test_layering.py) check the order between packages and inside cycle/;
a circle between two modules of one package (an admission module and its helper importing each
other, a type imported back under TYPE_CHECKING) slips past them, so this test reads every module's
imports with ``ast`` and looks for strongly connected components of more than one module."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("solver", "cluster", "cycle", "extender", "rpc", "controller", "phalanx_cli", "bench")


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, modules: set[str], root: pathlib.Path = ROOT) -> set[str]:
    """The project modules ``path`` imports (any import statement, wherever it stands)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if "_pb2" not in p.name]
    modules = {module_name(p, root) for p in paths}
    return {module_name(p, root): imports_of(p, modules, root) for p in paths}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan). A module importing its own
    package (the package's __init__ re-exporting it) is not counted as a circle."""
    def counts(a: str, b: str) -> bool:
        return not a.startswith(b + ".")
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if not counts(v, w) or w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_tree():
    assert circles(graph()) == []


def test_a_circle_is_found(tmp_path):
    # the check itself: two modules of one package importing each other, one of them type-only
    assert circles({"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}) == [["p.a", "p.b"]]
    pkg = tmp_path / "solver"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n")
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    assert circles(graph(tmp_path)) == [["solver.a", "solver.b"]]
