"""The client tools the install tests drive: kubectl, helm and krew, built by hack/build-tools.sh.

Missing tools are an error naming the command that builds them, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .binaries import MissingBinaries, locate, read_versions
from .controlplane import ControlPlane, release_workdir


@dataclass(frozen=True)
class Tools:
    kubectl: Path
    helm: Path
    krew: Path
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
    krew = tools_dir() / f"krew-{versions['KREW_VERSION']}" / "krew"
    missing = [str(p) for p in (kubectl, helm, krew) if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBinaries(f"kubectl/helm/krew not built: missing {', '.join(missing)}. "
                              "Run `make e2e` or `bash hack/build-tools.sh` first.")
    return Tools(kubectl=kubectl, helm=helm, krew=krew, kubeconfig=kubeconfig, home=home)


def override_flags(args: list[str], flags: dict[str, str]) -> list[str]:
    """A container's ``args`` with ``--flag`` values replaced (``--flag=v`` or ``--flag v``); absent
    ones appended: what the install tests change when they run a rendered container as a process."""
    out, seen, i = [], set(), 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name in flags:
            seen.add(name)
            out.append(f"{name}={flags[name]}")
            i += 1 if eq else 2
        else:
            out.append(args[i])
            i += 1
    return out + [f"{k}={v}" for k, v in flags.items() if k not in seen]


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a container's ``args`` (``--flag=v`` or ``--flag v``), None when absent."""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == flag:
            return value if eq else args[i + 1]
    return None


def own_control_plane(request: Any, prefix: str, what: str) -> Iterator[ControlPlane]:
    """A module's control plane of its own (the installs create cluster-wide objects that must
    not leak into other modules), released after; missing binaries fail, never skip."""
    import pytest

    try:
        binaries = locate()
    except MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    plane = ControlPlane(workdir, binaries).start()
    try:
        yield plane
    finally:
        plane.stop()
        release_workdir(workdir, bool(request.session.testsfailed), what)


def plane_tools(plane: ControlPlane) -> Tools:
    """kubectl and helm against ``plane``, helm's home in its work directory; missing tools fail."""
    import pytest

    try:
        return locate_tools(plane.admin_kubeconfig, plane.workdir / "helm-home")
    except MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
