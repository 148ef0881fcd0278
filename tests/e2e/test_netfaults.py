"""The quick network-fault run (the full one is part of ``phalanx bench faults``): a real TCP fault
proxy (Toxiproxy) between kube-scheduler and ``phalanx serve`` and between phalanx and the API
server, a fault of each kind on a link at a moment read from the API, and the API server
throttling phalanx's writes with real 429s (API Priority and Fairness); after each, at rest, the
invariants of the kills plus: every gang that fits bound within the fault's bound, plain pods
bound while plugin mode's serve link is down, serve's threads and memory back near their baseline
(tests/e2e/harness/netfaults.py)."""

from __future__ import annotations

import pytest
from harness.faults import FaultConfig, fault_control_plane
from harness.netfaults import run_net_faults


@pytest.fixture
def fault_plane():
    with fault_control_plane("phalanx-e2e-netfaults-") as plane:
        yield plane


def run_quick(plane, mode: str, sequence: tuple[str, ...], phases: tuple[str, ...], seed: int) -> list[dict]:
    log: list[str] = []
    cfg = FaultConfig(seed=seed, faults=len(sequence), mode=mode, sizes={4: 0.5, 16: 0.5}, sequence=sequence,
                      phases=phases, max_companions=1, max_plain=4, log=log.append)
    summary, rows = run_net_faults(plane, cfg, {})
    bad = [(r["i"], r["kind"], r["phase"], r["violations"]) for r in rows if r["violations"]]
    plane.keep_logs = plane.keep_logs or bool(bad)
    assert len(rows) == len(sequence) and [r["kind"] for r in rows] == list(sequence)
    assert not bad, f"seed {seed}, {mode} mode:\n" + "\n".join(log) + f"\nlogs: {plane.workdir}/logs"
    print("\n" + "\n".join(log))
    return rows


def test_extender_mode_network_faults_and_a_throttling_api_server(fault_plane):
    rows = run_quick(fault_plane, "extender",
                     ("net-blackhole-serve", "net-partition-apiserver", "api-throttle", "net-reset-serve",
                      "api-refuse", "net-bandwidth-apiserver"),
                     ("planned", "recorded", "before", "binding", "before", "planned"), seed=21)
    # every fault was really in place: the proxy held its toxic (or was disabled) while it lasted
    assert all(r["toxics"] or "partition" in r["kind"] for r in rows)
    assert all(r["victim_bound_at_rest"] >= r["min_count"] or r["victim_bound_at_rest"] == 0 for r in rows)
    # the API server really answered phalanx's writes with 429 (its own flow-control metric)
    assert sum(r["rejected_429"] for r in rows if r["kind"] in ("api-throttle", "api-refuse")) > 0


def test_plugin_mode_serve_link_down_plain_pods_schedule_and_gangs_bind_after(fault_plane):
    rows = run_quick(fault_plane, "plugin",
                     ("net-blackhole-serve", "net-partition-serve", "net-reset-apiserver", "net-latency-serve"),
                     ("planned", "binding", "recorded", "planned"), seed=22)
    outages = [r for r in rows if r["kind"] in ("net-blackhole-serve", "net-partition-serve")]
    assert all(r["plain_bound_s"] is not None for r in outages)
