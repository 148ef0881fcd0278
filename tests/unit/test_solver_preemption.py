"""Group preemption planning: one rule per test, then properties over generated instances with the
placement solver and the validator as the oracle, and a brute force over victim sets as the judge."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver import (
    DisruptionBudget,
    DisruptionMode,
    InvalidInput,
    Node,
    Pod,
    PodGroup,
    PodSpec,
    Policy,
    PreemptionContext,
    PreemptionPolicy,
    Snapshot,
    SolveOptions,
    VictimInfo,
    assert_placement_valid,
    expand_victims_for_pod,
    place,
    plan_preemption,
    rank_candidates,
    victim_cost,
    victim_units,
)

from .solver_builders import RACK, cluster, gang, gpu_node, pods

PATHS = ["greedy", "exact"]
ALL = DisruptionMode.ALL


def running(name, n, gpus, node, priority=0, **kw):
    """``n`` running pods of ``gpus`` GPUs each on ``node``, with their own pod priority."""
    return pods(name, n, gpus, node=node, priority=priority, **kw)


def plan(snap, group, context=PreemptionContext(), path="exact"):
    """Plan, and check every plan that helps the way the extender will act on it."""
    result = plan_preemption(snap, group, context, SolveOptions(path=path, deterministic_time=1.0))
    if result.helps:
        assert_sound(snap, group, context, result)
    return result


def assert_sound(snap, group, context, result):
    after = snap.without_pods(result.victims)
    assert_placement_valid(after, group, result.placement)
    assert result.victims == tuple(uid for unit in result.units for uid in unit.pods)
    assert [u.priority for u in result.units] == sorted((u.priority for u in result.units), reverse=True)
    assert all(u.priority < group.priority for u in result.units)
    evicted = set(result.victims)
    for unit in victim_units(snap, context):
        assert set(unit.pods) <= evicted or not set(unit.pods) & evicted, f"{unit.key} split"
    assert result.cost == victim_cost(result.units, context.budgets)
    assert result.pdb_violations == result.cost.pdb_violations


def units_necessary(snap, group, result):
    for unit in result.units:
        spared = [uid for uid in result.victims if uid not in unit.pods]
        if place(snap.without_pods(spared), group).assignments:
            return False
    return True


def keys(result):
    return sorted(u.key for u in result.units)


# -- what may be evicted ------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_only_strictly_lower_priority_pods_are_victims(path):
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)],
                    running("same", 4, 1, "a", priority=5) + running("low", 4, 1, "b", priority=4))
    result = plan(snap, gang("hi", 4, priority=5), path=path)
    assert keys(result) == [f"default/low-{i}" for i in range(4)]
    assert result.placement and set(result.placement.values()) == {"b"}


def test_equal_priority_pods_are_never_victims_so_preemption_cannot_help():
    snap = Snapshot([gpu_node("a", gpus=4)], running("same", 4, 1, "a", priority=5))
    result = plan(snap, gang("hi", 2, priority=5))
    assert not result.helps and result.victims == ()
    assert result.reason == "podgroup default/hi: preemption cannot help: no running pod has a priority below 5"


def test_preemption_policy_never_never_preempts():
    snap = Snapshot([gpu_node("a", gpus=4)], running("low", 4, 1, "a"))
    group = gang("hi", 2, priority=9, preemption_policy="Never")
    assert group.preemption_policy is PreemptionPolicy.NEVER
    result = plan(snap, group)
    assert result.reason == "podgroup default/hi: preemption cannot help: preemptionPolicy Never"


def test_when_even_evicting_everything_is_not_enough_the_reason_says_what_is_missing():
    snap = Snapshot([gpu_node("a", gpus=4)], running("low", 2, 1, "a"))
    result = plan(snap, gang("hi", 6, priority=9))
    assert not result.helps
    assert result.reason.startswith("podgroup default/hi: preemption cannot help: even with all 2 lower-priority "
                                    "pods evicted: ")
    assert "needs 6 nvidia.com/gpu, 4 free" in result.reason


def test_a_group_that_fits_needs_no_victims():
    snap = Snapshot([gpu_node("a", gpus=8)], running("low", 2, 1, "a"))
    result = plan(snap, gang("hi", 4, priority=9))
    assert result.helps and result.victims == () and len(result.placement) == 4


def test_the_unit_priority_is_the_groups_not_the_pods():
    low_pods = running("g", 2, 2, "a", priority=0)  # the pods say 0; their group says 7
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)], low_pods + running("x", 2, 2, "b", priority=3))
    context = PreemptionContext.from_groups([gang("g", 2, members=low_pods, priority=7)])
    result = plan(snap, gang("hi", 2, gpus=2, priority=5), context)
    assert keys(result) == ["default/x-0", "default/x-1"]


# -- upstream's order ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_fewest_pdb_violations_beats_lower_priority(path):
    protected = running("cheap", 1, 4, "a", priority=1)
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)], protected + running("dear", 1, 4, "b", priority=6))
    context = PreemptionContext(budgets=(DisruptionBudget("pdb", {protected[0].uid}, 0),))
    result = plan(snap, gang("hi", 1, gpus=4, priority=9), context, path)
    assert keys(result) == ["default/dear-0"] and result.pdb_violations == 0


def test_allowed_disruptions_are_not_violations():
    protected = running("cheap", 1, 4, "a", priority=1)
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)], protected + running("dear", 1, 4, "b", priority=6))
    context = PreemptionContext(budgets=(DisruptionBudget("pdb", {protected[0].uid}, 1),))
    result = plan(snap, gang("hi", 1, gpus=4, priority=9), context)
    assert keys(result) == ["default/cheap-0"] and result.pdb_violations == 0


@pytest.mark.parametrize("path", PATHS)
def test_lowest_highest_victim_priority_beats_fewer_victims(path):
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)],
                    running("many", 4, 1, "a", priority=1) + running("one", 1, 4, "b", priority=2))
    result = plan(snap, gang("hi", 1, gpus=4, priority=9), path=path)
    assert result.cost.highest_priority == 1 and result.cost.pods == 4


def test_fewest_victims_at_the_same_highest_priority():
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)],
                    running("many", 4, 1, "a", priority=2) + running("one", 1, 4, "b", priority=2))
    result = plan(snap, gang("hi", 1, gpus=4, priority=9))
    assert keys(result) == ["default/one-0"]


def test_least_total_priority_breaks_the_last_tie():
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)],
                    running("top", 1, 2, "a", priority=5) + running("x", 1, 2, "a", priority=4)
                    + running("top2", 1, 2, "b", priority=5) + running("y", 1, 2, "b", priority=1))
    result = plan(snap, gang("hi", 1, gpus=4, priority=9))
    assert keys(result) == ["default/top2-0", "default/y-0"]
    assert result.victims == ("top2-0", "y-0")  # highest priority first


def test_exact_evicts_fewer_pods_than_the_upstream_reprieve_order():
    # reprieve tries the big pod first (same priority, earlier key), keeps it, and loses all the small ones
    snap = Snapshot([gpu_node("a", gpus=8), gpu_node("b", gpus=8)],
                    running("a-big", 1, 8, "a", priority=1) + running("b-small", 8, 1, "b", priority=1))
    group = gang("hi", 1, gpus=8, priority=9)
    greedy, exact = plan(snap, group, path="greedy"), plan(snap, group, path="exact")
    assert greedy.cost.pods == 8 and exact.cost.pods == 1
    assert exact.optimal


# -- atomic groups --------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_an_all_group_is_evicted_whole_including_members_on_other_nodes(path):
    members = running("job", 1, 4, "a", priority=1) + running("job", 1, 4, "b", priority=1, start=1)
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4), gpu_node("c", gpus=4)],
                    members + running("solo", 1, 4, "c", priority=2))
    context = PreemptionContext.from_groups([gang("job", 2, members=members, priority=1, disruption_mode=ALL)])
    result = plan(snap, gang("hi", 1, gpus=4, priority=9), context, path)
    assert [u.describe() for u in result.units] == ["podgroup default/job (2 pods)"]
    assert set(result.victims) == {"job-0", "job-1"}


def test_a_single_pod_beats_an_all_group_of_the_same_priority_with_more_pods():
    members = running("job", 2, 2, "a", priority=1)
    snap = Snapshot([gpu_node("a", gpus=4), gpu_node("b", gpus=4)], members + running("solo", 1, 4, "b", priority=1))
    context = PreemptionContext.from_groups([gang("job", 2, members=members, priority=1, disruption_mode=ALL)])
    result = plan(snap, gang("hi", 1, gpus=4, priority=9), context)
    assert keys(result) == ["default/solo-0"]


def test_single_mode_group_members_are_separate_units():
    members = running("svc", 4, 1, "a", priority=1)
    snap = Snapshot([gpu_node("a", gpus=4)], members)
    context = PreemptionContext.from_groups([gang("svc", 4, members=members, priority=1)])
    result = plan(snap, gang("hi", 1, gpus=2, priority=9), context)
    assert len(result.units) == 2 and all(u.mode is DisruptionMode.SINGLE for u in result.units)


# -- topology -----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_topology_constrained_preemptor_takes_victims_in_one_rack_only(path):
    nodes = cluster(racks=2, per_rack=2, gpus=4)
    snap = Snapshot(nodes, running("r0", 2, 4, "n-0-0", priority=1)[:1] + running("r0b", 1, 4, "n-0-1", priority=1)
                    + running("r1", 1, 4, "n-1-0", priority=2) + running("r1b", 4, 1, "n-1-1", priority=1))
    result = plan(snap, gang("hi", 2, gpus=4, key=RACK, priority=9), path=path)
    assert result.domain == "r0" and keys(result) == ["default/r0-0", "default/r0b-0"]
    racks = {snap.nodes[snap.index[snap.bound[[p.uid for p in snap.bound].index(u)].node]].labels[RACK]
             for u in result.victims}
    assert racks == {"r0"}


def test_without_a_key_victims_may_come_from_any_rack():
    nodes = cluster(racks=2, per_rack=1, gpus=4)
    snap = Snapshot(nodes, running("a", 1, 4, "n-0-0", priority=1) + running("b", 1, 4, "n-1-0", priority=1))
    result = plan(snap, gang("hi", 2, gpus=4, priority=9))
    assert keys(result) == ["default/a-0", "default/b-0"]


# -- minimality ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
def test_every_victim_is_necessary(path):
    snap = Snapshot([gpu_node(f"n{i}", gpus=4) for i in range(3)],
                    running("p", 4, 1, "n0", priority=1) + running("q", 2, 2, "n1", priority=2)
                    + running("r", 1, 3, "n2", priority=1))
    group = gang("hi", 2, gpus=3, priority=9)
    result = plan(snap, group, path=path)
    assert result.helps and units_necessary(snap, group, result)


def test_same_input_same_plan():
    victims = [Pod(f"v{i}", f"v{i}", PodSpec({"nvidia.com/gpu": 2}, priority=i % 3), node=f"n-{i % 3}-{i % 2}")
               for i in range(12)]
    snap = Snapshot(cluster(racks=3, per_rack=3, gpus=4), victims)
    group = gang("hi", 3, gpus=4, key=RACK, priority=9)

    def decision(result):
        return result.victims, dict(result.placement), result.domain

    first = decision(plan(snap, group))
    assert first[0] and all(decision(plan(snap, group)) == first for _ in range(2))


# -- bad input ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: DisruptionBudget("pdb", {"a"}, -1), "allowed must be an integer >= 0"),
        (lambda: VictimInfo(1, "", ALL), "needs a group key"),
        (lambda: gang("g", 1, preemption_policy="Sometimes"), "preemptionPolicy must be PreemptLowerPriority or Never"),
        (lambda: Snapshot([gpu_node("a")]).without_pods(["ghost"]), "not bound in the snapshot"),
    ],
)
def test_bad_input_gets_a_clear_error(build, message):
    with pytest.raises(InvalidInput, match=message):
        build()


# -- snapshot what-if edits ------------------------------------------------------------------------
def test_without_pods_releases_usage_and_leaves_the_original_alone():
    snap = Snapshot([gpu_node("a", gpus=4)], running("p", 3, 1, "a"))
    snap.eligibility(PodSpec())
    gpu = snap.rindex["nvidia.com/gpu"]
    after = snap.without_pods(["p-0", "p-2"])
    assert int(after.free[0, gpu]) == 3 and int(snap.free[0, gpu]) == 1
    assert [p.uid for p in after.bound] == ["p-1"] and len(snap.bound) == 3
    assert after.nodes is snap.nodes and after.node_cache[("unsched",)] is snap.node_cache[("unsched",)]


# -- the preempt verb: a pod without a group ----------------------------------------------------------
def reverse_case():
    job = running("job", 1, 4, "a", priority=1) + running("job", 1, 4, "b", priority=1, start=1)
    snap = Snapshot([gpu_node(n, gpus=4) for n in "abc"], job + running("solo", 1, 4, "c", priority=1))
    context = PreemptionContext.from_groups([gang("job", 2, members=job, priority=1, disruption_mode=ALL)])
    return snap, context


def test_a_victim_in_an_all_group_costs_its_whole_group():
    snap, context = reverse_case()
    expanded = expand_victims_for_pod({"a": ["job-0"], "c": ["solo-0"]}, snap, context)
    assert expanded == {"a": ("job-0", "job-1"), "c": ("solo-0",)}


def test_candidates_breaking_an_all_group_are_dropped_when_a_cheaper_one_exists():
    snap, context = reverse_case()
    ranked = rank_candidates({"a": ["job-0"], "b": ["job-1"], "c": ["solo-0"]}, snap, context)
    assert [c.node for c in ranked] == ["c"]


def test_a_candidate_breaking_an_all_group_stays_when_nothing_is_cheaper_and_names_the_collateral():
    snap, context = reverse_case()
    ranked = rank_candidates({"a": ["job-0"], "b": ["job-1"]}, snap, context)
    assert [c.node for c in ranked] == ["a", "b"]
    assert ranked[0].victims == ("job-0",) and ranked[0].collateral == ("job-1",)
    assert ranked[0].breaks_all_group and ranked[0].cost.pods == 2


def test_reverse_case_rejects_a_victim_that_is_not_on_the_node():
    snap, context = reverse_case()
    with pytest.raises(InvalidInput, match="victim job-1 is not running on that node"):
        rank_candidates({"a": ["job-1"]}, snap, context)


# -- properties ---------------------------------------------------------------------------------
@st.composite
def instances(draw, max_nodes=4):
    """A small full-ish cluster of 1-4 GPU nodes in two racks, running pods of four priorities,
    some in an `all` group and some behind a budget, and a priority-3 gang that wants room."""
    nodes, bound, victims = [], [], {}
    group_priority = draw(st.sampled_from([0, 2, 5]))
    for i in range(draw(st.integers(1, max_nodes))):
        gpus = draw(st.integers(1, 4))
        nodes.append(Node(f"n{i}", {"nvidia.com/gpu": gpus, "pods": 8}, {RACK: f"r{i % 2}"}))
        free = gpus
        for k in range(draw(st.integers(0, 3))):
            need = draw(st.integers(1, 2))
            if need > free:
                break
            free -= need
            uid = f"p{i}-{k}"
            bound.append(Pod(uid, uid, PodSpec({"nvidia.com/gpu": need}), node=f"n{i}"))
            if draw(st.integers(0, 3)) == 0:
                victims[uid] = VictimInfo(group_priority, "t/all", ALL)
            else:
                victims[uid] = VictimInfo(draw(st.sampled_from([0, 1, 2, 5])))
    budgets = ()
    if bound and draw(st.booleans()):
        chosen = draw(st.sets(st.sampled_from([p.uid for p in bound]), min_size=1))
        budgets = (DisruptionBudget("pdb", frozenset(chosen), draw(st.integers(0, 1))),)
    size = draw(st.integers(1, 3))
    members = tuple(Pod(f"g{k}", f"g-{k}", PodSpec({"nvidia.com/gpu": draw(st.integers(1, 2))})) for k in range(size))
    group = PodGroup("t", "g", members, Policy.GANG, draw(st.integers(1, size)),
                     draw(st.sampled_from(["", RACK])), priority=3)
    return Snapshot(nodes, bound), group, PreemptionContext(victims, budgets)


@settings(max_examples=250)
@given(instances())
def test_every_plan_frees_room_spares_higher_priorities_keeps_groups_whole_and_needs_every_victim(instance):
    snap, group, context = instance
    for path in PATHS:
        result = plan(snap, group, context, path)  # sound: validator, priorities, no split group
        if result.helps:
            assert units_necessary(snap, group, result)
            if group.topology_key:
                domain_nodes = {n.name for n in snap.nodes if n.labels.get(RACK) == result.domain}
                node_of = {p.uid: p.node for p in snap.bound}
                assert all(any(node_of[uid] in domain_nodes for uid in u.pods) for u in result.units)
        else:
            lower = [p.uid for p in snap.bound if context.info(p).priority < group.priority]
            assert not place(snap.without_pods(lower), group).assignments


@settings(max_examples=250)
@given(instances())
def test_exact_is_never_worse_than_greedy(instance):
    snap, group, context = instance
    greedy, exact = plan(snap, group, context, "greedy"), plan(snap, group, context, "exact")
    assert greedy.helps == exact.helps
    if exact.helps:
        assert exact.cost <= greedy.cost


@settings(max_examples=100)
@given(instances(max_nodes=3))
def test_exact_cost_equals_the_brute_force_optimum_without_a_topology_key(instance):
    snap, group, context = instance
    if group.topology_key:
        return
    units = [u for u in victim_units(snap, context, group.key) if u.priority < group.priority]
    best = None
    for r in range(len(units) + 1):
        for chosen in itertools.combinations(units, r):
            cost = victim_cost(chosen, context.budgets)
            if best is not None and cost >= best:
                continue
            if place(snap.without_pods([uid for u in chosen for uid in u.pods]), group).assignments:
                best = cost
    result = plan(snap, group, context)
    assert (result.cost if result.helps else None) == best


# -- the room count that skips hopeless reprieves ----------------------------------------------------
def _upstream_basic(nodes: int, per_node: int) -> tuple[Snapshot, PodGroup, PreemptionContext]:
    """upstream scheduler_perf's GangPreemptionBasic, 100Nodes_1PreemptorGang_100Pods: every node
    runs ``per_node`` 40m pods of priority 0; a gang of one 3970m pod per node must evict them all."""
    cluster_nodes = [Node(f"n{i}", {"cpu": 4000, "memory": 32 * 2**30, "pods": 110}) for i in range(nodes)]
    bound = [Pod(f"low-{i}", f"low-{i}", PodSpec({"cpu": 40, "memory": 100 * 2**20}), node=f"n{i % nodes}",
                 namespace="low") for i in range(nodes * per_node)]
    members = tuple(Pod(f"g-{i}", f"g-{i}", PodSpec({"cpu": 3970, "memory": 100 * 2**20}), namespace="hi",
                        group="hi/g") for i in range(nodes))
    group = PodGroup("hi", "g", members, Policy.GANG, nodes, priority=8888888)
    return Snapshot(cluster_nodes, bound), group, PreemptionContext({p.uid: VictimInfo(0) for p in bound})


def test_a_gang_that_needs_every_victim_is_planned_without_a_solve_per_reprieve(monkeypatch):
    from solver import preemption as planning

    snapshot, group, context = _upstream_basic(nodes=40, per_node=10)
    solves = []
    real_place = planning.place
    monkeypatch.setattr(planning, "place", lambda *a, **k: solves.append(1) or real_place(*a, **k))
    plan = plan_preemption(snapshot, group, context)
    assert plan.helps and len(plan.victims) == 400 and len(plan.placement) == 40
    # 400 victims given back in turn twice (the greedy, then every-victim-necessary): each refused
    # by the room count, none by a solve; the solves left are the plan's own checks
    assert len(solves) < 10


@pytest.mark.parametrize("seed", range(4))
def test_the_room_count_and_the_standing_placement_never_change_a_plan(seed, monkeypatch):
    """The count only skips checks that would refuse, the placement left standing only checks that
    would accept: the plans with and without both shortcuts are the same."""
    import numpy as np

    from solver import preemption as planning

    rng = np.random.default_rng(seed)
    nodes = [gpu_node(f"n{i}", rack=f"r{i // 4}") for i in range(12)]
    bound, victims = [], {}
    for i, node in enumerate(nodes):
        used = 0
        while used < 8:
            gpus = int(rng.choice([1, 2, 4]))
            if used + gpus > 8:
                break
            uid = f"v{i}-{used}"
            bound.append(Pod(uid, uid, PodSpec({"cpu": 1000 * gpus, "nvidia.com/gpu": gpus}), node=node.name,
                             namespace="low", group=f"low/g{i % 5}"))
            victims[uid] = VictimInfo(int(rng.choice([10, 20, 30])), f"low/g{i % 5}",
                                      DisruptionMode.ALL if i % 5 == 0 else DisruptionMode.SINGLE)
            used += gpus
    snapshot, context = Snapshot(nodes, bound), PreemptionContext(victims)
    for size, gpus, key in ((6, 4, ""), (4, 8, RACK), (10, 2, RACK)):
        group = gang(f"p{size}", size, gpus, key, priority=100)
        with_count = plan_preemption(snapshot, group, context)
        monkeypatch.setattr(planning._Room, "refuses", lambda self, usage: False)
        monkeypatch.setattr(planning._Search, "untouched", lambda self, witness, usage: False)
        without = plan_preemption(snapshot, group, context)
        monkeypatch.undo()
        assert with_count.victims, "the instance must preempt"
        assert (with_count.victims, with_count.placement, with_count.cost) == \
            (without.victims, without.placement, without.cost)
