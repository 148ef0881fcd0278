"""Properties of the solver over generated instances, with the validator as the oracle and a brute
force over every assignment as the judge of optimality on small instances."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from solver import (
    Node,
    Pod,
    PodGroup,
    PodSpec,
    Policy,
    Snapshot,
    SolveOptions,
    Taint,
    TaintEffect,
    assert_placement_valid,
    evaluate,
    place,
)
from solver.errors import PlacementInvalid

RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"


@st.composite
def instances(draw, max_nodes=5, max_pods=4):
    n_nodes = draw(st.integers(0, max_nodes))
    nodes = []
    for i in range(n_nodes):
        labels = {"kubernetes.io/hostname": f"n{i}"}
        if draw(st.booleans()) or i == 0:
            labels[RACK] = draw(st.sampled_from(["r0", "r1", "r2"]))
            labels[ZONE] = "z0" if labels[RACK] != "r2" else "z1"
        taints = (Taint("dedicated", "x", TaintEffect.NO_SCHEDULE),) if draw(st.integers(0, 5)) == 0 else ()
        nodes.append(
            Node(
                f"n{i}",
                {"cpu": draw(st.integers(0, 8)) * 500, "nvidia.com/gpu": draw(st.integers(0, 4)), "pods": draw(st.integers(1, 6))},
                labels,
                taints,
                unschedulable=draw(st.integers(0, 7)) == 0,
            )
        )
    shapes = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 3)), min_size=1, max_size=2))
    members = []
    for s, (cpu, gpu, count) in enumerate(shapes):
        requests = {"cpu": cpu * 500, "nvidia.com/gpu": gpu}
        for k in range(count):
            if len(members) < max_pods:
                members.append(Pod(f"p{s}-{k}", f"g-{len(members)}", PodSpec(requests), group="default/g"))
    bound = []
    if nodes and draw(st.booleans()):
        # an unrelated bound pod somewhere
        bound.append(Pod("other", "other", PodSpec({"cpu": 500}), node=draw(st.sampled_from(nodes)).name))
    policy = draw(st.sampled_from([Policy.GANG, Policy.BASIC]))
    min_count = draw(st.integers(1, len(members))) if policy is Policy.GANG else 1
    key = draw(st.sampled_from(["", RACK, ZONE]))
    preferred = (RACK,) if key != RACK and draw(st.booleans()) else ()
    group = PodGroup("default", "g", tuple(members), policy, min_count, key, preferred)
    return Snapshot(nodes, bound), group


def brute_force(snap, group):
    """The best objective over every assignment of pending pods to nodes or to nothing."""
    pending = group.pending
    options = [None] + [n.name for n in snap.nodes]
    best = None
    for choice in itertools.product(options, repeat=len(pending)):
        placement = {p.uid: n for p, n in zip(pending, choice) if n is not None}
        if not placement or len(placement) < group.needed:
            continue
        try:
            assert_placement_valid(snap, group, placement)
        except PlacementInvalid:
            continue
        objective = evaluate(snap, group, placement)
        best = objective if best is None or objective < best else best
    return best


@settings(max_examples=300)
@given(instances())
def test_every_placement_passes_the_oracle_and_gangs_are_whole_or_nothing(instance):
    snap, group = instance
    for path in ("greedy", "exact"):
        result = place(snap, group, SolveOptions(path=path))
        if result.assignments:
            assert_placement_valid(snap, group, result.assignments)
            if group.policy is Policy.GANG:
                assert len(result.assignments) >= group.min_count
        else:
            assert result.explanation is not None and result.explanation.message()


@settings(max_examples=300)
@given(instances())
def test_exact_finds_a_placement_whenever_greedy_does_and_never_scores_worse(instance):
    snap, group = instance
    greedy = place(snap, group, SolveOptions(path="greedy"))
    exact = place(snap, group, SolveOptions(path="exact"))
    if greedy.assignments:
        assert exact.assignments
        assert exact.objective <= greedy.objective


@settings(max_examples=200)
@given(instances(max_nodes=4, max_pods=3))
def test_exact_objective_equals_the_brute_force_optimum(instance):
    snap, group = instance
    exact = place(snap, group, SolveOptions(path="exact"))
    optimum = brute_force(snap, group)
    if optimum is None:
        assert not exact.assignments
    else:
        assert exact.optimal
        assert exact.objective == optimum
        assert exact.objective == evaluate(snap, group, exact.assignments)
