"""``phalanx bench faults``: kill components of the real control plane and check the invariants.

On the loopback control plane of the e2e tests (build it with ``hack/build-k8s.sh``): ``phalanx
serve`` as a process, kube-scheduler with the shipped extender configuration, the controller and
its webhooks in-process. Each fault is a SIGKILL (phalanx serve, kube-scheduler, kube-apiserver) or
a leader crash (controller) at a moment read from the API (before the plan, at the barrier, after
the placement record, after k of N pods bound, after all), or a node lost under a running
``disruptionMode: all`` gang (deleted, or taken NotReady by KWOK), then a bounded wait for rest and
the invariants: no partial gang, no pod on a node no placement record named, no pod lost, no
DisruptionTarget, no component crashed; after a node loss, the gang gone whole within 30 s and,
re-created, bound whole within 60 s. The driver is ``tests/e2e/harness/faults.py`` (shared with
``tests/e2e/test_faults.py``). ``PHALANX_FAULT_SEED`` sets the first seed (default 0); a violation
names its seed and fault index.

Then the network and API-server faults (``tests/e2e/harness/netfaults.py``, shared with
``tests/e2e/test_netfaults.py``), on fresh control planes in extender and in plugin mode: a real
TCP fault proxy (Toxiproxy) on kube-scheduler's link to phalanx serve and on phalanx's link to the
API server — blackhole, reset, latency, bandwidth, a partition that heals — and the API server
throttling or refusing phalanx's writes with 429s, the kills mixed in; the same invariants plus
every fitting gang bound within its fault's bound, plain pods scheduling while plugin mode's
serve link is down, phalanx serve's threads and memory near their baseline.
"""

from __future__ import annotations

import os
import signal
import sys

from . import E2E, control_plane_binaries, run_suite

FULL = dict(faults=220, seeds=1, net_faults=120)
QUICK = dict(faults=12, seeds=1, net_faults=12)
#: the network and API-server run (tests/e2e/harness/netfaults.py): two thirds of ``net_faults`` in
#: extender mode, a third in plugin mode, kinds drawn with these weights (the kills mixed in)
NET_WEIGHTS = {
    "extender": {"serve": 0.06, "scheduler": 0.03, "apiserver": 0.03, "controller": 0.03,
                 **{f"net-{f}-{link}": 0.065 for f in ("blackhole", "reset", "latency", "bandwidth", "partition")
                    for link in ("serve", "apiserver")}, "api-throttle": 0.1, "api-refuse": 0.1},
    "plugin": {"serve": 0.05, "scheduler": 0.05,
               **{f"net-{f}-{link}": 0.08 for f in ("blackhole", "reset", "latency", "bandwidth", "partition")
                  for link in ("serve", "apiserver")}, "api-throttle": 0.05, "api-refuse": 0.05},
}


def run(faults: int, seeds: int, net_faults: int = 0) -> list[dict]:
    control_plane_binaries("faults")
    rows = run_kills(faults, seeds)
    return rows + run_network(net_faults, seeds) if net_faults else rows


def run_network(faults: int, seeds: int) -> list[dict]:
    """The network and API-server faults, on a control plane of their own per seed and mode."""
    sys.path.insert(0, str(E2E))
    from harness.faults import FaultConfig, fault_control_plane
    from harness.netfaults import run_net_faults

    first = int(os.environ.get("PHALANX_FAULT_SEED", "0"))
    rows: list[dict] = []
    for seed in range(first, first + seeds):
        for mode, count in (("extender", faults - faults // 3), ("plugin", faults // 3)):
            with fault_control_plane(f"phalanx-bench-netfaults-{mode}-") as plane:
                summary, shots = run_net_faults(plane, FaultConfig(seed=seed, faults=count, mode=mode),
                                                NET_WEIGHTS[mode])
                rows += [dict(r, mode=mode) for r in shots]
                plane.keep_logs = plane.keep_logs or summary["violations"] > 0
    return rows


def run_kills(faults: int, seeds: int) -> list[dict]:
    sys.path.insert(0, str(E2E))
    from harness.faults import FaultConfig, fault_control_plane, run_faults

    # SIGTERM unwinds like Ctrl-C, so the control plane and phalanx serve are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    first = int(os.environ.get("PHALANX_FAULT_SEED", "0"))
    rows: list[dict] = []
    for seed in range(first, first + seeds):
        with fault_control_plane("phalanx-bench-faults-") as plane:
            summary, shots = run_faults(plane, FaultConfig(seed=seed, faults=faults))
            rows += shots
            plane.keep_logs = plane.keep_logs or summary["violations"] > 0
    return rows


def markdown(rows: list[dict]) -> str:
    from collections import Counter

    kinds = ("serve", "scheduler", "apiserver", "controller") + NET_KINDS
    what = {"serve": "SIGKILL phalanx serve, restart", "scheduler": "SIGKILL kube-scheduler, restart",
            "apiserver": "SIGKILL kube-apiserver mid-barrier, restart",
            "controller": "controller leader crash mid-scale (Lease left to expire)", **NET_WHAT}
    node_loss = {"node-deleted": "Node deleted under a running all gang (re-created after)",
                 "node-notready": "node NotReady (KWOK) under a running all gang, taint eviction"}
    what, kinds = {**what, **node_loss}, kinds + tuple(node_loss)
    lines = ["| fault | injected | at phase | gangs | not at rest | violations |",
             "|---|---:|---|---:|---:|---:|"]
    for kind, mode in [(k, m) for k in kinds for m in ("extender", "plugin", None)]:
        mine = [r for r in rows if r["kind"] == kind and r.get("mode") == mode]
        if not mine:
            continue
        phases = Counter(r["wanted"] if kind == "controller" else r["phase"] for r in mine)
        label = what[kind] + (f" ({mode} mode)" if mode else "")
        lines.append(f"| {label} | {len(mine)} | {', '.join(f'{p} {n}' for p, n in sorted(phases.items()))} | "
                     f"{len({r['victim'] for r in mine})} | {sum(not r['at_rest'] for r in mine)} | "
                     f"{sum(len(r['violations']) for r in mine)} |")
    types = Counter(v["type"] for r in rows for v in r["violations"])
    gangs = len({(r["seed"], r.get("mode"), r["victim"]) for r in rows})
    lines.append(f"| **total** | **{len(rows)}** | | **{gangs}** | "
                 f"**{sum(not r['at_rest'] for r in rows)}** | **{sum(types.values())}** |")
    rest = sorted(r["rest_s"] for r in rows) or [0.0]
    lines += ["", f"Violations by type: {dict(types) or 'none'}. Rest after a fault: median "
                  f"{rest[len(rest) // 2]:.1f} s, max {rest[-1]:.1f} s."]
    return "\n".join(lines + network_notes(rows))


NET_KINDS = tuple(f"net-{f}-{link}" for link in ("serve", "apiserver")
                  for f in ("blackhole", "reset", "latency", "bandwidth", "partition")) + ("api-throttle", "api-refuse")
_LINK = {"serve": "kube-scheduler ↔ phalanx serve", "apiserver": "phalanx ↔ kube-apiserver"}
_FAULT = {"blackhole": "blackhole (timeout toxic)", "reset": "connection reset (reset_peer)",
          "latency": "latency 100 ms–5 s", "bandwidth": "bandwidth 4–64 KB/s", "partition": "partition, healed"}
NET_WHAT = {**{f"net-{f}-{link}": f"{_FAULT[f]} on {_LINK[link]}" for f in _FAULT for link in _LINK},
            "api-throttle": "API server throttles phalanx's writes (APF, 429) + 100 ms–1 s latency",
            "api-refuse": "API server refuses all of phalanx's writes (APF, 429) + 100 ms–1 s latency"}


def network_notes(rows: list[dict]) -> list[str]:
    """What the network run measured beyond the violations: 429s, bound waits, plain pods, serve."""
    net = [r for r in rows if r["kind"] in NET_KINDS]
    if not net:
        return []
    waits = sorted(r["bound_wait_s"] for r in net if "bound_wait_s" in r) or [0.0]
    plain = sorted(r["plain_bound_s"] for r in net if r.get("plain_bound_s") is not None)
    rejected = sum(r.get("rejected_429", 0) for r in net)
    threads = [r["serve_threads"] for r in net if "serve_threads" in r]
    rss = [r["serve_rss_kib"] for r in net if "serve_rss_kib" in r]
    out = ["", f"Network and API-server faults: {len(net)}; every fitting gang bound after the heal within "
               f"median {waits[len(waits) // 2]:.1f} s, at most {waits[-1]:.1f} s; {rejected} writes of phalanx's "
               "answered 429 by the API server."]
    if plain:
        out.append(f"Plain pods created while plugin mode's serve link was down: {len(plain)}, bound after median "
                   f"{plain[len(plain) // 2]:.1f} s, at most {plain[-1]:.1f} s.")
    if threads and rss:
        out.append(f"phalanx serve at rest: {min(threads)}–{max(threads)} threads, RSS {min(rss) / 1024:.0f}–"
                   f"{max(rss) / 1024:.0f} MiB.")
    return out


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
