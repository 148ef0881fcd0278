"""The container images' file layouts, built without a container engine.

The Dockerfile copies the build context (the repository filtered by .dockerignore) into a build
stage, ``pip install``s it into a virtual environment, and the runtime stage keeps only that
environment, run as a non-root user with ``phalanx`` as the entrypoint. This test does the same on
this host: it filters the tree with .dockerignore's rules, installs the result into a clean virtual
environment, deletes the sources, and starts the entrypoint. It is in the e2e suite because the
install fetches phalanx's dependencies from PyPI (pip's cache makes repeated runs quicker).

phalanx-scheduler.Dockerfile (plugin mode's scheduler) builds phalanx-scheduler with
hack/build-plugin.sh from its own context (phalanx-scheduler.Dockerfile.dockerignore) and keeps the
static binary alone on an empty base image: the test builds it from that filtered tree (Go's build
cache makes it quick) and runs it in a root directory holding nothing else, as the image's user.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from harness import read_versions

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_DOCKERFILE = ROOT / "phalanx-scheduler.Dockerfile"
SCHEDULER_IGNORE = ROOT / "phalanx-scheduler.Dockerfile.dockerignore"  # BuildKit's ignore file for it
PACKAGES = ["solver", "cluster", "web", "cycle", "extender", "rpc", "controller", "proto", "bench", "phalanx_cli"]


def dockerignore_rules(path: Path) -> list[tuple[bool, str]]:
    """(exception, pattern) per line of a .dockerignore, comments and blanks dropped."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").strip("/")))
    return rules


def _matches(relative: str, pattern: str) -> bool:
    """Does ``pattern`` match ``relative`` or one of its parent directories (Docker's rule)?"""
    parts = relative.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    patterns = [pattern] + ([pattern[3:]] if pattern.startswith("**/") else [])
    return any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns)


def included(relative: str, rules: list[tuple[bool, str]]) -> bool:
    """The last rule that matches decides, as in Docker."""
    keep = True
    for exception, pattern in rules:
        if _matches(relative, pattern):
            keep = exception
    return keep


def build_context(root: Path, target: Path, ignore: Path | None = None) -> list[str]:
    """Copy what the Docker build context would hold into ``target``; return its files. ``ignore``:
    the ignore file (default: the root's .dockerignore)."""
    rules = dockerignore_rules(ignore or root / ".dockerignore")
    files = []
    for directory, subdirs, names in os.walk(root):
        base = Path(directory).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        # an excluded directory no exception reaches into is not walked (.git, .venv, ...)
        subdirs[:] = sorted(d for d in subdirs if included(prefix + d, rules) or any(
            exception and (pattern.startswith(prefix + d + "/") or "**" in pattern) for exception, pattern in rules))
        for name in sorted(names):
            relative, path = prefix + name, Path(directory) / name
            if not path.is_symlink() and included(relative, rules):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / relative)
                files.append(relative)
    return files


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """(instruction, arguments) of each stage of the Dockerfile, continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    found: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        if instruction.upper() == "FROM":
            found.append([])
        found[-1].append((instruction.upper(), args.strip()))
    return found


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    return stages(dockerfile)[-1]


def test_dockerfile_runs_phalanx_as_a_non_root_user_from_a_venv_only():
    stage = final_stage(ROOT / "Dockerfile")
    users = [args for instruction, args in stage if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0] == "65532"  # the manifests' runAsUser
    assert ("ENTRYPOINT", '["phalanx"]') in stage
    copies = [args for instruction, args in stage if instruction == "COPY"]
    assert copies == ["--from=build /opt/phalanx /opt/phalanx"]  # no sources in the runtime image


def test_the_build_context_holds_the_packages_and_nothing_else(tmp_path):
    files = build_context(ROOT, tmp_path)
    tops = {f.split("/", 1)[0] for f in files}
    assert tops == {"pyproject.toml", "README.md", *PACKAGES}
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc") or f.startswith("bench/results/")]
    assert any(f.startswith("extender/dashboard/static/") for f in files)


def test_pip_install_of_the_context_runs_serve_and_controller(tmp_path):
    context, venv = tmp_path / "src", tmp_path / "opt" / "phalanx"
    build_context(ROOT, context)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # --no-compile: the image's .pyc files only speed up its start; compiling every dependency
    # would triple this test's time and change no file the entrypoint needs
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", str(context)],
                             capture_output=True, text=True, timeout=1200)
    assert install.returncode == 0, install.stdout + install.stderr
    shutil.rmtree(context)  # the runtime stage has only the virtual environment
    workdir = tmp_path / "run"
    workdir.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(workdir)}

    def run(*argv: str) -> str:
        done = subprocess.run([str(venv / "bin" / "phalanx"), *argv], capture_output=True, text=True, env=env,
                              cwd=workdir, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    assert "--health-addr" in run("serve", "--help")
    assert "--webhook-addr" in run("controller", "--help")
    # what serve and controller import at startup is installed (not found through the sources)
    probe = ("import json, extender.server, controller.service, extender.dashboard.routes as r; "
             "print(json.dumps({'server': extender.server.__file__, 'static': sorted(p.name for p in r.STATIC.iterdir())}))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env,
                          cwd=workdir, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["server"].startswith(str(venv)) and found["static"]
    site = next(venv.glob("lib/python*/site-packages"))
    assert not (site / "tests").exists()
    assert {p for p in PACKAGES if (site / p / "__init__.py").exists()} == set(PACKAGES)


@pytest.mark.parametrize(("relative", "kept"), [
    ("pyproject.toml", True), ("solver/model.py", True), (".git/HEAD", False), (".venv/bin/python", False),
    ("tests/unit/test_x.py", False), ("solver/__pycache__/m.pyc", False), ("bench/results/x.json", False),
    ("phalanx.egg-info/PKG-INFO", False), ("charts/phalanx/Chart.yaml", False),
])
def test_the_dockerignore_rules_as_docker_reads_them(relative, kept):
    assert included(relative, dockerignore_rules(ROOT / ".dockerignore")) is kept


def test_no_build_leftovers_would_enter_the_image():
    # the tree may hold build/ or *.egg-info from editable installs; none of it is in the context
    rules = dockerignore_rules(ROOT / ".dockerignore")
    leftovers = [p for p in ("build", "phalanx.egg-info", ".venv", ".pytest_cache", ".mypy_cache", ".hypothesis")
                 if (ROOT / p).exists() and included(p, rules)]
    assert leftovers == []
    assert os.access(ROOT / "Dockerfile", os.R_OK)


# -- phalanx-scheduler.Dockerfile ------------------------------------------------------------------

def is_static_elf(path: Path) -> bool:
    """A 64-bit little-endian ELF executable without a program interpreter (PT_INTERP): it needs no
    libc or loader from the image."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path}: not a 64-bit little-endian ELF"
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def test_scheduler_dockerfile_builds_with_the_plugin_script_and_runs_the_binary_alone_as_non_root():
    build, final = stages(SCHEDULER_DOCKERFILE)
    go_directive = next(line.split()[1] for line in (ROOT / "plugin" / "go.mod").read_text().splitlines()
                        if line.startswith("go "))
    assert build[0] == ("FROM", f"golang:{'.'.join(go_directive.split('.')[:2])} AS build")  # go.mod's Go
    assert any(i == "RUN" and "bash hack/build-plugin.sh" in a for i, a in build)  # the e2e suite's build
    assert final[0] == ("FROM", "scratch")
    assert [a for i, a in final if i == "COPY"] == [
        "--from=build /usr/local/bin/phalanx-scheduler /usr/local/bin/phalanx-scheduler"]
    assert [a for i, a in final if i == "USER"] == ["65532:65532"]  # the manifests' runAsUser
    assert ("ENTRYPOINT", '["phalanx-scheduler"]') in final  # the chart's and the component's command


def test_the_scheduler_build_context_holds_the_go_module_and_hack_only(tmp_path):
    files = build_context(ROOT, tmp_path, SCHEDULER_IGNORE)
    assert {f.split("/", 1)[0] for f in files} == {"plugin", "hack"}
    assert {"plugin/go.mod", "plugin/go.sum", "hack/build-plugin.sh", "hack/versions.env"} <= set(files)
    assert any(f.startswith("plugin/cmd/phalanx-scheduler/") for f in files)
    assert not [f for f in files if f.endswith("_test.go")]
    # the other image's context keeps the Go module out
    assert not included("plugin/go.mod", dockerignore_rules(ROOT / ".dockerignore"))


def test_the_scheduler_image_built_from_its_context_runs_phalanx_scheduler(tmp_path):
    """The build stage's RUN line, run on this host in the filtered context (its paths moved under
    tmp_path, Go's build cache reused), then the runtime stage's one file in an otherwise empty root
    directory, started as the image's user with the image's PATH."""
    context, out, stage_bin, image = tmp_path / "src", tmp_path / "out", tmp_path / "build-bin", tmp_path / "image"
    build_context(ROOT, context, SCHEDULER_IGNORE)
    build, final = stages(SCHEDULER_DOCKERFILE)
    (run,) = [a for i, a in build if i == "RUN"]
    run = " ".join(w for w in run.split(" ") if not w.startswith("--mount="))
    gocache = subprocess.run(["go", "env", "GOCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    for image_path, here in (("/root/.cache/go-build", gocache), ("/usr/local/bin", str(stage_bin)),
                             ("/out", str(out))):
        run = run.replace(image_path, here)
    done = subprocess.run(["bash", "-c", run], cwd=context, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    (copy_args,) = [a for i, a in final if i == "COPY"]
    source, target = copy_args.split()[1:]
    binary = image / target.lstrip("/")
    binary.parent.mkdir(parents=True)
    shutil.copy2(stage_bin / Path(source).name, binary)
    assert is_static_elf(binary)  # the runtime stage is scratch: no libc, no loader
    (path_env,) = [a.split("=", 1)[1] for i, a in final if i == "ENV" and a.startswith("PATH=")]
    (user,) = [a for i, a in final if i == "USER"]
    entrypoint = json.loads(next(a for i, a in final if i == "ENTRYPOINT"))
    if os.geteuid() == 0:  # the image's root holds nothing but the binary; run as the image's user
        chroot = shutil.which("chroot", path="/usr/sbin:/usr/bin:/sbin:/bin") or "chroot"
        argv = [chroot, f"--userspec={user}", str(image), *entrypoint, "--version"]
    else:  # no chroot without root: the binary from its place, with the image's PATH alone
        argv = [str(binary), "--version"]
    version = subprocess.run(argv, capture_output=True, text=True, env={"PATH": path_env}, timeout=60)
    expected = f"Kubernetes {read_versions()['K8S_VERSION']}"  # what build-plugin.sh stamps in
    assert version.returncode == 0 and version.stdout.strip() == expected, version.stdout + version.stderr
