"""The oracle: checks a placement against the rules, independently of how it was found.

Every test and every benchmark runs placements through :func:`assert_placement_valid`. It shares
no code with the search paths beyond the input model and the snapshot's plain data, so a bug in
aggregation, classes or patterns cannot hide behind itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping, Sequence

from .errors import PlacementInvalid
from .model import (
    HONOR,
    PODS,
    RWOP,
    NodeAffinity,
    Pod,
    PodAffinityTerm,
    PodGroup,
    Policy,
    SpreadConstraint,
    TaintEffect,
)
from .snapshot import Snapshot


def _eligible(snapshot: Snapshot, node_name: str, pod: Pod) -> str:
    node = snapshot.nodes[snapshot.index[node_name]]
    spec = pod.spec
    if node.unschedulable:
        return "node is unschedulable"
    for taint in node.taints:
        if taint.effect is TaintEffect.PREFER_NO_SCHEDULE:
            continue
        if not any(t.tolerates(taint) for t in spec.tolerations):
            return f"taint {taint.key}={taint.value}:{taint.effect.value} not tolerated"
    for key, value in spec.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if not spec.affinity.matches(node.labels):
        return "required node affinity does not match"
    return ""


def assert_placement_valid(snapshot: Snapshot, group: PodGroup, placement: Mapping[str, str]) -> None:
    """Raise :class:`PlacementInvalid` unless ``placement`` (pod uid -> node name) places only
    pending members of ``group``, on existing eligible nodes with room, inside one domain of the
    required topology key (together with the bound members), and at least minCount for a gang."""
    _check_capacity(snapshot, group, _usage(snapshot, group, placement))
    if group.topology_key:
        _check_one_domain(snapshot, group, placement)
    _check_pod_rules(snapshot, group, placement)
    if placement and group.policy is Policy.GANG and len(placement) < group.needed:
        raise PlacementInvalid(
            f"{group.key}: gang placement of {len(placement)} pods is below the {group.needed} still needed"
        )


def _usage(snapshot: Snapshot, group: PodGroup, placement: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """What the placed pods use per node, each checked to be a pending member on a node it may take."""
    pending = {p.uid: p for p in group.pending}
    usage: dict[str, dict[str, int]] = {}
    for uid, node in placement.items():
        pod = pending.get(uid)
        if pod is None:
            raise PlacementInvalid(f"{group.key}: pod {uid} is not a pending member")
        if node not in snapshot.index:
            raise PlacementInvalid(f"{group.key}: pod {pod.key} placed on unknown node {node}")
        why = _eligible(snapshot, node, pod)
        if why:
            raise PlacementInvalid(f"{group.key}: pod {pod.key} on {node}: {why}")
        slot = usage.setdefault(node, {PODS: 0})
        slot[PODS] += 1
        for r, amount in pod.spec.requests.items():
            slot[r] = slot.get(r, 0) + amount
    return usage


def _check_capacity(snapshot: Snapshot, group: PodGroup, usage: Mapping[str, Mapping[str, int]]) -> None:
    for node, amounts in usage.items():
        i = snapshot.index[node]
        for r, amount in amounts.items():
            if amount == 0:
                continue  # as kube-scheduler: a zero request fits even an overcommitted node
            j = snapshot.rindex.get(r)
            free = int(snapshot.allocatable[i, j] - snapshot.used[i, j]) if j is not None else 0
            if amount > free:
                raise PlacementInvalid(f"{group.key}: node {node} over capacity on {r}: {amount} > {free} free")


def _check_one_domain(snapshot: Snapshot, group: PodGroup, placement: Mapping[str, str]) -> None:
    """Placed and bound members share one domain of the required key."""
    nodes = set(placement.values()) | {p.node for p in group.bound}
    values = {snapshot.nodes[snapshot.index[n]].labels.get(group.topology_key)
              for n in nodes if n in snapshot.index}
    if None in values:
        raise PlacementInvalid(f"{group.key}: a node lacks the topology label {group.topology_key}")
    if len(values) > 1:
        shown = sorted(v for v in values if v is not None)
        raise PlacementInvalid(f"{group.key}: spans {len(values)} {group.topology_key} domains: {shown}")


# -- inter-pod and volume rules, checked pod by pod on the final state --------------------------------

def _term_selects(term: PodAffinityTerm, pod: Pod, namespaces: Mapping[str, Mapping[str, str]]) -> bool:
    if term.selector is None:
        return False
    in_scope = pod.namespace in term.namespaces or (
        term.namespace_selector is not None and term.namespace_selector.matches(namespaces.get(pod.namespace, {})))
    return in_scope and term.selector.matches(pod.labels)


@dataclass(frozen=True)
class _FinalState:
    """The cluster after the placement: every placed pod (bound, held and new) and node labels."""

    snapshot: Snapshot
    new: list[Pod]
    everyone: list[Pod]
    labels_of: Mapping[str, Mapping[str, str]]

    @cached_property
    def anti_holders(self) -> list[Pod]:
        """The placed pods carrying required anti-affinity (usually few: scanned once, not per pod)."""
        return [p for p in self.everyone if p.spec.pod_anti_affinity]

    def same_domain(self, a: Pod, b: Pod, key: str) -> bool:
        va = self.labels_of.get(a.node, {}).get(key)
        return va is not None and va == self.labels_of.get(b.node, {}).get(key)

    def selects(self, term: PodAffinityTerm, pod: Pod) -> bool:
        return _term_selects(term, pod, self.snapshot.namespaces)


def _check_pod_rules(snapshot: Snapshot, group: PodGroup, placement: Mapping[str, str]) -> None:
    pending = {p.uid: p for p in group.pending}
    new = [Pod(p.uid, p.name, p.spec, placement[p.uid], p.namespace, p.group, p.labels, p.volumes)
           for p in pending.values() if p.uid in placement]
    if not new:
        return
    state = _FinalState(snapshot, new, list(snapshot.placed_pods) + new, {n.name: n.labels for n in snapshot.nodes})
    for pod in new:
        where = f"{group.key}: pod {pod.key} on {pod.node}"
        _check_ports(state, pod, where)
        _check_anti_affinity(state, pod, where)
        for term in pod.spec.pod_affinity:
            _check_affinity(state, pod, term, where)
        for c in pod.spec.spread:
            if c.hard:
                _check_spread(snapshot, pod, c, state.everyone, state.labels_of, where)
        _check_volumes(snapshot, pod, new, state.labels_of[pod.node], where)
    _check_pv_matching(snapshot, group, new, state.labels_of)


def _check_ports(state: _FinalState, pod: Pod, where: str) -> None:
    for port in pod.spec.host_ports:
        for other in state.everyone:
            if other.uid != pod.uid and other.node == pod.node and any(
                    port.conflicts(q) for q in other.spec.host_ports):
                raise PlacementInvalid(f"{where}: host port {port.protocol}/{port.port} also used by {other.key}")


def _check_anti_affinity(state: _FinalState, pod: Pod, where: str) -> None:
    """Neither the pod's required anti-affinity nor any other pod's selects a pod beside it (the
    pods scanned are everyone for the pod's own terms, only the holders for theirs)."""
    for other in state.everyone if pod.spec.pod_anti_affinity else ():
        if other.uid == pod.uid:
            continue
        for term in pod.spec.pod_anti_affinity:
            if state.same_domain(pod, other, term.topology_key) and state.selects(term, other):
                raise PlacementInvalid(f"{where}: anti-affinity on {term.topology_key} with {other.key}")
    for other in state.anti_holders:
        if other.uid == pod.uid:
            continue
        for term in other.spec.pod_anti_affinity:
            if state.same_domain(pod, other, term.topology_key) and state.selects(term, pod):
                raise PlacementInvalid(f"{where}: {other.key}'s anti-affinity on {term.topology_key} selects it")


def _check_affinity(state: _FinalState, pod: Pod, term: PodAffinityTerm, where: str) -> None:
    if term.topology_key not in state.labels_of[pod.node]:
        raise PlacementInvalid(f"{where}: node lacks {term.topology_key} for pod affinity")
    placed = state.snapshot.placed_pods
    none_placed = not any(state.selects(term, o) for o in placed)
    # with matching pods already placed only they count: kube-scheduler taking this pod before
    # the new member beside it would refuse it, and the plan must hold in any order
    near = any(state.same_domain(pod, o, term.topology_key) and state.selects(term, o) for o in placed)
    first = none_placed and all(state.selects(t, pod) for t in pod.spec.pod_affinity)
    if not (first if none_placed else near):
        # none placed: only a pod matching its own terms may open a domain (kube-scheduler may
        # take this pod before the members it would follow)
        raise PlacementInvalid(f"{where}: no pod matching its affinity on {term.topology_key}")
    if none_placed and any(o.uid != pod.uid and state.selects(term, o)
                           and not state.same_domain(pod, o, term.topology_key) for o in state.new):
        # only the first pod kube-scheduler takes may open a domain: once it is placed, every
        # later pod must join a domain holding a matching pod, so the members share one
        raise PlacementInvalid(f"{where}: pods matching its affinity span several "
                               f"{term.topology_key} domains and none was there before")


def _node_taints_tolerated(snapshot: Snapshot, node_name: str, pod: Pod) -> bool:
    node = snapshot.nodes[snapshot.index[node_name]]
    return all(t.effect is TaintEffect.PREFER_NO_SCHEDULE or any(x.tolerates(t) for x in pod.spec.tolerations)
               for t in node.taints)


def _check_spread(snapshot: Snapshot, pod: Pod, c: SpreadConstraint, everyone: Sequence[Pod],
                  labels_of: Mapping[str, Mapping[str, str]], where: str) -> None:
    keys = [x.topology_key for x in pod.spec.spread]
    if any(k not in labels_of[pod.node] for k in keys):
        raise PlacementInvalid(f"{where}: node lacks a topology spread label")

    def counted(node_name: str) -> bool:
        node = snapshot.nodes[snapshot.index[node_name]]
        if any(k not in node.labels for k in keys):
            return False
        if c.node_affinity_policy == HONOR and (
                any(node.labels.get(k) != v for k, v in pod.spec.node_selector.items())
                or not pod.spec.affinity.matches(node.labels)):
            return False
        return c.node_taints_policy != HONOR or _node_taints_tolerated(snapshot, node_name, pod)

    domains = {labels_of[n.name][c.topology_key]: 0 for n in snapshot.nodes if counted(n.name)}
    for other in everyone:
        if other.namespace == pod.namespace and c.selector is not None and c.selector.matches(other.labels) \
                and other.node in labels_of and counted(other.node):
            domains[labels_of[other.node][c.topology_key]] += 1
    low = 0 if len(domains) < c.min_domains or not domains else min(domains.values())
    mine = domains.get(labels_of[pod.node][c.topology_key], 0)
    if mine - low > c.max_skew:
        raise PlacementInvalid(f"{where}: spread on {c.topology_key}: {mine} matching pods in its domain, "
                               f"minimum {low}, maxSkew {c.max_skew}")


def _affinity_ok(affinity: NodeAffinity | None, labels: Mapping[str, str]) -> bool:
    return affinity is None or not affinity.terms or affinity.matches(labels)


def _check_volumes(snapshot: Snapshot, pod: Pod, new: Sequence[Pod], node_labels: Mapping[str, str],
                   where: str) -> None:
    for claim in pod.volumes:
        if claim.missing:
            raise PlacementInvalid(f"{where}: claim {claim.name} does not exist")
        if claim.bound:
            if not _affinity_ok(claim.node_affinity, node_labels):
                raise PlacementInvalid(f"{where}: volume of claim {claim.name} is not reachable from the node")
            if RWOP in claim.access_modes and any(c.name == claim.name for o in list(snapshot.placed_pods) + list(new)
                                                  if o.uid != pod.uid for c in o.volumes):
                raise PlacementInvalid(f"{where}: ReadWriteOncePod claim {claim.name} is in use")
        elif not claim.delayed:
            raise PlacementInvalid(f"{where}: claim {claim.name} is unbound with immediate binding")
    limits = snapshot.volumes.attach_limits.get(pod.node, {})
    for driver, limit in limits.items():
        names = {c.name for o in list(snapshot.placed_pods) + list(new) if o.node == pod.node for c in o.volumes
                 if c.csi_driver == driver}
        if len(names) > limit:
            raise PlacementInvalid(f"{where}: {len(names)} volumes of {driver} exceed the node's limit {limit}")


def _check_pv_matching(snapshot: Snapshot, group: PodGroup, new: Sequence[Pod],
                       labels_of: Mapping[str, Mapping[str, str]]) -> None:
    """Every unbound WaitForFirstConsumer claim gets its own available PV reachable from its node,
    or may be provisioned there (augmenting-path matching, claims to PVs)."""
    claims = [(p, c) for p in new for c in p.volumes if not c.bound and c.delayed and not c.missing]
    if not claims:
        return
    pvs = snapshot.volumes.available
    owner: dict[int, int] = {}

    def options(k: int) -> list[int]:
        pod, claim = claims[k]
        return [j for j, pv in enumerate(pvs)
                if pv.serves(claim) and _affinity_ok(pv.node_affinity, labels_of[pod.node])]

    def augment(k: int, seen: set[int]) -> bool:
        for j in options(k):
            if j in seen:
                continue
            seen.add(j)
            if j not in owner or augment(owner[j], seen):
                owner[j] = k
                return True
        return False

    for k, (pod, claim) in enumerate(claims):
        if augment(k, set()):
            continue
        topo = claim.allowed_topologies
        if claim.dynamic and _affinity_ok(topo, labels_of[pod.node]):
            continue
        raise PlacementInvalid(f"{group.key}: pod {pod.key} on {pod.node}: no available PersistentVolume for "
                               f"claim {claim.name} on that node")
