"""The per-domain objective lower bound that prunes domains in solver.place: never above what a
placement in the domain scores (brute force over small instances), the same answers as ranking and
pruning with the looser bound alone, and what it saves on a cluster of many racks of CPU nodes."""

import itertools
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from solver import Snapshot, SolveOptions, assert_placement_valid, evaluate, place
from solver.errors import PlacementInvalid
from solver.model import Node, Pod, PodGroup, PodSpec, Policy
from solver.problem import Problem

from .test_solver_properties import RACK, instances, rule_instances

HOST = "kubernetes.io/hostname"


def _valid_placements(snap, group):
    pending = group.pending
    for choice in itertools.product([None] + [n.name for n in snap.nodes], repeat=len(pending)):
        placement = {p.uid: n for p, n in zip(pending, choice, strict=True) if n is not None}
        if not placement:
            continue
        try:
            assert_placement_valid(snap, group, placement)
        except PlacementInvalid:
            continue
        yield placement


@settings(max_examples=200, deadline=None)
@given(st.one_of(instances(max_nodes=4, max_pods=3), rule_instances(max_assignments=1500)))
def test_no_placement_in_a_domain_scores_below_its_lower_bound(instance):
    snap, group = instance
    problem = Problem(snap, group)
    if not problem.pending_total:
        return
    bounds = {b.domain: b for b in problem.domain_bounds()}
    for placement in _valid_placements(snap, group):
        domains = {int(problem.domain_ids[snap.index[n]]) for n in placement.values()}
        if len(domains) != 1 or next(iter(domains)) not in bounds:
            continue
        bound = bounds[next(iter(domains))]
        objective = evaluate(snap, group, placement, problem)
        assert problem.objective_lower_bound(bound, len(placement)) <= objective
        assert problem.objective_lower_bound(bound, len(placement), tight=False) <= \
            problem.objective_lower_bound(bound, len(placement))


def _loose_only(self, bound, placed, tight=True):
    return _ORIGINAL(self, bound, placed, tight=False)


_ORIGINAL = Problem.objective_lower_bound


@settings(max_examples=200, deadline=None)
@given(st.one_of(instances(), rule_instances()))
def test_pruning_with_the_tight_bound_gives_the_answers_of_the_loose_one(instance):
    snap, group = instance
    for path in ("greedy", "exact"):
        fast = place(snap, group, SolveOptions(path=path))
        with mock.patch.object(Problem, "objective_lower_bound", _loose_only):
            slow = place(snap, group, SolveOptions(path=path))
        assert fast.assignments == slow.assignments
        assert fast.objective == slow.objective
        assert fast.domain == slow.domain


def _cpu_racks(racks, per_rack):
    return [Node(f"n-{r:03d}-{i:02d}", {"cpu": 16_000, "memory": 64 * 2**30, "pods": 110},
                 {HOST: f"n-{r:03d}-{i:02d}", RACK: f"rack-{r:03d}"})
            for r in range(racks) for i in range(per_rack)]


def _cpu_gang(name, size=8):
    members = tuple(Pod(f"{name}-{i}", f"{name}-{i}", PodSpec({"cpu": 1000}), group=f"default/{name}",
                        labels={"gang": name}) for i in range(size))
    return PodGroup("default", name, members, Policy.GANG, size, RACK)


def _assert_one_rack_tried(snap, node, stranded):
    for path in ("greedy", "exact"):
        result = place(snap, _cpu_gang("g"), SolveOptions(path=path))
        assert set(result.assignments.values()) == {node}
        assert result.objective.stranded == stranded
        assert result.stats.get("domains_solved", 0) <= 1
        assert result.stats["domains_greedy_pruned"] == 39


def test_a_gang_of_cpu_pods_on_many_empty_racks_is_solved_in_one_domain():
    """Eight 1-CPU pods on empty 16-CPU nodes strand 8 CPUs wherever they go: every rack's bound
    says so, so after the first rack no other is tried (before, all 40 were, one CP-SAT model each)."""
    _assert_one_rack_tried(Snapshot(_cpu_racks(40, 5)), "n-000-00", 8000)


def test_a_node_the_gang_fills_exactly_wins_and_prunes_every_other_rack():
    bound = [Pod(f"b{k}", f"b{k}", PodSpec({"cpu": 1000}), node="n-017-03") for k in range(8)]
    _assert_one_rack_tried(Snapshot(_cpu_racks(40, 5), bound), "n-017-03", 0)


def test_a_domain_taken_out_before_the_solve_is_explained_as_closed_not_as_full():
    """Nodes ``only_nodes`` took out (kube-scheduler's filters, a kept domain, a hold) read as full
    to the solver; the explanation says they are closed to the group, not that a pod's cpu is
    missing on them."""
    from .solver_builders import cluster, gang

    snapshot = Snapshot(cluster(racks=2, per_rack=2)).only_nodes(["n-0-0", "n-0-1"])
    result = place(snapshot, gang("g", 20, gpus=1, key=RACK), SolveOptions())
    assert not result.assignments
    message = result.explanation.message()
    assert "rack r1: no node here is open to the group" in message, message
    assert "needs 20 nvidia.com/gpu, 16 free" in message and "cpu" not in message, message


def test_a_small_gang_that_fits_on_one_node_is_proven_by_its_greedy_packing():
    """scheduler_perf's shape: gangs of three 100m pods on 4-CPU nodes, some busier than others.
    The three fit on one node; the best fit is the busiest node that still holds them, greedy
    finds it, and the one-node bound proves it: no CP-SAT model is built (before, one per gang:
    a busier node that cannot hold three made the bound 0 stranded)."""
    nodes = [Node(f"n{i}", {"cpu": 4000, "memory": 32 * 2**30, "pods": 110}, {HOST: f"n{i}"}) for i in range(50)]
    bound = [Pod(f"b{i}-{k}", f"b{i}-{k}", PodSpec({"cpu": 100}), node=f"n{i}")
             for i in range(50) for k in range(i % 39 if i != 37 else 0)]  # n38: 200m free, too little
    members = tuple(Pod(f"g-{i}", f"g-{i}", PodSpec({"cpu": 100}), group="default/g") for i in range(3))
    group = PodGroup("default", "g", members, Policy.GANG, 3)
    snap = Snapshot(nodes, bound)
    exact = place(snap, group, SolveOptions(path="exact"))
    greedy = place(snap, group, SolveOptions(path="greedy"))
    assert set(exact.assignments.values()) == {"n36"} and exact.objective.stranded == 100  # 400m free
    assert exact.assignments == greedy.assignments and exact.optimal
    assert exact.stats.get("domains_solved", 0) == 0


def test_a_request_that_times_the_gang_overflows_int64_is_refused_without_a_numeric_warning():
    import warnings

    huge = PodSpec({"cpu": 2**62})  # a corrupted manifest's request: 4 of them overflow int64
    members = tuple(Pod(uid=f"p{i}", name=f"p{i}", namespace="default", group="default/g", spec=huge)
                    for i in range(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning fails the test
        answer = place(Snapshot([Node("n0", {"cpu": 8000, "pods": 110})]), PodGroup("default", "g", members,
                                                                                   Policy.GANG, 4))
    assert answer.assignments == {}
    assert "a pod needs 4611686018427387904 cpu, at most 8000 free on one node" in answer.explanation.message()


def _rack_of(*gpus):
    return [Node(f"n{i}", {"cpu": 64000, "memory": 256 * 2**30, "nvidia.com/gpu": g, "pods": 110},
                 {HOST: f"n{i}", RACK: "r0"}) for i, g in enumerate(gpus)]


def _gpu_gang(n):
    members = tuple(Pod(f"g-{i}", f"g-{i}", PodSpec({"cpu": 1000, "nvidia.com/gpu": 1}), group="default/g")
                    for i in range(n))
    return PodGroup("default", "g", members, Policy.GANG, n, RACK)


def test_keeping_the_roomiest_node_whole_is_proven_without_a_model():
    """One 8-GPU node and two 2-GPU nodes. Four pods: the two small nodes hold them and the bound
    counts only those (a placement that loses nothing leaves the roomiest alone). Six pods: only
    the big node holds them, and the bound knows its loss. Either way the greedy answer meets the
    bound and no CP-SAT model is built."""
    for pods, nodes, lost in ((4, {"n1", "n2"}, 0), (6, {"n0"}, 6)):
        result = place(Snapshot(_rack_of(8, 2, 2)), _gpu_gang(pods), SolveOptions(path="exact"))
        assert set(result.assignments.values()) == nodes and result.objective.largest_lost == lost
        assert result.optimal and result.stats.get("domains_solved", 0) == 0
