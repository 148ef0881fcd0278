"""The asynchronous API-write dispatcher: ordered per object, retried with backoff on WriteError
(on the injected clock), coalesced, bounded (the oldest coalescable write dropped, counted), and
a submit never waits for a write."""

import threading
import time

from cluster.backend import WriteError
from cycle import CycleMetrics, Dispatcher
from cycle.dispatch import Write


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def count(metrics, outcome, kind):
    return metrics.dispatch.labels(outcome=outcome, kind=kind)._value.get()


def test_writes_of_one_object_run_in_order_and_others_in_parallel():
    done, gate = [], threading.Event()
    d = Dispatcher(workers=2)
    d.submit(Write("slow", "event", lambda: gate.wait(5)))
    for i in range(50):
        d.submit(Write("a", "event", lambda i=i: done.append(i)))
    assert d.flush("a", timeout=5)  # not behind the slow object
    gate.set()
    assert d.flush(timeout=5) and done == list(range(50))
    d.close()


def test_a_write_error_is_retried_with_backoff_on_the_injected_clock():
    clock, metrics, calls = Clock(), CycleMetrics(), []

    def flaky():
        calls.append(clock.now)
        if len(calls) < 3:
            raise WriteError("conflict", 409)

    d = Dispatcher(clock, metrics, backoff=1.0)
    d.submit(Write("pg", "status", flaky))
    time.sleep(0.3)
    assert calls == [0.0]  # waiting for the clock, not for real time
    clock.now = 1.0
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    clock.now = 3.0  # backoff doubled: 2 s
    assert d.flush(timeout=5)
    assert calls == [0.0, 1.0, 3.0] and count(metrics, "retried", "status") == 2
    d.close()


def test_a_newer_status_replaces_a_queued_one_and_a_full_queue_drops_the_oldest_coalescable():
    metrics, written, gate = CycleMetrics(), [], threading.Event()
    d = Dispatcher(metrics=metrics, capacity=3, workers=1)
    d.submit(Write("busy", "event", lambda: gate.wait(5)))  # holds the only worker
    time.sleep(0.1)
    d.submit(Write("pg", "status", lambda: written.append("old"), coalesce="status:pg"))
    d.submit(Write("pg", "status", lambda: written.append("new"), coalesce="status:pg"))
    assert count(metrics, "coalesced", "status") == 1 and d.pending() == 1
    d.submit(Write("pg", "event", lambda: written.append("e1")))
    d.submit(Write("pg", "event", lambda: written.append("e2")))
    # full: the status goes, and the submission returns while the only worker is still held
    submitter = threading.Thread(target=d.submit, args=(Write("pg", "event", lambda: written.append("e3")),))
    submitter.start()
    submitter.join(5)
    assert not submitter.is_alive() and not gate.is_set()  # never waits for a worker
    assert count(metrics, "dropped", "status") == 1
    gate.set()
    assert d.flush(timeout=5) and written == ["e1", "e2", "e3"]
    d.close()


def test_a_write_that_raises_anything_else_is_dropped_and_the_worker_lives():
    metrics, written = CycleMetrics(), []
    d = Dispatcher(metrics=metrics, workers=1)
    d.submit(Write("pg", "event", lambda: 1 / 0))
    d.submit(Write("pg", "event", lambda: written.append(1)))
    assert d.flush(timeout=5) and written == [1] and count(metrics, "failed", "event") == 1
    d.close()


def test_a_throttled_or_unreachable_api_server_loses_no_write():
    """429s, 5xx and lost connections are retried past ``max_attempts`` until the write lands (a
    refusal such as 404 still gives up after ``max_attempts``)."""
    clock, metrics, landed, tries = Clock(), CycleMetrics(), [], {"status": 0, "event": 0, "gone": 0}
    failures = [WriteError("throttled", 429, "TooManyRequests"), WriteError("transport error", 0),
                WriteError("unavailable", 503)] * 4

    def throttled(kind):
        tries[kind] += 1
        if tries[kind] <= len(failures):
            raise failures[tries[kind] - 1]
        landed.append(kind)

    def gone():
        tries["gone"] += 1
        raise WriteError("not found", 404, "NotFound")

    d = Dispatcher(clock, metrics, max_attempts=3, backoff=0.5, max_backoff=2.0)
    d.submit(Write("PodGroup/ns/a", "status", lambda: throttled("status")))
    d.submit(Write("PodGroup/ns/a", "event", lambda: throttled("event")))
    d.submit(Write("PodGroup/ns/b", "status", gone))
    deadline = time.monotonic() + 20
    while (len(landed) < 2 or d.pending()) and time.monotonic() < deadline:
        clock.now += 1.0
        time.sleep(0.02)
    assert landed == ["status", "event"]  # in order, each after 12 failures
    assert tries == {"status": 13, "event": 13, "gone": 3}
    assert count(metrics, "failed", "status") == 1 and count(metrics, "failed", "event") == 0
    d.close()
