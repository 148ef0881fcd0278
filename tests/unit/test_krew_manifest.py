"""The krew manifest (plugins/krew/phalanx.yaml) installs what the repository builds: its sha256 is
the reproducible archive's (hack/krew_archive.py), the executable it names is in the archive, and
that launcher runs the package's plugin, or says clearly that the package is missing."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import pathlib
import subprocess
import sys
import tarfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "plugins" / "krew" / "phalanx.yaml"
spec = importlib.util.spec_from_file_location("krew_archive", ROOT / "hack" / "krew_archive.py")
krew_archive = importlib.util.module_from_spec(spec)
spec.loader.exec_module(krew_archive)


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_is_a_krew_plugin_named_after_its_executable():
    plugin = manifest()
    assert plugin["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and plugin["kind"] == "Plugin"
    assert plugin["metadata"]["name"] == "phalanx"  # kubectl phalanx -> kubectl-phalanx
    (platform,) = plugin["spec"]["platforms"]
    assert platform["bin"] == "kubectl-phalanx" and platform["uri"].startswith("https://")
    assert plugin["spec"]["version"] == "v" + __import__("tomllib").loads(
        (ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_its_sha256_is_the_archive_built_here_and_the_archive_holds_the_bin():
    data = krew_archive.archive_bytes()
    assert data == krew_archive.archive_bytes()  # reproducible, byte for byte
    (platform,) = manifest()["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(data).hexdigest(), "run `make krew-archive` and update the sha256"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmember(platform["bin"])
        assert member.mode & 0o111 and member.isfile()


def test_the_launcher_runs_the_plugin_or_says_the_package_is_missing(tmp_path):
    launcher = ROOT / "plugins" / "krew" / "kubectl-phalanx"
    env = {"PATH": os.environ["PATH"], "PHALANX_PYTHON": sys.executable}
    done = subprocess.run([str(launcher), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: kubectl phalanx")
    bare = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], timeout=60)
    assert bare.returncode == 0
    env["PHALANX_PYTHON"] = str(tmp_path / "bare" / "bin" / "python")
    done = subprocess.run([str(launcher), "top"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 1 and "the phalanx package is not installed for" in done.stderr
