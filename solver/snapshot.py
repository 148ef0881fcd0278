"""An immutable view of the cluster for one scheduling cycle.

The solver never reads a live cache: a cycle builds one :class:`Snapshot` (nodes, bound pods,
reservations) and every answer is computed against it. Capacities are held as numpy matrices
(nodes x resources, integer base units) so that capacity checks over thousands of nodes are
vector operations, not Python loops. Derived indexes (topology domains, eligibility masks per
pod constraint signature) are computed lazily and cached; they never change because the snapshot
does not. What-if edits (a batch placing one group after another, a preemption trial) go through
:meth:`Snapshot.with_usage` and :meth:`Snapshot.without_pods`, which share every static part and copy
only the usage matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Mapping

import numpy as np

from .errors import InvalidInput
from .model import PODS, Node, Pod, PodSpec, Taint, TaintEffect, VolumeInventory, placement_usage


def constraint_signature(spec: PodSpec) -> tuple[object, ...]:
    """Everything about a pod that decides node eligibility (not capacity)."""
    return spec.eligibility_key


@dataclass(frozen=True)
class Eligibility:
    mask: np.ndarray  # bool per node
    excluded: Mapping[str, int]  # reason -> node count


class Snapshot:
    def __init__(
        self,
        nodes: Iterable[Node],
        bound: Iterable[Pod] = (),
        reserved: Mapping[str, Mapping[str, int]] | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        volumes: VolumeInventory | None = None,
    ) -> None:
        self.nodes: tuple[Node, ...] = tuple(sorted(nodes, key=lambda n: n.name))
        self.index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise InvalidInput(f"duplicate node {node.name}")
            self.index[node.name] = i
        self.bound: tuple[Pod, ...] = tuple(bound)
        #: does a bound pod carry required anti-affinity? Set by a maker that keeps count (a watch
        #: cache); None: :func:`~.constraints.placed_anti_affinity` scans :attr:`bound` once
        self.bound_anti: bool | None = None
        #: pods planned by other groups but not bound yet (kube-scheduler has them assumed): they
        #: count for inter-pod constraints and host ports, never for capacity (``reserved`` does)
        self.assumed: tuple[Pod, ...] = ()
        #: nodes :meth:`only_nodes` took out (shown full, though not for their usage), or None
        self.cut: np.ndarray | None = None
        #: namespace -> labels, for affinity terms with a namespaceSelector
        self.namespaces: Mapping[str, Mapping[str, str]] = dict(namespaces or {})
        self.volumes: VolumeInventory = volumes or VolumeInventory()
        names = {PODS}
        for node in self.nodes:
            names.update(node.allocatable)
        self.resources: tuple[str, ...] = tuple(sorted(names))
        self.rindex = {r: j for j, r in enumerate(self.resources)}
        self.allocatable = np.zeros((len(self.nodes), len(self.resources)), dtype=np.int64)
        for i, node in enumerate(self.nodes):
            for r, amount in node.allocatable.items():
                self.allocatable[i, self.rindex[r]] = amount
        self.used = np.zeros_like(self.allocatable)
        for pod in self.bound:
            self._charge(self.used, pod.node, pod.spec.requests, pods=1, what=f"pod {pod.key}")
        for node_name, amounts in (reserved or {}).items():
            self._charge(self.used, node_name, amounts, pods=amounts.get(PODS, 0), what="reservation")
        #: Derived values (cache key -> an array, domains, an Eligibility) that the solver's modules
        #: compute once per snapshot. ``usage_cache`` holds what depends on usage (per snapshot);
        #: ``node_cache`` what depends on the nodes only (shared by every what-if copy).
        self.usage_cache: dict[Hashable, Any] = {}
        self.node_cache: dict[Hashable, Any] = {}

    # -- to a solver worker process --------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process needs: everything but the derived caches, which the copy
        computes again as its solves ask (they hold arrays per constraint signature and per domain
        key: often larger than the snapshot, and cheap to rebuild where the solve runs)."""
        state = dict(self.__dict__)
        state["usage_cache"], state["node_cache"] = {}, {}
        return state

    # -- construction helpers -------------------------------------------------------------
    def _charge(self, used: np.ndarray, node: str, amounts: Mapping[str, int], pods: int, what: str) -> None:
        i = self.index.get(node)
        if i is None:
            raise InvalidInput(f"{what} is on node {node!r}, which is not in the snapshot")
        for r, amount in amounts.items():
            if r == PODS:
                continue
            j = self.rindex.get(r)
            if j is not None:  # a resource no node offers consumes nothing we track
                used[i, j] += amount
        used[i, self.rindex[PODS]] += pods

    def _clone(self, copy_used: bool = True) -> "Snapshot":
        """A copy sharing nodes, indexes and the static caches, with its own usage matrix (the
        caller sets it when ``copy_used`` is False)."""
        clone = object.__new__(Snapshot)
        clone.__dict__.update(self.__dict__)
        if copy_used:
            clone.used = self.used.copy()
        clone.usage_cache = {}
        return clone

    def with_usage(self, extra: Mapping[str, Mapping[str, int]]) -> "Snapshot":
        """A new snapshot with ``extra`` (node -> amounts, ``pods`` counted as given) also used.
        Shares nodes, indexes and eligibility caches; copies only the usage matrix."""
        clone = self._clone()
        for node_name, amounts in extra.items():
            self._charge(clone.used, node_name, amounts, pods=amounts.get(PODS, 0), what="usage")
        return clone

    def with_used(self, used: np.ndarray, bound: Iterable[Pod] | None = None,
                  bound_anti: bool | None = None) -> "Snapshot":
        """A new snapshot over the same nodes with the usage matrix ``used`` (nodes x
        :attr:`resources`, as kept incrementally by a watch cache) and, optionally, the bound pods
        behind it (with ``bound_anti``, :attr:`bound_anti`, when the caller counts it). Shares every
        static part; O(nodes x resources) instead of O(pods)."""
        if used.shape != self.allocatable.shape:
            raise InvalidInput(f"usage matrix has shape {used.shape}, expected {self.allocatable.shape}")
        clone = self._clone(copy_used=False)
        clone.used = used.copy()
        if bound is not None:
            clone.bound = tuple(bound)
            clone.bound_anti = bound_anti
        return clone

    def with_context(
        self,
        assumed: Iterable[Pod] | None = None,
        namespaces: Mapping[str, Mapping[str, str]] | None = None,
        volumes: VolumeInventory | None = None,
    ) -> "Snapshot":
        """A new snapshot sharing everything, with the given inter-pod and volume context replaced:
        ``assumed`` pods (each with its planned ``node``), namespace labels, volume inventory."""
        clone = self._clone()
        if assumed is not None:
            clone.assumed = tuple(assumed)
        if namespaces is not None:
            clone.namespaces = dict(namespaces)
        if volumes is not None:
            clone.volumes = volumes
        return clone

    @property
    def placed_pods(self) -> tuple[Pod, ...]:
        """Every pod that sits on a node for the inter-pod rules: bound plus assumed."""
        return self.bound + self.assumed if self.assumed else self.bound

    def only_nodes(self, allowed: Iterable[str]) -> "Snapshot":
        """A new snapshot in which every node outside ``allowed`` has no free capacity (e.g.
        kube-scheduler's own filters excluded it). Shares every static part."""
        keep = np.zeros(len(self.nodes), dtype=bool)
        for name in allowed:
            i = self.index.get(name)
            if i is not None:
                keep[i] = True
        if keep.all():
            return self
        clone = self._clone()
        clone.used[~keep] = np.maximum(clone.used[~keep], clone.allocatable[~keep])
        clone.cut = ~keep if self.cut is None else self.cut | ~keep
        return clone

    def without_pods(self, uids: Iterable[str]) -> "Snapshot":
        """A new snapshot where the bound pods ``uids`` are gone (a preemption trial): their usage
        is released and they leave :attr:`bound`. Shares every static part, like :meth:`with_usage`."""
        gone = set(uids)
        missing = gone - {p.uid for p in self.bound}
        if missing:
            raise InvalidInput(f"pods {sorted(missing)} are not bound in the snapshot")
        clone = self._clone()
        clone.bound = tuple(p for p in self.bound if p.uid not in gone)
        clone.bound_anti = None
        for pod in self.bound:
            if pod.uid in gone:
                released = {r: -amount for r, amount in pod.spec.requests.items()}
                self._charge(clone.used, pod.node, released, pods=-1, what=f"pod {pod.key}")
        return clone

    def with_placement(self, placement: Mapping[str, str], pods: Mapping[str, Pod]) -> "Snapshot":
        """A new snapshot where the pods of ``placement`` (uid -> node) also use their nodes."""
        return self.with_usage(placement_usage(placement, {uid: pods[uid].spec.requests for uid in placement}))

    # -- capacity -----------------------------------------------------------------------
    @property
    def free(self) -> np.ndarray:
        cached: np.ndarray | None = self.usage_cache.get(("free",))
        if cached is None:
            cached = np.maximum(self.allocatable - self.used, 0)
            self.usage_cache[("free",)] = cached
        return cached

    def request_vector(self, requests: Mapping[str, int]) -> tuple[np.ndarray, list[str]]:
        """Requests as a vector over :attr:`resources` (pods = 1), plus the names of requested
        resources that no node offers (such a pod fits nowhere)."""
        vec = np.zeros(len(self.resources), dtype=np.int64)
        unknown = []
        for r, amount in requests.items():
            j = self.rindex.get(r)
            if j is None:
                if amount > 0:
                    unknown.append(r)
            else:
                vec[j] = amount
        vec[self.rindex[PODS]] = 1
        return vec, sorted(unknown)

    # -- labels and topology ----------------------------------------------------------------
    def label_values(self, key: str) -> np.ndarray:
        """The value of label ``key`` per node (object array; None where absent)."""
        cache_key = ("labels", key)
        cached: np.ndarray | None = self.node_cache.get(cache_key)
        if cached is None:
            cached = np.array([n.labels.get(key) for n in self.nodes], dtype=object)
            self.node_cache[cache_key] = cached
        return cached

    def domains(self, key: str) -> tuple[tuple[str, ...], np.ndarray]:
        """Topology domains of ``key``: the sorted values and the domain id per node (-1 where the
        node lacks the label). An empty key means one domain holding every node."""
        cache_key = ("domains", key)
        cached: tuple[tuple[str, ...], np.ndarray] | None = self.node_cache.get(cache_key)
        if cached is None:
            if not key:
                cached = (("",), np.zeros(len(self.nodes), dtype=np.int64))
            else:
                raw = self.label_values(key)
                values = tuple(sorted({v for v in raw if v is not None}))
                pos = {v: i for i, v in enumerate(values)}
                ids = np.array([pos.get(v, -1) if v is not None else -1 for v in raw], dtype=np.int64)
                cached = (values, ids)
            self.node_cache[cache_key] = cached
        return cached

    # -- eligibility ----------------------------------------------------------------------
    def eligibility(self, spec: PodSpec) -> Eligibility:
        """Which nodes a pod may run on, ignoring capacity, and why the others may not."""
        sig = constraint_signature(spec)
        cache_key = ("elig", sig)
        cached: Eligibility | None = self.node_cache.get(cache_key)
        if cached is not None:
            return cached
        n = len(self.nodes)
        mask = np.ones(n, dtype=bool)
        excluded: dict[str, int] = {}

        def exclude(reason: str, bad: np.ndarray) -> None:
            newly = mask & bad
            count = int(newly.sum())
            if count:
                excluded[reason] = count
                mask[newly] = False

        exclude("unschedulable", self._unschedulable_mask())
        exclude("taint", self.taint_mask(spec))
        for key, value in spec.node_selector.items():
            exclude("selector", self.label_values(key) != value)
        if spec.affinity.terms:
            exclude("affinity", ~self._affinity_mask(spec))
        cached = Eligibility(mask=mask, excluded=excluded)
        self.node_cache[cache_key] = cached
        return cached

    def _unschedulable_mask(self) -> np.ndarray:
        cached: np.ndarray | None = self.node_cache.get(("unsched",))
        if cached is None:
            cached = np.array([n.unschedulable for n in self.nodes], dtype=bool)
            self.node_cache[("unsched",)] = cached
        return cached

    def taint_mask(self, spec: PodSpec) -> np.ndarray:
        """True where a NoSchedule/NoExecute taint is not tolerated. Evaluated once per distinct
        taint set: clusters have few of them."""
        verdict: dict[tuple[Taint, ...], bool] = {}
        out = np.zeros(len(self.nodes), dtype=bool)
        for i, node in enumerate(self.nodes):
            if not node.taints:
                continue
            bad = verdict.get(node.taints)
            if bad is None:
                bad = any(
                    t.effect is not TaintEffect.PREFER_NO_SCHEDULE
                    and not any(tol.tolerates(t) for tol in spec.tolerations)
                    for t in node.taints
                )
                verdict[node.taints] = bad
            out[i] = bad
        return out

    def _affinity_mask(self, spec: PodSpec) -> np.ndarray:
        keys = {r.key for term in spec.affinity.terms for r in term}
        columns = {k: self.label_values(k) for k in keys}
        out = np.zeros(len(self.nodes), dtype=bool)
        for i in range(len(self.nodes)):
            labels = {k: col[i] for k, col in columns.items() if col[i] is not None}
            out[i] = spec.affinity.matches(labels)
        return out
