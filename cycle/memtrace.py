"""A diagnostic of where serve's memory goes over hours (``phalanx serve --memory-trace DIR``).

The soaks found serve's resident size growing a few MiB an hour with every collection of
phalanx's flat (docs/benchmarks.md, "Soak"). The resident size has four owners, and each is read
here so a soak can say which one grows:

- Python's objects: ``tracemalloc`` (started before anything else, so every allocation site is
  known), a snapshot written every ``every`` seconds; two snapshots diffed by traceback name the
  lines whose live allocations grew (:func:`snapshot_growth`).
- Python's small-object allocator (pymalloc): the 1 MiB arenas it holds against the blocks in use
  in them (``sys._debugmallocstats``); arenas held while blocks are freed is fragmentation, which
  no collection's size shows. Read only while ``tracemalloc`` is off (its hooks replace pymalloc's
  entry points, and Python then prints no arena statistics): ``--memory-trace-frames 0``.
- The C allocator (glibc ``mallinfo2``): bytes in use (Python's larger objects, gRPC's and the
  solver's native memory), free but kept, and mapped directly.
- The rest (thread stacks, shared libraries) is what the resident size holds beyond these; the soak
  reads ``/proc/PID/smaps`` from outside for it.

Tracing costs: every Python allocation records its traceback (``FRAMES`` frames), slowing serve
by some tens of percent and adding the traces' own memory (reported, and subtracted by the diff).
It is for a diagnostic run, never for production.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from .heap import resident_bytes

log = logging.getLogger(__name__)

FRAMES = 8  # frames kept per traced allocation
SERIES = "heap.jsonl"  # one line per look: the counters below
SNAPSHOT = "snapshot-{:04d}.tracemalloc"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_counters() -> dict[str, int]:
    """glibc's ``mallinfo2``: ``in_use`` (allocated chunks), ``free`` (free chunks kept),
    ``mapped`` (chunks mapped directly), ``heap`` (bytes the arenas took from the system); {} where
    the C library has none (not glibc, or glibc before 2.33)."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    call.restype = _Mallinfo2
    info = call()
    return {"heap": info.arena, "in_use": info.uordblks, "free": info.fordblks, "mapped": info.hblkhd}


_ARENAS = re.compile(r"^# arenas allocated current\s*=\s*([\d,]+)", re.M)
_ARENA_SIZE = re.compile(r"^\d+ arenas \* ([\d,]+) bytes/arena", re.M)
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:")  # serve's log format starts with its time
_IN_BLOCKS = re.compile(r"^# bytes in allocated blocks\s*=\s*([\d,]+)", re.M)


def pymalloc_counters(stats: str | None = None) -> dict[str, int]:
    """pymalloc's arenas held and bytes in its allocated blocks, parsed from
    ``sys._debugmallocstats`` (which prints to the C stderr: captured in a file for the call)."""
    if stats is None:
        stats = _debug_mallocstats()
    arenas, size, blocks = _ARENAS.search(stats), _ARENA_SIZE.search(stats), _IN_BLOCKS.search(stats)
    if not arenas:
        return {}
    count = int(arenas.group(1).replace(",", ""))
    arena_bytes = int(size.group(1).replace(",", "")) if size else 0
    return {"arenas": count, "arena_bytes": count * arena_bytes,
            "in_blocks": int(blocks.group(1).replace(",", "")) if blocks else 0}


def _debug_mallocstats() -> str:
    debug = getattr(sys, "_debugmallocstats", None)
    if debug is None:
        return ""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as out:
        os.dup2(out.fileno(), 2)  # a log line written meanwhile lands here, read back below
        try:
            debug()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    for line in text.splitlines():  # a log record written while stderr was captured goes back to it
        if _LOG_LINE.match(line):
            print(line, file=sys.stderr)
    return text


class MemoryTrace:
    """Snapshots and counters into ``directory`` every ``every`` seconds, from a daemon thread."""

    def __init__(self, directory: str | Path, every: float = 300.0, frames: int = FRAMES) -> None:
        """``frames``: frames kept per traced allocation; 0: no ``tracemalloc``, counters only."""
        self.directory, self.every, self.frames = Path(directory), every, frames
        self.count = 0
        self._started = time.monotonic()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.frames and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        self._started = time.monotonic()
        threading.Thread(target=self._loop, name="memory-trace", daemon=True).start()
        log.warning("memory trace on (a diagnostic: serve is slower): %s every %.0f s", self.directory, self.every)

    def _loop(self) -> None:
        self.look()
        while True:  # for the process's life (a daemon thread)
            time.sleep(self.every)
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a diagnostic never takes serve down
                log.exception("memory trace: a look failed")

    def look(self) -> dict[str, Any]:
        """One snapshot file (while tracing) and one line of counters; returns the line."""
        row: dict[str, Any] = {"t": round(time.monotonic() - self._started, 1), "rss": resident_bytes(),
                               "threads": threading.active_count(), "malloc": malloc_counters()}
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot().filter_traces(
                (tracemalloc.Filter(False, tracemalloc.__file__),
                 tracemalloc.Filter(False, "<frozen importlib._bootstrap>")))
            name = SNAPSHOT.format(self.count)
            snapshot.dump(str(self.directory / name))
            traced, peak = tracemalloc.get_traced_memory()
            row.update(snapshot=name, python={"traced": traced, "peak": peak,
                                              "tracing": tracemalloc.get_tracemalloc_memory()})
        else:
            row.update(pymalloc=pymalloc_counters())
        with open(self.directory / SERIES, "a") as series:
            series.write(json.dumps(row) + "\n")
        self.count += 1
        return row


def snapshot_growth(first: Path, last: Path, top: int = 15) -> list[dict[str, Any]]:
    """The allocation sites (by traceback) whose live bytes grew most from ``first`` to ``last``:
    each with its growth, live bytes and count at the end, and its frames, innermost first."""
    before, after = tracemalloc.Snapshot.load(str(first)), tracemalloc.Snapshot.load(str(last))
    grew = sorted((stat for stat in after.compare_to(before, "traceback") if stat.size_diff > 0),
                  key=lambda stat: -stat.size_diff)  # compare_to orders by the size of a change, either way
    rows = [{"grew": stat.size_diff, "size": stat.size, "count": stat.count, "count_grew": stat.count_diff,
             "frames": [f"{frame.filename}:{frame.lineno}" for frame in reversed(stat.traceback)]}
            for stat in grew[:top]]
    return rows


def read_series(directory: Path) -> list[dict[str, Any]]:
    path = Path(directory) / SERIES
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


__all__ = ["MemoryTrace", "malloc_counters", "pymalloc_counters", "read_series", "snapshot_growth"]
