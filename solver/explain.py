"""Why a group does not fit: per-domain shortfalls, excluded nodes, the nearest miss.

The text is plain and short enough for a Kubernetes condition message and a kube-scheduler
failure reason, e.g. ``rack r7: needs 64 nvidia.com/gpu, 40 free``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import DomainBound, Problem

#: Domains listed in a message before the rest are summarised as a count.
MAX_DOMAINS_LISTED = 5


#: what limits a domain: room that more nodes of its kind would add, or anything else (no eligible
#: node: taints, selectors, cordons; the pods' own rules) that new nodes need not cure
CAPACITY, ELIGIBILITY, RULE = "capacity", "eligibility", "rule"


@dataclass(frozen=True)
class DomainShortfall:
    domain: str
    fits: int  # pods that fit at most
    needed: int
    detail: str  # why, without the domain's name
    value: str = ""  # the domain's topology value ("" without a topology key)
    kind: str = CAPACITY  # CAPACITY, ELIGIBILITY or RULE

    @property
    def missing(self) -> int:
        """Pods of the group that do not fit in the domain (by ``fits``: a bound, not a proof,
        when the totals alone ruled the domain out)."""
        return max(self.needed - self.fits, 0)

    def __str__(self) -> str:
        return f"{self.domain}: {self.detail}"


@dataclass(frozen=True)
class Explanation:
    group: str
    needed: int
    domains: tuple[DomainShortfall, ...]  # nearest miss first
    excluded: tuple[tuple[str, int], ...]  # (reason, node count) over the whole cluster
    summary: str = ""

    def message(self) -> str:
        parts = [self.summary] if self.summary else []
        parts += _collapse(self.domains)
        if self.excluded:
            parts.append("nodes excluded: " + ", ".join(f"{n} {r}" for r, n in self.excluded))
        return f"podgroup {self.group}: " + "; ".join(parts)


def _collapse(domains: tuple[DomainShortfall, ...]) -> list[str]:
    """Merge domains that fail for the same reason: ``rack r1, r2 (+6 more): needs 72 ...``."""
    merged: dict[str, list[str]] = {}
    for d in domains:
        merged.setdefault(d.detail, []).append(d.domain)
    lines = []
    for detail, labels in list(merged.items())[:MAX_DOMAINS_LISTED]:
        kind = labels[0].split(" ", 1)[0]
        names = [label.split(" ", 1)[-1] for label in labels]
        shown = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        lines.append(f"{kind} {shown}: {detail}" if kind != shown else f"{shown}: {detail}")
    if len(merged) > MAX_DOMAINS_LISTED:
        lines.append(f"{sum(len(v) for v in list(merged.values())[MAX_DOMAINS_LISTED:])} more domains do not fit")
    return lines


def _domain_label(problem: Problem, d: int) -> str:
    key = problem.group.topology_key
    if not key:
        return "cluster"
    short = key.rsplit("/", 1)[-1]
    return f"{short} {problem.domain_values[d]}"


def _shortfall(problem: Problem, bound: DomainBound, greedy_fits: int | None, hosts: "_Hosts") -> DomainShortfall:
    label = _domain_label(problem, bound.domain)
    needed = max(problem.needed, 1)
    fits = bound.placed_ub if greedy_fits is None else greedy_fits
    kind = CAPACITY
    if len(bound.nodes) == 0:
        detail, kind = _no_host(hosts, bound.domain)
    elif bound.rule:
        detail, kind = bound.rule, RULE
    elif problem.constrained and greedy_fits is not None:
        kind = RULE
        detail = f"the pods' own rules ({_rule_names(problem)}) leave room for at most {fits} of {needed} pods"
    elif bound.binding:
        detail = f"needs {bound.need} {bound.binding}, {bound.have} free"
    else:
        detail = f"capacity is fragmented, at most {fits} of {needed} pods fit on its nodes"
    value = problem.domain_values[bound.domain] if problem.group.topology_key else ""
    return DomainShortfall(label, fits, needed, detail, value, kind)


def _rule_names(problem: Problem) -> str:
    """The kinds of rule the group's pods carry, for a message."""
    rules = problem.rules
    kinds = []
    if rules.anti or any("anti-affinity" in lim.reason for lim in rules.limits) or rules.pairs:
        kinds.append("anti-affinity")
    if rules.coloc:
        kinds.append("pod affinity")
    kinds += [f"topology spread on {sp.key} maxSkew {sp.skew}" for sp in rules.spreads if sp.hard]
    if any("host port" in lim.reason for lim in rules.limits):
        kinds.append("host ports")
    if any(lim.reason.startswith("volume") for lim in rules.limits) or rules.totals:
        kinds.append("volumes")
    return ", ".join(dict.fromkeys(kinds)) or "placement rules"


class _Hosts:
    """Per shape and domain, what :func:`_no_host` reads — eligible nodes, those still open to the
    group, the most free of each resource on one open node — from one pass over the nodes (not one
    per domain: a gang that fits in none of 200 racks is explained in a few milliseconds)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self._per_shape: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def of(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = self._per_shape.get(s)
        if found is None:
            problem = self.problem
            ids, domains = problem.domain_ids, len(problem.domain_values)
            eligible = problem.shapes[s].eligibility.mask & (ids >= 0)
            cut = problem.snapshot.cut
            open_ = eligible & ~cut if cut is not None else eligible
            free = problem.snapshot.free
            most = np.full((domains, free.shape[1]), -1, dtype=np.int64)
            np.maximum.at(most, ids[open_], free[open_])
            found = (np.bincount(ids[eligible], minlength=domains), np.bincount(ids[open_], minlength=domains), most)
            self._per_shape[s] = found
        return found


def _no_host(hosts: _Hosts, d: int) -> tuple[str, str]:
    """Why not one node of the domain can take a single member: the most lacking resource (a
    capacity shortfall), or no eligible node at all (not one)."""
    problem = hosts.problem
    for s, shape in enumerate(problem.shapes):
        eligible, open_, most_free = hosts.of(s)
        if not eligible[d]:
            return "no eligible node", ELIGIBILITY
        if not open_[d]:
            # taken out before the solve, not full: kube-scheduler's filters, the domain the
            # group keeps, another gang's hold or the queue's domain choice
            return "no node here is open to the group (filtered out, held, or outside the domain it keeps)", \
                ELIGIBILITY
        worst = None
        for j in np.nonzero(shape.vec)[0]:
            most = int(most_free[d, j])
            if most < shape.vec[j] and (worst is None or most / shape.vec[j] < worst[0]):
                worst = (most / shape.vec[j], problem.snapshot.resources[j], int(shape.vec[j]), most)
        if worst is not None:
            _, resource, need, most = worst
            lacking = f"a pod needs {need} {resource}, at most {most} free on one node"
            return f"no node can host a member: {lacking}", CAPACITY
    return "no node can host a member", CAPACITY


def explain(problem: Problem, bounds: list[DomainBound], greedy_fits: dict[int, int]) -> Explanation:
    """Explain an infeasible group. ``greedy_fits`` holds, for domains whose totals passed, how
    many pods the packing managed (so fragmentation is reported as such)."""
    group = problem.group
    unknown = sorted({r for s in problem.shapes for r in s.unknown})
    summary = ""
    if unknown:
        summary = "no node offers " + ", ".join(unknown)
    elif group.topology_key and not problem.domain_values:
        summary = f"no node has the topology label {group.topology_key}"
    elif not bounds:
        summary = "no candidate domain"
    hosts = _Hosts(problem)
    shortfalls = sorted(
        (_shortfall(problem, b, greedy_fits.get(b.domain), hosts) for b in bounds),
        key=lambda s: (-s.fits, s.domain),
    )
    excluded: dict[str, int] = {}
    for shape in problem.shapes:
        for reason, count in shape.eligibility.excluded.items():
            excluded[reason] = max(excluded.get(reason, 0), count)
    if group.topology_key:
        missing = int((problem.domain_ids < 0).sum())
        if missing:
            excluded["missing topology label"] = missing
    return Explanation(
        group=group.key,
        needed=max(problem.needed, 1),
        domains=tuple(shortfalls),
        excluded=tuple(sorted(excluded.items())),
        summary=summary,
    )
