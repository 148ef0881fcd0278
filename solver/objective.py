"""What makes one placement better than another, computed the same way for every path.

The objective is lexicographic, smaller is better:

1. ``unplaced`` — pending members left unplaced (a gang places at least minCount, and all pending
   members when they fit);
1b. ``preference`` — the pods' own soft rules: preferred (anti-)affinity weights and
   ``ScheduleAnyway`` spread excess (see :func:`solver.constraints.preference`), above every packing
   term, so soft anti-affinity lands on distinct nodes whenever room exists;
2. ``spread`` — per preferred topology key, in order, how many distinct domains the group uses
   (keep a group inside one rack, then one block, when the required key allows more);
3. ``domain_free`` — free main resource left in the chosen required domain (best fit over domains:
   the tightest domain that fits, so the roomiest stay whole for the next big gang; inside one
   domain it is the same for every placement of the same pods, so it only chooses the domain);
3b. ``largest_lost`` — how much the domain's roomiest node shrinks: its free main resource less that
   of the roomiest node of the domain the placement leaves untouched (0 when a node as roomy as any
   stays whole). Inside the chosen domain a gang takes smaller nodes when they hold it, and the
   roomiest stays whole for the next pod that needs a whole node; a gang that needs it still takes
   it. Measured on the fragmentation benchmark (docs/benchmarks.md): 13 gangs stranded where 18
   were, for 2% more nodes per gang;
4. ``nodes`` — nodes touched (tight fit: fill nodes rather than sprinkle);
5. ``stranded`` — free main resource left on the touched nodes (least capacity stranded).

The *main resource* is the group's scarcest kind: an extended resource such as
``nvidia.com/gpu`` when the pods request one, else CPU, else the pod count.

Greedy, exact, brute force and the benchmark baselines are all scored by :func:`evaluate`, so
their numbers are comparable; the CP-SAT model encodes exactly this tuple as a weighted sum
(:class:`Weights`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import PODS, Pod, by_shape
from .snapshot import Snapshot

STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage", PODS)


@dataclass(frozen=True, order=True)
class Objective:
    unplaced: int
    preference: int
    spread: tuple[int, ...]
    domain_free: int
    largest_lost: int
    nodes: int
    stranded: int

    def describe(self) -> str:
        spread = ",".join(str(s) for s in self.spread) or "-"
        return (
            f"unplaced={self.unplaced} preference={self.preference} spread={spread} "
            f"domain_free={self.domain_free} largest_lost={self.largest_lost} nodes={self.nodes} "
            f"stranded={self.stranded}"
        )


def main_resource(pods: tuple[Pod, ...] | list[Pod]) -> str:
    """The resource whose placement matters most for this group (see the module docstring)."""
    totals: dict[str, int] = {}
    for members in by_shape(pods).values():
        for r, amount in members[0].spec.requests.items():
            totals[r] = totals.get(r, 0) + amount * len(members)
    extended = sorted((-amount, r) for r, amount in totals.items() if r not in STANDARD_RESOURCES and amount > 0)
    if extended:
        return extended[0][1]
    if totals.get("cpu", 0) > 0:
        return "cpu"
    return PODS


def preferred_paths(snapshot: Snapshot, keys: tuple[str, ...]) -> list[np.ndarray]:
    """Per preferred level, an id per node of the value *path* down to that level, so a rack
    name reused in two blocks counts as two domains."""
    out = []
    path: np.ndarray | None = None
    for key in keys:
        raw = snapshot.label_values(key)
        combined = [(None if path is None else int(path[i]), v) for i, v in enumerate(raw)]
        ids: dict[tuple[int | None, object], int] = {}
        path = np.array([ids.setdefault(c, len(ids)) for c in combined], dtype=np.int64)
        out.append(path)
    return out


@dataclass(frozen=True)
class Weights:
    """Integer weights that make a weighted sum order exactly like :class:`Objective`.

    Each term's weight exceeds the largest possible total of every term below it. ``unit`` divides
    the two main-resource terms when the product would not fit in 62 bits (large CPU clusters);
    then those two terms compare in multiples of ``unit`` base units.
    """

    spread_max: tuple[int, ...]
    nodes_max: int
    stranded_max: int
    domain_free_max: int
    unit: int = 1
    preference_max: int = 0
    lost_max: int = 0

    @classmethod
    def for_instance(cls, pods: int, spread_max: tuple[int, ...], nodes_max: int, main_max: int,
                     preference_max: int = 0, node_main_max: int | None = None) -> "Weights":
        """``main_max`` bounds a domain's free main resource, ``node_main_max`` one node's (the
        largest ``largest_lost``; ``main_max`` when not given)."""
        node_max = main_max if node_main_max is None else node_main_max
        unit = 1
        while True:
            w = cls(spread_max, nodes_max, main_max // unit, main_max // unit, unit, preference_max, node_max // unit)
            worst = Objective(pods, preference_max, spread_max, domain_free=main_max, largest_lost=node_max,
                              nodes=nodes_max, stranded=main_max)
            if w.scalar(worst) < 2**62:
                return w
            unit *= 10

    def scalar(self, obj: Objective) -> int:
        value = obj.unplaced * (self.preference_max + 1) + obj.preference
        for s, smax in zip(obj.spread, self.spread_max, strict=False):
            value = value * (smax + 1) + s
        value = value * (self.domain_free_max + 1) + obj.domain_free // self.unit
        value = value * (self.lost_max + 1) + obj.largest_lost // self.unit
        value = value * (self.nodes_max + 1) + obj.nodes
        return value * (self.stranded_max + 1) + obj.stranded // self.unit

    def coefficients(self) -> tuple[int, tuple[int, ...], int, int, int, int]:
        """Weights of (unplaced, spread levels, nodes, stranded, domain_free, largest_lost) in
        :meth:`scalar`; the preference term's weight is :meth:`preference_weight`."""
        w_st = 1
        w_nodes = self.stranded_max + 1
        w_lost = w_nodes * (self.nodes_max + 1)
        w_df = w_lost * (self.lost_max + 1)
        w = w_df * (self.domain_free_max + 1)
        spread_w = []
        for smax in reversed(self.spread_max):
            spread_w.append(w)
            w *= smax + 1
        return w * (self.preference_max + 1), tuple(reversed(spread_w)), w_nodes, w_st, w_df, w_lost

    def preference_weight(self) -> int:
        w = (self.domain_free_max + 1) * (self.lost_max + 1) * (self.stranded_max + 1) * (self.nodes_max + 1)
        for smax in self.spread_max:
            w *= smax + 1
        return w
