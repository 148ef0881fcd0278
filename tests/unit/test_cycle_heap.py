"""The heap is settled once the caches are synced and re-collected on the requeue thread's schedule."""

import gc
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
