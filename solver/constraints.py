"""Inter-pod and volume rules of one placement problem, as kube-scheduler's default filters and
scorers state them, compiled into what the search paths use.

kube-scheduler decides pod by pod (InterPodAffinity, PodTopologySpread, NodePorts, VolumeBinding,
VolumeRestrictions, NodeVolumeLimits); phalanx places a whole group at once, so each rule becomes
one of:

- a **mask** per shape: nodes a pod may not take because of what already sits on the cluster
  (bound pods and pods other plans hold, "placed pods"): their host ports, their required
  anti-affinity terms that select the pod (the symmetric rule), the pod's own anti-affinity against
  them, its required affinity towards them, a missing spread label, its volumes' node affinity, the
  nodes kube-scheduler itself accepted for it;
- a **node limit**: how many pods of some shapes one node may take (host ports among members,
  self anti-affinity on a per-node key, local PVs, CSI attach limits);
- a **pair**: two shapes that may not share a node (anti-affinity or port conflicts between them);
- a **domain rule** over the domains of a topology key: anti-affinity (a shape and the pods it must
  avoid), co-location (required affinity among members: all in one domain), spread (maxSkew with the
  global minimum as kube-scheduler computes it);
- a **soft term** for the objective: preferred (anti-)affinity weights and ``ScheduleAnyway`` spread,
  ranked above phalanx's packing terms (see :mod:`solver.objective`).

Conservative where kube-scheduler's answer depends on the order members arrive in: a plan must pass
its filters whatever that order is (phalanx hands a member the slot of an identical sibling when
kube-scheduler's order differs, so spread holds for identical members in any order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Collection, Iterable, Mapping, Protocol, Sequence, TypedDict

import numpy as np

from .model import (
    HONOR,
    HOSTNAME_KEY,
    RWOP,
    HostPort,
    LabelSelector,
    NodeAffinity,
    PersistentVolume,
    Pod,
    PodAffinityTerm,
    PodGroup,
    PodSpec,
    Requirement,
    SpreadConstraint,
    VolumeClaim,
)

if TYPE_CHECKING:  # pragma: no cover
    from .snapshot import Eligibility, Snapshot


class ShapeView(Protocol):
    """What the rules read of one shape of identical pending pods (solver.problem.Shape)."""

    @property
    def pods(self) -> list[Pod]: ...

    @property
    def eligibility(self) -> "Eligibility": ...


class ProblemView(Protocol):
    """What the rules read of a group's problem (solver.problem.Problem, which builds them: a
    protocol, so this module does not import the one that imports it)."""

    @property
    def snapshot(self) -> "Snapshot": ...

    @property
    def group(self) -> PodGroup: ...

    @property
    def allowed(self) -> Mapping[str, Collection[str]] | None: ...

    @property
    def shapes(self) -> Sequence[ShapeView]: ...

    @property
    def shape_of(self) -> dict[str, int]: ...

    @property
    def rules(self) -> "Rules": ...

#: Weight of one pod of excess skew of a ``ScheduleAnyway`` spread constraint (the strongest
#: preferred-term weight kube-scheduler allows: a soft spread the user wrote counts as much as that).
SOFT_SPREAD_WEIGHT = 100

#: Reasons a rule excludes a node for a pod (reported in explanations), in one place.
REASON_ANTI_AFFINITY = "pod anti-affinity"
REASON_EXISTING_ANTI_AFFINITY = "anti-affinity of placed pods"
REASON_AFFINITY = "pod affinity"
REASON_HOST_PORT = "host port in use"
REASON_SPREAD_LABEL = "missing topology spread label"
REASON_VOLUME = "volume"
REASON_KUBE_SCHEDULER = "kube-scheduler filters"


@dataclass(frozen=True)
class Scope:
    """A selector with the namespaces it looks in: what a term or a spread constraint counts."""

    selector: LabelSelector | None
    namespaces: frozenset[str]
    namespace_selector: LabelSelector | None = None

    @classmethod
    def of_term(cls, term: PodAffinityTerm) -> "Scope":
        return cls(term.selector, term.namespaces, term.namespace_selector)

    def selects(self, pod: Pod, namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
        if self.selector is None:
            return False
        in_scope = pod.namespace in self.namespaces or (
            self.namespace_selector is not None
            and self.namespace_selector.matches(namespace_labels.get(pod.namespace, {})))
        return in_scope and self.selector.matches(pod.labels)


@dataclass
class NodeLimit:
    """Per node: sum over ``shapes`` of coeff x pods <= ``limit[node]`` (applies when any of
    ``shapes`` is on the node)."""

    shapes: tuple[int, ...]
    coeffs: tuple[int, ...]
    limit: np.ndarray  # int per node
    reason: str


@dataclass
class DomainAnti:
    """Required anti-affinity of ``shape`` on ``key``: in a domain holding a pod of ``shape``, no
    pod of ``others`` (and no second pod of ``shape`` when it matches its own term)."""

    key: str
    shape: int
    others: tuple[int, ...]
    self_match: bool


@dataclass
class Coloc:
    """Required affinity among members: when any pod of ``owner`` (the shape carrying the term) is
    placed, every placed pod of ``shapes`` (owner and the members its term selects) shares one
    domain of ``key``; an owner left unplaced (minCount below the group's size) binds nobody."""

    key: str
    shapes: tuple[int, ...]
    owner: int = -1


@dataclass
class Spread:
    """A spread constraint of ``shape`` over ``key``: ``members`` are the shapes its selector
    counts, ``existing`` the matching placed pods per domain value, ``counted`` which domain values
    take part in the global minimum (kube-scheduler's eligible domains), ``min_zero`` when fewer
    than minDomains exist (the minimum is then 0)."""

    key: str
    shape: int
    members: tuple[int, ...]
    skew: int
    existing: np.ndarray
    counted: np.ndarray
    min_zero: bool
    hard: bool

    def global_min(self, counts: np.ndarray) -> int:
        if self.min_zero or not self.counted.any():
            return 0
        return int(counts[self.counted].min())


@dataclass
class Soft:
    """A preferred term of ``shape``: ``anti`` (avoid domains holding ``members``/matching placed
    pods) or ``affinity`` (prefer domains holding matching pods); ``existing`` per domain value."""

    kind: str
    key: str
    shape: int
    members: tuple[int, ...]
    self_match: bool
    weight: int
    existing: np.ndarray


@dataclass
class Rules:
    masks: list[np.ndarray]
    excluded: list[dict[str, int]]
    limits: list[NodeLimit] = field(default_factory=list)
    pairs: set[tuple[int, int]] = field(default_factory=set)
    anti: list[DomainAnti] = field(default_factory=list)
    coloc: list[Coloc] = field(default_factory=list)
    spreads: list[Spread] = field(default_factory=list)
    soft: list[Soft] = field(default_factory=list)
    totals: list[tuple[tuple[int, ...], int, str]] = field(default_factory=list)  # (shapes, max pods, why)

    @property
    def empty(self) -> bool:
        return not (self.limits or self.pairs or self.anti or self.coloc or self.spreads or self.soft
                    or self.totals)

    @property
    def soft_terms(self) -> bool:
        return bool(self.soft) or any(not sp.hard for sp in self.spreads)

    @property
    def domain_keys(self) -> list[str]:
        keys = [r.key for r in self.anti] + [r.key for r in self.coloc] + [r.key for r in self.spreads]
        keys += [r.key for r in self.soft]
        return list(dict.fromkeys(keys))

    def max_soft_penalty(self, shape_counts: list[int]) -> int:
        total = sum(shape_counts)
        out = 0
        for t in self.soft:
            out += t.weight * (total + 1)
        for sp in self.spreads:
            if not sp.hard:
                out += SOFT_SPREAD_WEIGHT * (total + int(sp.existing.sum()) + 1)
        return out


# -- what placed pods contribute ------------------------------------------------------------------

class PlacedIndex(TypedDict):
    """Placed pods by namespace, the ones with required anti-affinity, host ports per node index."""

    by_ns: dict[str, list[Pod]]
    anti: list[Pod]
    ports: dict[int, list[HostPort]]


def _index_pods(snapshot: "Snapshot", pods: tuple[Pod, ...]) -> PlacedIndex:
    by_ns: dict[str, list[Pod]] = {}
    anti: list[Pod] = []
    ports: dict[int, list[HostPort]] = {}
    for pod in pods:
        i = snapshot.index.get(pod.node)
        if i is None:
            continue
        by_ns.setdefault(pod.namespace, []).append(pod)
        if pod.spec.pod_anti_affinity:
            anti.append(pod)
        if pod.spec.host_ports:
            ports.setdefault(i, []).extend(pod.spec.host_ports)
    return {"by_ns": by_ns, "anti": anti, "ports": ports}


def _bound_cache(snapshot: "Snapshot") -> dict[Any, Any]:
    """A cache for what depends only on the bound pods, shared by every snapshot over the same
    nodes whose bound-pod tuple is the very same object (a watch cache hands the same tuple to
    each cycle until a pod changes), so 100,000 bound pods are indexed once, not per cycle."""
    entry: tuple[tuple[Pod, ...], dict[Any, Any]] | None = snapshot.node_cache.get("bound-cache")
    if entry is None or entry[0] is not snapshot.bound:
        entry = (snapshot.bound, {})
        snapshot.node_cache["bound-cache"] = entry
    return entry[1]


def placed_anti_affinity(snapshot: "Snapshot") -> bool:
    """Does any placed pod carry required anti-affinity (which may exclude any new pod)? One scan
    of the bound pods per bound-pod tuple, without building the index."""
    bound: bool | None = snapshot.bound_anti
    if bound is None:
        shared = _bound_cache(snapshot)
        bound = shared.get("any-anti")
        if bound is None:
            bound = shared["any-anti"] = any(p.spec.pod_anti_affinity for p in snapshot.bound)
    return bound or any(p.spec.pod_anti_affinity for p in snapshot.assumed)


def _bound_index(snapshot: "Snapshot") -> PlacedIndex:
    """The bound pods' index, built once per bound-pod tuple."""
    shared = _bound_cache(snapshot)
    index: PlacedIndex | None = shared.get("index")
    if index is None:
        index = shared["index"] = _index_pods(snapshot, snapshot.bound)
    return index


def placed_index(snapshot: "Snapshot") -> PlacedIndex:
    """Placed pods (bound + assumed) by namespace, the ones with required anti-affinity, and the
    host ports in use per node."""
    key = ("placed-index", id(snapshot.assumed))
    index: PlacedIndex | None = snapshot.usage_cache.get(key)
    if index is None:
        index = _bound_index(snapshot)
        if snapshot.assumed:
            extra = _index_pods(snapshot, snapshot.assumed)
            by_ns = {ns: list(pods) for ns, pods in index["by_ns"].items()}
            for ns, pods in extra["by_ns"].items():
                by_ns.setdefault(ns, []).extend(pods)
            ports = {i: list(v) for i, v in index["ports"].items()}
            for i, v in extra["ports"].items():
                ports.setdefault(i, []).extend(v)
            index = {"by_ns": by_ns, "anti": index["anti"] + extra["anti"], "ports": ports}
        snapshot.usage_cache[key] = index
    return index


def _scoped(pods_by_ns: Mapping[str, list[Pod]], scope: Scope) -> Iterable[Pod]:
    if scope.namespace_selector is not None:
        return (p for pods in pods_by_ns.values() for p in pods)
    return (p for ns in scope.namespaces for p in pods_by_ns.get(ns, ()))


def _count(snapshot: "Snapshot", pods: Iterable[Pod], scope: Scope) -> np.ndarray:
    counts = np.zeros(len(snapshot.nodes), dtype=np.int64)
    for pod in pods:
        if scope.selects(pod, snapshot.namespaces):
            i = snapshot.index.get(pod.node)
            if i is not None:
                counts[i] += 1
    return counts


def placed_counts(snapshot: "Snapshot", scope: Scope) -> np.ndarray:
    """Matching placed pods per node (bound ones counted once per bound-pod tuple)."""
    key = ("placed-counts", id(snapshot.assumed), scope)
    counts: np.ndarray | None = snapshot.usage_cache.get(key)
    if counts is None:
        shared = _bound_cache(snapshot)
        base: np.ndarray | None = shared.get(("counts", scope, id(snapshot.namespaces)))
        if base is None:
            base = shared[("counts", scope, id(snapshot.namespaces))] = _count(
                snapshot, _scoped(_bound_index(snapshot)["by_ns"], scope), scope)
        counts = base
        if snapshot.assumed:  # few: Scope.selects checks their namespace itself
            counts = base + _count(snapshot, snapshot.assumed, scope)
        snapshot.usage_cache[key] = counts
    return counts


def per_domain(snapshot: "Snapshot", key: str, per_node: np.ndarray) -> np.ndarray:
    values, ids = snapshot.domains(key)
    ok = ids >= 0
    return np.bincount(ids[ok], weights=per_node[ok], minlength=len(values)).astype(np.int64)


def node_level(snapshot: "Snapshot", key: str) -> bool:
    """Every domain of ``key`` is one node (kubernetes.io/hostname, as clusters label it): rules over
    such a key are per-node rules (the exact model checks them per packing pattern)."""
    cache = snapshot.node_cache
    ck = ("node-level", key)
    if ck not in cache:
        values, ids = snapshot.domains(key)
        cache[ck] = bool(len(values)) and int(np.bincount(ids[ids >= 0]).max()) <= 1
    level: bool = cache[ck]
    return level


def _value_index(snapshot: "Snapshot", key: str) -> dict[str, np.ndarray]:
    """Label value of ``key`` -> node indices holding it; once per snapshot's nodes."""
    ck = ("value-index", key)
    index: dict[str, np.ndarray] | None = snapshot.node_cache.get(ck)
    if index is None:
        positions: dict[str, list[int]] = {}
        for i, v in enumerate(snapshot.label_values(key)):
            if v is not None:
                positions.setdefault(v, []).append(i)
        index = {v: np.array(ix, dtype=np.int64) for v, ix in positions.items()}
        snapshot.node_cache[ck] = index
    return index


def _requirement_mask(snapshot: "Snapshot", r: Requirement) -> np.ndarray:
    """Nodes whose labels satisfy one requirement, exactly as :meth:`Requirement.matches`."""
    index = _value_index(snapshot, r.key)
    out = np.zeros(len(snapshot.nodes), dtype=bool)
    if r.operator in ("In", "NotIn"):
        for v in r.values:
            ix = index.get(v)
            if ix is not None:
                out[ix] = True
        return ~out if r.operator == "NotIn" else out
    for v, ix in index.items():  # few distinct values outside In/NotIn (Exists, Gt, Lt on counts)
        if r.matches({r.key: v}):
            out[ix] = True
    if r.matches({}):  # nodes without the label (DoesNotExist)
        out |= snapshot.label_values(r.key) == None  # noqa: E711 (element-wise on an object array)
    return out


def node_affinity_mask(snapshot: "Snapshot", affinity: NodeAffinity) -> np.ndarray:
    """Nodes matching ``affinity`` (a PV's, a claim's allowed topologies), vectorised per
    requirement and cached on the snapshot's static part: a thousand local PVs on ten thousand
    nodes is a thousand index look-ups, not ten million label comparisons."""
    ck = ("node-affinity", affinity)
    mask: np.ndarray | None = snapshot.node_cache.get(ck)
    if mask is None:
        if not affinity.terms:
            mask = np.ones(len(snapshot.nodes), dtype=bool)
        else:
            mask = np.zeros(len(snapshot.nodes), dtype=bool)
            for term in affinity.terms:
                part = np.ones(len(snapshot.nodes), dtype=bool)
                for r in term:
                    part &= _requirement_mask(snapshot, r)
                mask |= part
        snapshot.node_cache[ck] = mask
    return mask


# -- compiling a problem's rules --------------------------------------------------------------------

def signature_scopes(snapshot: "Snapshot", specs: Iterable[tuple[PodSpec, str]]) -> list[Scope]:
    """Every selector whose verdict on a pending pod changes where it may go: the pending pods'
    own terms and spread constraints, and placed pods' required anti-affinity terms."""
    scopes: dict[Scope, None] = {}
    for spec, namespace in specs:
        terms = spec.pod_affinity + spec.pod_anti_affinity + spec.preferred_affinity + spec.preferred_anti_affinity
        for term in terms:
            scopes[Scope.of_term(term)] = None
        for c in spec.spread:
            scopes[Scope(c.selector, frozenset((namespace,)))] = None
    for pod in placed_index(snapshot)["anti"]:
        for term in pod.spec.pod_anti_affinity:
            scopes[Scope.of_term(term)] = None
    return list(scopes)


def volume_signature(pod: Pod) -> tuple[object, ...]:
    return tuple(sorted((c.signature for c in pod.volumes), key=repr))


class _Builder:
    def __init__(self, problem: ProblemView) -> None:
        self.p = problem
        self.snap = problem.snapshot
        self.shapes = problem.shapes
        n = len(self.snap.nodes)
        self.rules = Rules(masks=[np.ones(n, dtype=bool) for _ in self.shapes],
                           excluded=[{} for _ in self.shapes])
        # which shapes each scope selects (all pods of a shape agree: the signature is in the key)
        self._selects: dict[Scope, tuple[int, ...]] = {}

    def selected(self, scope: Scope) -> tuple[int, ...]:
        out = self._selects.get(scope)
        if out is None:
            out = tuple(t for t, shape in enumerate(self.shapes)
                        if scope.selects(shape.pods[0], self.snap.namespaces))
            self._selects[scope] = out
        return out

    def exclude(self, s: int, bad: np.ndarray, reason: str) -> None:
        mask = self.rules.masks[s]
        newly = mask & bad & self.shapes[s].eligibility.mask
        count = int(newly.sum())
        if count:
            self.rules.excluded[s][reason] = self.rules.excluded[s].get(reason, 0) + count
        mask &= ~bad

    def labelled(self, key: str) -> np.ndarray:
        return self.snap.domains(key)[1] >= 0

    def in_domains(self, key: str, domain_mask: np.ndarray) -> np.ndarray:
        """Nodes whose ``key`` domain is flagged in ``domain_mask`` (per domain value)."""
        ids = self.snap.domains(key)[1]
        out = np.zeros(len(ids), dtype=bool)
        ok = ids >= 0
        out[ok] = domain_mask[ids[ok]]
        return out

    def build(self) -> Rules:
        allowed = self.p.allowed or {}
        for s, shape in enumerate(self.shapes):
            pod = shape.pods[0]
            spec = pod.spec
            nodes = allowed.get(pod.uid)
            if nodes is not None:
                self.kube_scheduler_verdict(s, nodes)
            if spec.host_ports:
                self.ports(s)
            self.existing_anti(s)
            for term in spec.pod_anti_affinity:
                self.anti(s, term)
            for term in spec.pod_affinity:
                self.affinity(s, term)
            for c in spec.spread:
                self.spread(s, c)
            for term in spec.preferred_anti_affinity:
                self.soft(s, term, "anti")
            for term in spec.preferred_affinity:
                self.soft(s, term, "affinity")
            if pod.volumes:
                self.volumes(s)
        self.port_pairs()
        self.csi_limits()
        if self.p.group.default_preference == "spread":
            self.default_spread()
        return self.rules

    def kube_scheduler_verdict(self, s: int, nodes: Collection[str]) -> None:
        """Shape ``s`` only on the ``nodes`` kube-scheduler itself accepted for it."""
        keep = np.zeros(len(self.snap.nodes), dtype=bool)
        for name in nodes:
            i = self.snap.index.get(name)
            if i is not None:
                keep[i] = True
        self.exclude(s, ~keep, REASON_KUBE_SCHEDULER)

    def default_spread(self) -> None:
        """A group that asks to be spread: members without a soft rule of their own prefer distinct
        nodes, counted among the group's members (bound ones included)."""
        key = HOSTNAME_KEY
        if not self.labelled(key).any():
            return
        values, ids = self.snap.domains(key)
        bound = np.zeros(len(self.snap.nodes), dtype=np.int64)
        for pod in self.p.group.bound:
            i = self.snap.index.get(pod.node)
            if i is not None:
                bound[i] += 1
        existing = per_domain(self.snap, key, bound)
        counted = np.zeros(len(values), dtype=bool)
        counted[np.unique(ids[ids >= 0])] = True
        members = tuple(range(len(self.shapes)))
        for s, shape in enumerate(self.shapes):
            spec = shape.pods[0].spec
            if not (spec.preferred_affinity or spec.preferred_anti_affinity or any(not c.hard for c in spec.spread)):
                self.rules.spreads.append(Spread(key, s, members, 1, existing, counted, False, False))

    # -- NodePorts ------------------------------------------------------------------------
    def ports(self, s: int) -> None:
        mine = self.shapes[s].pods[0].spec.host_ports
        bad = np.zeros(len(self.snap.nodes), dtype=bool)
        for i, used in placed_index(self.snap)["ports"].items():
            if any(a.conflicts(b) for a in mine for b in used):
                bad[i] = True
        self.exclude(s, bad, REASON_HOST_PORT)
        # two pods of one shape carry the same ports: at most one per node
        self.rules.limits.append(NodeLimit((s,), (1,), np.ones(len(self.snap.nodes), dtype=np.int64),
                                           REASON_HOST_PORT))

    def port_pairs(self) -> None:
        for s, a in enumerate(self.shapes):
            for t in range(s + 1, len(self.shapes)):
                pa, pb = a.pods[0].spec.host_ports, self.shapes[t].pods[0].spec.host_ports
                if pa and pb and any(x.conflicts(y) for x in pa for y in pb):
                    self.rules.pairs.add((s, t))

    # -- InterPodAffinity -------------------------------------------------------------------
    def existing_anti(self, s: int) -> None:
        """Placed pods' required anti-affinity terms that select this pod exclude their domains."""
        pod = self.shapes[s].pods[0]
        bad = np.zeros(len(self.snap.nodes), dtype=bool)
        for other in placed_index(self.snap)["anti"]:
            for term in other.spec.pod_anti_affinity:
                if not Scope.of_term(term).selects(pod, self.snap.namespaces):
                    continue
                value = self.snap.nodes[self.snap.index[other.node]].labels.get(term.topology_key)
                if value is not None:
                    bad |= self.snap.label_values(term.topology_key) == value
        self.exclude(s, bad, REASON_EXISTING_ANTI_AFFINITY)

    def anti(self, s: int, term: PodAffinityTerm) -> None:
        scope = Scope.of_term(term)
        existing = per_domain(self.snap, term.topology_key, placed_counts(self.snap, scope))
        self.exclude(s, self.in_domains(term.topology_key, existing > 0), REASON_ANTI_AFFINITY)
        selected = self.selected(scope)
        self_match = s in selected
        others = tuple(t for t in selected if t != s)
        if not self_match and not others:
            return
        if node_level(self.snap, term.topology_key):
            if self_match:
                self.rules.limits.append(NodeLimit((s,), (1,), np.ones(len(self.snap.nodes), dtype=np.int64),
                                                   f"{REASON_ANTI_AFFINITY} on {term.topology_key}"))
            for t in others:
                self.rules.pairs.add((min(s, t), max(s, t)))
        else:
            self.rules.anti.append(DomainAnti(term.topology_key, s, others, self_match))

    def affinity(self, s: int, term: PodAffinityTerm) -> None:
        key = term.topology_key
        self.exclude(s, ~self.labelled(key), REASON_AFFINITY)
        scope = Scope.of_term(term)
        counts = placed_counts(self.snap, scope)
        if counts.any():
            # matching pods exist: the pod goes where they are (kube-scheduler's rule, any order)
            existing = per_domain(self.snap, key, counts)
            self.exclude(s, ~self.in_domains(key, existing > 0), REASON_AFFINITY)
            return
        selected = self.selected(scope)
        if s not in selected:
            # no pod to be near, and the pod does not match its own term: kube-scheduler refuses it
            # whenever it takes it before the members it would follow, so the plan may not rely on them
            self.exclude(s, np.ones(len(self.snap.nodes), dtype=bool), REASON_AFFINITY)
            return
        # no matching pod anywhere yet: this shape and every member it selects share one domain
        # (sufficient whichever member kube-scheduler takes first)
        shapes = tuple(sorted(set(selected) | {s}))
        self.rules.coloc.append(Coloc(key, shapes, s))

    def soft(self, s: int, term: PodAffinityTerm, kind: str) -> None:
        scope = Scope.of_term(term)
        existing = per_domain(self.snap, term.topology_key, placed_counts(self.snap, scope))
        selected = self.selected(scope)
        self.rules.soft.append(Soft(kind, term.topology_key, s, selected, s in selected, term.weight, existing))

    # -- PodTopologySpread -------------------------------------------------------------------
    def spread(self, s: int, c: SpreadConstraint) -> None:
        shape = self.shapes[s]
        pod = shape.pods[0]
        keys = [x.topology_key for x in pod.spec.spread]
        has_keys = np.ones(len(self.snap.nodes), dtype=bool)
        for k in keys:
            has_keys &= self.labelled(k)
        if c.hard:
            self.exclude(s, ~has_keys, REASON_SPREAD_LABEL)
        # the nodes whose pods count and whose domains take part in the minimum
        counted_nodes = has_keys.copy()
        if c.node_affinity_policy == HONOR:
            counted_nodes &= self._node_affinity_mask(pod.spec)
        if c.node_taints_policy == HONOR:
            counted_nodes &= ~self.snap.taint_mask(pod.spec)
        scope = Scope(c.selector, frozenset((pod.namespace,)))
        per_node = np.where(counted_nodes, placed_counts(self.snap, scope), 0)
        existing = per_domain(self.snap, c.topology_key, per_node)
        values, ids = self.snap.domains(c.topology_key)
        counted = np.zeros(len(values), dtype=bool)
        counted[np.unique(ids[counted_nodes & (ids >= 0)])] = True
        min_zero = int(counted.sum()) < c.min_domains
        self.rules.spreads.append(Spread(c.topology_key, s, self.selected(scope), c.max_skew, existing, counted,
                                         min_zero, c.hard))

    def _node_affinity_mask(self, spec: PodSpec) -> np.ndarray:
        mask = np.ones(len(self.snap.nodes), dtype=bool)
        for key, value in spec.node_selector.items():
            mask &= self.snap.label_values(key) == value
        if spec.affinity.terms:
            mask &= node_affinity_mask(self.snap, spec.affinity)
        return mask

    # -- volumes ---------------------------------------------------------------------------
    def volumes(self, s: int) -> None:
        pod = self.shapes[s].pods[0]
        n = len(self.snap.nodes)
        pools: dict[tuple[object, ...], int] = {}
        for claim in pod.volumes:
            if claim.missing:
                self.exclude(s, np.ones(n, dtype=bool), f"{REASON_VOLUME}: claim {claim.name} not found")
            elif claim.bound:
                if claim.node_affinity is not None and claim.node_affinity.terms:
                    self.exclude(s, ~self._affinity(claim.node_affinity), f"{REASON_VOLUME} node affinity")
                if RWOP in claim.access_modes and self._claim_in_use(claim):
                    self.exclude(s, np.ones(n, dtype=bool), f"{REASON_VOLUME}: ReadWriteOncePod claim in use")
            elif not claim.delayed:
                self.exclude(s, np.ones(n, dtype=bool), f"{REASON_VOLUME}: claim {claim.name} is not bound yet")
            else:
                sig = claim.signature
                pools[sig] = pools.get(sig, 0) + 1
        for sig, per_pod in pools.items():
            claim = next(c for c in pod.volumes if c.signature == sig)
            pvs, local = self._local_pvs(claim)
            if claim.dynamic:
                topo = claim.allowed_topologies
                ok = self._affinity(topo) if topo is not None and topo.terms else np.ones(n, dtype=bool)
                self.exclude(s, ~(ok | (local >= per_pod)), f"{REASON_VOLUME} topology")
                continue
            self.exclude(s, local < per_pod, f"{REASON_VOLUME}: no available PersistentVolume")
            sharers = tuple(t for t, other in enumerate(self.shapes)
                            if any(c.signature == sig for c in other.pods[0].volumes))
            if s == sharers[0]:
                coeffs = tuple(sum(1 for c in self.shapes[t].pods[0].volumes if c.signature == sig) for t in sharers)
                self.rules.limits.append(
                    NodeLimit(sharers, coeffs, local, f"{REASON_VOLUME}: available PersistentVolumes"))
                self.rules.totals.append((sharers, len(pvs) // max(1, per_pod), "available PersistentVolumes"))

    def _affinity(self, affinity: NodeAffinity) -> np.ndarray:
        return node_affinity_mask(self.snap, affinity)

    def _local_pvs(self, claim: VolumeClaim) -> tuple[list[PersistentVolume], np.ndarray]:
        """The available PVs that could bind ``claim`` and how many of them each node reaches; once
        per snapshot and claim signature (greedy and exact build the same problem)."""
        volumes = self.snap.volumes
        key = ("local-pvs", id(volumes), claim.signature)
        cached: tuple[object, list[PersistentVolume], np.ndarray] | None = self.snap.usage_cache.get(key)
        if cached is None or cached[0] is not volumes:
            pvs = [pv for pv in volumes.available if not pv.claim_ref and pv.serves(claim)]
            local = np.zeros(len(self.snap.nodes), dtype=np.int64)
            for pv in pvs:
                local += self._affinity(pv.node_affinity) if pv.node_affinity is not None else 1
            cached = (volumes, pvs, local)
            self.snap.usage_cache[key] = cached
        return cached[1], cached[2]

    def _claim_in_use(self, claim: VolumeClaim) -> bool:
        return any(c.name == claim.name for p in self.snap.placed_pods for c in p.volumes)

    def csi_limits(self) -> None:
        limits = self.snap.volumes.attach_limits
        if not limits:
            return
        drivers: dict[str, list[tuple[int, int]]] = {}
        for s, shape in enumerate(self.shapes):
            per_driver: dict[str, int] = {}
            for claim in shape.pods[0].volumes:
                if claim.csi_driver:
                    per_driver[claim.csi_driver] = per_driver.get(claim.csi_driver, 0) + 1
            for d, k in per_driver.items():
                drivers.setdefault(d, []).append((s, k))
        if not drivers:
            return
        attached: dict[str, np.ndarray] = {d: np.zeros(len(self.snap.nodes), dtype=np.int64) for d in drivers}
        seen: set[tuple[int, str]] = set()
        for pod in self.snap.placed_pods:
            i = self.snap.index.get(pod.node)
            for claim in pod.volumes:
                if i is not None and claim.csi_driver in attached and (i, claim.name) not in seen:
                    seen.add((i, claim.name))
                    attached[claim.csi_driver][i] += 1
        big = 1 << 30
        for d, users in drivers.items():
            cap = np.array([limits.get(node.name, {}).get(d, big) for node in self.snap.nodes], dtype=np.int64)
            left = np.maximum(cap - attached[d], 0)
            self.rules.limits.append(NodeLimit(tuple(s for s, _ in users), tuple(k for _, k in users), left,
                                               f"{REASON_VOLUME}: CSI attach limit of {d}"))


def build_rules(problem: ProblemView) -> Rules:
    return _Builder(problem).build()



# -- the soft terms' penalty, as every path scores it ------------------------------------------------

def shape_node_counts(problem: ProblemView, assignments: Mapping[str, str]) -> np.ndarray:
    """x[s, node]: pods of shape s the assignment puts on each node."""
    snap = problem.snapshot
    x = np.zeros((len(problem.shapes), len(snap.nodes)), dtype=np.int64)
    shape_of = problem.shape_of
    for uid, node in assignments.items():
        x[shape_of[uid], snap.index[node]] += 1
    return x


def _members_per_domain(snap: "Snapshot", key: str, x: np.ndarray, members: tuple[int, ...]) -> np.ndarray:
    per_node = x[list(members)].sum(axis=0) if members else np.zeros(x.shape[1], dtype=np.int64)
    return per_domain(snap, key, per_node)


def soft_penalty(problem: ProblemView, assignments: Mapping[str, str]) -> int:
    """The preference term of :class:`solver.objective.Objective` (smaller is better):

    - preferred anti-affinity of a shape that its own term selects: weight x matching pods beyond
      the first in each domain (a placed matching pod counts as the first);
      of a shape its term does not select: weight x its pods in domains holding matching placed pods;
    - preferred affinity: weight x domains its pods use that hold no matching placed pod;
    - ``ScheduleAnyway`` spread: :data:`SOFT_SPREAD_WEIGHT` x pods above (global minimum + maxSkew)
      per counted domain.
    """
    snap = problem.snapshot
    x = shape_node_counts(problem, assignments)
    total = 0
    for t in problem.rules.soft:
        mine = per_domain(snap, t.key, x[t.shape])
        has = t.existing > 0
        if t.kind == "anti":
            if t.self_match:
                crowd = _members_per_domain(snap, t.key, x, t.members) + has
                total += t.weight * int(np.maximum(crowd - 1, 0).sum())
            else:
                total += t.weight * int(mine[has].sum())
        else:
            total += t.weight * int(((mine > 0) & ~has).sum())
    for sp in problem.rules.spreads:
        if sp.hard:
            continue
        c = sp.existing + _members_per_domain(snap, sp.key, x, sp.members)
        m = sp.global_min(c)
        total += SOFT_SPREAD_WEIGHT * int(np.maximum(c[sp.counted] - m - sp.skew, 0).sum())
    return total


def spread_fixed_min(sp: Spread, pending_matching: int) -> int | None:
    """The global minimum a placement cannot move, when it is certain: fewer than minDomains, or
    more domains at the minimum than the pods that could raise them. None when it may move."""
    if sp.min_zero or not sp.counted.any():
        return 0
    low = int(sp.existing[sp.counted].min())
    at_min = int((sp.existing[sp.counted] == low).sum())
    return low if at_min > pending_matching else None
