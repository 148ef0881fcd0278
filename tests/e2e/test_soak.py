"""The short soak: two minutes of fast churn on the real control plane (the driver of ``phalanx bench
soak --real``, ``bench/soak_real.py``): gang StatefulSets created, scaled and deleted through
phalanx's controller, high-priority gangs preempting them, nodes added and drained away; then every
unit deleted. Asserted: no invariant violation at any rest, and phalanx serve's and the controller's
collections bounded by structure, not by time — none ever held more entries than there were live
pods, PodGroups and nodes, and after the drain each is back to its size before the churn (plus
the nodes the run added). The run creates several times more objects than are ever live at once,
so a map that kept an entry per pod or group would break both bounds."""

from __future__ import annotations

import pytest
from harness.faults import fault_control_plane

from bench.soak_bench import analyse
from bench.soak_real import RealSoak

CHURN_SECONDS = 110.0


@pytest.fixture
def soak_plane():
    with fault_control_plane("phalanx-e2e-soak-") as plane:
        yield plane


def test_short_soak(soak_plane):
    lines: list[str] = []
    # a small cluster (2 racks x 4 nodes x 8 CPUs) churned fast: many more objects pass through it
    # than are ever live at once
    run = RealSoak(duration=CHURN_SECONDS, interval=10.0, rest_every=35.0, racks=2, nodes_per_rack=4,
                   log=lines.append, pause=(0.2, 0.8)).run_on(soak_plane)
    a = analyse(run)
    soak_plane.keep_logs = soak_plane.keep_logs or bool(run["violations"])
    log = "\n".join(lines[-60:]) + f"\nlogs: {soak_plane.workdir}/logs"
    assert run["violations"] == [], log
    # a rest is reached, or held off only by gangs partly bound with no room for the rest (a
    # StatefulSet scaled up past the free room: its pods bound before stay): the soak's own rule,
    # which counts those as ``partial_no_room`` and any other rest not reached as a violation
    assert len(run["rests"]) >= 3 and all(r["at_rest"] or r["partial_no_room"] for r in run["rests"]), \
        f"{log}\nrests: {run['rests']}"
    created = sum(run["created"].values())
    assert created > 2 * a["peak_live_objects"], f"too little churn to tell a leak: {run['created']}, " \
                                                 f"peak live {a['peak_live_objects']}"
    assert any(k.startswith("cycle.") for k in a["collections"]) and any(
        k.startswith("controller.") for k in a["collections"]), sorted(a["collections"])
    assert a["unbounded"] == [], {k: a["collections"][k] for k in a["unbounded"]}
    assert a["drained"] and a["left_over_after_drain"] == {}, a["left_over_after_drain"]
