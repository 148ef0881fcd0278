"""The CP-SAT paths give the answers they gave when the answers were recorded: the same placements,
objectives, per-domain model values and bounds, and the same preemption plans, instance by instance
(see :mod:`tests.unit.solver_recorded`). A refactoring of the models must keep every one."""

import json

import pytest

from .solver_recorded import PLACEMENT_SEEDS, PREEMPTION_SEEDS, RECORDED, placement_answer, preemption_answer

RECORDED_ANSWERS = json.loads(RECORDED.read_text())


def _as_json(answer):
    return json.loads(json.dumps(answer, sort_keys=True))


@pytest.mark.parametrize("seed", PLACEMENT_SEEDS)
def test_placement_answers_are_the_recorded_ones(seed):
    assert _as_json(placement_answer(seed)) == RECORDED_ANSWERS["placement"][str(seed)]


@pytest.mark.parametrize("seed", PREEMPTION_SEEDS)
def test_preemption_plans_are_the_recorded_ones(seed):
    assert _as_json(preemption_answer(seed)) == RECORDED_ANSWERS["preemption"][str(seed)]


def test_the_recorded_instances_reach_every_model_part():
    """The fixture is worth something only if its instances exercise the models: exact placements in
    several domains, with and without a proof, and preemption plans that evict."""
    placements = RECORDED_ANSWERS["placement"].values()
    domains = [d for a in placements for d in a["domains"]]
    assert sum("picks" in d for d in domains) >= 30
    assert any(d.get("infeasible") for d in domains)
    assert sum(bool(a["assignments"]) for a in placements) >= 20
    plans = RECORDED_ANSWERS["preemption"].values()
    assert sum(bool(p["victims"]) for p in plans) >= 8
    assert any(p["stats"].get("domains_solved", 0) > 0 for p in plans)
