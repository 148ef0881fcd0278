"""Benchmarks and baselines. Each suite is a module with ``main(quick, json_path, seeds) -> int``,
registered here under the name ``phalanx bench NAME`` takes."""

import json
import pathlib
import sys
import time
from typing import Any, Callable

#: the end-to-end harness: the suites that run a real control plane start it with its code
E2E = pathlib.Path(__file__).resolve().parents[1] / "tests" / "e2e"

SUITES = {
    "solver": "bench.solver_bench",
    "preemption": "bench.preemption_bench",
    "cache": "bench.cache_bench",
    "scale": "bench.scale_bench",
    "trace": "bench.trace_bench",
    "trace-defaults": "bench.trace_defaults",
    "controller": "bench.controller_bench",
    "extender": "bench.extender_bench",
    "faults": "bench.faults_bench",
    "failover": "bench.failover_bench",
    "contention": "bench.contention_bench",
    "plugin": "bench.plugin_bench",
    "scheduler-perf": "bench.scheduler_perf_bench",
    "preemption-perf": "bench.preemption_perf_bench",
    "tenants": "bench.tenants_bench",
    "soak": "bench.soak_bench",
    "whatif": "bench.whatif_bench",
    "composite": "bench.composite_bench",
    "fragmentation": "bench.fragmentation_bench",
}


def control_plane_binaries(suite: str) -> Any:
    """The e2e control plane's binaries (``harness.locate``), or SystemExit with the one line that
    says how to build them — before the suite makes a work directory or starts anything."""
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    from harness import MissingBinaries, locate

    try:
        return locate()
    except MissingBinaries as err:
        raise SystemExit(f"phalanx bench {suite}: {err}") from None


def run_suite(run: Callable[..., list[dict]], markdown: Callable[[list[dict]], str], params: dict,
              seeds: int | None, json_path: str | None) -> int:
    """A suite's ``main``: run it (``seeds`` overrides the parameters' count), print its markdown
    summary, and write the rows as JSON to ``json_path`` with the summary beside it (.md)."""
    params = dict(params)
    if seeds:
        params["seeds"] = seeds
    started = time.perf_counter()
    rows = run(**params)
    table = markdown(rows)
    print(f"\n{len(rows)} rows in {time.perf_counter() - started:.0f} s\n")
    print(table)
    if not json_path:
        return 0
    path = pathlib.Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1) + "\n")
    path.with_suffix(".md").write_text(table + "\n")
    return 0
