"""Inter-pod, spread, host-port and volume rules, case by case on both paths.

Each case names the kube-scheduler (v1.37 default plugins) behaviour it mirrors. Every placement
goes through the validator, and the validator itself must reject a hand-made placement that breaks
each rule (so no case passes because the oracle accepts everything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from solver import (
    DO_NOT_SCHEDULE,
    SCHEDULE_ANYWAY,
    HostPort,
    InvalidInput,
    LabelSelector,
    Node,
    NodeAffinity,
    PersistentVolume,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Policy,
    Requirement,
    Snapshot,
    SolveOptions,
    SpreadConstraint,
    Taint,
    VolumeClaim,
    VolumeInventory,
    assert_placement_valid,
    place,
)
from solver.errors import PlacementInvalid
from solver.model import HONOR, IGNORE

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
PATHS = ["greedy", "exact"]
WEB = LabelSelector((("app", "web"),))
DEFAULT = frozenset({"default"})
WFFC = "local"  # a WaitForFirstConsumer storage class
RWO = frozenset({"ReadWriteOnce"})


# -- builders ---------------------------------------------------------------------------------------
def nodes(n=6, zones=3, cpu=8000, pods=110, no_zone=(), **extra_labels):
    """n nodes n0..n{n-1}, node i in zone z{i % zones} (none for indices in ``no_zone``)."""
    out = []
    for i in range(n):
        labels = {HOST: f"n{i}"} | {k: v(i) for k, v in extra_labels.items()}
        if i not in no_zone:
            labels[ZONE] = f"z{i % zones}"
        out.append(Node(f"n{i}", {"cpu": cpu, "pods": pods}, labels))
    return out


def members(n, name="p", labels=None, cpu=1000, volumes=None, **spec):
    labels = {"app": "web"} if labels is None else labels
    return tuple(Pod(f"{name}{i}", f"{name}-{i}", PodSpec({"cpu": cpu}, **spec), group="default/g",
                     labels=labels, volumes=volumes(i) if volumes else ())
                 for i in range(n))


def bound(uid, node, labels=None, namespace="default", cpu=0, **spec):
    return Pod(uid, uid, PodSpec({"cpu": cpu}, **spec), node=node, namespace=namespace,
               labels={"app": "web"} if labels is None else labels)


def gang(pods_, min_count=None):
    return PodGroup("default", "g", tuple(pods_), Policy.GANG, min_count or len(pods_))


def anti(key, selector=WEB, weight=0, **kw):
    return PodAffinityTerm(key, selector, kw.pop("namespaces", DEFAULT), weight=weight, **kw)


def zone_of(snap, node):
    return snap.nodes[snap.index[node]].labels.get(ZONE)


def per_zone(snap, placement):
    out: dict[str, int] = {}
    for node in placement.values():
        out[zone_of(snap, node)] = out.get(zone_of(snap, node), 0) + 1
    return out


def zone_in(*zones):
    return NodeAffinity(((Requirement(ZONE, "In", tuple(zones)),),))


def pv(name, node=None, zone=None, storage_class=WFFC, capacity=10, driver=""):
    affinity = None
    if node is not None:
        affinity = NodeAffinity(((Requirement(HOST, "In", (node,)),),))
    elif zone is not None:
        affinity = zone_in(zone)
    return PersistentVolume(name, storage_class, capacity, RWO, affinity, csi_driver=driver)


def wffc_claim(i, **kw):
    return (VolumeClaim(f"default/data-{i}", storage_class=WFFC, request=1, access_modes=RWO, delayed=True, **kw),)


# -- the cases --------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    mirrors: str  # the kube-scheduler behaviour
    build: Callable[[], tuple[Snapshot, PodGroup]]
    expect: Callable | None  # (snap, placement) -> None; None: the group does not fit


def distinct_nodes(k):
    def check(snap, placement):
        assert len(placement) == k and len(set(placement.values())) == k
    return check


def distinct_nodes_at_most(k):
    def check(snap, placement):
        assert len(set(placement.values())) <= k, f"spread over {sorted(set(placement.values()))}"
    return check


def zones_exactly(counts):
    def check(snap, placement):
        assert per_zone(snap, placement) == counts
    return check


def only_nodes(*names, count=None):
    def check(snap, placement):
        assert set(placement.values()) <= set(names)
        if count is not None:
            assert len(placement) == count
    return check


def in_zones(*zones):
    def check(snap, placement):
        assert set(per_zone(snap, placement)) <= set(zones) and placement
    return check


def one_zone(snap, placement):
    assert len(per_zone(snap, placement)) == 1


def all_balanced(snap, placement):
    counts = per_zone(snap, placement)
    assert max(counts.values()) - min(counts.values()) <= 1 and len(counts) == 3


CASES = [
    # InterPodAffinity: required anti-affinity
    Case("hostname-anti-5-on-6", "InterPodAffinity: a required anti-affinity term on kubernetes.io/hostname that "
         "selects the pod itself keeps every member on its own node",
         lambda: (Snapshot(nodes(6)), gang(members(5, pod_anti_affinity=(anti(HOST),)))), distinct_nodes(5)),
    Case("hostname-anti-7-on-6", "InterPodAffinity: the 7th member finds every node holding a matching pod",
         lambda: (Snapshot(nodes(6)), gang(members(7, pod_anti_affinity=(anti(HOST),)))), None),
    Case("zone-anti-3-on-3-zones", "InterPodAffinity: anti-affinity on a zone key blocks the whole zone",
         lambda: (Snapshot(nodes(6)), gang(members(3, pod_anti_affinity=(anti(ZONE),)))), zones_exactly(
             {"z0": 1, "z1": 1, "z2": 1})),
    Case("zone-anti-4-on-3-zones", "InterPodAffinity: a 4th member has no zone free of matching pods",
         lambda: (Snapshot(nodes(6)), gang(members(4, pod_anti_affinity=(anti(ZONE),)))), None),
    Case("anti-vs-bound", "InterPodAffinity: the incoming pod's anti-affinity counts existing matching pods",
         lambda: (Snapshot(nodes(6), [bound("old", "n0")]),
                  gang(members(2, labels={"app": "api"}, pod_anti_affinity=(anti(ZONE),)))),
         in_zones("z1", "z2")),
    Case("symmetric-anti", "InterPodAffinity: an existing pod's required anti-affinity that selects the incoming "
         "pod excludes the existing pod's domain (symmetry)",
         lambda: (Snapshot(nodes(6), [bound("db", "n1", labels={"app": "db"}, pod_anti_affinity=(anti(ZONE),))]),
                  gang(members(4))), in_zones("z0", "z2")),
    Case("namespaces-out-of-scope", "InterPodAffinity: a term only counts pods in its namespaces "
         "(default: the pod's own)",
         lambda: (Snapshot(nodes(1, zones=1), [bound("old", "n0", namespace="other")]),
                  gang(members(1, labels={}, pod_anti_affinity=(anti(HOST),)))), only_nodes("n0", count=1)),
    Case("namespaces-in-scope", "InterPodAffinity: listed namespaces are searched",
         lambda: (Snapshot(nodes(2, zones=1), [bound("old", "n0", namespace="other")]),
                  gang(members(1, labels={}, pod_anti_affinity=(anti(HOST, namespaces=frozenset({"other"})),)))),
         only_nodes("n1", count=1)),
    Case("namespace-selector", "InterPodAffinity: namespaceSelector picks namespaces by their labels",
         lambda: (Snapshot(nodes(2, zones=1), [bound("old", "n0", namespace="other")],
                           namespaces={"other": {"team": "a"}}),
                  gang(members(1, labels={}, pod_anti_affinity=(
                      anti(HOST, namespaces=frozenset(), namespace_selector=LabelSelector((("team", "a"),))),)))),
         only_nodes("n1", count=1)),
    Case("namespace-selector-no-match", "InterPodAffinity: a namespaceSelector that matches no namespace "
         "labels leaves the pod free",
         lambda: (Snapshot(nodes(1, zones=1), [bound("old", "n0", namespace="other")],
                           namespaces={"other": {"team": "b"}}),
                  gang(members(1, labels={}, pod_anti_affinity=(
                      anti(HOST, namespaces=frozenset(), namespace_selector=LabelSelector((("team", "a"),))),)))),
         only_nodes("n0", count=1)),
    # InterPodAffinity: required affinity
    Case("affinity-to-bound", "InterPodAffinity: with matching pods in the cluster, the pod must go to a domain "
         "holding one",
         lambda: (Snapshot(nodes(6), [bound("cache", "n1", labels={"app": "cache"})]),
                  gang(members(3, pod_affinity=(anti(ZONE, LabelSelector((("app", "cache"),))),)))),
         in_zones("z1")),
    Case("self-affinity-first-pod", "InterPodAffinity: no pod matches yet and the pod matches its own term: the "
         "first may go anywhere, the rest follow it, so the gang shares one zone",
         lambda: (Snapshot(nodes(6, pods=2)), gang(members(4, pod_affinity=(anti(ZONE),)))), one_zone),
    Case("affinity-nothing-to-follow", "InterPodAffinity: no matching pod anywhere and the pod does not match its "
         "own term: unschedulable",
         lambda: (Snapshot(nodes(3)), gang(members(2, labels={"app": "api"}, pod_affinity=(anti(ZONE),)))), None),
    # PodTopologySpread
    Case("spread-2-2-2", "PodTopologySpread: maxSkew 1 over 3 zones, 6 pods end 2/2/2",
         lambda: (Snapshot(nodes(6)), gang(members(6, spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
         zones_exactly({"z0": 2, "z1": 2, "z2": 2})),
    Case("spread-existing-skew", "PodTopologySpread: existing matching pods count: 2 in z0 already, 4 more go "
         "to z1 and z2",
         lambda: (Snapshot(nodes(6), [bound("a", "n0"), bound("b", "n3")]),
                  gang(members(4, spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
         zones_exactly({"z1": 2, "z2": 2})),
    Case("spread-min-domains", "PodTopologySpread: fewer eligible domains than minDomains make the global "
         "minimum 0, so each zone takes at most maxSkew pods",
         lambda: (Snapshot(nodes(6)), gang(members(4, spread=(SpreadConstraint(1, ZONE, selector=WEB,
                                                                                min_domains=5),)))), None),
    Case("spread-min-domains-fits", "PodTopologySpread: minDomains 5 with maxSkew 1: 3 pods, one per zone",
         lambda: (Snapshot(nodes(6)), gang(members(3, spread=(SpreadConstraint(1, ZONE, selector=WEB,
                                                                                min_domains=5),)))),
         zones_exactly({"z0": 1, "z1": 1, "z2": 1})),
    Case("spread-node-affinity-honor", "PodTopologySpread: nodeAffinityPolicy Honor leaves zones the pod cannot "
         "reach out of the minimum",
         lambda: (Snapshot(nodes(6)), gang(members(4, affinity=zone_in("z0", "z1"),
                                                   spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
         zones_exactly({"z0": 2, "z1": 2})),
    Case("spread-node-affinity-ignore", "PodTopologySpread: nodeAffinityPolicy Ignore counts the unreachable zone "
         "(0 pods) in the minimum",
         lambda: (Snapshot(nodes(6)), gang(members(4, affinity=zone_in("z0", "z1"), spread=(
             SpreadConstraint(1, ZONE, selector=WEB, node_affinity_policy=IGNORE),)))), None),
    Case("spread-taints-ignore", "PodTopologySpread: nodeTaintsPolicy Ignore (default) counts tainted nodes' "
         "zone in the minimum",
         lambda: (Snapshot(tainted_z2()), gang(members(4, spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
         None),
    Case("spread-taints-honor", "PodTopologySpread: nodeTaintsPolicy Honor drops untolerated nodes' zone",
         lambda: (Snapshot(tainted_z2()), gang(members(4, spread=(
             SpreadConstraint(1, ZONE, selector=WEB, node_taints_policy=HONOR),)))),
         zones_exactly({"z0": 2, "z1": 2})),
    Case("spread-node-lacks-key", "PodTopologySpread: a DoNotSchedule constraint filters out nodes without its "
         "topology key",
         lambda: (Snapshot(nodes(4, zones=2, no_zone=(0, 1))),
                  gang(members(2, spread=(SpreadConstraint(2, ZONE, selector=WEB),)))), only_nodes("n2", "n3")),
    # NodePorts
    Case("ports-one-per-node", "NodePorts: two pods with the same hostPort/protocol never share a node",
         lambda: (Snapshot(nodes(3)), gang(members(3, host_ports=(HostPort(8080),)))), distinct_nodes(3)),
    Case("ports-too-few-nodes", "NodePorts: 3 pods with one hostPort on 2 nodes do not fit",
         lambda: (Snapshot(nodes(2)), gang(members(3, host_ports=(HostPort(8080),)))), None),
    Case("ports-tcp-udp", "NodePorts: the same port over TCP and UDP does not conflict",
         lambda: (Snapshot(nodes(1, zones=1)), gang(members(1, "t", host_ports=(HostPort(53, "TCP"),))
                                                    + members(1, "u", host_ports=(HostPort(53, "UDP"),)))),
         only_nodes("n0", count=2)),
    Case("ports-specific-ips", "NodePorts: two different specific hostIPs on one port do not conflict",
         lambda: (Snapshot(nodes(1, zones=1), [bound("old", "n0", host_ports=(HostPort(80, host_ip="10.0.0.1"),))]),
                  gang(members(1, host_ports=(HostPort(80, host_ip="10.0.0.2"),)))), only_nodes("n0", count=1)),
    Case("ports-wildcard-vs-specific", "NodePorts: 0.0.0.0 conflicts with every hostIP on the port",
         lambda: (Snapshot(nodes(2, zones=1), [bound("old", "n0", host_ports=(HostPort(80, host_ip="10.0.0.1"),))]),
                  gang(members(1, host_ports=(HostPort(80),)))), only_nodes("n1", count=1)),
    Case("ports-bound-conflict", "NodePorts: a bound pod's port blocks its node",
         lambda: (Snapshot(nodes(3), [bound("old", "n1", host_ports=(HostPort(8080),))]),
                  gang(members(2, host_ports=(HostPort(8080),)))), only_nodes("n0", "n2", count=2)),
    # VolumeBinding / NodeVolumeLimits
    Case("bound-pv-affinity", "VolumeBinding: a bound PV's node affinity limits the pod to matching nodes",
         lambda: (Snapshot(nodes(6)), gang(members(2, volumes=lambda i: (
             VolumeClaim(f"default/v{i}", bound=True, node_affinity=zone_in("z1")),)))), in_zones("z1")),
    Case("wffc-local-pvs", "VolumeBinding: a WaitForFirstConsumer claim needs an available PV reachable from the "
         "node: local PVs on 4 of 8 nodes take exactly those",
         lambda: (Snapshot(nodes(8), volumes=VolumeInventory(tuple(pv(f"pv{k}", node=f"n{k * 2}") for k in range(4)))),
                  gang(members(4, volumes=wffc_claim))), distinct_nodes(4)),
    Case("wffc-too-few-pvs", "VolumeBinding: each claim binds its own PV: 3 PVs for 4 pods do not fit",
         lambda: (Snapshot(nodes(8), volumes=VolumeInventory(tuple(pv(f"pv{k}", node=f"n{k}") for k in range(3)))),
                  gang(members(4, volumes=wffc_claim))), None),
    Case("wffc-dynamic-topology", "VolumeBinding: a provisioner's allowedTopologies restrict the node",
         lambda: (Snapshot(nodes(6)), gang(members(3, volumes=lambda i: wffc_claim(
             i, dynamic=True, allowed_topologies=zone_in("z2"))))), in_zones("z2")),
    Case("missing-claim", "VolumeBinding: a pod whose claim does not exist is unschedulable",
         lambda: (Snapshot(nodes(3)), gang(members(1, volumes=lambda i: (
             VolumeClaim("default/gone", missing=True),)))), None),
    Case("immediate-unbound", "VolumeBinding: an unbound claim with Immediate binding waits for the PV controller",
         lambda: (Snapshot(nodes(3)), gang(members(1, volumes=lambda i: (VolumeClaim("default/later"),)))), None),
    Case("csi-attach-limit", "NodeVolumeLimits: a node attaches at most its CSI driver's count of volumes",
         lambda: (Snapshot(nodes(3), volumes=VolumeInventory(attach_limits={f"n{k}": {"ebs": 1} for k in range(3)})),
                  gang(members(3, volumes=lambda i: (VolumeClaim(f"default/v{i}", bound=True, csi_driver="ebs"),)))),
         distinct_nodes(3)),
    Case("csi-attach-limit-full", "NodeVolumeLimits: 3 volumes, 2 nodes with room for one each",
         lambda: (Snapshot(nodes(2), volumes=VolumeInventory(attach_limits={f"n{k}": {"ebs": 1} for k in range(2)})),
                  gang(members(3, volumes=lambda i: (VolumeClaim(f"default/v{i}", bound=True, csi_driver="ebs"),)))),
         None),
    # soft rules in the objective
    Case("soft-anti-3", "InterPodAffinity scoring: preferred anti-affinity spreads the members when room exists "
         "(ranked above packing)",
         lambda: (Snapshot(nodes(3)), gang(members(3, preferred_anti_affinity=(anti(HOST, weight=50),)))),
         distinct_nodes(3)),
    Case("soft-spread", "PodTopologySpread scoring: ScheduleAnyway prefers the placement with the least skew",
         lambda: (Snapshot(nodes(6)), gang(members(6, spread=(
             SpreadConstraint(1, ZONE, SCHEDULE_ANYWAY, selector=WEB),)))),
         zones_exactly({"z0": 2, "z1": 2, "z2": 2})),
    Case("soft-spread-uneven-room", "PodTopologySpread: ScheduleAnyway never blocks: a full zone is skipped",
         lambda: (Snapshot(nodes(3, pods=3)), gang(members(7, spread=(
             SpreadConstraint(1, ZONE, SCHEDULE_ANYWAY, selector=WEB),)))), all_balanced),
    Case("no-preferences-packs", "no soft rule: phalanx packs (fewest nodes)",
         lambda: (Snapshot(nodes(6)), gang(members(4))), distinct_nodes_at_most(1)),
]


def tainted_z2():
    out = nodes(6)
    return [Node(n.name, n.allocatable, n.labels, (Taint("gpu", "x"),)) if n.labels[ZONE] == "z2" else n for n in out]


def solve(snap, group, path):
    result = place(snap, group, SolveOptions(path=path))
    if result.assignments:
        assert_placement_valid(snap, group, result.assignments)
    return result


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case, path):
    snap, group = case.build()
    result = solve(snap, group, path)
    if case.expect is None:
        assert result.assignments == {}, f"{case.mirrors}: placed {result.assignments}"
        assert result.explanation is not None and result.explanation.message()
    else:
        assert result.assignments, f"{case.mirrors}: {result.explanation and result.explanation.message()}"
        case.expect(snap, result.assignments)


def _enumerable(case) -> bool:
    """Small enough to try every assignment (the 7-on-6 anti-affinity case is pigeonhole)."""
    snap, group = case.build()
    return len(snap.nodes) ** len(group.pending) <= 20_000


@pytest.mark.parametrize("case", [c for c in CASES if c.expect is None and _enumerable(c)], ids=lambda c: c.name)
def test_infeasible_cases_have_no_valid_placement_of_the_gang_at_all(case):
    """Brute force on the small infeasible cases: the validator accepts no full placement either, so
    "no placement" is the rule, not the solver giving up."""
    import itertools
    snap, group = case.build()
    names = [n.name for n in snap.nodes]
    pending = group.pending
    for choice in itertools.product(names, repeat=len(pending)):
        placement = {p.uid: n for p, n in zip(pending, choice, strict=False)}
        with pytest.raises(PlacementInvalid):
            assert_placement_valid(snap, group, placement)


# -- the validator rejects each broken rule ------------------------------------------------------------
def _uid(group, k):
    return group.pending[k].uid


@dataclass
class Broken:
    name: str
    build: Callable[[], tuple[Snapshot, PodGroup]]
    nodes: tuple[str, ...]  # node of pending member k (in order)
    fixed: tuple[str, ...] | None = None  # a valid placement of the same instance, accepted


BROKEN = [
    Broken("hostname-anti", lambda: (Snapshot(nodes(6)), gang(members(2, pod_anti_affinity=(anti(HOST),)))),
           ("n0", "n0"), ("n0", "n1")),
    Broken("zone-anti", lambda: (Snapshot(nodes(6)), gang(members(2, pod_anti_affinity=(anti(ZONE),)))),
           ("n0", "n3"), ("n0", "n1")),
    Broken("anti-vs-bound", lambda: (Snapshot(nodes(6), [bound("old", "n0")]),
                                     gang(members(1, labels={}, pod_anti_affinity=(anti(ZONE),)))), ("n3",), ("n1",)),
    Broken("symmetric-anti", lambda: (Snapshot(nodes(6), [bound("db", "n1", labels={},
                                                                pod_anti_affinity=(anti(ZONE),))]),
                                      gang(members(1))), ("n4",), ("n0",)),
    Broken("namespace-selector", lambda: (Snapshot(nodes(2, zones=1), [bound("old", "n0", namespace="other")],
                                                   namespaces={"other": {"team": "a"}}),
                                          gang(members(1, labels={}, pod_anti_affinity=(anti(
                                              HOST, namespaces=frozenset(),
                                              namespace_selector=LabelSelector((("team", "a"),))),)))),
           ("n0",), ("n1",)),
    Broken("affinity-to-bound", lambda: (Snapshot(nodes(6), [bound("c", "n1", labels={"app": "cache"})]),
                                         gang(members(1, pod_affinity=(anti(ZONE, LabelSelector((("app", "cache"),))),)))),
           ("n0",), ("n4",)),
    Broken("self-affinity-split", lambda: (Snapshot(nodes(6)), gang(members(4, pod_affinity=(anti(ZONE),)))),
           ("n0", "n3", "n1", "n4"), ("n0", "n3", "n0", "n3")),
    Broken("affinity-nothing-to-follow", lambda: (Snapshot(nodes(3)), gang(members(1, labels={"app": "api"},
                                                                                   pod_affinity=(anti(ZONE),)))),
           ("n0",)),
    Broken("spread-skew", lambda: (Snapshot(nodes(6)), gang(members(6, spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
           ("n0", "n0", "n3", "n1", "n4", "n2"), ("n0", "n3", "n1", "n4", "n2", "n5")),
    Broken("spread-existing", lambda: (Snapshot(nodes(3), [bound("a", "n0"), bound("b", "n0")]),
                                       gang(members(1, spread=(SpreadConstraint(1, ZONE, selector=WEB),)))),
           ("n0",), ("n1",)),
    Broken("spread-min-domains", lambda: (Snapshot(nodes(6)), gang(members(2, spread=(
        SpreadConstraint(1, ZONE, selector=WEB, min_domains=4),)))), ("n0", "n3"), ("n0", "n1")),
    Broken("spread-node-affinity-ignore", lambda: (Snapshot(nodes(6)), gang(members(2, affinity=zone_in("z0", "z1"), spread=(
        SpreadConstraint(1, ZONE, selector=WEB, node_affinity_policy=IGNORE),)))), ("n0", "n3"), ("n0", "n1")),
    Broken("spread-taints-ignore", lambda: (Snapshot(tainted_z2()), gang(members(2, spread=(
        SpreadConstraint(1, ZONE, selector=WEB),)))), ("n0", "n3"), ("n0", "n1")),
    Broken("spread-lacks-key", lambda: (Snapshot(nodes(2, zones=1, no_zone=(0,))), gang(members(1, spread=(
        SpreadConstraint(1, ZONE, selector=WEB),)))), ("n0",), ("n1",)),
    Broken("ports-members", lambda: (Snapshot(nodes(2)), gang(members(2, host_ports=(HostPort(8080),)))),
           ("n0", "n0"), ("n0", "n1")),
    Broken("ports-wildcard", lambda: (Snapshot(nodes(2), [bound("old", "n0", host_ports=(HostPort(80, host_ip="10.0.0.1"),))]),
                                      gang(members(1, host_ports=(HostPort(80),)))), ("n0",), ("n1",)),
    Broken("ports-same-ip", lambda: (Snapshot(nodes(2), [bound("old", "n0", host_ports=(HostPort(80, host_ip="10.0.0.1"),))]),
                                     gang(members(1, host_ports=(HostPort(80, host_ip="10.0.0.1"),)))), ("n0",), ("n1",)),
    Broken("bound-pv-affinity", lambda: (Snapshot(nodes(6)), gang(members(1, volumes=lambda i: (
        VolumeClaim(f"default/v{i}", bound=True, node_affinity=zone_in("z1")),)))), ("n0",), ("n1",)),
    Broken("wffc-no-pv-on-node", lambda: (Snapshot(nodes(4), volumes=VolumeInventory((pv("pv0", node="n2"),))),
                                          gang(members(1, volumes=wffc_claim))), ("n0",), ("n2",)),
    Broken("wffc-pv-shared", lambda: (Snapshot(nodes(4), volumes=VolumeInventory((pv("pv0", node="n2"), pv("pv1", node="n3")))),
                                      gang(members(2, volumes=wffc_claim))), ("n2", "n2"), ("n2", "n3")),
    Broken("wffc-pv-too-small", lambda: (Snapshot(nodes(4), volumes=VolumeInventory((pv("pv0", node="n2", capacity=0),))),
                                         gang(members(1, volumes=wffc_claim))), ("n2",)),
    Broken("wffc-dynamic-outside", lambda: (Snapshot(nodes(6)), gang(members(1, volumes=lambda i: wffc_claim(
        i, dynamic=True, allowed_topologies=zone_in("z2"))))), ("n0",), ("n2",)),
    Broken("missing-claim", lambda: (Snapshot(nodes(2)), gang(members(1, volumes=lambda i: (
        VolumeClaim("default/gone", missing=True),)))), ("n0",)),
    Broken("csi-limit", lambda: (Snapshot(nodes(2), volumes=VolumeInventory(attach_limits={"n0": {"ebs": 1}, "n1": {"ebs": 1}})),
                                 gang(members(2, volumes=lambda i: (VolumeClaim(f"default/v{i}", bound=True, csi_driver="ebs"),)))),
           ("n0", "n0"), ("n0", "n1")),
    Broken("csi-limit-with-bound", lambda: (Snapshot(nodes(2), [Pod("old", "old", PodSpec(), node="n0", volumes=(
                                                VolumeClaim("default/old", bound=True, csi_driver="ebs"),))],
                                                     volumes=VolumeInventory(attach_limits={"n0": {"ebs": 1}})),
                                            gang(members(1, volumes=lambda i: (
                                                VolumeClaim(f"default/v{i}", bound=True, csi_driver="ebs"),)))),
           ("n0",), ("n1",)),
]


@pytest.mark.parametrize("case", BROKEN, ids=[b.name for b in BROKEN])
def test_validator_rejects_a_placement_that_breaks_the_rule(case):
    snap, group = case.build()
    broken = {_uid(group, k): n for k, n in enumerate(case.nodes)}
    with pytest.raises(PlacementInvalid):
        assert_placement_valid(snap, group, broken)
    if case.fixed is not None:
        assert_placement_valid(snap, group, {_uid(group, k): n for k, n in enumerate(case.fixed)})


# -- malformed records ----------------------------------------------------------------------------------
MALFORMED = [
    ("maxSkew 0", lambda: SpreadConstraint(0, ZONE)),
    ("maxSkew not an int", lambda: SpreadConstraint("1", ZONE)),
    ("spread without key", lambda: SpreadConstraint(1, "")),
    ("whenUnsatisfiable unknown", lambda: SpreadConstraint(1, ZONE, "Sometimes")),
    ("minDomains 0", lambda: SpreadConstraint(1, ZONE, DO_NOT_SCHEDULE, min_domains=0)),
    ("nodeAffinityPolicy unknown", lambda: SpreadConstraint(1, ZONE, node_affinity_policy="Maybe")),
    ("nodeTaintsPolicy unknown", lambda: SpreadConstraint(1, ZONE, node_taints_policy="honor")),
    ("selector operator unknown", lambda: LabelSelector(match_expressions=(Requirement("app", "Like", ("w",)),))),
    ("label selector Gt", lambda: LabelSelector(match_expressions=(Requirement("n", "Gt", ("1",)),))),
    ("In without values", lambda: LabelSelector(match_expressions=(Requirement("app", "In"),))),
    ("term without topologyKey", lambda: PodAffinityTerm("", WEB)),
    ("term weight 101", lambda: PodAffinityTerm(HOST, WEB, weight=101)),
    ("term weight negative", lambda: PodAffinityTerm(HOST, WEB, weight=-1)),
    ("hostPort 0", lambda: HostPort(0)),
    ("hostPort 65536", lambda: HostPort(65536)),
    ("hostPort protocol", lambda: HostPort(80, "HTTP")),
    ("claim request negative", lambda: VolumeClaim("default/c", request=-1)),
]


@pytest.mark.parametrize("build", [m[1] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_records_raise_invalid_input(build):
    with pytest.raises(InvalidInput):
        build()


def test_an_unplaced_affinity_owner_does_not_hold_the_pods_it_selects_together():
    """Required zone affinity binds the members it selects only when its owner is placed: with
    minCount 1, two web pods with a host port on two one-node zones both go, and the owner (which
    would need a third node) stays out — brute force's answer."""
    from solver.model import HostPort, LabelSelector, PodAffinityTerm

    zone, host = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
    nodes = [Node(f"n{i}", {"cpu": 8000, "pods": 110}, labels={host: f"n{i}", zone: f"z{i}"}) for i in range(2)]
    web = LabelSelector((("app", "web"),))
    plain = PodSpec({"cpu": 1000}, host_ports=(HostPort(80),))
    owner = PodSpec({"cpu": 1000}, host_ports=(HostPort(80),),
                    pod_affinity=(PodAffinityTerm(zone, web, frozenset({"default"})),))
    members = (Pod("a0", "a0", plain, labels={"app": "web"}), Pod("a1", "a1", plain, labels={"app": "web"}),
               Pod("b0", "b0", owner, labels={"app": "web"}))
    group = PodGroup("default", "g", members, min_count=1)
    placement = place(Snapshot(nodes), group, SolveOptions(path="exact"))
    assert_placement_valid(Snapshot(nodes), group, placement.assignments)
    assert len(placement.assignments) == 2
