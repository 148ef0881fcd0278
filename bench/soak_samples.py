"""What both soaks (bench/soak_bench.py, simulated; bench/soak_real.py, the real control plane)
read and record the same way: a process's RSS and threads, one churn action, one sample."""

from __future__ import annotations

import pathlib
import random
from typing import Any, Callable

# the dashboard's history (groups remembered, and as many events) a soak's serve keeps: a bound
# history fills for its first groups and then stays put, and at the default (20,000 groups, ~2.3
# KiB each, docs/benchmarks.md) it would still be filling at the end of an hour; a small one is full
# within the warm-up, so what still grows after it is something else
SOAK_HISTORY_GROUPS = 100


# -- process readings --------------------------------------------------------------------------
def proc_status(pid: int | str = "self") -> dict[str, int]:
    """RSS (KiB) and threads of a process, from /proc (0 where not available)."""
    out = {"rss_kib": 0, "threads": 0}
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    except OSError:
        pass
    return out


def churn_step(rng: random.Random, counts: dict[str, int],
               actions: dict[str, tuple[float, Callable[[], object] | list | None]]) -> str:
    """One churn action drawn by weight from ``actions`` (name -> (weight, what to do; empty or
    None when it cannot be done now)), done and counted; its name, or "none"."""
    action = rng.choices(list(actions), weights=[w for w, _ in actions.values()])[0]
    do = actions[action][1]
    if not callable(do):
        return "none"
    do()
    counts[action] = counts.get(action, 0) + 1
    return action


def record_sample(samples: list[dict], log: Callable[[str], None], t: float, process: dict[str, int],
                  live: dict[str, int], filter_calls: int, p50: float | None, p99: float | None,
                  sizes: dict[str, int], violations: int, **extra: Any) -> dict:
    """One sample: appended to ``samples``, said in one line, returned."""
    row = {"t": round(t, 1), **process, "live": live, "filter_calls": filter_calls, "filter_p50_ms": p50,
           "filter_p99_ms": p99, "sizes": sizes, "violations": violations, **extra}
    samples.append(row)
    log(f"[{row['t']:7.0f}s] rss {row['rss_kib'] / 1024:6.1f} MiB threads {row['threads']:3d} "
        + "".join(f"{k} {v} " for k, v in live.items())
        + f"filter p50/p99 {p50}/{p99} ms ({filter_calls}) violations {violations}")
    return row
