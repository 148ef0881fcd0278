"""The parts every phalanx CP-SAT model is built from, shared by placement and preemption.

Both models place a group's pods inside one domain, so both need the same pieces:

- **node classes with packing patterns** (the cutting-stock formulation): nodes that are
  interchangeable for the group form a class with a count, a *pattern* is what one node of the class
  can host (pods per shape), and a variable per pattern says how many nodes of the class take it —
  exact, with no relaxation, and a few dozen integers for a 1,000-pod gang;
- **the group's size**: no shape placed beyond its pending pods, and at least the gang's minimum;
- **indicators**: a boolean forced to 1 whenever some count is positive ("this domain is used",
  "some victim of this level is evicted");
- **one solve**: a single worker and a fixed seed with a deterministic-time budget, so the same
  instance gets the same answer on every run.

:class:`ModelBuilder` holds them; every variable it creates carries a name that says what it is
(``x[class=3,pattern=(2, 0)]``, ``evict[unit=default/web-0]``), so a model dump reads as the
formulation. :mod:`solver.exact` (placement) and :mod:`solver.preemption` add their own parts on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

#: Patterns enumerated per class before the model is declared too large for the exact path.
MAX_PATTERNS_PER_CLASS = 4000

#: A pattern: pods per shape on one node.
Pattern = tuple[int, ...]


class ModelTooLarge(Exception):
    """A mixed-shape class has more packing patterns than the exact path enumerates."""


def packing_patterns(caps: tuple[int, ...], free: np.ndarray, vecs: Sequence[np.ndarray]) -> list[Pattern]:
    """Non-empty pod-count vectors (one entry per shape) that fit on one node of a class: ``caps`` is
    the most pods of each shape one node takes alone, ``free`` the node's free vector and ``vecs`` each
    shape's request over the same resources. Raises :class:`ModelTooLarge` past
    :data:`MAX_PATTERNS_PER_CLASS`."""
    if len(caps) == 1:
        return [(n,) for n in range(1, caps[0] + 1)]
    out: list[Pattern] = []

    def walk(s: int, left: np.ndarray, prefix: Pattern) -> None:
        if s == len(caps):
            if any(prefix):
                out.append(prefix)
                if len(out) > MAX_PATTERNS_PER_CLASS:
                    raise ModelTooLarge(f"more than {MAX_PATTERNS_PER_CLASS} packing patterns")
            return
        for n in range(caps[s] + 1):
            rest = left - vecs[s] * n
            if np.any(rest < 0):
                break
            walk(s + 1, rest, prefix + (n,))

    walk(0, free, ())
    return out


@dataclass(frozen=True)
class Solved:
    """A feasible answer of one solve: variable values, whether it is proven optimal, the objective
    and CP-SAT's proven bound on it."""

    solver: cp_model.CpSolver
    optimal: bool

    def value(self, var: cp_model.LinearExprT) -> int:
        return int(self.solver.value(var))

    @property
    def objective(self) -> int:
        return int(round(self.solver.objective_value))

    @property
    def bound(self) -> int:
        return int(round(self.solver.best_objective_bound))


class _CpModel(cp_model.CpModel):
    """ortools' CpModel without the camel-case aliases its constructor sets on every instance (one
    per ``add_``/``new_``/``clear_`` method, ~2.5 ms a model: a tenth of a small gang's cycle at
    5,000 nodes). phalanx calls only the snake-case names (ortools pinned in pyproject.toml)."""

    def _add_pre_pep8_methods(self) -> None:
        pass


class ModelBuilder:
    """One CP-SAT model under construction, with the group's pods per shape (``placed``) that the
    placement parts add to and the size rule reads."""

    def __init__(self, shapes: int) -> None:
        self.model: cp_model.CpModel = _CpModel()
        #: per shape, the terms that count its pods placed by the model
        self.placed: list[list[cp_model.LinearExprT]] = [[] for _ in range(shapes)]

    def int_var(self, upper: int, name: str) -> cp_model.IntVar:
        return self.model.new_int_var(0, upper, name)

    def bool_var(self, name: str) -> cp_model.IntVar:
        return self.model.new_bool_var(name)

    def indicator(self, name: str, *bounded: tuple[cp_model.LinearExprT, int]) -> cp_model.IntVar:
        """A boolean that must be 1 when any ``expr`` of the ``(expr, bound)`` pairs is positive
        (``expr <= bound * y``; ``bound`` is the most ``expr`` can be)."""
        y = self.bool_var(name)
        for expr, bound in bounded:
            self.model.add(expr <= bound * y)
        return y

    def node_class(self, name: str, count: int, patterns: Sequence[Pattern]) -> list[cp_model.IntVar]:
        """How many of ``count`` interchangeable nodes take each pattern (one variable per pattern, in
        order); their pods count in :attr:`placed`, and together they use at most ``count`` nodes."""
        variables = []
        for pattern in patterns:
            var = self.int_var(count, f"x[{name},pattern={pattern}]")
            variables.append(var)
            for s, n in enumerate(pattern):
                if n:
                    self.placed[s].append(var * n)
        if variables:
            self.model.add(sum(variables) <= count)
        return variables

    def group_size(self, counts: Sequence[int], needed: int) -> cp_model.LinearExprT | None:
        """No shape placed beyond its ``counts`` of pending pods and at least ``needed`` pods (one at
        the least) in all; the pods placed, or None when no part of the model places any."""
        totals: list[cp_model.LinearExprT] = []
        for terms, count in zip(self.placed, counts, strict=True):
            if terms:
                self.model.add(sum(terms) <= count)
                totals.append(sum(terms))
        if not totals:
            return None
        placed = sum(totals)
        self.model.add(placed >= max(needed, 1))
        return placed

    def solve(self, seed: int, deterministic_time: float, time_limit: float) -> Solved | None:
        """Solve on one worker with ``seed`` (reproducible); None when no feasible answer is found."""
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = seed
        solver.parameters.max_deterministic_time = deterministic_time
        solver.parameters.max_time_in_seconds = time_limit
        status = solver.solve(self.model)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        return Solved(solver, status == cp_model.OPTIMAL)
