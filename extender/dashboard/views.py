"""The dashboard's JSON documents, built from the cache, the cycle's plans and the history.

Nothing here runs a workload cycle or holds the cache's or the cycle's lock for long: dictionaries
are copied whole (one C-level copy under the GIL) and then read at leisure; the only call that takes
the cycle's lock is :meth:`WorkloadCycle.group_state`, which holds it for a few dictionary reads.

Topology is zones -> racks -> nodes from the ``topology.kubernetes.io/zone`` and ``.../rack`` labels.
Every node shows its *main resource*: its first extended resource (``nvidia.com/gpu``) when it has
one, else CPU. Above ``detail_limit`` nodes the topology is aggregated per rack (totals and the
groups using it), and one rack's nodes are served on demand, so 10,000 nodes stay one small page.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Iterable, Mapping

from prometheus_client import CollectorRegistry

from cluster import names
from cluster.cache import ClusterCache, PodGroupRecord, PodRecord
from cluster.convert import GroupOwner, placement_domain
from cycle import CompositeOf, WorkloadCycle
from solver import Node

from .history import GroupHistory

NO_ZONE, NO_RACK = "(no zone)", "(no rack)"
OTHER = ""  # pods without a PodGroup
DETAIL_LIMIT = 2000
STATE_WORDS = {"waiting": "waiting for members"}
CPU = "cpu"


def natural(name: str) -> list:
    """Sort key that puts node-2 before node-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def main_resource(node: Node) -> str:
    return next((r for r in sorted(node.allocatable) if "/" in r), CPU)


def _amount(resource: str, value: int) -> float:
    """Base units to what an operator counts: cores for CPU, devices for the rest."""
    return value / 1000 if resource == CPU else value


# -- topology ----------------------------------------------------------------------------------
def _node_view(node: Node, pods: Iterable[PodRecord], reserved: int) -> dict:
    resource = main_resource(node)
    groups: Counter[str] = Counter()
    count = 0
    for record in pods:
        if record.active:
            count += 1
            groups[record.pod.group or OTHER] += record.pod.spec.requests.get(resource, 0)
    used = sum(groups.values())
    return {"name": node.name, "resource": resource, "total": _amount(resource, node.allocatable.get(resource, 0)),
            "used": _amount(resource, used), "reserved": _amount(resource, reserved), "pods": count,
            "groups": [[g, _amount(resource, a)] for g, a in groups.most_common() if a or g],
            "unschedulable": node.unschedulable}


def _reserved_main(cycle: WorkloadCycle, nodes: Mapping[str, Node], cache: ClusterCache) -> dict[str, int]:
    """Main resource held by plans not bound yet, per node (read without the cycle's lock)."""
    out: Counter[str] = Counter()
    for plan in list(cycle.plans.values()):
        if plan.state not in ("planned", "binding"):
            continue
        for uid, node_name in list(plan.assignments.items()):
            node = nodes.get(node_name)
            record = cache.pods.get(uid)
            if node is not None and not (record and record.pod.node):
                out[node_name] += plan.requests.get(uid, {}).get(main_resource(node), 0)
    return out


def _place(node: Node) -> tuple[str, str]:
    return node.labels.get(names.LABEL_ZONE, NO_ZONE), node.labels.get(names.LABEL_RACK, NO_RACK)


def _racks(cache: ClusterCache, cycle: WorkloadCycle, only: tuple[str, str] | None = None
           ) -> tuple[dict[tuple[str, str], list[dict]], int]:
    """Node views per (zone, rack); ``only`` restricts them to one rack (the drill-down)."""
    nodes = dict(cache.nodes)
    count = len(nodes)
    if only is not None:
        nodes = {name: node for name, node in nodes.items() if _place(node) == only}
    by_node = dict(cache.pods_by_node)
    pods = cache.pods
    reserved = _reserved_main(cycle, nodes, cache)
    racks: dict[tuple[str, str], list[dict]] = {}
    for name in sorted(nodes, key=natural):
        node = nodes[name]
        records = [r for r in (pods.get(u) for u in list(by_node.get(name, ()))) if r is not None]
        racks.setdefault(_place(node), []).append(_node_view(node, records, reserved.get(name, 0)))
    return racks, count


def _rack_view(zone: str, rack: str, nodes: list[dict], detail: bool) -> dict:
    resource = Counter(n["resource"] for n in nodes).most_common(1)[0][0]
    mine = [n for n in nodes if n["resource"] == resource]
    groups: Counter[str] = Counter()
    for n in mine:
        for g, amount in n["groups"]:
            groups[g] += amount
    view = {"zone": zone, "name": rack, "resource": resource, "node_count": len(nodes),
            "total": sum(n["total"] for n in mine), "used": sum(n["used"] for n in mine),
            "reserved": sum(n["reserved"] for n in mine), "pods": sum(n["pods"] for n in nodes),
            "groups": [[g, a] for g, a in groups.most_common(12)]}
    if detail:
        view["nodes"] = nodes
    return view


def topology(cache: ClusterCache, cycle: WorkloadCycle, detail_limit: int = DETAIL_LIMIT) -> dict:
    racks, node_count = _racks(cache, cycle)
    detail = node_count <= detail_limit
    zones: dict[str, list[dict]] = {}
    held = {(h.key, h.domain): h.holder for h in cycle.queue_policies.holds}  # starving gangs' domains
    for (zone, rack), nodes in sorted(racks.items(), key=lambda item: (natural(item[0][0]), natural(item[0][1]))):
        view = _rack_view(zone, rack, nodes, detail)
        view["held_by"] = held.get((names.LABEL_RACK, rack)) or held.get((names.LABEL_ZONE, zone)) or ""
        zones.setdefault(zone, []).append(view)
    totals: dict[str, dict[str, float]] = {}
    for rack_views in zones.values():
        for r in rack_views:
            t = totals.setdefault(r["resource"], {"total": 0, "used": 0, "reserved": 0})
            for k in t:
                t[k] += r[k]
    return {"nodes": node_count, "aggregated": not detail, "detail_limit": detail_limit, "totals": totals,
            "zones": [{"name": z, "racks": rs} for z, rs in zones.items()]}


def rack(cache: ClusterCache, cycle: WorkloadCycle, zone: str, rack_name: str) -> dict | None:
    racks, _ = _racks(cache, cycle, only=(zone, rack_name))
    nodes = racks.get((zone, rack_name))
    return _rack_view(zone, rack_name, nodes, True) if nodes else None


# -- podgroups ---------------------------------------------------------------------------------
def _owner(members: list[PodRecord], group_owner: GroupOwner) -> dict:
    if group_owner.level:  # a LeaderWorkerSet's group: the LWS owns it, not its pods' StatefulSet
        return {"kind": group_owner.kind, "name": group_owner.name, "level": group_owner.level}
    kinds = Counter((m.owner_kind, m.owner_name) for m in members if m.owner_kind)
    if kinds:
        (kind, name), _ = kinds.most_common(1)[0]
        return {"kind": kind, "name": name}
    return {"kind": group_owner.kind, "name": group_owner.name}


def state_of(cycle: WorkloadCycle, key: str) -> str:
    if key in cycle.preemption.nominations:
        return "preempting"
    state = cycle.group_state(key)
    return STATE_WORDS.get(state, state)


def _waits_for(cycle: WorkloadCycle, key: str, state: str) -> str:
    """An unschedulable group: "room" (it fits the empty cluster) or "never" (not even there)."""
    if state != "unschedulable":
        return ""
    return "never" if cycle.smallest.never_fits(key) else "room"


def group_row(cache: ClusterCache, cycle: WorkloadCycle, history: GroupHistory, key: str,
              record: PodGroupRecord, now: float) -> dict:
    spec = record.spec
    members = cache.members(key)
    facts = history.facts(key)
    first_seen = facts.first_seen if facts else history.started
    placement = facts.placement if facts else None
    bound_at = facts.bound_at if facts else None
    state = state_of(cycle, key)
    return {
        "key": key, "namespace": record.namespace, "name": record.name,
        "owner": _owner(members, record.owner),
        "policy": spec.policy.value,
        "min_count": spec.min_count,
        "priority": spec.priority if spec.priority is not None else (spec.priority_class or 0),
        "disruption_mode": spec.disruption_mode.value,
        "members": len(members), "bound": sum(1 for m in members if m.pod.node),
        "topology_key": spec.topology_key,
        "domain": placement_domain(record.placement) or (placement or {}).get("domain", ""),
        "state": state,
        "waits_for": _waits_for(cycle, key, state),
        "age_s": round(now - first_seen, 1),
        "time_to_place_s": round(bound_at - first_seen, 2) if bound_at else None,
        "preempted_by": facts.preempted_by if facts else "",
        # a starving gang holding the domain nearest to fitting it (cycle/queue.py)
        "held_domain": cycle.queue_policies.held_domain(key),
        "expected_duration_s": spec.expected_duration,
    }


def podgroups(cache: ClusterCache, cycle: WorkloadCycle, history: GroupHistory) -> dict:
    now = time.time()
    rows = [group_row(cache, cycle, history, key, record, now)
            for key, record in sorted(dict(cache.podgroups).items())]
    return {"podgroups": rows, "states": dict(Counter(r["state"] for r in rows))}


def podgroup(cache: ClusterCache, cycle: WorkloadCycle, history: GroupHistory, key: str) -> dict | None:
    record = cache.podgroups.get(key)
    if record is None:
        return None
    row = group_row(cache, cycle, history, key, record, time.time())
    explanation = cycle.explanations.get(key, "")
    facts = history.facts(key)
    plan = cycle.plans.get(key)
    row.update(
        explanation=explanation,
        shortfalls=_shortfalls(explanation),
        smallest_change=[part for part in cycle.smallest.texts.get(key, "").split(" | ") if part],
        placement=(facts.placement if facts else None),
        plan_state=plan.state if plan else "",
        victims=(facts.victims if facts else []),
        timeline=history.timeline(key),
        pods=[{"name": m.pod.name, "node": m.pod.node, "phase": m.phase, "gated": m.gated,
               "requests": {r: _amount(r, v) for r, v in m.pod.spec.requests.items()}}
              for m in cache.members(key)],
        conditions=[c.to_json() for c in record.conditions],
        composite=_composite(cycle.composite_of(key)),
    )
    return row


def _composite(of: CompositeOf | None) -> dict:
    return {} if of is None else {"key": of.root, "groups": list(of.groups), "how": of.how, "why": of.why}


def _shortfalls(explanation: str) -> list[str]:
    """The solver's message split into its parts: per-domain shortfalls, nearest miss first."""
    body = explanation.split(": ", 1)[1] if explanation.startswith("podgroup ") else explanation
    return [part.strip() for part in body.split("; ") if part.strip()]


# -- plans -------------------------------------------------------------------------------------
def plans(cache: ClusterCache, cycle: WorkloadCycle, namespace: str = "") -> dict:
    """Every plan the cycle holds (planned, binding, bound), with its pods' nodes, for
    ``kubectl phalanx plans``; only ``namespace``'s when given. Read without the cycle's lock."""
    now = cycle.clock()
    rows = []
    for key, plan in sorted(dict(cycle.plans).items()):
        group_namespace, _, name = key.partition("/")
        if namespace and group_namespace != namespace:
            continue
        pods = cache.pods
        assignments = {}
        for uid, node in list(plan.assignments.items()):
            record = pods.get(uid)
            assignments[record.pod.name if record else uid] = node
        solved = plan.placement
        rows.append({"namespace": group_namespace, "name": name, "state": plan.state.value if plan.state else "planned",
                     "domain": plan.domain, "path": solved.path if solved else "",
                     "optimal": bool(solved and solved.optimal), "gap": solved.gap if solved else None,
                     "pods": len(assignments), "nodes": sorted(set(assignments.values()), key=natural),
                     "assignments": dict(sorted(assignments.items(), key=lambda item: natural(item[0]))),
                     "members_at_barrier": len(plan.arrived),
                     "expires_in_s": round(max(0.0, plan.deadline - now), 1)})
    return {"plans": rows}


# -- solver and extender -----------------------------------------------------------------------
def _samples(registry: CollectorRegistry) -> list[tuple[str, dict, float]]:
    return [(s.name, dict(s.labels), s.value) for family in registry.collect() for s in family.samples]


def _by_label(samples: list, name: str, label: str) -> dict[str, float]:
    out: Counter[str] = Counter()
    for sample_name, labels, value in samples:
        if sample_name == name:
            out[labels.get(label, "")] += value
    return dict(out)


def _histogram(samples: list, name: str) -> dict:
    cumulative = sorted(((float(labels["le"]), value) for n, labels, value in samples if n == f"{name}_bucket"),
                        key=lambda b: b[0])
    buckets, previous = [], 0.0
    for le, value in cumulative:
        buckets.append({"le": le if le != float("inf") else None, "count": value - previous})  # JSON has no inf
        previous = value
    total = next((v for n, _, v in samples if n == f"{name}_sum"), 0.0)
    return {"buckets": buckets, "count": previous, "sum": total}


def metrics(registry: CollectorRegistry, history: GroupHistory) -> dict:
    samples = _samples(registry)
    return {
        "attempts": _by_label(samples, names.METRIC_PODGROUP_ATTEMPTS, "result"),
        "attempt_latency": _histogram(samples, names.METRIC_PODGROUP_ATTEMPT_DURATION),
        "solver": history.solver_summary(),
        "barrier": _by_label(samples, names.METRIC_BARRIER_OUTCOMES, "outcome"),
        "barrier_waiting": sum(_by_label(samples, names.METRIC_BARRIER_WAITING, "").values()),
        "plans_held": sum(_by_label(samples, names.METRIC_PLANS, "").values()),
        "plans_released": _by_label(samples, names.METRIC_PLANS_RELEASED, "reason"),
        "preemption_attempts": _by_label(samples, names.METRIC_PREEMPTION_ATTEMPTS, "result"),
        "preemption_victims": _histogram(samples, names.METRIC_PREEMPTION_VICTIMS)["sum"],
        "requests": _by_label(samples, names.METRIC_EXTENDER_REQUESTS, "verb"),
        "request_errors": sum(v for n, labels, v in samples
                              if n == names.METRIC_EXTENDER_REQUESTS and labels.get("code") != "200"),
    }
