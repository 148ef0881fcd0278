"""The layering of the design (DESIGN.md section 2), checked on the source by import-linter: the
contracts live in pyproject.toml ([tool.importlinter]); `make test` also runs `lint-imports`.

- solver/ is pure: no other phalanx package, no web/RPC/Kubernetes library, no I/O module of the
  standard library (import-linter treats the standard library as external packages);
- cluster/ imports none of the services above it, nor flask (nor web/, the HTTP stack);
- web/ (the HTTP stack) imports no phalanx package and no Kubernetes or gRPC library;
- extender/ and controller/ are independent of each other and of bench/ and phalanx_cli/;
- extender.http and extender.grpc are independent of each other."""

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTRACTS = {"solver-pure", "cluster-below-services", "web-below-services", "services-independent",
             "extender-controller-independent", "http-grpc-independent"}


def test_the_layering_contracts_are_configured():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert CONTRACTS <= {c["id"] for c in config["contracts"]}


def test_package_imports_respect_the_layering():
    lint_imports = pathlib.Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"layering broken:\n{done.stdout}\n{done.stderr}"
