"""The smallest change that makes a pending group fit, one kind per test. Each test applies the
stated change to the snapshot and sees the solver place the group; where the change is claimed
minimal, it applies one step less and sees the group still not fit."""

import dataclasses

from solver import (
    LabelSelector,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Policy,
    PreemptionContext,
    PreemptionPolicy,
    Snapshot,
    SolveOptions,
    Taint,
    place,
    plan_preemption,
)
from solver.smallest import fits, made_eligible, rebuilt, smallest_change

from .solver_builders import RACK, cluster, gang, gpu_node, pods

OPTIONS = SolveOptions(deterministic_time=1.0)
HOST = "kubernetes.io/hostname"


def fitting(snap, group):
    return fits(snap, group, OPTIONS)


def with_nodes(snap, added):
    return rebuilt(snap, snap.nodes + tuple(added))


def eligible(snap, names):
    return rebuilt(snap, [made_eligible(n) if n.name in names else n for n in snap.nodes])


# -- capacity ------------------------------------------------------------------------------------
def test_capacity_names_the_fewest_nodes_of_the_domain_and_adding_them_makes_the_gang_fit():
    snap = Snapshot(cluster(racks=2, per_rack=2))  # 2 racks of 2 nodes of 8 GPUs
    group = gang("train", 4, gpus=8, key=RACK)  # 4 whole nodes in one rack
    assert not fitting(snap, group)

    change = smallest_change(snap, group, OPTIONS).of("capacity")

    assert change is not None and change.proven
    assert len(change.add_nodes) == 2
    rack = change.add_nodes[0].labels[RACK]
    assert {n.labels[RACK] for n in change.add_nodes} == {rack}
    assert change.text.startswith(f"rack {rack} lacks 2 nodes like n-")
    assert f"{RACK}={rack}" in change.text and "nvidia.com/gpu 8" in change.text and "(minimal)" in change.text
    assert change.free == {"nvidia.com/gpu": 16}
    assert fitting(with_nodes(snap, change.add_nodes), group)
    assert not fitting(with_nodes(snap, change.add_nodes[:1]), group)  # one node less does not do


def test_capacity_counts_what_the_domain_already_has_free():
    busy = pods("busy", 1, gpus=8, node="n-1-0")
    snap = Snapshot(cluster(racks=2, per_rack=3), bound=busy)  # rack r1 has one node taken
    group = gang("train", 4, gpus=8, key=RACK)

    change = smallest_change(snap, group, OPTIONS).of("capacity")

    assert change is not None and change.proven and len(change.add_nodes) == 1
    assert change.add_nodes[0].labels[RACK] == "r0"  # the rack with three free nodes: one more
    assert fitting(with_nodes(snap, change.add_nodes), group)


# -- the binding constraint ----------------------------------------------------------------------
def test_constraint_names_the_cordoned_and_tainted_nodes_to_free_and_freeing_them_makes_it_fit():
    nodes = [gpu_node("a", rack="r0", unschedulable=True),
             gpu_node("b", rack="r0", taints=(Taint("maintenance", "yes"),)),
             gpu_node("c", rack="r0"), gpu_node("d", rack="r0"),
             gpu_node("e", rack="r1")]
    snap = Snapshot(nodes)
    group = gang("train", 3, gpus=8, key=RACK)
    assert not fitting(snap, group)

    change = smallest_change(snap, group, OPTIONS).of("constraint")

    assert change is not None and change.proven
    assert change.domain == "rack r0" and len(change.nodes) == 1
    assert "2 kept out there by a cordon or taint" in change.text
    assert "(cordoned)" in change.text or "taint maintenance=yes:NoSchedule" in change.text
    assert fitting(eligible(snap, change.nodes), group)


def test_constraint_on_required_anti_affinity_states_the_rule_and_how_many_nodes_are_kept_out():
    term = PodAffinityTerm(HOST, LabelSelector((("app", "db"),)), frozenset({"default"}))
    members = tuple(Pod(f"db{i}", f"db-{i}", PodSpec({"cpu": 100}, pod_anti_affinity=(term,)),
                        group="default/db", labels={"app": "db"}) for i in range(5))
    nodes = [gpu_node(f"n{i}") for i in range(3)]
    nodes += [gpu_node("n3", taints=(Taint("dedicated", "infra"),)), gpu_node("n4", unschedulable=True),
              gpu_node("n5", unschedulable=True)]
    snap = Snapshot(nodes)
    group = PodGroup("default", "db", members, Policy.GANG, 5)
    assert not fitting(snap, group)

    change = smallest_change(snap, group, OPTIONS).of("constraint")

    assert change is not None and change.proven and len(change.nodes) == 2
    assert "anti-affinity on kubernetes.io/hostname" in change.text
    assert "3 kept out there by a cordon or taint" in change.text
    assert fitting(eligible(snap, change.nodes), group)
    assert not fitting(eligible(snap, change.nodes[:1]), group)


def test_nodes_a_node_selector_excludes_are_not_offered():
    nodes = [gpu_node("a", unschedulable=True, labels={"pool": "other"}), gpu_node("b")]
    snap = Snapshot(nodes)
    members = pods("train", 2, gpus=8, node_selector={"pool": "gpu"})
    group = gang("train", 2, members=members)

    assert smallest_change(snap, group, OPTIONS).of("constraint") is None


# -- the topology key ----------------------------------------------------------------------------
def test_topology_says_it_fits_across_two_domains_and_relaxing_the_key_makes_it_fit():
    snap = Snapshot(cluster(racks=3, per_rack=2))
    group = gang("train", 4, gpus=8, key=RACK)

    change = smallest_change(snap, group, OPTIONS).of("topology")

    assert change is not None and change.proven and len(change.domains) == 2
    assert change.text.startswith(f"fits across racks {'+'.join(change.domains)}, but the key {RACK} requires one")
    relaxed = dataclasses.replace(group, topology_key="")
    on_those = [n.name for n in snap.nodes if n.labels[RACK] in change.domains]
    assert fitting(snap.only_nodes(on_those), relaxed)
    assert not fitting(snap, group)


def test_no_topology_change_for_a_group_without_a_required_key():
    snap = Snapshot(cluster(racks=2, per_rack=1))
    group = gang("train", 3, gpus=8)

    found = smallest_change(snap, group, OPTIONS)

    assert found.of("topology") is None
    assert found.of("capacity") is not None and len(found.of("capacity").add_nodes) == 1


# -- preemption it may not do --------------------------------------------------------------------
def test_preemption_names_the_least_priority_that_preempts_and_the_pods_in_the_way():
    running = pods("web", 4, gpus=4, node="n-0-0", priority=5) + pods("batch", 4, gpus=4, node="n-0-1", priority=1)
    snap = Snapshot(cluster(racks=1, per_rack=2), bound=running)
    group = gang("train", 1, gpus=8, priority=3)
    context = PreemptionContext()
    assert not place(snap, group).assignments
    assert plan_preemption(snap, group, context).helps  # priority 3 beats batch: no change needed

    equal = gang("train", 1, gpus=8, priority=1)  # nothing of lower priority
    change = smallest_change(snap, equal, OPTIONS, context).of("preemption")

    assert change is not None and change.proven and change.priority == 2
    assert "with priority 2 or more (now 1)" in change.text and "priority 1" in change.text
    assert plan_preemption(snap, dataclasses.replace(equal, priority=2), context).helps
    raised = plan_preemption(snap, dataclasses.replace(equal, priority=change.priority), context)
    assert place(snap.without_pods(raised.victims), equal).assignments
    assert not plan_preemption(snap, dataclasses.replace(equal, priority=1), context).helps


def test_preemption_policy_never_says_what_preempting_would_evict():
    running = pods("batch", 2, gpus=4, node="n-0-0", priority=0)
    snap = Snapshot(cluster(racks=1, per_rack=1), bound=running)
    group = gang("train", 1, gpus=8, priority=10, preemption_policy=PreemptionPolicy.NEVER)

    change = smallest_change(snap, group, OPTIONS, PreemptionContext()).of("preemption")

    assert change is not None
    assert change.text.startswith("preemptionPolicy Never: with PreemptLowerPriority it would evict 2 pods")
    assert place(snap.without_pods(change.victims), group).assignments


# -- together --------------------------------------------------------------------------------------
def test_every_change_is_in_the_message_and_the_short_form_is_clipped():
    snap = Snapshot(cluster(racks=8, per_rack=2))
    group = gang("train", 8, gpus=8, key=RACK)

    found = smallest_change(snap, group, OPTIONS)

    assert [c.kind for c in found.changes] == ["capacity", "topology"]
    assert found.of("topology").proven and len(found.of("topology").domains) == 4
    assert found.message() == " | ".join(str(c) for c in found.changes)
    assert len(found.short()) <= 400
    assert fitting(with_nodes(snap, found.of("capacity").add_nodes), group)


def test_capacity_counts_every_resource_the_whole_group_asks_for():
    snap = Snapshot([gpu_node("a", rack="r0"), gpu_node("b", rack="r1")])
    members = pods("big", 2, gpus=8) + pods("small", 8, gpus=1)  # 24 GPUs; a rack has 8
    group = PodGroup("default", "mix", members, Policy.GANG, 10, RACK)

    change = smallest_change(snap, group, OPTIONS).of("capacity")

    assert change is not None and change.proven and len(change.add_nodes) == 2
    assert fitting(with_nodes(snap, change.add_nodes), group)
    assert not fitting(with_nodes(snap, change.add_nodes[:1]), group)


def test_capacity_says_bound_when_fragmentation_needs_more_than_the_totals():
    busy = pods("busy", 1, gpus=8, node="a")
    snap = Snapshot([gpu_node("a", rack="r0")], bound=busy)  # the rack is full
    members = pods("five", 3, gpus=5) + pods("four", 1, gpus=4, start=3)  # 19 GPUs; no 5 + 4 on a node
    group = PodGroup("default", "frag", members, Policy.GANG, 4, RACK)

    change = smallest_change(snap, group, OPTIONS).of("capacity")

    assert change is not None and not change.proven
    assert "(a bound: at least 3, at most 4 nodes)" in change.text
    assert fitting(with_nodes(snap, change.add_nodes), group)


def test_preemption_policy_never_below_the_running_pods_names_both_changes():
    running = pods("web", 2, gpus=4, node="n-0-0", priority=5)
    snap = Snapshot(cluster(racks=1, per_rack=1), bound=running)
    group = gang("train", 1, gpus=8, priority=1, preemption_policy=PreemptionPolicy.NEVER)

    change = smallest_change(snap, group, OPTIONS, PreemptionContext()).of("preemption")

    assert change is not None and change.priority == 6
    assert change.text.startswith("preemptionPolicy Never: with PreemptLowerPriority and priority 6 or more (now 1)")
    assert "2 units of priority 1 or more are in the way" in change.text
    raised = dataclasses.replace(group, priority=6, preemption_policy=PreemptionPolicy.PREEMPT_LOWER_PRIORITY)
    assert plan_preemption(snap, raised, PreemptionContext()).helps
