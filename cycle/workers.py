"""Solver worker processes: the long solves run outside the interpreter that answers the verbs.

phalanx serve answers filter, PreFilter, Reserve, Permit and bind from one Python interpreter; a
solve made there holds its lock (the GIL) for as long as it runs Python, so every verb waits in turn
behind a 5,000-node preemption search. The solves no verb needs inside its own answer, or whose
caller only waits for the result, run in a worker process instead: the caller's thread sleeps on the
result with the interpreter free for the others.

Which solves go there (see :mod:`cycle.smallest` and :mod:`cycle.preemption`): a group
preemption plan (the searches over growing prefixes of victims, one call) and the smallest change
that would make a refused group fit. Placement solves stay in serve: their verb waits for them
either way, and a small gang's takes about 2 ms at 5,000 nodes (moving them is not measured yet).

**The worker's replica.** Sending a whole snapshot each time would cost serve the pickling (37 ms
of held interpreter at 5,000 nodes and 5,000 bound pods, measured: half the nodes, half the pods).
So each worker keeps a replica of what changes slowly — the node list and the bound pods by uid —
and a solve carries only what moved since the last one it was sent: the nodes when the cache's
node list is a new one, the bound pods that are new or changed (by identity: the cache makes a new
record for each change) and the uids gone, plus the small parts (the usage matrix, the pods
assumed on plans, namespaces, volumes). Each send names the replica generation it builds on; a
worker that lacks it (started again) says so and the whole snapshot is sent. The worker also keeps
the derived per-node caches (eligibility masks, domains) while the node list stays the same, as
serve's own snapshots share them. Nothing deleted stays held: a worker keeps only the pods of the
order it was last sent, and the requeue thread's full prune drops from serve's record the pods the
cache no longer has (:meth:`SolverWorkers.prune`).

Solves and answers travel pickled, in length-prefixed frames over the worker's stdin and stdout
(a plain child process of this interpreter, which imports the cycle package and the solver: not
serve's entry point, so a program that embeds the cycle need not guard its main module). What
runs there is a pure function of :mod:`solver`: a worker that dies (killed, out of memory) loses
nothing — it is started again and the solve sent once more, whole; a second death in a row is the
solver's error. A worker whose serve is gone reads the end of its stdin and exits, so a killed
serve leaves no process behind. One worker per kind of solve, shared by every cycle of the process
(:func:`shared`): the group preemption worker is started when serve starts acting (a verb waits for
its plans: the worker's start — 0.5 s on a quiet machine, seconds under load — should not be paid
then), the smallest-change worker on first use (nothing waits for it; an idle worker holds about
114 MiB).
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable, Container, Protocol, TypeVar

from solver import Node, Pod, Snapshot, SolverError

log = logging.getLogger("phalanx.cycle")

T = TypeVar("T")

#: sends of one solve (the second after a worker died under the first)
ATTEMPTS = 2
#: a frame on the worker's pipes: its length, then that many bytes of pickle
FRAME = struct.Struct("!Q")
#: how a worker is started: this interpreter, importing only this module (and what it imports)
WORKER_CODE = "from cycle.workers import worker_main; worker_main()"


class Solves(Protocol):
    """Where a solve runs: ``run(fn, *args)`` returns ``fn(*args)``."""

    def run(self, fn: Callable[..., T], *args: object) -> T: ...

    def prune(self, live: Container[str]) -> None:
        """Forget the pods ``live`` (pod uids the cache holds) no longer has."""

    def warm(self) -> None:
        """Get ready for a first solve that should not wait (nothing to do in-process)."""


class InProcess:
    """Solves in the calling thread, in serve's interpreter (``phalanx serve --solver-workers off``,
    and the comparison row of ``phalanx bench contention``)."""

    def run(self, fn: Callable[..., T], *args: object) -> T:
        return fn(*args)

    def prune(self, live: Container[str]) -> None:
        return None

    def warm(self) -> None:
        return None


class WorkerDied(Exception):
    """The worker process ended (or its pipe broke) before answering."""


class SolverWorkers:
    """One solver worker process (started on first use) and serve's side of its replica."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one solve at a time: the replica's updates go in order
        self._process: subprocess.Popen[bytes] | None = None
        self._replica = _Sent()
        self.restarts = 0  # workers started again after one died
        self.solves = 0  # solves answered by a worker
        self.resent = 0  # whole snapshots sent again to a worker that lacked its replica

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the worker process (``fn`` a module-level function of :mod:`solver`);
        its exceptions are raised here. Blocks the calling thread, never the interpreter: the
        thread sleeps reading the worker's pipe."""
        name = getattr(fn, "__name__", repr(fn))
        with self._lock:
            for attempt in range(ATTEMPTS):
                try:
                    try:
                        answer = self._ask(fn, args)
                    except ReplicaMissing:  # a worker that has not got this replica: send it whole
                        self._replica = _Sent()
                        self.resent += 1
                        answer = self._ask(fn, args)
                except WorkerDied as died:
                    self._stop()
                    self.restarts += 1
                    log.warning("a solver worker died during %s (attempt %d of %d): %s; started again",
                                name, attempt + 1, ATTEMPTS, died)
                    continue
                self.solves += 1
                result: T = answer
                return result
        raise SolverError(f"solver workers died {ATTEMPTS} times in a row during {name}")

    def prune(self, live: Container[str]) -> None:
        """From the requeue thread's full prune: forget the pods the cache no longer has (and the
        bound-pod tuple last sent, which holds them), so nothing the cluster deleted stays held
        here after it drained; the next solve sends the pods' order and the worker keeps only
        those. Skipped while a solve runs (the next pass does it)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._replica.forget(live)
        finally:
            self._lock.release()

    def warm(self) -> None:
        """Start the worker now, on a thread of its own, rather than on first use: a worker's
        interpreter takes 0.5 s to start and import the solver on a quiet machine (seconds under
        load), which the first group preemption after serve starts (or takes over) would otherwise
        wait for while its gang's members wait too."""
        def start() -> None:
            with self._lock:
                self._started()
        threading.Thread(target=start, name="phalanx-solver-warm", daemon=True).start()

    def pids(self) -> list[int]:
        """The worker process's id (none before the first solve)."""
        process = self._process
        return [process.pid] if process is not None and process.poll() is None else []

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- the pipe ------------------------------------------------------------------------------
    def _ask(self, fn: Callable[..., Any], args: tuple[object, ...]) -> Any:
        process = self._started()
        assert process.stdin is not None and process.stdout is not None
        shipped = [self._replica.ship(a) if isinstance(a, Snapshot) else a for a in args]
        try:
            _write(process.stdin, (fn, shipped))
            ok, value = _read(process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as err:
            raise WorkerDied(str(err) or type(err).__name__) from err
        if ok:
            return value
        raise value

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            if self._process is not None:
                self._stop()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._process = subprocess.Popen([sys.executable, "-c", WORKER_CODE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, env=env)
        return self._process

    def _stop(self) -> None:
        """End the worker (its stdin closed: it exits at once; killed if it does not) and forget
        what its replica held."""
        process, self._process = self._process, None
        self._replica = _Sent()
        if process is None:
            return
        for pipe in (process.stdin, process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # mid-solve: it reads its pipe only between solves
            process.kill()
            process.wait()


def _write(pipe: IO[bytes], message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(FRAME.pack(len(data)))
    pipe.write(data)
    pipe.flush()


def _read(pipe: IO[bytes]) -> Any:
    head = pipe.read(FRAME.size)
    if len(head) < FRAME.size:
        raise EOFError("the worker's pipe closed")
    (size,) = FRAME.unpack(head)
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the worker's pipe closed mid-answer")
    return pickle.loads(data)


def worker_main() -> None:
    """A worker's loop: read a solve from stdin, answer on stdout, until stdin closes (serve
    stopped it, or serve is gone: nothing is left behind). Anything else the solver would print
    goes to stderr, never into the answers."""
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            fn, args = _read(requests)
        except EOFError:
            return
        try:
            reply: tuple[bool, object] = (True, _call(fn, args))
        except Exception as err:  # noqa: BLE001 - every error goes back to the caller, as raised
            reply = (False, err)
        try:
            _write(answers, reply)
        except (pickle.PicklingError, TypeError, AttributeError) as err:  # an answer that cannot travel
            _write(answers, (False, SolverError(f"{type(err).__name__}: {err}")))
        except BrokenPipeError:
            return


#: a snapshot's parts computed from its node list alone (Snapshot.__init__): they travel with it
NODE_PARTS = ("allocatable", "index", "resources", "rindex")
#: what a send carries apart from the snapshot's other parts (or not at all: the caches)
SENT_APART = frozenset({"nodes", "bound", "usage_cache", "node_cache", *NODE_PARTS})


class ReplicaMissing(Exception):
    """A worker was sent changes to a replica it does not hold (it was started again)."""


@dataclass(frozen=True)
class Shipped:
    """A snapshot as sent to a worker: what changed since the replica ``base`` (see the module's
    docstring), turned back into a :class:`~solver.Snapshot` there by :meth:`rebuild`."""

    base: int  # the replica generation these changes apply to (0: none, whole)
    generation: int  # the replica's generation once they are applied
    nodes: tuple[Node, ...] | None  # None: the replica's node list (and what derives from it) stands
    node_parts: dict[str, Any] | None  # with new nodes: the parts derived from them (see NODE_PARTS)
    added: tuple[Pod, ...]  # bound pods new or changed
    order: tuple[str, ...] | None  # the snapshot's bound pods, by uid, in its order (None: as last sent)
    rest: dict[str, Any]  # the snapshot's other parts (usage, assumed pods, namespaces, ...)

    def rebuild(self) -> Snapshot:
        replica = _REPLICA
        if self.base == 0:  # sent whole: whatever was held goes
            replica.__init__()  # type: ignore[misc]
        elif self.base != replica.generation:
            raise ReplicaMissing(f"replica {self.base} asked, {replica.generation} held")
        if self.nodes is not None:
            replica.nodes, replica.node_parts, replica.node_cache = self.nodes, self.node_parts or {}, {}
        for pod in self.added:
            replica.pods[pod.uid] = pod
        replica.generation = self.generation
        if self.order is not None and (self.added or self.order != replica.order):
            replica.order = self.order  # else the same tuple as last time: its indexes stay cached
            if len(replica.pods) != len(self.order):  # it holds every uid of the order: some went
                replica.pods = {uid: replica.pods[uid] for uid in self.order}
            replica.bound = tuple(replica.pods[uid] for uid in self.order)
        snapshot = object.__new__(Snapshot)
        vars(snapshot).update(self.rest, **replica.node_parts, nodes=replica.nodes, bound=replica.bound,
                              usage_cache={}, node_cache=replica.node_cache)  # node caches stay while the nodes do
        return snapshot


class _Sent:
    """Serve's side of one worker's replica: what it was sent (the node list and the bound pods,
    kept by identity) and the generation that made it."""

    def __init__(self) -> None:
        self.generation = 0
        self.nodes: tuple[Node, ...] | None = None
        self.bound: tuple[Pod, ...] | None = None  # the bound-pod tuple last sent
        self.pods: dict[str, Pod] = {}

    def ship(self, snapshot: Snapshot) -> Shipped:
        nodes, bound = snapshot.nodes, snapshot.bound
        state = {k: v for k, v in vars(snapshot).items() if k not in SENT_APART}
        parts = {k: getattr(snapshot, k) for k in NODE_PARTS}
        sent = self.pods
        if bound is self.bound:  # the cache hands the same tuple until a bound pod changes
            added: tuple[Pod, ...] = ()
            order: tuple[str, ...] | None = None
        else:
            added = tuple(p for p in bound if sent.get(p.uid) is not p)
            order = tuple(p.uid for p in bound)
            if len(sent) + len(added) != len(order):  # some went: the worker keeps the order's only
                self.pods = sent = {uid: sent[uid] for uid in order if uid in sent}
            self.bound = bound
        base, self.generation = self.generation, self.generation + 1
        same = nodes is self.nodes
        shipped = Shipped(base, self.generation, None if same else nodes, None if same else parts, added, order, state)
        self.nodes = nodes
        for pod in added:
            sent[pod.uid] = pod
        return shipped

    def forget(self, live: Container[str]) -> None:
        """Drop the pods ``live`` lacks; the next send carries the order again (see
        :meth:`SolverWorkers.prune`)."""
        gone = [uid for uid in self.pods if uid not in live]
        if gone:
            for uid in gone:
                del self.pods[uid]
            self.bound = None


class _Replica:
    """A worker's side: the node list and bound pods it was sent, and the node caches it derived."""

    def __init__(self) -> None:
        self.generation = 0
        self.nodes: tuple[Node, ...] = ()
        self.node_parts: dict[str, Any] = {}
        self.node_cache: dict[Any, Any] = {}
        self.pods: dict[str, Pod] = {}
        self.order: tuple[str, ...] = ()
        self.bound: tuple[Pod, ...] = ()


_REPLICA = _Replica()  # in a worker process: its replica (serve's own is never read)


def _call(fn: Callable[..., T], args: list[object]) -> T:
    """In a worker: the snapshots rebuilt from the replica, then the solve."""
    return fn(*[a.rebuild() if isinstance(a, Shipped) else a for a in args])


_shared: dict[str, SolverWorkers] = {}
_shared_lock = threading.Lock()


def shared(name: str = "preemption") -> SolverWorkers:
    """The process's workers for one kind of solve (started on first use, stopped at exit): a
    group preemption plan, which a verb waits for, never queues behind a smallest-change search,
    which none does."""
    with _shared_lock:
        workers = _shared.get(name)
        if workers is None:
            workers = _shared[name] = SolverWorkers()
            atexit.register(workers.close)
        return workers
