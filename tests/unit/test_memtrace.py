"""serve's memory diagnostic (``--memory-trace``): what it writes and how a soak reads it."""

from __future__ import annotations

import json
import linecache
import tracemalloc
from pathlib import Path

import pytest

from bench.soak_samples import memory_summary, proc_smaps
from cycle.memtrace import SERIES, MemoryTrace, malloc_counters, pymalloc_counters, read_series, snapshot_growth

STATS = """Small block threshold = 512, in 32 size classes.

# arenas allocated total           =                   60
# arenas reclaimed                 =                   21
# arenas highwater mark            =                   40
# arenas allocated current         =                   39
39 arenas * 1048576 bytes/arena    =           40,894,464

# bytes in allocated blocks        =           38,950,144
# bytes in available blocks        =              282,576
Total                              =           40,894,464
"""


def test_pymalloc_counters_are_read_from_pythons_own_statistics():
    assert pymalloc_counters(STATS) == {"arenas": 39, "arena_bytes": 39 * 1048576, "in_blocks": 38950144}
    assert pymalloc_counters("no statistics (tracemalloc replaced the allocator)") == {}


def test_the_c_allocators_counters_are_read_on_glibc():
    counters = malloc_counters()
    if not counters:
        pytest.skip("this C library has no mallinfo2")
    assert set(counters) == {"heap", "in_use", "free", "mapped"}
    assert counters["in_use"] > 0 and counters["heap"] >= counters["in_use"]


@pytest.fixture
def tracing():
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start(4)
    yield
    if not was:
        tracemalloc.stop()


def test_a_trace_names_the_line_whose_allocations_grew(tmp_path: Path, tracing):
    trace = MemoryTrace(tmp_path, every=3600)
    first = trace.look()
    kept = [bytearray(2048) for _ in range(500)]  # ~1 MiB held from this line
    last = trace.look()
    assert [r["snapshot"] for r in read_series(tmp_path)] == [first["snapshot"], last["snapshot"]]
    assert last["python"]["traced"] - first["python"]["traced"] >= 500 * 2048
    grew = snapshot_growth(tmp_path / first["snapshot"], tmp_path / last["snapshot"], top=3)
    filename, line = grew[0]["frames"][0].rsplit(":", 1)
    assert filename == __file__ and "bytearray(2048)" in linecache.getline(filename, int(line))
    assert grew[0]["count_grew"] >= 500 and grew[0]["grew"] >= 500 * 2048
    summary = memory_summary(tmp_path)
    assert summary["looks"] == 2 and summary["mib"]["python_traced"]["last"] > summary["mib"]["python_traced"]["first"]
    assert summary["grew"][0]["frames"] == grew[0]["frames"]
    del kept


def test_without_tracing_a_look_reads_the_allocators_only(tmp_path: Path):
    if tracemalloc.is_tracing():
        pytest.skip("tracemalloc is on in this process")
    row = MemoryTrace(tmp_path, every=3600, frames=0).look()
    assert "snapshot" not in row and "python" not in row
    assert row["rss"] > 0
    assert json.loads((tmp_path / SERIES).read_text()) == row


def test_a_summary_of_too_few_looks_says_so(tmp_path: Path):
    assert memory_summary(tmp_path) == {"looks": 0, "note": "fewer than two looks: nothing to compare"}


def test_the_resident_size_is_split_by_kind_of_mapping():
    kinds = proc_smaps()
    assert set(kinds) == {"heap", "anon", "file", "stack"}
    assert kinds["file"] > 0 and kinds["anon"] + kinds["heap"] > 0  # the interpreter's code; its objects
    assert proc_smaps(2 ** 31) == {}  # no such process


@pytest.mark.parametrize("args, said", [
    (["--memory-trace", "/proc/no-such-dir"], "phalanx serve: --memory-trace /proc/no-such-dir: No such file"),
    (["--memory-trace", "DIR", "--memory-trace-every", "0"], "--memory-trace-every must be > 0"),
    (["--memory-trace", "DIR", "--memory-trace-frames", "-1"], "--memory-trace-frames >= 0"),
])
def test_a_bad_memory_trace_flag_is_one_line(args, said, tmp_path: Path):
    from phalanx_cli.main import main

    args = [str(tmp_path / "trace") if a == "DIR" else a for a in args]
    with pytest.raises(SystemExit, match=said):  # said before serve starts, not a traceback
        main(["serve", "--sim", str(tmp_path / "absent.yaml"), *args])


def test_only_the_real_soak_takes_a_memory_trace():
    from phalanx_cli.main import main

    for suite in (["soak"], ["solver"]):
        with pytest.raises(SystemExit, match="--memory-trace is for soak --real only"):
            main(["bench", *suite, "--memory-trace", "x"])
