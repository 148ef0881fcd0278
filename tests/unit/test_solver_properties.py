"""Properties of the solver over generated instances, with the validator as the oracle and a brute
force over every assignment as the judge of optimality on small instances."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from solver import (
    DO_NOT_SCHEDULE,
    SCHEDULE_ANYWAY,
    HostPort,
    LabelSelector,
    Node,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Policy,
    Snapshot,
    SolveOptions,
    SpreadConstraint,
    Taint,
    TaintEffect,
    assert_placement_valid,
    evaluate,
    place,
)
from solver.errors import PlacementInvalid
from solver.problem import Problem

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


def brute_force(snap, group, problem=None):
    """The best objective over every assignment of pending pods to nodes or to nothing."""
    pending = group.pending
    options = [None] + [n.name for n in snap.nodes]
    best = None
    for choice in itertools.product(options, repeat=len(pending)):
        placement = {p.uid: n for p, n in zip(pending, choice, strict=False) if n is not None}
        if not placement or len(placement) < group.needed:
            continue
        try:
            assert_placement_valid(snap, group, placement)
        except PlacementInvalid:
            continue
        objective = evaluate(snap, group, placement, problem)
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


# -- inter-pod, spread and port rules: random small instances, brute force as the judge ------------------
HOST = "kubernetes.io/hostname"
WEB = LabelSelector((("app", "web"),))
DEFAULT_NS = frozenset({"default"})


@st.composite
def rule_specs(draw):
    """The rules of one shape: any mix of hostname/zone anti-affinity (required or preferred), zone
    spread (DoNotSchedule or ScheduleAnyway), a host port and now and then a required zone affinity."""
    kw: dict = {}
    if draw(st.booleans()):
        term = PodAffinityTerm(draw(st.sampled_from([HOST, ZONE])), WEB, DEFAULT_NS,
                               weight=draw(st.sampled_from([0, 0, 10, 100])))
        kw["preferred_anti_affinity" if term.weight else "pod_anti_affinity"] = (term,)
    if draw(st.booleans()):
        kw["spread"] = (SpreadConstraint(draw(st.integers(1, 2)), ZONE,
                                         draw(st.sampled_from([DO_NOT_SCHEDULE, SCHEDULE_ANYWAY])), WEB),)
    if draw(st.integers(0, 3)) == 0:
        kw["host_ports"] = (HostPort(8080),)
    if draw(st.integers(0, 4)) == 0:
        kw["pod_affinity"] = (PodAffinityTerm(ZONE, WEB, DEFAULT_NS),)
    return kw


@st.composite
def rule_instances(draw, max_assignments=5000):
    n_zones = draw(st.integers(2, 3))
    n_nodes = draw(st.integers(2, 6))
    nodes = [Node(f"n{i}", {"cpu": draw(st.integers(1, 4)) * 1000, "pods": 110},
                  {HOST: f"n{i}", ZONE: f"z{i % n_zones}"}) for i in range(n_nodes)]
    budget = draw(st.integers(2, 5))
    members = []
    for s in range(draw(st.integers(1, 2))):
        labels = {"app": draw(st.sampled_from(["web", "web", "db"]))}
        spec = PodSpec({"cpu": draw(st.integers(1, 2)) * 1000}, **draw(rule_specs()))
        for k in range(draw(st.integers(1, 4))):
            if len(members) < budget and (n_nodes + 1) ** (len(members) + 1) <= max_assignments:
                members.append(Pod(f"p{s}-{k}", f"g-{len(members)}", spec, group="default/g", labels=labels))
    bound = []
    for b in range(draw(st.integers(0, 2))):
        extra = {}
        kind = draw(st.sampled_from(["plain", "anti", "port"]))
        if kind == "anti":
            extra["pod_anti_affinity"] = (PodAffinityTerm(draw(st.sampled_from([HOST, ZONE])), WEB, DEFAULT_NS),)
        elif kind == "port":
            extra["host_ports"] = (HostPort(8080),)
        bound.append(Pod(f"b{b}", f"b{b}", PodSpec({"cpu": 0}, **extra), node=f"n{draw(st.integers(0, n_nodes - 1))}",
                         labels={"app": draw(st.sampled_from(["web", "db"]))}))
    min_count = draw(st.integers(1, len(members)))
    group = PodGroup("default", "g", tuple(members), Policy.GANG, min_count)
    return Snapshot(nodes, bound), group


def brute_force_rules(snap, group):
    """As :func:`brute_force`, scoring every valid assignment with one Problem (its soft rules)."""
    return brute_force(snap, group, Problem(snap, group))


@settings(max_examples=120, deadline=None)
@given(rule_instances())
def test_with_rules_exact_matches_the_brute_force_optimum_and_greedy_stays_valid(instance):
    snap, group = instance
    greedy = place(snap, group, SolveOptions(path="greedy"))
    if greedy.assignments:
        assert_placement_valid(snap, group, greedy.assignments)
    exact = place(snap, group, SolveOptions(path="exact"))
    optimum = brute_force_rules(snap, group)
    if optimum is None:
        assert not exact.assignments and not greedy.assignments
        return
    assert exact.assignments, exact.explanation and exact.explanation.message()
    assert_placement_valid(snap, group, exact.assignments)
    assert exact.optimal
    assert exact.objective == optimum
    assert exact.objective == evaluate(snap, group, exact.assignments, Problem(snap, group))
    if greedy.assignments:
        assert exact.objective <= greedy.objective


@settings(max_examples=300, deadline=None)
@given(instances(max_nodes=14, max_pods=4))
def test_node_classes_grouped_at_once_equal_the_classes_built_node_by_node(instance):
    """The exact path groups a domain's nodes into classes on an integer matrix (np.unique); the
    classes, their order and their members' order are those of building each node's key."""
    from solver.exact import PlacementModel

    snap, group = instance
    problem = Problem(snap, group)
    for bound in problem.domain_bounds():
        model = PlacementModel(problem, bound)
        if model.enc is not None:
            continue
        per_node = model._node_classes_per_node()
        assert list(model.classes.items()) == list(per_node.items())
