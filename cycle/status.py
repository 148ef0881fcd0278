"""What the workload cycle tells the world: PodGroup status and events, pod touches, listeners.

Every write here goes through the asynchronous :class:`~.dispatch.Dispatcher` (never under the
cycle's lock, never on a verb's thread). Listeners (the dashboard, the gRPC event stream, the queue
policies) are called in-line and must be quick; a listener that raises is logged and skipped, so a
broken one never breaks scheduling.

The ``PodGroupInitiallyScheduled`` condition as upstream's gang scheduling writes it: ``True``
once the group's members go to binding and never back to ``False``; ``False`` with reason
``Unschedulable`` (or ``SchedulerError``) and the explanation otherwise. Once it is ``True``, what
the gang's later members wait for (a lost member's replacement, a member that joined) goes on
phalanx's ``scheduling.phalanx.dev/MembersScheduled`` beside it: ``False`` with which members are
pending, running and finished and why they wait, ``True`` again when they go to binding (written
only after it was ``False``: a gang that never waits again gets no second condition). The last
condition queued wins over the cache's copy, which lags the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, TypeVar

from cluster import names
from cluster.backend import ClusterWriter, Expected, WriteError
from cluster.cache import ClusterCache
from cluster.convert import Condition

from .dispatch import Dispatcher, Write, transient

log = logging.getLogger("phalanx.cycle")

MAX_MESSAGE = 32768  # a condition's message, as the API server's validation allows
MAX_NOTE = 1024  # an event's note

Listener = Callable[[str, Mapping[str, Any]], None]


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class TouchStamps:
    """Values for the retry annotation, each different from every earlier one this process gave:
    the time with microseconds, moved on by one microsecond when the clock has not moved.

    The API server drops an update that changes nothing (no new resourceVersion, no watch event).
    With whole seconds, a second touch of a pod within the second of its first wrote the same value,
    so kube-scheduler never heard of it and the member stayed parked: seen as a gang answered
    "waiting for 1 preempted pods" and never retried after its last victim went (its members were
    touched at each victim's going, all within one second)."""

    def __init__(self, now_ns: Callable[[], int] = time.time_ns) -> None:
        self._now_ns = now_ns
        self._last = 0  # microseconds since the epoch of the last value given
        self._lock = threading.Lock()

    def next(self) -> str:
        with self._lock:
            self._last = max(self._now_ns() // 1000, self._last + 1)
            micros = self._last
        seconds, rest = divmod(micros, 1_000_000)
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{rest:06d}Z"


def _names(head: str, names_: list[str], shown: int = 3) -> str:
    """``head`` and up to ``shown`` names: "2 pending (a, b)", "5 running (a, b, c, +2)"."""
    more = f", +{len(names_) - shown}" if len(names_) > shown else ""
    return f"{head} ({', '.join(names_[:shown])}{more})"


def scheduled_message(pods: int, domain: str) -> str:
    """``PodGroupInitiallyScheduled=True``'s message."""
    return f"{pods} pods going to binding in {domain or 'the cluster'}"


def podgroup_obj(key: str) -> str:
    """The dispatcher's ordering key for a PodGroup's writes."""
    return f"PodGroup/{key}"


T = TypeVar("T")


def until_not_refused(known: Callable[[], T], write: Callable[[T], None], wait_seconds: float,
                      guarded: Callable[[T], bool] = lambda _: True) -> None:
    """``write(known())``, a write guarded on what phalanx knows of the object (``known()``: a
    version, an annotation's value), made again while the API server refuses it 409 (the object
    moved on): each time once ``known()`` has changed, for up to ``wait_seconds`` in all; then, or
    for another error, or for a token ``guarded`` says guards nothing, the refusal is raised."""
    deadline = time.monotonic() + wait_seconds
    while True:
        token = known()
        try:
            write(token)
            return
        except WriteError as err:
            if err.status != 409 or not guarded(token) or time.monotonic() >= deadline:
                raise
            while known() == token and time.monotonic() < deadline:
                time.sleep(0.01)


class StatusWriter:
    def __init__(self, cache: ClusterCache, writer: ClusterWriter, dispatcher: Dispatcher) -> None:
        self.cache = cache
        self.writer = writer
        self.dispatcher = dispatcher
        # group -> condition type -> the last condition queued (the cache lags)
        self.conditions: dict[str, dict[str, Condition]] = {}
        # group -> (the version phalanx's last write on it was conditional on, the version it made)
        self.written: dict[str, tuple[str, str]] = {}
        # group -> (its placement annotation as the cache showed it at phalanx's last write of it,
        # as that write left it)
        self.annotated: dict[str, tuple[Expected, Expected]] = {}
        self.touches = TouchStamps()
        self._listeners: list[Listener] = []

    # -- listeners ---------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def emit(self, kind: str, **data: Any) -> None:
        for listener in self._listeners:
            try:
                listener(kind, data)
            except Exception:  # noqa: BLE001 - a broken listener must not break scheduling
                log.exception("event listener failed")

    # -- PodGroup writes ---------------------------------------------------------------------
    def submit(self, key: str, kind: str, call: Callable[[], None], coalesce: str = "") -> None:
        self.dispatcher.submit(Write(podgroup_obj(key), kind, call, coalesce))

    # the rule's one home (docs/design.md: KEP-6277/initially-scheduled)
    def set_status(self, key: str, ok: bool, reason: str, message: str) -> None:
        """Queue ``PodGroupInitiallyScheduled`` on ``key`` (True: scheduled; never back to False);
        once it is True, ``MembersScheduled`` instead (see the module's docstring)."""
        if self.cache.podgroups.get(key) is None:
            return  # the group is gone (or not seen yet): nothing to write on
        change = self._scheduled(key, ok, reason, message)
        if change is not None:
            self._put(key, *change)

    def _scheduled(self, key: str, ok: bool, reason: str, message: str) -> tuple[str, bool, str, str] | None:
        """The condition :meth:`set_status` writes, or None when it writes nothing."""
        current = self._current(key, names.CONDITION_INITIALLY_SCHEDULED)
        if current is None or current.status != "True":
            return names.CONDITION_INITIALLY_SCHEDULED, ok, reason, message  # never back to False
        members = self._current(key, names.CONDITION_MEMBERS_SCHEDULED)
        if not ok:
            return names.CONDITION_MEMBERS_SCHEDULED, False, reason, f"{self.members_note(key)}: {message}"
        if members is not None and members.status == "False":
            return names.CONDITION_MEMBERS_SCHEDULED, True, names.REASON_MEMBERS_SCHEDULED, message
        return None  # True -> True keeps its lastTransitionTime

    def members_waiting(self, key: str, message: str) -> None:
        """A gang already scheduled waits for members (a lost one's replacement not created yet):
        ``MembersScheduled`` says so. Nothing is written for a gang not yet scheduled: waiting for
        members is how every gang starts."""
        current = self._current(key, names.CONDITION_INITIALLY_SCHEDULED)
        if current is not None and current.status == "True":
            self.set_status(key, False, names.REASON_WAITING_FOR_MEMBERS, message)

    def members_note(self, key: str) -> str:
        """Which members of ``key`` are pending, running and finished (a few names each)."""
        live = self.cache.members(key)
        parts = [_names(f"{len(rows)} {what}", [r.pod.name for r in rows]) for what, rows in (
            ("pending", [r for r in live if not r.pod.node]), ("running", [r for r in live if r.pod.node]),
            ("finished", self.cache.finished_members(key))) if rows]
        return f"podgroup {key} was scheduled; members " + ", ".join(parts or ["none"])

    def _current(self, key: str, type_: str) -> Condition | None:
        queued = self.conditions.get(key, {}).get(type_)
        record = self.cache.podgroups.get(key)
        return queued or (record.condition(type_) if record else None)

    def _condition(self, key: str, type_: str, ok: bool, reason: str, message: str) -> Condition | None:
        """Condition ``type_`` as it should now read, or None when it says this already."""
        current = self._current(key, type_)
        status = "True" if ok else "False"
        message = message[:MAX_MESSAGE]
        same_status = current is not None and current.status == status
        if current is not None and same_status and current.message == message:
            return None
        return Condition(type_, status, reason, message,
                         current.last_transition_time if current and same_status else now_rfc3339())

    def _patch(self, key: str) -> dict[str, Any]:
        """The status patch of ``key``: every condition queued for it over the cache's copy."""
        queued = dict(self.conditions.get(key, {}))  # a copy: the cycle may queue one meanwhile
        record = self.cache.podgroups.get(key)
        others = [c.to_json() for c in (record.conditions if record else ()) if c.type not in queued]
        return {"conditions": others + [c.to_json() for c in queued.values()]}

    def _put(self, key: str, type_: str, ok: bool, reason: str, message: str) -> None:
        """Queue condition ``type_`` on ``key`` unless it says this already."""
        condition = self._condition(key, type_, ok, reason, message)
        if condition is None:
            return
        self.conditions.setdefault(key, {})[type_] = condition
        self.submit(key, "status", lambda: self._write_status(key), coalesce=f"status:{key}")

    # the rule's one home (docs/design.md: phalanx/fenced-podgroup-writes)
    def _version(self, key: str) -> str:
        """The version of PodGroup ``key`` phalanx's next write on it is conditional on: the
        cache's, or the one phalanx's own last write made while the cache has not seen it yet
        ("" when the cache has no version: the write is unconditional)."""
        record = self.cache.podgroups.get(key)
        cached = record.resource_version if record else ""
        based, made = self.written.get(key, ("", ""))
        return made if made and based == cached else cached

    def _fenced(self, key: str, write: Callable[[str], str], wait_seconds: float = 0.0) -> None:
        """``write(version)``, a PodGroup write conditional on the version phalanx last knew of
        the group (:meth:`_version`); the version it made is remembered. A write refused because
        the group moved on (409: another writer — kube-scheduler, the controller, or the serve
        that leads now while this one was frozen) is not forced: with ``wait_seconds`` it is made
        again, on what the cache then holds, once the cache has seen the newer version (waiting
        up to that long); else the refusal is raised, and the dispatcher's retry makes it again
        the same way — through the leadership gate, so a serve that no longer leads drops it."""
        def conditional(version: str) -> None:
            made = write(version)
            if made:
                self.written[key] = (version, made)
        until_not_refused(lambda: self._version(key), conditional, wait_seconds, guarded=bool)

    def _cached_annotation(self, key: str) -> Expected:
        record = self.cache.podgroups.get(key)
        if record is None:
            return Expected(False, {names.ANNOTATION_PLACEMENT: None})
        return Expected(bool(record.annotations), {names.ANNOTATION_PLACEMENT: record.annotations.get(
            names.ANNOTATION_PLACEMENT)})

    def _expected_annotation(self, key: str) -> Expected:
        """How PodGroup ``key``'s placement annotation reads as far as phalanx knows: the cache's
        copy, or what phalanx's own last write of it left while the cache has not seen that yet."""
        cached = self._cached_annotation(key)
        based, made = self.annotated.get(key, (None, None))
        return made if made is not None and based == cached else cached

    def _annotate_record(self, key: str, text: str | None, wait_seconds: float = 0.0) -> None:
        """Write (``None``: remove) the placement annotation of ``key``, guarded on what phalanx
        knows it to read (:meth:`_expected_annotation`), not on the group's version: kube-scheduler's
        pod-group cycle writes the group's status condition at the moment a gang's record is
        written, and a write conditional on the version was refused about every other gang (one
        more API call, and a wait in Permit). A new leader's record in between still refuses it
        (409), and it is then made again as :meth:`_fenced` makes its writes again."""
        namespace, name = key.split("/", 1)

        def guarded(expect: Expected) -> None:
            cached, record = self._cached_annotation(key), self.cache.podgroups.get(key)
            based = record.resource_version if record else ""
            made = self.writer.annotate_podgroup(namespace, name, {names.ANNOTATION_PLACEMENT: text}, expect=expect)
            others = bool(record and set(record.annotations) - {names.ANNOTATION_PLACEMENT})
            self.annotated[key] = (cached, Expected(text is not None or others, {names.ANNOTATION_PLACEMENT: text}))
            if made and based:
                self.written[key] = (based, made)
        until_not_refused(lambda: self._expected_annotation(key), guarded, wait_seconds)

    def _write_status(self, key: str) -> None:
        """Write ``key``'s status as it should read now (the queued conditions over the cache's
        copy, computed when the write starts, so a retry writes what the group then holds)."""
        namespace, name = key.split("/", 1)
        self._fenced(key, lambda version: self.writer.patch_podgroup_status(namespace, name, self._patch(key),
                                                                          version))

    # the write-ahead record's one home (docs/design.md: phalanx/placement-record)
    def write_record(self, key: str, text: str, scheduled: str | None, flush_seconds: float) -> None:
        """Write gang ``key``'s placement record ``text`` now, synchronously, before any member
        binds; with ``scheduled`` (the message) ``PodGroupInitiallyScheduled=True`` goes in the
        same status write: one write per gang, as in-tree's condition alone. Raises what the
        writer raises (the plan then fails).

        The conditions are queued before the write, so a status write queued meanwhile carries
        them too; earlier queued writes land first. The record goes on the annotation instead
        (metadata, which no status write touches) when it is too long for a condition's message
        (hundreds of members: a second write per gang is cheap per pod), and when ``scheduled``
        is None: kube-scheduler's pod-group cycle writes the group's condition at this very
        moment, and a status write of phalanx's that crossed it would carry the conditions list
        without it."""
        namespace, name = key.split("/", 1)
        changes: list[tuple[str, bool, str, str]] = []
        if len(text) > MAX_MESSAGE or scheduled is None:
            self._flush(key, flush_seconds)
            self._annotate_record(key, text, flush_seconds)
            current = self._current(key, names.CONDITION_PLACEMENT)
            if current is not None and current.status == "True":  # it would win over the annotation
                changes.append((names.CONDITION_PLACEMENT, False, names.REASON_PLACEMENT_ON_ANNOTATION,
                                f"the record is on annotation {names.ANNOTATION_PLACEMENT}"))
        else:
            changes.append((names.CONDITION_PLACEMENT, True, names.REASON_PLACEMENT_RECORDED, text))
        if scheduled is not None:
            changes += filter(None, [self._scheduled(key, True, names.REASON_SCHEDULED, scheduled)])
        if not changes:
            return
        queued = self.conditions.setdefault(key, {})
        before = dict(queued)
        for change in changes:
            condition = self._condition(key, *change)
            if condition is not None:
                queued[condition.type] = condition
        try:
            self._flush(key, flush_seconds)
            self._fenced(key, lambda version: self.writer.patch_podgroup_status(
                namespace, name, self._patch(key), version), flush_seconds)
        except Exception:
            if self.conditions.get(key) is queued:  # not written: what was queued before stands
                queued.clear()
                queued.update(before)
            raise

    def _flush(self, key: str, seconds: float) -> None:
        if not self.dispatcher.flush(podgroup_obj(key), timeout=seconds):
            raise WriteError(f"earlier writes on podgroup {key} are still pending "
                             f"after {seconds:g} s (API server slow or away)", 0)

    def event(self, key: str, reason: str, note: str, type_: str = "Normal") -> None:
        """Queue an event on PodGroup ``key``."""
        ns, name = key.split("/", 1)
        record = self.cache.podgroups.get(key)
        ref = {"kind": "PodGroup", "namespace": ns, "name": name, "uid": record.uid if record else ""}
        self.submit(key, "event", lambda: self.writer.event(ref, reason, note[:MAX_NOTE], type_))

    def remove_record(self, key: str, why: str) -> None:
        """Queue the abandonment of gang ``key``'s placement record: its condition False with
        ``why`` where it is a condition, its annotation removed where it is one."""
        record = self.cache.podgroups.get(key)
        if record is None:
            return
        current = self._current(key, names.CONDITION_PLACEMENT)
        if current is not None and current.status == "True":
            self._put(key, names.CONDITION_PLACEMENT, False, names.REASON_PLACEMENT_ABANDONED, why)
        if names.ANNOTATION_PLACEMENT in record.annotations:
            self.submit(key, "annotate", lambda: self._annotate_record(key, None))

    def unschedulable(self, key: str, message: str, reason: str = names.REASON_UNSCHEDULABLE) -> None:
        """A group that cannot be placed now: the condition, a Warning event, the listeners."""
        self.set_status(key, False, reason, message)
        self.event(key, names.EVENT_FAILED_SCHEDULING, message, "Warning")
        self.emit("unschedulable", group=key, message=message)

    # -- pods --------------------------------------------------------------------------------
    def nudge(self, namespace: str, name: str) -> None:
        """Touch a pod (annotation ``scheduling.phalanx.dev/retry``): the update makes
        kube-scheduler retry a pod phalanx answered "no node" for a reason that has gone. Each
        touch writes a value no earlier one wrote (:class:`TouchStamps`), so it is always an update."""
        def touch() -> None:
            try:
                self.writer.annotate_pod(namespace, name, {names.ANNOTATION_RETRY: self.touches.next()})
            except WriteError as err:  # a pod gone or changed: the next event retries it anyway
                if transient(err):
                    raise  # the API server away, failing or throttling: the dispatcher retries
                log.info("could not nudge %s/%s: %s", namespace, name, err)
        self.dispatcher.submit(Write(f"Pod/{namespace}/{name}", "nudge", touch, f"nudge:{namespace}/{name}"))

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Queue a merge of ``annotations`` into a pod's; a pod gone or changed is let be."""
        def annotate() -> None:
            try:
                self.writer.annotate_pod(namespace, name, annotations)
            except WriteError as err:
                log.info("could not annotate %s/%s: %s", namespace, name, err)
        self.dispatcher.submit(Write(f"Pod/{namespace}/{name}", "annotate", annotate))

    def prune(self, live: Mapping[str, Any]) -> None:
        for key in [k for k in self.conditions if k not in live]:
            del self.conditions[key]
        for key in [k for k in self.written if k not in live]:
            del self.written[key]
        for key in [k for k in self.annotated if k not in live]:
            del self.annotated[key]
