"""The oracle: checks a placement against the rules, independently of how it was found.

Every test and every benchmark runs placements through :func:`assert_placement_valid`. It shares
no code with the search paths beyond the input model and the snapshot's plain data, so a bug in
aggregation, classes or patterns cannot hide behind itself.
"""

from __future__ import annotations

from typing import Mapping

from .errors import PlacementInvalid
from .model import PODS, Policy, PodGroup, TaintEffect
from .snapshot import Snapshot


def _eligible(snapshot: Snapshot, node_name: str, pod) -> str:
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
    for node, amounts in usage.items():
        i = snapshot.index[node]
        for r, amount in amounts.items():
            if amount == 0:
                continue  # as kube-scheduler: a zero request fits even an overcommitted node
            j = snapshot.rindex.get(r)
            free = int(snapshot.allocatable[i, j] - snapshot.used[i, j]) if j is not None else 0
            if amount > free:
                raise PlacementInvalid(f"{group.key}: node {node} over capacity on {r}: {amount} > {free} free")
    if group.topology_key:
        nodes = set(placement.values()) | {p.node for p in group.bound}
        values = {snapshot.nodes[snapshot.index[n]].labels.get(group.topology_key) for n in nodes if n in snapshot.index}
        if None in values:
            raise PlacementInvalid(f"{group.key}: a node lacks the topology label {group.topology_key}")
        if len(values) > 1:
            raise PlacementInvalid(f"{group.key}: spans {len(values)} {group.topology_key} domains: {sorted(values)}")
    if placement and group.policy is Policy.GANG and len(placement) < group.needed:
        raise PlacementInvalid(
            f"{group.key}: gang placement of {len(placement)} pods is below the {group.needed} still needed"
        )
