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


def proc_smaps(pid: int | str = "self") -> dict[str, int]:
    """A process's resident KiB by kind of mapping (/proc/PID/smaps): ``heap`` (the brk heap:
    glibc's main arena), ``anon`` (other anonymous mappings: glibc's other arenas, Python's 1 MiB
    arenas, directly mapped chunks, thread stacks), ``file`` (code and data of files); {} where not
    readable. Each thread's stack is an anonymous mapping of its own, so ``anon`` grows with threads."""
    out = {"heap": 0, "anon": 0, "file": 0, "stack": 0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if not head.endswith(":"):  # a mapping's first line: address perms offset dev inode [path]
                    fields = line.split()
                    path = fields[5] if len(fields) > 5 else ""
                    kind = ("heap" if path == "[heap]" else "stack" if path.startswith("[stack")
                            else "anon" if not path or path.startswith("[anon") else "file")
                elif head == "Rss:":
                    out[kind] += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def memory_summary(directory: pathlib.Path, warmup: float = 0.25, top: int = 15) -> dict[str, Any]:
    """serve's memory trace (``--memory-trace``) over a soak: each owner of its memory at the first
    look after the warm-up and at the last (MiB), and the Python allocation sites that grew most
    between those two looks. Python's traced bytes exclude tracemalloc's own."""
    from cycle.memtrace import read_series, snapshot_growth

    series = read_series(directory)
    if len(series) < 2:
        return {"looks": len(series), "note": "fewer than two looks: nothing to compare"}
    first, last = series[min(len(series) - 2, int(len(series) * warmup))], series[-1]

    def owners(row: dict) -> dict[str, float]:
        mib = 1 << 20
        out = {"rss": row["rss"] / mib}
        out.update({f"malloc_{k}": v / mib for k, v in (row.get("malloc") or {}).items()})
        if "python" in row:
            out["python_traced"] = row["python"]["traced"] / mib
            out["tracemalloc_own"] = row["python"]["tracing"] / mib
        out.update({f"pymalloc_{k}": v / mib for k, v in (row.get("pymalloc") or {}).items() if k != "arenas"})
        return out

    a, b = owners(first), owners(last)
    hours = max(1e-9, (last["t"] - first["t"]) / 3600)
    table = {k: {"first": round(a[k], 2), "last": round(b[k], 2), "per_hour": round((b[k] - a[k]) / hours, 2)}
             for k in a if k in b}
    summary: dict[str, Any] = {"looks": len(series), "from_s": first["t"], "to_s": last["t"], "mib": table,
                               "threads": [first["threads"], last["threads"]]}
    if first.get("snapshot") and last.get("snapshot"):
        summary["grew"] = snapshot_growth(directory / first["snapshot"], directory / last["snapshot"], top)
    return summary


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
