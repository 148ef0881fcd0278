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
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from . import run_suite

FULL = dict(faults=220, seeds=1)
QUICK = dict(faults=12, seeds=1)
E2E = Path(__file__).resolve().parents[1] / "tests" / "e2e"


def run(faults: int, seeds: int) -> list[dict]:
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

    kinds = ("serve", "scheduler", "apiserver", "controller")
    what = {"serve": "SIGKILL phalanx serve, restart", "scheduler": "SIGKILL kube-scheduler, restart",
            "apiserver": "SIGKILL kube-apiserver mid-barrier, restart",
            "controller": "controller leader crash mid-scale (Lease left to expire)"}
    node_loss = {"node-deleted": "Node deleted under a running all gang (re-created after)",
                 "node-notready": "node NotReady (KWOK) under a running all gang, taint eviction"}
    what, kinds = {**what, **node_loss}, kinds + tuple(node_loss)
    lines = ["| fault | injected | at phase | gangs | not at rest | violations |",
             "|---|---:|---|---:|---:|---:|"]
    for kind in kinds:
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        phases = Counter(r["wanted"] if kind == "controller" else r["phase"] for r in mine)
        lines.append(f"| {what[kind]} | {len(mine)} | {', '.join(f'{p} {n}' for p, n in sorted(phases.items()))} | "
                     f"{len({r['victim'] for r in mine})} | {sum(not r['at_rest'] for r in mine)} | "
                     f"{sum(len(r['violations']) for r in mine)} |")
    types = Counter(v["type"] for r in rows for v in r["violations"])
    lines.append(f"| **total** | **{len(rows)}** | | **{len({(r['seed'], r['victim']) for r in rows})}** | "
                 f"**{sum(not r['at_rest'] for r in rows)}** | **{sum(types.values())}** |")
    rest = sorted(r["rest_s"] for r in rows) or [0.0]
    lines += ["", f"Violations by type: {dict(types) or 'none'}. Rest after a fault: median "
                  f"{rest[len(rest) // 2]:.1f} s, max {rest[-1]:.1f} s."]
    return "\n".join(lines)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
