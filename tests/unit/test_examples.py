"""The repository's examples/ do what the README and docs/whatif.md say: the sample simulated
cluster loads, and each example manifest gets its verdict from what-if on it."""

import pathlib

import pytest

from cluster.sim import SimCluster
from cluster.whatif import manifest_objects
from controller.whatif import compile_objects
from cycle import DOES_NOT_FIT, FITS, FITS_AFTER_PREEMPTION, WorkloadCycle

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example_cycle():
    sim = SimCluster()
    sim.load_yaml((EXAMPLES / "cluster.yaml").read_text())
    cycle = WorkloadCycle(sim.cache, sim)
    yield cycle
    cycle.close()


@pytest.mark.parametrize(("example", "verdicts"), [
    ("gang-statefulset", [FITS]),
    ("lws", [FITS, FITS]),
    ("job-gang", [FITS]),
    ("too-big", [DOES_NOT_FIT]),
    ("preempting", [FITS, FITS_AFTER_PREEMPTION]),
])
def test_each_example_gets_its_verdict_on_the_sample_cluster(example_cycle, example, verdicts):
    drafts = compile_objects(manifest_objects((EXAMPLES / f"{example}.yaml").read_text()))
    assert not drafts.errors
    answers = example_cycle.what_if(drafts.groups)
    assert [a.verdict for a in answers] == verdicts
    if example == "preempting":  # the low-priority gang goes whole, and only it
        assert sorted(v.pod for v in answers[1].victims) == [f"default/sweep-{i}" for i in range(4)]
    if example == "too-big":
        assert "needs 48 nvidia.com/gpu, 32 free" in answers[0].explanation


def test_every_example_is_named_in_the_docs():
    docs = (EXAMPLES.parent / "docs" / "whatif.md").read_text()
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {n for n in (p.name for p in EXAMPLES.glob("*.yaml"))
                                                           if f"examples/{n}" in docs}


def test_the_readmes_path_serve_the_sample_cluster_then_ask_what_if(tmp_path):
    """As the README says it: `phalanx serve --sim examples/cluster.yaml --insecure-loopback-no-auth`
    in one process, `phalanx whatif -f examples/... --exit-code` in another."""
    import re
    import subprocess
    import sys

    root = EXAMPLES.parent
    serve = subprocess.Popen([sys.executable, "-m", "phalanx_cli.main", "serve", "--sim", "examples/cluster.yaml",
                              "--insecure-loopback-no-auth", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
                             cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        addr = ""
        for line in serve.stdout:
            found = re.search(r"gRPC phalanx\.v1\.WorkloadCycle on (\S+)", line)
            if found:
                addr = found.group(1)
                break
        assert addr and not addr.endswith(":0"), "serve did not say its gRPC address"

        def whatif(example: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "phalanx_cli.main", "whatif", "-f", f"examples/{example}.yaml",
                                   "--exit-code", "--grpc-addr", addr], cwd=root, capture_output=True, text=True,
                                  timeout=120)

        fits, too_big, preempting = whatif("gang-statefulset"), whatif("too-big"), whatif("preempting")
        assert fits.returncode == 0 and "fits" in fits.stdout, fits
        assert too_big.returncode == 4 and "does-not-fit" in too_big.stdout, too_big
        assert preempting.returncode == 3 and "default/sweep-0" in preempting.stdout, preempting
    finally:
        serve.terminate()
        serve.wait(timeout=30)
