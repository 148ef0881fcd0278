"""``phalanx bench scale`` at a tiny size: the rows it reports, a gang placed whole in one zone, and
a wrong answer failing the bench."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest

from bench import SUITES
from bench import scale_bench as scale
from cluster.names import LABEL_ZONE
from solver import Placement, PodGroup, Snapshot, SolveOptions
from solver import place as real_place

# 64 nodes in 4 zones of 16 (128 GPUs); a 64-pod gang fits only in the zone kept for it
TINY: dict[str, Any] = dict(nodes=64, pods=400, gang=64, repeats=2, small_repeats=3, zone_nodes=16)


def test_the_suite_is_registered() -> None:
    assert SUITES["scale"] == "bench.scale_bench"


def test_the_layout_leaves_room_for_the_gang_in_one_zone_only() -> None:
    where = scale.layout(64, 400, 64, zone_nodes=16)
    per_node = [0] * 64
    for i in range(400):
        per_node[where.node(i)] += 1
    assert max(per_node) <= scale.GPUS
    free = [sum(scale.GPUS - per_node[n] for n in range(z * 16, z * 16 + 16)) for z in range(4)]
    assert [z for z, f in enumerate(free) if f >= 64] == [where.open_zone]
    with pytest.raises(ValueError):
        scale.layout(64, 500, 64, zone_nodes=16)  # 500 pods leave no zone room for the gang
    with pytest.raises(ValueError):
        scale.layout(16, 10, 64, zone_nodes=16)  # one zone: nothing to choose between


def test_the_rows_and_the_gang_placed_whole_in_one_zone() -> None:
    rows = scale.measure(**TINY, progress=lambda line: None)
    assert [r["what"] for r in rows] == ["start-up sync", "first snapshot", "cycle: 64-pod zone gang",
                                         "cycle: 64-pod zone gang", "cycle: 3-pod gang", "cycle: 3-pod gang"]
    assert all(r["nodes"] == 64 and r["pods"] == 400 and r["rss_mib"] > 0 for r in rows)
    sync = rows[0]
    assert sync["seconds"] >= 0 and sync["peak_rss_mib"] >= sync["rss_mib"]
    assert list(sync["targets"]) == ["sync ≤ 60 s", "RSS ≤ 4 GiB"] and all(sync["targets"].values())
    gangs = rows[2:4]
    assert [r["path"] for r in gangs] == ["greedy", "exact"]
    for r in gangs:
        assert r["placed"] == 64 and r["key"] == LABEL_ZONE and r["repeats"] == 2
        assert (r["zones"], r["zones_with_room"]) == (4, 1)
        assert 0 < r["p50_ms"] <= r["p99_ms"] and all(isinstance(m, bool) for m in r["targets"].values())
    assert list(gangs[0]["targets"]) == ["p99 ≤ 50 ms"] and list(gangs[1]["targets"]) == ["p99 ≤ 1 s"]
    assert all("targets" not in r for r in rows[1:2] + rows[4:])
    assert [(r["path"], r["placed"], r["repeats"]) for r in rows[4:]] == [("greedy", 3, 3), ("exact", 3, 3)]
    table = scale.markdown(rows)
    assert "Simulated cluster" in table and table.count("\n| 64 | 400 |") == 6
    assert "sync ≤ 60 s: MET; RSS ≤ 4 GiB: MET" in table


def test_a_gang_bigger_than_any_zone_fails_the_bench() -> None:
    with pytest.raises(scale.BenchFailed, match="0 of 200 pods placed"):
        scale.measure(**dict(TINY, pods=300, gang=200), progress=lambda line: None)


def _one_pod_moved(placement: Placement) -> Placement:
    """The first pod on the last node, in the last zone (full of bound pods)."""
    first = sorted(placement.assignments)[0]
    return dataclasses.replace(placement, assignments={**placement.assignments, first: "node-00063"})


def _all_on_one_node(placement: Placement) -> Placement:
    node = min(placement.assignments.values())
    return dataclasses.replace(placement, assignments={uid: node for uid in placement.assignments})


@pytest.mark.parametrize("broken, error", [
    (_one_pod_moved, "placed across 2 .*zone domains"),
    (_all_on_one_node, "over capacity"),
])
def test_a_wrong_placement_fails_the_bench(monkeypatch: pytest.MonkeyPatch, broken: Callable[[Placement], Placement],
                                           error: str) -> None:
    def wrong(snapshot: Snapshot, group: PodGroup, options: SolveOptions) -> Placement:
        placement = real_place(snapshot, group, options)
        return broken(placement) if group.topology_key else placement

    monkeypatch.setattr(scale, "place", wrong)
    with pytest.raises(scale.BenchFailed, match=error):
        scale.measure(**TINY, progress=lambda line: None)


def test_run_measures_in_a_fresh_process() -> None:
    rows = scale.run(**TINY)
    assert [r["placed"] for r in rows[2:]] == [64, 64, 3, 3]
