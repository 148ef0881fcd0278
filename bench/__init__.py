"""Benchmarks and baselines. Each suite is a module with ``main(quick, json_path, seeds) -> int``,
registered here under the name ``phalanx bench NAME`` takes."""

SUITES = {
    "solver": "bench.solver_bench",
}
