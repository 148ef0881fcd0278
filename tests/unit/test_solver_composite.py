"""CompositePodGroups planned as one unit (solver/composite.py): the children together inside one
domain of the composite's key, each inside one domain of its own, all-or-nothing over the children
a gang composite requires, at any depth upstream allows."""

from dataclasses import replace

import pytest

from solver import InvalidInput, Policy, Snapshot
from solver.composite import Composite, place_composite
from solver.placement import place_batch

from .solver_builders import RACK, ZONE, cluster, gang, pods

HOST = "kubernetes.io/hostname"


def blocks():
    """Two blocks (zones) of two racks each, two 8-GPU nodes per rack: z0 holds r0, r2; z1 r1, r3."""
    return cluster(racks=4, per_rack=2, zones=2, gpus=8)


def label_of(nodes, name, key):
    return next(n for n in nodes if n.name == name).labels[key]


def replicas(name, count, size, gpus, key=RACK):
    """``count`` child gangs of ``size`` pods, each in one ``key`` domain."""
    return tuple(gang(f"{name}-{i}", size, gpus=gpus, key=key, members=pods(f"{name}-{i}", size, gpus))
                 for i in range(count))


def where(nodes, answer, key):
    """child key -> the set of ``key`` values its placed pods sit in."""
    return {child: {label_of(nodes, n, key) for n in a.assignments.values()} for child, a in answer.children.items()}


def test_a_job_in_one_block_with_each_replica_in_one_rack():
    nodes = blocks()
    job = Composite("default", "job", replicas("rep", 2, 2, 8), min_group_count=2, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes), job)
    assert answer.fits and answer.domain in ("z0", "z1")
    racks = where(nodes, answer, RACK)
    assert all(len(r) == 1 for r in racks.values()) and len(set.union(*racks.values())) == 2
    assert set.union(*where(nodes, answer, ZONE).values()) == {answer.domain}
    assert len(answer.assignments) == 4


def test_children_planned_alone_would_split_across_blocks_the_composite_keeps_them_in_one():
    nodes = blocks()
    # each block has one rack with room for a replica: r0 (z0) and r1 (z1); r2 and r3 are full
    busy = [replace(p, node=f"n-{r}-{i}", group="") for r in (2, 3) for i in range(2)
            for p in pods(f"busy-{r}-{i}", 1, gpus=8)]
    snapshot = Snapshot(nodes, busy)
    children = replicas("rep", 2, 2, 8)
    # planned child by child (as phalanx planned them before composites): a rack each, one per block
    alone = place_batch(snapshot, children).placements
    assert all(p.assignments for p in alone)
    assert {label_of(nodes, n, ZONE) for p in alone for n in p.assignments.values()} == {"z0", "z1"}
    job = Composite("default", "job", children, min_group_count=2, topology_key=ZONE)
    answer = place_composite(snapshot, job)
    assert not answer.fits and answer.assignments == {}  # no block holds both: nothing is placed
    assert "no topology.kubernetes.io/zone domain holds the 32 nvidia.com/gpu" in answer.explanation
    # with room for both in z1, both go there
    freed = Snapshot(nodes, [p for p in busy if not p.node.startswith("n-3-")])
    answer = place_composite(freed, job)
    assert answer.fits and answer.domain == "z1" and set.union(*where(nodes, answer, ZONE).values()) == {"z1"}


def test_the_tightest_block_that_holds_the_children_is_taken():
    nodes = blocks()
    # z0 less free (one node of r0 half used) but still room for a replica of 2 x 8 GPUs in r2
    used = [replace(p, node="n-0-0", group="") for p in pods("busy", 1, gpus=4)]
    job = Composite("default", "job", replicas("rep", 1, 2, 8), min_group_count=1, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes, used), job)
    assert answer.fits and answer.domain == "z0"


def test_a_gang_composite_places_none_unless_its_required_children_fit_a_basic_one_what_fits():
    nodes = blocks()
    # five one-pod children of 6 GPUs, each in one rack: 30 of a block's 32 GPUs, but only its 4
    # nodes can take a 6-GPU pod
    children = replicas("rep", 5, 1, 6)
    gang_job = Composite("default", "job", children, min_group_count=5, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes), gang_job)
    assert not answer.fits and answer.assignments == {}
    assert "4 of 5 children fit, 5 required; podgroup default/rep-" in answer.explanation, answer.explanation
    four_of_five = Composite("default", "job", children, min_group_count=4, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes), four_of_five)
    assert answer.fits and len(answer.children) == 4
    basic = Composite("default", "job", children, policy=Policy.BASIC, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes), basic)
    assert answer.fits and len(answer.children) == 4


def test_three_levels_block_then_rack_then_node():
    nodes = blocks()
    racks = tuple(Composite("default", f"rack-{i}", replicas(f"r{i}-host", 2, 1, 8, key=HOST), min_group_count=2,
                            topology_key=RACK) for i in range(2))
    job = Composite("default", "job", racks, min_group_count=2, topology_key=ZONE)
    assert job.depth == 3
    answer = place_composite(Snapshot(nodes), job)
    assert answer.fits
    for rack in racks:
        inner = answer.children[rack.key]
        assert len(set.union(*where(nodes, inner, RACK).values())) == 1
        assert all(len(h) == 1 for h in where(nodes, inner, HOST).values())
    zones = {label_of(nodes, n, ZONE) for n in answer.assignments.values()}
    assert zones == {answer.domain}


def test_running_members_hold_the_composite_to_their_block():
    nodes = blocks()
    running = tuple(replace(p, node="n-1-0") for p in pods("rep-0", 2, gpus=4))  # rep-0 runs in r1 (z1)
    first = gang("rep-0", 2, gpus=4, key=RACK, members=running)
    second = gang("rep-1", 2, gpus=8, key=RACK)
    job = Composite("default", "job", (first, second), min_group_count=2, topology_key=ZONE)
    answer = place_composite(Snapshot(nodes, list(running)), job)
    assert answer.fits and answer.domain == "z1"
    assert set.union(*where(nodes, answer, ZONE).values()) == {"z1"}


def test_a_composite_that_no_block_can_hold_says_so_by_totals_and_what_the_roomiest_lacks():
    job_big = Composite("default", "big", replicas("rep", 2, 4, 8), min_group_count=2, topology_key=ZONE)
    answer = place_composite(Snapshot(blocks()), job_big)  # 64 GPUs asked, a block has 32
    assert not answer.fits and answer.children == {}
    assert "no topology.kubernetes.io/zone domain holds the 64 nvidia.com/gpu" in answer.explanation
    # the roomiest block (a tie: the first) is tried for what it lacks: no replica of 4 x 8 GPUs fits
    # one of its 16-GPU racks
    assert answer.domain == "z0"
    assert [x.child.key for x in answer.left_out] == ["default/rep-0", "default/rep-1"]
    assert answer.left_out[0].explanation is not None and answer.left_out[0].explanation.domains


def test_bad_composites_are_refused():
    child = gang("a", 1)
    with pytest.raises(InvalidInput, match="minGroupCount must be an integer >= 1"):
        Composite("default", "job", (child,), min_group_count=0)
    with pytest.raises(InvalidInput, match="a child is listed twice"):
        Composite("default", "job", (child, child))
    deep = Composite("default", "l1", (child,))
    for level in range(2, 4):
        deep = Composite("default", f"l{level}", (deep,))
    assert deep.depth == 4  # three composites over the PodGroups: upstream's deepest tree
    with pytest.raises(InvalidInput, match="nests 5 levels, at most 4"):
        Composite("default", "l4", (deep,))


def test_a_composite_waiting_for_a_child_or_a_member_is_not_planned():
    short = gang("b", 2, min_count=3)  # 2 of 3 members exist
    job = Composite("default", "job", (gang("a", 1), short), min_group_count=2)
    with pytest.raises(InvalidInput, match="waiting for members"):
        place_composite(Snapshot(blocks()), job)
    lonely = Composite("default", "job", (gang("a", 1),), min_group_count=2)
    with pytest.raises(InvalidInput, match="waiting for children, 1 of 2 exist"):
        place_composite(Snapshot(blocks()), lonely)


def test_the_benchmark_checks_its_answers_and_shows_the_split_it_prevents():
    from bench import composite_bench
    rows = composite_bench.run(calls=1)
    assert [r["fits"] for r in rows] == [True, True, False]
    assert all(r["nodes"] == 5_000 and r["pods"] == 64 for r in rows)
    assert rows[0]["apart_placed"] == 8 and rows[0]["apart_blocks"] > 1  # one by one: scattered
    assert 0 < rows[2]["apart_placed"] < 8  # one by one where no block holds the job: some bind
    assert rows[2]["smallest_change"].startswith("capacity ")  # the tree's own change, searched once
    table = composite_bench.markdown(rows)
    assert table.count("\n") == 4 and "does not fit" in table and "(capacity)" in table


def test_kube_schedulers_verdicts_on_a_childs_pods_are_kept():
    nodes = blocks()
    job = Composite("default", "job", replicas("rep", 2, 2, 8), min_group_count=2, topology_key=ZONE)
    only_r2 = frozenset(n.name for n in nodes if n.labels[RACK] == "r2")
    allowed = {p.uid: only_r2 for p in job.children[0].pending}  # rep-0's pods: rack r2 only
    answer = place_composite(Snapshot(nodes), job, allowed=allowed)
    assert answer.fits and answer.domain == "z0"
    assert {label_of(nodes, n, RACK) for n in answer.children["default/rep-0"].assignments.values()} == {"r2"}


def _running(nodes, priority_of, on=None):
    """One 8-GPU pod on each node (``on``: those nodes only), at ``priority_of(node)``."""
    return [replace(p, node=n.name, group="", spec=replace(p.spec, priority=priority_of(n)))
            for n in nodes if on is None or n.name in on for p in pods(f"low-{n.name}", 1, gpus=8)]


def job(priority=100):
    return Composite("default", "job", replicas("rep", 2, 2, 8), min_group_count=2, topology_key=ZONE,
                     priority=priority)


def test_a_composite_that_does_not_fit_preempts_the_cheapest_block_and_no_more():
    from solver import PreemptionContext
    from solver.composite import plan_composite_preemption

    nodes = blocks()
    # z0's pods at priority 50, z1's at 10: z1 is the cheaper block to free
    low = _running(nodes, lambda n: 50 if n.labels[ZONE] == "z0" else 10)
    plan = plan_composite_preemption(Snapshot(nodes, low), job(), PreemptionContext())
    assert plan is not None and plan.placement.fits and plan.placement.domain == "z1"
    assert len(plan.victims) == 4 and plan.cost.highest_priority == 10
    victims_nodes = {p.node for p in low if p.uid in plan.victims}
    assert {label_of(nodes, n, ZONE) for n in victims_nodes} == {"z1"}
    # one rack of z1 already free: only the other rack's two pods go
    fewer = [p for p in low if label_of(nodes, p.node, RACK) != "r1"]
    plan = plan_composite_preemption(Snapshot(nodes, fewer), job(), PreemptionContext())
    assert plan is not None and len(plan.victims) == 2 and plan.placement.domain == "z1"


def test_a_composite_preempts_nothing_of_equal_or_higher_priority_and_an_all_unit_goes_whole():
    from solver import DisruptionMode, PreemptionContext, VictimInfo
    from solver.composite import plan_composite_preemption

    nodes = blocks()
    high = _running(nodes, lambda n: 100)
    assert plan_composite_preemption(Snapshot(nodes, high), job(), PreemptionContext()) is None
    # z1's four pods one `all` unit with a pod in z0 too: taking z1 evicts it whole, z0 pod included
    low = _running(nodes, lambda n: 10)
    unit = {p.uid for p in low if label_of(nodes, p.node, ZONE) == "z1"} | {low[0].uid}
    context = PreemptionContext({uid: VictimInfo(10, "default/low-job", DisruptionMode.ALL) for uid in unit})
    plan = plan_composite_preemption(Snapshot(nodes, low), job(), context)
    # z0 would cost its three single pods and the unit (its pod there pulls in all 5): 8 pods; z1 the unit: 5
    assert plan is not None and plan.placement.fits and plan.placement.domain == "z1"
    assert set(plan.victims) == unit  # the unit whole, its pod in z0 too


# -- the smallest change for the whole tree (docs/design.md: composite/smallest-change) ------------
def _half_full(priority):
    """blocks() with one rack of each block full (r0 in z0, r1 in z1) at ``priority``: each block
    holds one replica of job(), none holds both."""
    nodes = blocks()
    return nodes, _running(nodes, lambda n: priority, on={n.name for n in nodes if n.labels[RACK] in ("r0", "r1")})


def test_the_smallest_change_of_a_composite_is_for_the_whole_tree_and_names_the_child_left_out():
    from solver import smallest_composite_change

    nodes, running = _half_full(0)
    snap = Snapshot(nodes, running)
    assert not place_composite(snap, job()).fits
    found = smallest_composite_change(snap, job())
    capacity = found.of("capacity")
    # the nearest block is short a whole replica's rack room: two 8-GPU nodes, proven by totals
    assert capacity is not None and capacity.proven and len(capacity.add_nodes) == 2
    assert capacity.domain == "zone z0"
    assert "podgroup default/rep-1 does not fit there now" in capacity.text
    added = Snapshot(nodes + list(capacity.add_nodes), running)
    assert place_composite(added, job()).fits  # the change, applied, places the tree
    topology = found.of("topology")
    assert topology is not None and topology.domains == ("z0", "z1") and topology.proven
    assert found.of("preemption") is None  # it may evict the priority-0 pods already


def test_a_composite_held_back_by_higher_priority_work_is_told_the_priority_it_needs():
    from solver import PreemptionContext, smallest_composite_change

    nodes, running = _half_full(500)
    found = smallest_composite_change(Snapshot(nodes, running), job(priority=100), context=PreemptionContext())
    change = found.of("preemption")
    assert change is not None and change.priority == 501 and len(change.victims) == 2
    assert "compositepodgroup default/job would evict 2 pods in zone" in change.text


def test_the_fewest_nodes_are_found_by_doubling_then_bisecting():
    from solver.smallest import _fewest
    calls = []

    def fits_with(k):
        calls.append(k)
        return k >= 13
    assert _fewest(1, fits_with, 256) == 13 and len(calls) <= 9  # 1, 2, 4, 8, 16, then 12, 14, 13
    assert _fewest(20, fits_with, 256) == 20
    assert _fewest(1, lambda k: False, 40) is None
