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
