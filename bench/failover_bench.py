"""``phalanx bench failover``: two scheduler replicas on a real control plane, the leader's pod killed
while gangs bind, the standby taking over — repeated, in both integration modes.

Each round starts fresh replicas (kube-scheduler or phalanx-scheduler, each with its own
``phalanx serve --leader-lease``), creates gang StatefulSets required in one rack, kills the leader's
scheduler and serve together (SIGKILL) when the first member is bound, and measures from the kill:
the standby's kube-scheduler taking the Lease, the next bind, and the last gang bound. Every round
checks the fault suite's invariants at rest (no gang partly bound, nothing bound that was not
planned, no pod lost) and that the standby wrote nothing before it took over (counted by the API
server, per replica). The harness is tests/e2e/harness/failover.py; the e2e suite runs one round
per mode (tests/e2e/test_failover.py).
"""

from __future__ import annotations

import os
import signal
import sys

from . import E2E, control_plane_binaries, run_suite

FULL = dict(rounds=5, seeds=1)
QUICK = dict(rounds=1, seeds=1)


def run(rounds: int, seeds: int) -> list[dict]:
    control_plane_binaries("failover")
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    from harness.failover import run_failover_bench
    from harness.faults import fault_control_plane

    # SIGTERM unwinds like Ctrl-C, so the control plane and the replicas are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rows: list[dict] = []
    for _ in range(seeds):
        with fault_control_plane("phalanx-bench-failover-") as plane:
            out = run_failover_bench(plane, rounds, log=lambda line: print(line, flush=True))
            for mode, summary in out["modes"].items():
                rows.append({"mode": mode, "lease": out["lease"], "gangs": out["gangs"], "size": out["size"],
                             **summary})
            plane.keep_logs = plane.keep_logs or any(r["violations"] for r in rows) \
                or os.environ.get("PHALANX_E2E_KEEP") == "1"
    return rows


def markdown(rows: list[dict]) -> str:
    def s(stat: dict) -> str:
        if stat["median"] is None:
            return "not seen"
        missing = f" ({stat['missing']} not seen)" if stat["missing"] else ""
        return f"{stat['median']:.1f} / {stat['max']:.1f}{missing}"

    lines = ["| mode | Lease (duration / renew / retry, s) | rounds | gangs × pods "
             "| Lease taken over, median / max (s) | next bind (s) | last gang bound (s) "
             "| standby writes before the kill | violations |",
             "|---|---|---:|---|---|---|---|---:|---:|"]
    for r in rows:
        lease = r["lease"]
        lines.append(f"| {r['mode']} | {lease['duration']:g} / {lease['renew']:g} / {lease['retry']:g} | {r['rounds']} "
                     f"| {r['gangs']} × {r['size']} | {s(r['takeover_s'])} | {s(r['next_bind_s'])} "
                     f"| {s(r['last_gang_s'])} | {r['standby_writes_before_kill']} | {len(r['violations'])} |")
    lines += ["", "Times from the kill (SIGKILL of the leading replica's scheduler and serve when the first "
              "member is bound). Target: the last gang bound within the Lease's duration + 10 s."]
    for r in rows:
        lines += [f"- {line}" for line in r["rows"]]
    return "\n".join(lines)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, seeds, json_path)
