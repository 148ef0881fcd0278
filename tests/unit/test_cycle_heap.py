"""The heap is settled once the caches are synced and re-collected on the requeue thread's schedule."""

import gc
import sys
import weakref

import pytest

from cycle.heap import Heap


@pytest.fixture
def heap():
    now = [100.0]
    h = Heap(clock=lambda: now[0], interval=600.0)
    yield h, now
    gc.unfreeze()


def test_settling_moves_the_live_objects_out_of_the_full_passes(heap):
    h, _ = heap
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    h.settle()
    assert gc.get_freeze_count() > 1000 and h.settled_at == 100.0


class _Cyclic:
    def __init__(self):
        self.me = self


def test_a_full_pass_runs_only_past_the_interval_and_reclaims_cycles_frozen_meanwhile(heap):
    h, now = heap
    assert not h.tick()  # never settled (a process whose caches never synced): nothing to do
    garbage = _Cyclic()
    alive = weakref.ref(garbage)
    h.settle()
    del garbage
    gc.collect()
    assert alive() is not None  # frozen: the collector's passes leave it alone
    now[0] += 599.0
    assert not h.tick() and alive() is not None
    now[0] += 2.0
    assert h.tick() and h.settled_at == now[0]
    assert alive() is None  # the pass past the interval reclaimed it


def test_release_hands_free_memory_back_and_counts_what_the_resident_size_fell_by():
    calls, counted = [], []
    sizes = iter([300 << 20, 220 << 20])  # resident bytes before and after the trim
    heap = Heap(returned=counted.append, trim=lambda pad: calls.append(pad) or 1, resident=lambda: next(sizes))
    assert heap.release() == 80 << 20
    assert calls == [0] and counted == [80 << 20]  # malloc_trim(0): keep no padding at the top


def test_release_counts_nothing_when_the_resident_size_did_not_fall_and_does_nothing_without_malloc_trim():
    counted = []
    heap = Heap(returned=counted.append, trim=lambda pad: 0, resident=lambda: 100 << 20)
    assert heap.release() == 0 and counted == []
    assert Heap(returned=counted.append, trim=None).release() == 0 and counted == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc: Linux")
def test_this_process_has_malloc_trim_and_reads_its_resident_size():
    """The images phalanx ships are Debian-based (glibc): the trim is found there, as here."""
    from cycle.heap import malloc_trim, resident_bytes
    assert malloc_trim() is not None
    before = resident_bytes()
    assert before > 0
    assert Heap().release() >= 0 and resident_bytes() > 0



def test_a_trim_runs_soon_after_the_resident_size_grew_past_what_the_last_trim_left():
    from cycle.heap import GROWTH_CHECK_INTERVAL
    now, trims, resident = [0.0], [], [150 << 20]

    def trim(pad):
        trims.append(now[0])
        resident[0] = 160 << 20  # what a trim leaves
        return 1
    heap = Heap(clock=lambda: now[0], trim=trim, resident=lambda: resident[0])
    assert heap.release_if_grown() == 0 and trims == []  # the first look notes the size
    resident[0] = 250 << 20  # a burst
    assert heap.release_if_grown() == 0 and trims == []  # looked at too recently
    assert 0 < heap.next_look() <= GROWTH_CHECK_INTERVAL
    now[0] += GROWTH_CHECK_INTERVAL
    assert heap.next_look() == 0
    assert heap.release_if_grown() == 90 << 20 and trims == [now[0]]
    resident[0] = 170 << 20  # grown by less than the factor over what that trim left: no trim
    now[0] += GROWTH_CHECK_INTERVAL
    assert heap.release_if_grown() == 0 and len(trims) == 1
    resident[0] = 200 << 20
    now[0] += GROWTH_CHECK_INTERVAL
    assert heap.release_if_grown() == 40 << 20 and len(trims) == 2


def test_a_small_heap_is_not_trimmed_for_growth_below_the_minimum():
    from cycle.heap import GROWTH_MIN_BYTES
    now, resident, trims = [0.0], [10 << 20], []
    heap = Heap(clock=lambda: now[0], trim=lambda pad: trims.append(pad) or 1, resident=lambda: resident[0])
    heap.release_if_grown()
    resident[0] = (10 << 20) + GROWTH_MIN_BYTES - 1  # far past the factor, below the minimum
    now[0] += 60
    assert heap.release_if_grown() == 0 and trims == []
    resident[0] = (10 << 20) + GROWTH_MIN_BYTES
    now[0] += 60
    heap.release_if_grown()
    assert trims == [0]


def test_without_malloc_trim_nothing_is_read_or_trimmed():
    read = []
    heap = Heap(trim=None, resident=lambda: read.append(1) or 1 << 30)
    assert heap.release_if_grown() == 0 and read == []
    assert heap.next_look() == float("inf")  # the requeue thread does not wake for it


def test_the_allocator_env_turns_glibcs_per_thread_cache_off_once_and_keeps_an_operators_choice():
    from cycle.heap import allocator_env
    assert allocator_env({"A": "1"}, "glibc 2.36") == {"A": "1", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    assert allocator_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, "glibc 2.36") == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.malloc.tcache_count=0"}
    assert allocator_env({"GLIBC_TUNABLES": "glibc.malloc.tcache_count=7"}, "glibc 2.36") is None
    assert allocator_env({}, "") is None  # musl, macOS: nothing to set


def test_serve_and_bench_re_execute_themselves_with_the_cache_off_and_only_once():
    """The real re-execution: a process that calls it runs again from the start with the variable
    set (glibc reads it only at start), and the second run goes on."""
    import os
    import subprocess
    import sys

    from cycle.heap import libc_name
    if not libc_name().startswith("glibc"):
        pytest.skip("not glibc: nothing is re-executed")
    code = ("import os; print('start', flush=True); from phalanx_cli.main import _without_tcache; "
            "_without_tcache(); print(os.environ['GLIBC_TUNABLES'])")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))).stdout
    assert out.split("\n") == ["start", "start", "glibc.malloc.tcache_count=0", ""]


def test_a_caller_running_the_cli_in_its_own_process_is_never_re_executed(tmp_path, monkeypatch):
    """Only the process whose own command line is phalanx's re-executes itself: ``main(argv)``
    called with an argv (a test, an embedding program) must not replace its caller."""
    import os

    from phalanx_cli.main import main
    execs = []
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(os, "execve", lambda *a: execs.append(a))
    with pytest.raises(SystemExit, match="phalanx serve: .*absent.yaml"):  # said, not a traceback
        main(["serve", "--sim", str(tmp_path / "absent.yaml"), "--insecure-loopback-no-auth",
              "--http-addr", "127.0.0.1:0", "--grpc-addr", ""])
    assert execs == []
