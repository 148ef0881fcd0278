"""Where the e2e control-plane binaries live, and the versions they were built at.

Versions are pinned once, in ``hack/versions.env``; ``hack/build-k8s.sh`` builds the binaries into
``${XDG_CACHE_HOME:-$HOME/.cache}/phalanx/k8s/<K8S_VERSION>/``, and ``hack/build-kwok.sh`` builds KWOK
into ``.../phalanx/kwok/<KWOK_VERSION>/kwok``. A missing binary is an error, never a skip: an e2e run
that silently tests nothing is worse than a red one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class MissingBinaries(RuntimeError):
    """The control-plane binaries have not been built (run ``make e2e`` or hack/build-k8s.sh)."""


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """Parse the ``KEY=value`` lines of hack/versions.env (comments and blanks ignored)."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            versions[key.strip()] = value.strip().strip('"')
    return versions


@dataclass(frozen=True)
class Binaries:
    k8s_version: str
    etcd_version: str
    directory: Path
    kwok: Path

    def path(self, component: str) -> Path:
        return self.directory / component


def cache_dir(tool: str = "k8s") -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "phalanx" / tool


def locate() -> Binaries:
    """Return the pinned binaries, or raise MissingBinaries naming what is missing and the fix."""
    versions = read_versions()
    k8s, etcd = versions["K8S_VERSION"], versions["ETCD_VERSION"]
    directory = Path(os.environ.get("PHALANX_K8S_BIN_DIR") or cache_dir() / k8s)
    missing = [c for c in COMPONENTS if not os.access(directory / c, os.X_OK)]
    if missing:
        raise MissingBinaries(
            f"e2e control plane not built: missing {', '.join(missing)} in {directory} "
            f"(Kubernetes {k8s}, etcd {etcd}). Run `make e2e` or `bash hack/build-k8s.sh` first."
        )
    kwok_version = versions["KWOK_VERSION"]
    kwok = Path(os.environ.get("PHALANX_KWOK_BIN") or cache_dir("kwok") / kwok_version / "kwok")
    if not os.access(kwok, os.X_OK):
        raise MissingBinaries(f"KWOK {kwok_version} not built: no executable {kwok}. "
                              "Run `make e2e` or `bash hack/build-kwok.sh` first.")
    return Binaries(k8s_version=k8s, etcd_version=etcd, directory=directory, kwok=kwok)
