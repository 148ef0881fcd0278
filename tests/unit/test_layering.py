"""The layering of docs/design.md, checked on the source by import-linter: the contracts live in
pyproject.toml ([tool.importlinter]); `make test` also runs `lint-imports`.

- solver/ is pure: no other phalanx package, no web/RPC/Kubernetes library, no I/O module of the
  standard library (import-linter treats the standard library as external packages);
- cluster/ imports none of the packages above it, nor flask or grpc;
- cycle/ (the workload-cycle service) imports no entry point, no web or RPC library;
- the entry points (extender/ for HTTP, rpc/ for gRPC) are independent of each other and of the
  controller; the controller imports neither the cycle nor an entry point;
- web/ (the HTTP stack) imports no phalanx package and no Kubernetes or gRPC library;
- nothing but the tools on top (bench/, phalanx_cli/) imports bench/ or phalanx_cli/."""

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTRACTS = {"solver-pure", "cluster-below-services", "cycle-below-entry-points", "services-independent",
             "controller-beside-the-cycle", "extender-controller-independent", "grpc-knows-no-http",
             "cycle-inside", "layers", "controller-admission-one-way",
             "http-grpc-independent", "web-below-services"}


def test_the_layering_contracts_are_configured():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert CONTRACTS <= {c["id"] for c in config["contracts"]}


def test_package_imports_respect_the_layering():
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"layering broken:\n{done.stdout}\n{done.stderr}"
