"""Joint placement (solver/joint.py): more groups whole than one at a time where the order strands
one, never fewer, every answer valid."""

import random

import pytest

from solver import LabelSelector, Pod, PodAffinityTerm, PodSpec, Snapshot, SolveOptions, assert_placement_valid
from solver.joint import place_joint

from .solver_builders import RACK, gang, gpu_node, pods


def _check(snapshot, groups, result):
    """Every placed group is valid on the snapshot with the groups placed before it charged."""
    current = snapshot
    for group, placement in zip(groups, result.placements, strict=True):
        if placement.assignments:
            assert_placement_valid(snapshot, group, placement.assignments)
    for group, placement in zip(groups, result.placements, strict=True):
        if placement.assignments:
            current = current.with_placement(placement.assignments, {p.uid: p for p in group.pending})
    assert (current.free >= 0).all() and (current.used <= current.allocatable).all()


def test_a_burst_one_at_a_time_strands_is_placed_whole_jointly():
    # rack a: two 4-GPU nodes (8); rack b: one 6-GPU node. One at a time, the 4-GPU gang takes the
    # tighter rack b and the 6-GPU pod that only b's node holds is stranded; jointly both fit
    nodes = [gpu_node(f"a{i}", rack="a", gpus=4) for i in range(2)] + [gpu_node("b0", rack="b", gpus=6)]
    snap = Snapshot(nodes)
    groups = [gang("four", 2, key=RACK, members=pods("four", 2, gpus=2)),
              gang("six", 1, key=RACK, members=pods("six", 1, gpus=6))]
    result = place_joint(snap, groups, budget=5.0)
    assert result.sequential_placed == 1 and result.placed == 2 and result.joint
    four, six = result.placements
    assert four.domain == "a" and six.domain == "b"
    _check(snap, groups, result)


def test_when_every_group_fits_one_at_a_time_that_answer_stands():
    nodes = [gpu_node(f"n{i}", rack=f"r{i % 2}") for i in range(4)]
    groups = [gang(f"g{i}", 2, key=RACK) for i in range(3)]
    result = place_joint(Snapshot(nodes), groups)
    assert result.placed == 3 and not result.joint and result.joint_reason == "every group fits one at a time"


def test_groups_with_inter_pod_rules_are_placed_one_at_a_time_and_say_so():
    nodes = [gpu_node("a0", rack="a", gpus=4), gpu_node("b0", rack="b", gpus=2)]
    anti = (PodAffinityTerm("kubernetes.io/hostname", LabelSelector((("app", "x"),)), frozenset({"default"})),)
    spec = PodSpec({"cpu": 1000, "nvidia.com/gpu": 2}, pod_anti_affinity=anti)
    members = tuple(Pod(f"ruled-{i}", f"ruled-{i}", spec, group="default/ruled", labels={"app": "x"})
                    for i in range(2))
    groups = [gang("ruled", 2, members=members), gang("big", 1, members=pods("big", 1, gpus=4))]
    result = place_joint(Snapshot(nodes), groups)
    assert result.sequential_placed == 1 and not result.joint and "inter-pod rules" in result.joint_reason


@pytest.mark.parametrize("seed", range(12))
def test_never_fewer_groups_than_one_at_a_time_on_random_bursts(seed):
    rng = random.Random(seed)
    nodes = [gpu_node(f"n{r}-{i}", rack=f"r{r}", gpus=rng.choice([2, 4, 8]))
             for r in range(rng.randint(2, 4)) for i in range(rng.randint(1, 3))]
    groups = [gang(f"g{k}", n, key=RACK, members=pods(f"g{k}", n, gpus=rng.choice([1, 2, 4])))
              for k in range(rng.randint(3, 7)) for n in [rng.randint(1, 4)]]
    snap = Snapshot(nodes)
    result = place_joint(snap, groups, SolveOptions(path="greedy"), budget=2.0)
    assert result.placed >= result.sequential_placed
    _check(snap, groups, result)


def test_the_fragmentation_benchmark_runs_tiny_and_counts_what_it_says():
    from bench import SUITES, fragmentation_bench

    assert SUITES["fragmentation"] == "bench.fragmentation_bench"
    rows = fragmentation_bench.run(seeds=2, calls=1)
    for label, instances in (("benchmark", 2), ("held out", 4)):  # twice as many held out
        sequence = {r["rule"]: r for r in rows if r["kind"] == "sequence" and r["set"] == label}
        assert set(sequence) == set(fragmentation_bench.RULES)
        for r in sequence.values():  # stranded counts gangs some arrangement placed: never negative
            assert r["instances"] == instances
            assert r["stranded"] >= 0 and r["placed"] + r["stranded"] <= r["gangs"]
    [burst] = [r for r in rows if r["kind"] == "bursts"]
    assert burst["joint"] >= burst["one_at_a_time"] and burst["fewer_on"] == 0
    timing = [r for r in rows if r["kind"] == "timing"]
    assert [t["placed"] >= t["sequential_placed"] for t in timing] == [True, True]
    table = fragmentation_bench.markdown(rows)
    assert "| phalanx |" in table and "in-tree (simulated)" in table and "joint solve, 50 gangs of 3" in table
    assert "Sequence (benchmark)" in table and "Sequence (held out)" in table
