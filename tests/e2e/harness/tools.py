"""The client tools the install tests drive: kubectl and helm, built by hack/build-tools.sh.

Missing tools are an error naming the command that builds them, never a skip.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .binaries import MissingBinaries, read_versions


@dataclass(frozen=True)
class Tools:
    kubectl: Path
    helm: Path
    kubeconfig: Path
    home: Path  # helm's cache, config and data directories live here, not in the user's home

    def run(self, tool: str, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run kubectl or helm against the control plane; a failure raises with its output."""
        binary = self.kubectl if tool == "kubectl" else self.helm
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_CONFIG_HOME": str(self.home / "config"), "HELM_DATA_HOME": str(self.home / "data")}
        done = subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done


def tools_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx" / "tools"


def locate_tools(kubeconfig: Path, home: Path) -> Tools:
    versions = read_versions()
    kubectl = tools_dir() / f"kubectl-{versions['K8S_VERSION']}" / "kubectl"
    helm = tools_dir() / f"helm-{versions['HELM_VERSION']}" / "helm"
    missing = [str(p) for p in (kubectl, helm) if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBinaries(f"kubectl/helm not built: missing {', '.join(missing)}. "
                              "Run `make e2e` or `bash hack/build-tools.sh` first.")
    return Tools(kubectl=kubectl, helm=helm, kubeconfig=kubeconfig, home=home)
