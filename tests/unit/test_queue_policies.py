"""The queue policies of cycle/queue.py (the code the live cycle and the trace simulator
share): a starving gang holds the domain nearest to fitting it, smaller gangs stay out unless their
declared duration ends before the holder's shadow time, fragmentation-aware domain choice keeps a
queued shape fitting, victims are offered cheapest lost work first — and the live cycle applies
the hold and shows it on the dashboard."""

import numpy as np
import pytest

from cluster import names
from cluster.convert import expected_duration
from cycle import WorkloadCycle
from cycle.queue import (
    QueuePolicy,
    Running,
    Waiting,
    blocked_nodes,
    fragmentation_domains,
    lost_work,
    plan_holds,
    preemptor_work,
    victim_budget,
    victim_prefixes,
)
from extender.http import create_app
from solver import InvalidInput, Node, Pod, PodGroup, PodSpec, Policy, Snapshot

from .k8s_objects import pod, podgroup

GPU = "nvidia.com/gpu"


def cluster(racks=2, per_rack=2, gpus=8) -> Snapshot:
    return Snapshot(tuple(Node(f"r{r}-n{i}", {GPU: gpus, "cpu": 64000, "pods": 110},
                               {names.LABEL_RACK: f"r{r}", names.LABEL_HOSTNAME: f"r{r}-n{i}"})
                          for r in range(racks) for i in range(per_rack)))


def gang(name, pods, gpus, key=names.LABEL_RACK, priority=0) -> PodGroup:
    spec = PodSpec({GPU: gpus, "cpu": 1000})
    members = tuple(Pod(uid=f"{name}-{i}", name=f"{name}-{i}", spec=spec, namespace="t", group=f"t/{name}")
                    for i in range(pods))
    return PodGroup("t", name, members, Policy.GANG, pods, key, priority=priority)


def used(snapshot: Snapshot, per_node: dict[int, int]) -> Snapshot:
    u = snapshot.used.copy()
    for i, g in per_node.items():
        u[i, snapshot.rindex[GPU]] = g
    return snapshot.with_used(u)


def test_a_starving_gang_holds_the_domain_that_frees_first_and_backfill_needs_a_hint_that_ends_before():
    snap = used(cluster(), {0: 8, 2: 8})  # one busy node per rack: each rack has 8 of 16 GPUs free
    big = gang("big", 2, 8)
    running = [Running("t/a", {0: snap.used[0].copy()}, ends=5000.0), Running("t/b", {2: snap.used[2].copy()},
                                                                                 ends=3000.0)]
    policy = QueuePolicy(starvation_after=3600.0, starvation_factor=None)
    assert plan_holds(snap, [Waiting(big, since=0.0)], running, 1000.0, policy) == []  # not waited long enough
    holds = plan_holds(snap, [Waiting(big, since=0.0)], running, 4000.0, policy)
    assert [(h.holder, h.domain) for h in holds] == [("t/big", "r1")]  # r1 freed (3000), r0 frees at 5000
    assert holds[0].shadow == 4000.0
    small = gang("small", 1, 4)
    mask = blocked_nodes(small, None, 4000.0, holds)
    assert mask is not None and list(np.nonzero(mask)[0]) == [2, 3]
    assert blocked_nodes(small, 100.0, 4000.0, holds) is not None  # ends after the shadow: still out
    later = plan_holds(snap, [Waiting(big, since=0.0)], [Running("t/a", {0: snap.used[0].copy()}, ends=9000.0),
                                                         Running("t/b", {2: snap.used[2].copy()}, ends=8000.0)],
                       4000.0, policy)
    assert later[0].shadow == 8000.0
    assert blocked_nodes(small, 3000.0, 4000.0, later) is None  # declared to end at 7000, before 8000: backfill
    assert blocked_nodes(small, 5000.0, 4000.0, later) is not None
    unknown = plan_holds(snap, [Waiting(big, since=0.0)], [Running("t/a", {0: snap.used[0].copy()}),
                                                           Running("t/b", {2: snap.used[2].copy()})], 4000.0, policy)
    assert unknown[0].shadow is None and blocked_nodes(small, 1.0, 4000.0, unknown) is not None  # no guessing
    assert blocked_nodes(gang("vip", 1, 4, priority=10), None, 4000.0, holds) is None  # higher priority passes
    assert blocked_nodes(big, None, 4000.0, holds) is None  # the holder itself


def test_a_hold_keeps_the_nodes_its_gang_needs_and_leaves_the_rest_of_the_domain_open():
    """A 12-GPU gang in a rack of four 8-GPU nodes holds the two nodes it will fit on first (of
    equals, the busier now: holding a busy node costs nothing until it frees), not the rack; with
    no declared end to go by, the whole rack."""
    snap = used(cluster(racks=1, per_rack=4), {0: 8, 1: 8, 2: 8})  # only node 3 free
    mid = gang("mid", 3, 4, key=names.LABEL_RACK)  # 3 pods of 4 GPUs: 2 fit now, 3 once a node frees
    running = [Running("t/a", {0: snap.used[0].copy()}, ends=5000.0),
               Running("t/b", {1: snap.used[1].copy()}, ends=6000.0),
               Running("t/c", {2: snap.used[2].copy()}, ends=9000.0)]
    policy = QueuePolicy(starvation_after=3600.0, starvation_factor=None)
    [hold] = plan_holds(snap, [Waiting(mid, since=0.0)], running, 4000.0, policy)
    assert hold.shadow == 5000.0 and list(np.nonzero(hold.nodes)[0]) == [0, 3]
    assert list(np.nonzero(blocked_nodes(gang("other", 1, 4), None, 4000.0, [hold]))[0]) == [0, 3]
    blind = [Running(r.key, r.usage) for r in running]  # no declared ends
    [unknown] = plan_holds(snap, [Waiting(mid, since=0.0)], blind, 4000.0, policy)
    assert unknown.shadow is None and unknown.nodes.all()


def test_the_hold_threshold_can_be_a_multiple_of_the_declared_duration_and_holds_do_not_overlap():
    snap = used(cluster(), {0: 8, 2: 8})
    policy = QueuePolicy(starvation_after=None, starvation_factor=2.0, max_holds=2)
    waiting = [Waiting(gang("a", 2, 8), 0.0, duration_hint=100.0), Waiting(gang("b", 2, 8), 0.0, duration_hint=100.0)]
    assert plan_holds(snap, waiting, [], 150.0, policy) == []
    holds = plan_holds(snap, waiting, [], 250.0, policy)
    assert sorted(h.domain for h in holds) == ["r0", "r1"] and not (holds[0].nodes & holds[1].nodes).any()


def test_fragmentation_aware_placement_keeps_the_queued_gang_shape_fitting():
    # r0: 8 GPUs free on one node, r1: 2 nodes with 4 free each; a 4-GPU pod goes to r1 (the solver's
    # best fit would pick r0, the tighter rack) so the queued 8-GPU pod still has a whole node
    snap = used(cluster(), {0: 8, 2: 4, 3: 4})
    keep = fragmentation_domains(snap, gang("small", 1, 4), [gang("whole", 1, 8)])
    assert keep is not None and list(np.nonzero(keep)[0]) == [2, 3]
    assert fragmentation_domains(snap, gang("small", 1, 4), []) is None  # nothing queued: no opinion


def test_victims_are_offered_cheapest_lost_work_first_in_growing_prefixes():
    assert lost_work(100.0, 1000.0, 0.0) == 900.0
    assert lost_work(100.0, 1000.0, 300.0) == 0.0 and lost_work(100.0, 1100.0, 300.0) == 100.0
    prefixes = victim_prefixes({"a": 5.0, "b": 1.0, "c": 3.0, "d": 9.0, "e": 0.0})
    assert prefixes == [["e"], ["e", "b"], ["e", "b", "c", "a"], ["e", "b", "c", "a", "d"]]
    assert victim_prefixes({}) == []
    # priority first: a cheap but more important group is offered after every less important one
    assert victim_prefixes({"vip": 0.0, "a": 5.0, "b": 9.0}, priorities={"vip": 50, "a": 0, "b": 0})[-2:] == \
        [["a", "b"], ["a", "b", "vip"]]
    assert victim_prefixes({"a": 5.0, "b": 1.0, "c": 3.0}, budget=4.5) == [["b"], ["b", "c"]]  # a: over budget
    assert victim_prefixes({"a": 5.0}, budget=1.0) == []  # nothing affordable: no preemption
    policy = QueuePolicy(lost_work_budget=0.05)
    assert victim_budget(policy, preemptor_work(16, 3600.0)) == pytest.approx(0.05 * 16 * 3600)
    assert victim_budget(policy, preemptor_work(16, None)) is None  # no declared duration: no budget
    assert victim_budget(QueuePolicy(lost_work_preemption=False), 100.0) is None


@pytest.mark.parametrize("raw, seconds", [("3600", 3600.0), ("2h30m", 9000.0), ("90m", 5400.0), ("45s", 45.0)])
def test_expected_duration_annotation(raw, seconds):
    assert expected_duration({"annotations": {names.ANNOTATION_EXPECTED_DURATION: raw}}) == seconds


@pytest.mark.parametrize("raw", ["soon", "-5", "0", "h"])
def test_a_bad_expected_duration_names_the_annotation(raw):
    with pytest.raises(InvalidInput, match=names.ANNOTATION_EXPECTED_DURATION):
        expected_duration({"annotations": {names.ANNOTATION_EXPECTED_DURATION: raw}})


def test_the_live_cycle_keeps_smaller_gangs_out_of_the_held_domain_and_the_dashboard_shows_it(sim):
    now = [0.0]
    cycle = WorkloadCycle(sim.cache, sim, barrier_timeout=2.0, clock=lambda: now[0],
                          queue_policy=QueuePolicy(starvation_after=3600.0, starvation_factor=None)).start()
    try:
        sim.create(pod("busy-0", node="n-0-0", gpu=4))  # each rack: 4 of 8 GPUs free
        sim.create(pod("busy-1", node="n-1-0", gpu=4))
        sim.create(podgroup("big", 2, key=names.LABEL_RACK))
        for i in range(2):
            sim.create(pod(f"big-{i}", "big", gpu=4))
        assert isinstance(cycle.place_group("default/big"), str)  # 8 GPUs in one rack: none has them
        now[0] = 4000.0
        sim.create(podgroup("small", 1, key=names.LABEL_RACK))
        sim.create(pod("small-0", "small", gpu=4))
        cycle.place_group("default/small")
        held = cycle.queue_policies.held_domain("default/big")
        assert held == f"{names.LABEL_RACK}=r0"
        assert set(cycle.plans["default/small"].assignments.values()) == {"n-1-1"}  # r1: r0 is held
        client = create_app(cycle).test_client()
        rows = {r["key"]: r for r in client.get("/api/v1/podgroups").json["podgroups"]}
        assert rows["default/big"]["held_domain"] == held and rows["default/small"]["held_domain"] == ""
        racks = {r["name"]: r["held_by"] for z in client.get("/api/v1/topology").json["zones"] for r in z["racks"]}
        assert racks == {"r0": "default/big", "r1": ""}
    finally:
        cycle.close()


def test_serve_flags_set_each_queue_policy_and_default_to_the_measured_ones():
    from phalanx_cli.main import _queue_policy, build_parser

    parse = build_parser().parse_args
    assert _queue_policy(parse(["serve", "--sim", "x.yaml"])) == QueuePolicy()
    chosen = _queue_policy(parse(["serve", "--sim", "x.yaml", "--hold-after-duration", "0", "--hold-after", "600",
                                  "--fragmentation-aware", "--lost-work-budget", "0"]))
    assert chosen == QueuePolicy(starvation_factor=None, starvation_after=600.0, fragmentation_aware=True,
                                 lost_work_budget=None)
    with pytest.raises(SystemExit, match="--hold-after must be >= 0"):
        _queue_policy(parse(["serve", "--sim", "x.yaml", "--hold-after", "-1"]))
