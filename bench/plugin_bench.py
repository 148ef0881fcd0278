"""``phalanx bench plugin``: the plugin path, the counterpart of ``phalanx bench extender``.

``phalanx serve`` runs here on a simulated cluster (10,000 nodes in racks of 32, 8 GPUs each) with
its gRPC endpoint; the Go driver ``TestPluginPathAgainstService`` (plugin/pkg/phalanx, run with
``go test``) drives phalanx's framework plugin against it as kube-scheduler would, for 1,000 gangs
of 8 with a rack constraint (a second pass with required anti-affinity on the hostname): every
member's PreFilter — the first one's asks the service (PlanForPod, which runs the workload cycle),
the rest are answered from the plugin's mirror of the service's plans — then Reserve on the
planned node and Permit, and the barrier's release; then, while one more gang is planned and holds
its nodes, a plain pod's PreFilter and its Filter on every node. Once a gang is allowed the bench
binds its members in the simulated cluster, as kube-scheduler would, so its plan is let go when
the cache shows the bindings. The service and the driver are separate processes on the same
cores. Needs Go (the toolchain ``make plugin-test`` uses).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import tempfile
import threading
import time

from bench import run_suite
from bench.extender_bench import _cluster, _pod, _podgroup
from cluster import names
from cycle import PlanState
from cycle.plugin_mode import PluginEnforcement
from extender.server import ServeOptions, build
from rpc.plugin_servicer import snapshot_message

FULL = dict(nodes=10_000, gangs=1_000)
QUICK = dict(nodes=2_000, gangs=40)
PLUGIN = pathlib.Path(__file__).resolve().parents[1] / "plugin"
RESULT = "PHALANX_BENCH_RESULT "


def _drive(nodes: int, gangs: int, anti: bool) -> dict:
    sim = _cluster(nodes)
    phalanx = build(ServeOptions(insecure_loopback_no_auth=True, http_addr="127.0.0.1:0", grpc_addr="127.0.0.1:0",
                                 barrier_timeout=120, plan_ttl=3600), sim=sim).start()
    try:
        groups = []
        for k in range(gangs + 1):  # the last one is only planned, to hold capacity (see the driver)
            group = f"p{k}{'a' if anti else ''}"
            sim.create(_podgroup(group, 8, names.LABEL_RACK))
            groups.append([sim.create(_pod(f"{group}-{i}", group, anti=anti)) for i in range(8)])
        plain = sim.create(_pod("plain", None))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"groups": groups, "plain": plain, "nodes": sim.list("Node")}, f)
        binder = _Binder(sim, phalanx.cycle, groups[:-1])
        try:
            env = {**os.environ, "PHALANX_BENCH_ADDR": f"127.0.0.1:{phalanx.grpc.port}", "PHALANX_BENCH_INPUT": f.name}
            done = subprocess.run(["go", "test", "./pkg/phalanx/", "-run", "^TestPluginPathAgainstService$",
                                   "-count=1", "-v", "-timeout", "30m"], cwd=PLUGIN, env=env,
                                  capture_output=True, text=True)
        finally:
            binder.stop()
            os.unlink(f.name)
        snapshot = _snapshot_cost(phalanx.cycle)
    finally:
        phalanx.stop()
    line = next((x for x in done.stdout.splitlines() if x.startswith(RESULT)), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"the plugin driver failed ({done.returncode}):\n"
                           f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    result = json.loads(line[len(RESULT):])
    result.update(snapshot)
    return result


class _Binder(threading.Thread):
    """Plays kube-scheduler's binding: once phalanx serve allowed a gang (its plan is bound),
    its members are bound in the simulated cluster, so the plan is let go when the cache shows
    them, as on a real cluster. The driver places the gangs in order; only the next one is looked at."""

    def __init__(self, sim, cycle, groups) -> None:
        super().__init__(daemon=True, name="bench-binder")
        self.sim, self.cycle, self.groups, self.halt = sim, cycle, groups, threading.Event()
        self.start()

    def run(self) -> None:
        for members in self.groups:
            key = f"{members[0]['metadata']['namespace']}/{members[0]['spec']['schedulingGroup']['podGroupName']}"
            while not self.halt.is_set():
                plan = self.cycle.plan_of(key)
                if plan is not None and plan.state is PlanState.BOUND:
                    break
                self.halt.wait(0.002)
            if self.halt.is_set():
                return
            for pod in members:
                meta = pod["metadata"]
                self.sim.bind(meta["namespace"], meta["name"], meta["uid"], plan.assignments[meta["uid"]])

    def stop(self) -> None:
        self.halt.set()
        self.join()


def _snapshot_cost(cycle) -> dict:
    """What one reservations-stream message costs the service once the run's plans are held (the
    stream sends a full snapshot after every coalesced change): building and encoding it, and its
    size."""
    enforcement = PluginEnforcement(cycle)
    times, size, plans = [], 0, 0
    for _ in range(20):
        started = time.perf_counter()
        message = snapshot_message(enforcement.snapshot())
        size = len(message.SerializeToString(deterministic=True))
        times.append((time.perf_counter() - started) * 1000)
        plans = len(message.plans)
    times.sort()
    what = f"reservations snapshot, {plans:,} plans held: build + encode ({size / 1024:.0f} KiB)"
    return {what: {"p50_ms": times[len(times) // 2], "p99_ms": times[-1], "n": len(times)}}


def run(nodes: int, gangs: int, seeds: int = 1) -> list[dict]:
    rows = []
    for anti in (False, True):
        for what, stats in sorted(_drive(nodes, gangs, anti).items()):
            if anti and "plain pod" in what:
                continue  # the same path as without anti-affinity
            rows.append(dict(nodes=nodes, gang=8, anti_affinity=anti, what=what, p50_ms=round(stats["p50_ms"], 4),
                             p99_ms=round(stats["p99_ms"], 4), samples=int(stats["n"])))
            print(rows[-1])
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["| nodes | gangs of 8 (rack) | what | p50 ms | p99 ms | samples |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['nodes']:,} | {'hostname anti-affinity' if r['anti_affinity'] else 'plain'} | "
                   f"{r['what']} | {r['p50_ms']} | {r['p99_ms']} | {r['samples']:,} |")
    return "\n".join(out)


def main(quick: bool, json_path: str | None, seeds: int | None = None) -> int:
    return run_suite(run, markdown, QUICK if quick else FULL, None, json_path)
