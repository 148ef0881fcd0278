"""The layering of the design, checked on the source: solver/ is pure, and no layer imports one
above it (solver < cluster < extender/controller)."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "solver": {"cluster", "extender", "controller", "bench", "phalanx_cli", "flask", "grpc", "kubernetes",
               "requests", "urllib", "http", "socket", "subprocess", "threading", "asyncio", "waitress",
               "yaml", "json", "os", "pathlib", "io", "logging"},
    "cluster": {"extender", "controller", "bench", "phalanx_cli", "flask"},
    "extender": {"controller", "bench", "phalanx_cli"},
    "controller": {"extender", "bench", "phalanx_cli"},
}


def imported_roots(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_respect_the_layering(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    offenders = {
        str(f.relative_to(ROOT)): sorted(imported_roots(f) & FORBIDDEN[package])
        for f in files
        if imported_roots(f) & FORBIDDEN[package] and "_pb2" not in f.name
    }
    assert not offenders, f"layering broken: {offenders}"
