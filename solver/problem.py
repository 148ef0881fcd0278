"""One placement problem: a group on a snapshot, aggregated for speed.

Identical pending pods become one :class:`Shape` with a count, so model size follows the number
of distinct pod shapes, not pods. Per shape and node we compute the *capacity* (how many pods of
that shape alone fit) with vector operations; per candidate domain we then check totals before
any per-node search (:meth:`Problem.domain_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Collection, Iterable, Mapping

import numpy as np

from .constraints import Rules, build_rules, placed_anti_affinity, signature_scopes, soft_penalty, volume_signature
from .errors import InvalidInput
from .model import PODS, Pod, PodGroup, by_shape
from .objective import Objective, Weights, main_resource, preferred_paths
from .snapshot import Eligibility, Snapshot


@dataclass
class Shape:
    pods: list[Pod]
    vec: np.ndarray  # requests over snapshot.resources, pods = 1
    main: int  # main-resource request of one pod (1 when the main resource is the pod count)
    eligibility: Eligibility
    unknown: list[str]  # requested resources no node offers

    @property
    def count(self) -> int:
        return len(self.pods)


def _ordinal_key(pod: Pod) -> tuple[int, str]:
    """Shorter names first, then by name: StatefulSet ordinals in order (db-2 before db-10) at
    the cost of two C-level comparisons per pod."""
    return (len(pod.name), pod.name)


@dataclass(frozen=True)
class DomainBound:
    domain: int
    placed_ub: int  # at most this many pending pods fit in the domain
    nodes: np.ndarray  # node indices of the domain that can host at least one pod
    binding: str = ""  # the resource that limits the domain, when one does
    need: int = 0  # how much of it the needed pods ask for
    have: int = 0  # how much of it is free on eligible nodes
    rule: str = ""  # the pods' own rule that limits the domain below what the group needs


@dataclass
class Problem:
    snapshot: Snapshot
    group: PodGroup
    #: pod uid -> the only node names it may take (kube-scheduler's verdict), see solver.place
    allowed: Mapping[str, Collection[str]] | None = None
    #: score the objective's ``largest_lost`` (see :class:`solver.placement.SolveOptions`)
    keep_largest: bool = True
    shapes: list[Shape] = field(init=False)

    def __post_init__(self) -> None:
        self.group.check_ready()
        snap = self.snapshot
        for pod in self.group.bound:
            if pod.node not in snap.index:
                raise InvalidInput(f"podgroup {self.group.key}: member {pod.key} is bound to unknown node {pod.node!r}")
        pending = sorted(self.group.pending, key=_ordinal_key)
        self.main_name = main_resource(pending)
        self.main_j = snap.rindex.get(self.main_name)
        buckets = by_shape(pending)
        plain = self._plain(buckets.values(), pending)
        if not plain:
            buckets = self._rule_buckets(pending)
        shapes = []
        for pods in buckets.values():
            spec = pods[0].spec
            vec, unknown = snap.request_vector(spec.requests)
            main = 1 if self.main_name == PODS else spec.requests.get(self.main_name, 0)
            shapes.append(Shape(pods, vec, main, snap.eligibility(spec), unknown))
        # big pods first: they are the hard part of any packing
        shapes.sort(key=lambda s: (-s.main, -int(s.vec.sum()), -s.count))
        self.shapes = shapes
        self.pending_total = len(pending)
        self.needed = self.group.needed
        self.rules = Rules(masks=[], excluded=[]) if plain else build_rules(self)
        #: the group carries rules beyond capacity and eligibility (checked once: hot paths read it)
        self.constrained = not self.rules.empty
        if not plain:
            for s, shape in enumerate(shapes):
                merged = dict(shape.eligibility.excluded)
                for reason, count in self.rules.excluded[s].items():
                    merged[reason] = merged.get(reason, 0) + count
                shape.eligibility = Eligibility(shape.eligibility.mask & self.rules.masks[s], merged)

    def _plain(self, buckets: Iterable[list[Pod]], pending: list[Pod]) -> bool:
        """No inter-pod or volume rule can touch this group: the fast path of before."""
        if self.allowed or self.group.default_preference != "pack":
            return False
        if any(pods[0].spec.has_pod_constraints for pods in buckets) or any(p.volumes for p in pending):
            return False
        return not placed_anti_affinity(self.snapshot)

    def _rule_buckets(self, pending: list[Pod]) -> dict[tuple[object, ...], list[Pod]]:
        """Pods the rules tell apart are different shapes: the selectors that match them, their
        volumes (all but the claim's name), the nodes kube-scheduler accepted for them."""
        snap = self.snapshot
        scopes = signature_scopes(snap, {(p.spec.shape_key, p.namespace): (p.spec, p.namespace)
                                         for p in pending}.values())
        allowed = self.allowed or {}
        buckets: dict[tuple[object, ...], list[Pod]] = {}
        for pod in pending:
            nodes = allowed.get(pod.uid)
            key = (pod.spec.shape_key, pod.namespace, tuple(sc.selects(pod, snap.namespaces) for sc in scopes),
                   volume_signature(pod), frozenset(nodes) if nodes is not None else None)
            buckets.setdefault(key, []).append(pod)
        return buckets

    @cached_property
    def shape_of(self) -> dict[str, int]:
        return {p.uid: s for s, shape in enumerate(self.shapes) for p in shape.pods}



    # -- per-node capacities --------------------------------------------------------------
    @cached_property
    def free_main(self) -> np.ndarray:
        if self.main_j is None:
            return np.zeros(len(self.snapshot.nodes), dtype=np.int64)
        return self.snapshot.free[:, self.main_j]

    @cached_property
    def caps(self) -> np.ndarray:
        """caps[s, n]: pods of shape s alone that fit on node n (0 where not eligible)."""
        free = self.snapshot.free
        out = np.zeros((len(self.shapes), len(self.snapshot.nodes)), dtype=np.int64)
        for s, shape in enumerate(self.shapes):
            if shape.unknown:
                continue
            cols = np.nonzero(shape.vec)[0]
            cap = np.min(free[:, cols] // shape.vec[cols], axis=1)
            out[s] = np.where(shape.eligibility.mask, cap, 0)
        for limit in self.rules.limits:  # a node limit over several shapes bounds each of them too
            for s, coeff in zip(limit.shapes, limit.coeffs, strict=False):
                out[s] = np.minimum(out[s], limit.limit // coeff)
        return out

    @cached_property
    def pods_ub(self) -> np.ndarray:
        """An upper bound on pods of any mix of shapes per node."""
        if len(self.shapes) == 1:
            only: np.ndarray = self.caps[0]
            return only
        usable = [s for s in range(len(self.shapes)) if not self.shapes[s].unknown]
        if not usable:
            return np.zeros(len(self.snapshot.nodes), dtype=np.int64)
        smallest = np.min(np.stack([self.shapes[s].vec for s in usable]), axis=0)
        cols = np.nonzero(smallest)[0]
        ub = np.min(self.snapshot.free[:, cols] // smallest[cols], axis=1)
        return np.where(self.caps.max(axis=0) > 0, ub, 0)

    @cached_property
    def pref(self) -> list[np.ndarray]:
        return preferred_paths(self.snapshot, self.group.preferred_keys)

    # -- domains --------------------------------------------------------------------------
    @cached_property
    def domain_values(self) -> tuple[str, ...]:
        return self.snapshot.domains(self.group.topology_key)[0]

    @cached_property
    def domain_ids(self) -> np.ndarray:
        return self.snapshot.domains(self.group.topology_key)[1]

    # the rule's one home (docs/design.md: KEP-6277/topology-bound-domain)
    @cached_property
    def candidate_domains(self) -> list[int]:
        """All domains of the required key; only the bound members' domain once some are bound."""
        bound_domains = {int(self.domain_ids[self.snapshot.index[p.node]]) for p in self.group.bound}
        bound_domains.discard(-1)
        if self.group.topology_key and bound_domains:
            return sorted(bound_domains)
        return list(range(len(self.domain_values)))

    @cached_property
    def domain_free_main(self) -> np.ndarray:
        counts = len(self.domain_values)
        ids = self.domain_ids
        ok = ids >= 0
        return np.bincount(ids[ok], weights=self.free_main[ok], minlength=counts).astype(np.int64)

    @cached_property
    def _by_domain(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hosts (nodes that can take a pod) grouped by domain, roomiest first inside each domain:
        (node order, segment starts, cumulative per-segment pod capacity)."""
        ids = np.where(self.pods_ub > 0, self.domain_ids, -1)
        order = np.lexsort((-self.pods_ub, ids))
        order = order[ids[order] >= 0]
        starts = np.searchsorted(ids[order], np.arange(len(self.domain_values) + 1))
        cum = np.cumsum(self.pods_ub[order])
        return order, starts, cum

    def domain_bounds(self) -> list[DomainBound]:
        """Per candidate domain, an upper bound on the pods that fit, from totals only (vector
        operations over all nodes at once), plus the resource that binds when the bound falls
        short of what the group needs."""
        ids, count = self.domain_ids, len(self.domain_values)
        ok = ids >= 0
        placed = np.zeros(count, dtype=np.int64)
        rule_text = np.full(count, "", dtype=object) if self.constrained else None
        for s, shape in enumerate(self.shapes):
            per_shape = np.minimum(shape.count, np.bincount(ids[ok], self.caps[s][ok], count).astype(np.int64))
            if rule_text is not None:  # constrained
                for key in self.self_anti_keys(s):
                    spots = self._distinct_domains(s, key)
                    short = (spots < max(self.needed, 1)) & (spots <= per_shape)
                    want = min(shape.count, max(self.needed, 1))
                    unit = "nodes" if key.endswith("hostname") else f"{key.rsplit('/', 1)[-1]} domains"
                    rule_text[short] = [f"anti-affinity on {key}: {want} members need {want} {unit}, {int(n)} eligible"
                                        for n in spots[short]]
                    per_shape = np.minimum(per_shape, spots)
            placed += per_shape
        placed = np.minimum(placed, np.bincount(ids[ok], self.pods_ub[ok], count).astype(np.int64))
        eligible = ok & np.any(np.stack([s.eligibility.mask for s in self.shapes]), axis=0)
        cheapest = np.min(np.stack([s.vec for s in self.shapes]), axis=0)
        needed = max(self.needed, 1)
        worst = np.full(count, np.inf)
        binding = np.full(count, -1)
        totals: dict[int, np.ndarray] = {}
        for j in np.nonzero(cheapest)[0]:
            total = np.bincount(ids[eligible], self.snapshot.free[eligible, j], count)
            totals[int(j)] = total
            fit = (total // cheapest[j]).astype(np.int64)
            placed = np.minimum(placed, fit)
            ratio = total / (float(cheapest[j]) * needed)  # in floats: a huge request times needed overflows int64
            tighter = (fit < needed) & (ratio < worst)
            worst[tighter] = ratio[tighter]
            binding[tighter] = j
        order, starts, _ = self._by_domain
        out = []
        for d in self.candidate_domains:
            b = int(binding[d])
            out.append(DomainBound(
                d,
                min(int(placed[d]), self.pending_total),
                order[starts[d]:starts[d + 1]],
                self.snapshot.resources[b] if b >= 0 else "",
                int(cheapest[b]) * needed if b >= 0 else 0,
                int(totals[b][d]) if b >= 0 else 0,
                rule_text[d] if rule_text is not None and placed[d] < max(self.needed, 1) else "",
            ))
        return out

    def self_anti_keys(self, s: int) -> list[str]:
        """Topology keys on which shape ``s`` may have at most one pod per domain."""
        if self.rules.empty:
            return []
        keys = [r.key for r in self.rules.anti if r.shape == s and r.self_match]
        terms = self.shapes[s].pods[0].spec.pod_anti_affinity
        nodes = [t.topology_key for t in terms if any(
            lim.shapes == (s,) and lim.reason.endswith(f"on {t.topology_key}") for lim in self.rules.limits)]
        return list(dict.fromkeys(keys + nodes))

    def _distinct_domains(self, s: int, key: str) -> np.ndarray:
        """Per required domain: how many ``key`` domains hold a node that can host a pod of ``s``."""
        sub = self.snapshot.domains(key)[1]
        hosts = (self.caps[s] > 0) & (self.domain_ids >= 0) & (sub >= 0)
        pairs = (np.unique(np.stack([self.domain_ids[hosts], sub[hosts]]), axis=1) if hosts.any()
                 else np.zeros((2, 0), int))
        return np.bincount(pairs[0], minlength=len(self.domain_values)).astype(np.int64)

    def objective_lower_bound(self, bound: DomainBound, placed: int, tight: bool = True) -> Objective:
        """No placement of ``placed`` pods in the domain scores better than this. ``tight=False``
        gives the looser bound that orders the domains (the order decides between domains whose
        best placements score the same, so it stays what it was when only this bound existed)."""
        order, starts, cum = self._by_domain
        lo, hi = starts[bound.domain], starts[bound.domain + 1]
        offset = cum[lo - 1] if lo > 0 else 0
        nodes = int(np.searchsorted(cum[lo:hi] - offset, placed)) + 1 if placed > 0 else 0
        max_main = max(s.main for s in self.shapes)
        hosts = order[lo:hi]
        lost = 0
        if tight and self.keep_largest:
            lost, kept = self._largest_lost_bound(bound, hosts, placed)
            if kept is not None:
                # a placement that loses nothing leaves the one roomiest host alone: count the rest
                hosts = kept
                nodes = int(np.searchsorted(np.cumsum(np.sort(self.pods_ub[kept])[::-1]), placed)) + 1
        k = min(nodes, len(hosts))
        stranded = 0
        if k > 0 and (tight or self.constrained):
            # a placement on more nodes than `nodes` already scores worse; one on exactly `nodes`
            # touches `k` hosts, each left with at least its free main resource less what its bound
            # of pods can take (rules keep pods off nodes they would fill)
            per_node = self.pods_ub[hosts] if not tight else np.minimum(self.pods_ub[hosts], placed)
            residue = np.maximum(self.free_main[hosts] - per_node * max_main, 0)
            stranded = int(np.partition(residue, k - 1)[:k].sum())
            if tight:
                # and together they strand their free main resource less what the pods take:
                # at least the `k` smallest frees less `placed` pods of the largest main request
                free = self.free_main[hosts]
                stranded = max(stranded, int(np.partition(free, k - 1)[:k].sum()) - placed * max_main)
                if k == 1:
                    # one node holds them all: only a host whose bound takes `placed` pods can, and
                    # it strands at least its free main resource less theirs — the best-fit node a
                    # greedy packing picks meets this, so a small gang's greedy answer is proven
                    # and no CP-SAT model is built for it
                    able = hosts[self.pods_ub[hosts] >= placed]
                    if len(able):
                        stranded = max(stranded, int(np.maximum(self.free_main[able] - placed * max_main, 0).min()))
        levels = len(self.group.preferred_keys)
        return Objective(
            unplaced=self.pending_total - placed,
            preference=0,
            spread=(1 if placed else 0,) * levels,
            nodes=nodes,
            stranded=stranded,
            domain_free=max(0, int(self.domain_free_main[bound.domain]) - placed * max_main),
            largest_lost=lost,
        )

    def _largest_lost_bound(self, bound: DomainBound, hosts: np.ndarray, placed: int) -> tuple[int, np.ndarray | None]:
        """No placement of ``placed`` pods in the domain loses less of its roomiest node than the
        first value: when the hosts hold them only with every roomiest node touched, the step from
        the roomiest free main resource down to the next; else 0. The second, when one host alone
        is the roomiest and the others hold the pods: those others (a placement that loses nothing
        uses them only), else None."""
        if placed <= 0 or len(hosts) == 0:
            return 0, None
        free = self.free_main
        in_domain = self.domain_ids == bound.domain
        top = int(free[in_domain].max())
        at_top = free[hosts] == top
        if not at_top.any() or int((free[in_domain] == top).sum()) > int(at_top.sum()):
            return 0, None  # a node as roomy that no pod of the group can take always stays whole
        if int(self.pods_ub[hosts].sum()) - int(self.pods_ub[hosts[at_top]].min()) >= placed:
            return 0, (hosts[~at_top] if int(at_top.sum()) == 1 else None)
        rest = in_domain & (free < top)
        return top - (int(free[rest].max()) if rest.any() else 0), None

    @cached_property
    def weights(self) -> Weights:
        levels = tuple(int(p.max()) + 1 if len(p) else 1 for p in self.pref)
        per_domain = np.bincount(self.domain_ids[self.domain_ids >= 0], minlength=len(self.domain_values))
        nodes_max = int(per_domain.max()) if len(per_domain) else 0
        main_max = int(self.domain_free_main.max()) if len(self.domain_free_main) else 0
        pref_max = self.rules.max_soft_penalty([s.count for s in self.shapes]) if not self.rules.empty else 0
        node_main_max = int(self.free_main.max()) if len(self.free_main) else 0
        return Weights.for_instance(self.pending_total, levels, nodes_max, main_max, pref_max, node_main_max)


def evaluate(snapshot: Snapshot, group: PodGroup, assignments: Mapping[str, str],
             problem: "Problem | None" = None) -> Objective:
    """Score a placement (pod uid -> node name) of ``group``'s pending pods on ``snapshot``.
    ``problem`` (the group's :class:`solver.problem.Problem`) is built when soft rules need it."""
    pending = group.pending
    by_uid = {p.uid: p for p in pending}
    main = main_resource(pending)
    j = snapshot.rindex.get(main)
    placed_main: dict[int, int] = {}
    for uid, node in assignments.items():
        i = snapshot.index[node]
        placed_main[i] = placed_main.get(i, 0) + (by_uid[uid].spec.requests.get(main, 0) if main != PODS else 1)
    touched = sorted(placed_main)
    free_main = snapshot.free[:, j] if j is not None else np.zeros(len(snapshot.nodes), dtype=np.int64)
    stranded = int(sum(max(0, int(free_main[i]) - placed_main[i]) for i in touched))
    spread = tuple(
        len({int(ids[i]) for i in touched}) for ids in preferred_paths(snapshot, group.preferred_keys)
    )
    domain_free = largest_lost = 0
    if touched:
        values, dom_ids = snapshot.domains(group.topology_key)
        d = dom_ids[touched[0]]
        in_domain = dom_ids == d
        domain_free = int(free_main[in_domain].sum()) - sum(placed_main.values())
        if problem is None or problem.keep_largest:
            largest_lost = _largest_lost(free_main, in_domain, touched)
    preference = 0
    if problem is None and any(s.preferred_affinity or s.preferred_anti_affinity or s.spread
                               for s in {id(p.spec): p.spec for p in pending}.values()):
        problem = Problem(snapshot, group)
    if problem is not None and problem.rules.soft_terms:
        preference = soft_penalty(problem, assignments)
    return Objective(
        unplaced=len(pending) - len(assignments),
        preference=preference,
        spread=spread,
        nodes=len(touched),
        stranded=stranded,
        domain_free=domain_free,
        largest_lost=largest_lost,
    )


def _largest_lost(free_main: np.ndarray, in_domain: np.ndarray, touched: list[int]) -> int:
    """The objective's ``largest_lost``: the domain's largest free main resource less the largest
    among the domain's nodes the placement leaves untouched (0 when none is left)."""
    untouched = in_domain.copy()
    untouched[touched] = False
    top = int(free_main[in_domain].max())
    return top - (int(free_main[untouched].max()) if untouched.any() else 0)
