"""Which of several ``phalanx serve`` replicas acts: the one beside the kube-scheduler that leads.

Several scheduler replicas run for availability; kube-scheduler (phalanx-scheduler in plugin mode)
leader-elects on a coordination.k8s.io Lease and only the leader schedules, so only the leader's
phalanx serve is asked anything. Every serve keeps its caches warm; only the leader's may plan ahead,
touch, write records, status, events, bindings and evictions, or provision: a standby that wrote
would fight the leader over the same PodGroups. So serve follows the Lease its kube-scheduler
elects on (``phalanx serve --leader-lease NAMESPACE/NAME``) rather than running an election of its
own, which could pick a serve whose kube-scheduler does not lead.

kube-scheduler's identity on the Lease is ``<host name>_<uuid>`` (``os.Hostname()``; in a pod, the
pod's name, which its sidecars share). serve acts while

- the Lease's ``holderIdentity`` is ``identity`` or starts with ``identity + "_"``, and
- the holder keeps renewing: serve saw the Lease change (a renewal, or the holder taking it) less
  than :attr:`LeaseFollower.stand_down_after` ago, measured on serve's monotonic clock from the
  moment it saw the change. The first read is no proof (the holder may have died before serve
  started): a serve starts acting at the first renewal it sees, a ``retryPeriod`` later.

A holder that stops renewing (its kube-scheduler died, hangs or is cut off) cannot be replaced
until ``leaseDurationSeconds`` have passed since another replica last saw it renew; serve stands
down two polls before that, so two serves never act at once while clocks run at the same rate
(client-go's leader election makes the same assumption). A serve frozen and resumed (a node
partitioned and back) finds its last sighting old and stays a standby until it sees a renewal of
its own holder again. serve reads the Lease every ``poll`` seconds (a GET: one request a second at
the default Lease duration of 15 s) and never writes it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from .kube import Kube, KubeError, api_path

log = logging.getLogger("phalanx.leadership")

#: the Lease's API
LEASE_API_VERSION = "coordination.k8s.io/v1"
#: kube-scheduler's default ``leaderElection.leaseDuration`` (s), when a Lease does not say
DEFAULT_LEASE_SECONDS = 15.0
#: the longest wait between two reads of the Lease (s); shorter Leases are read 8 times a duration
MAX_POLL_SECONDS = 1.0
#: :meth:`LeaseFollower.confirm` reads the Lease at most this often (s): a burst of refused writes
#: makes one read, not one each
CONFIRM_SECONDS = 0.1


class Leadership(Protocol):
    def acting(self) -> bool:
        """Whether this serve acts now (plans ahead, writes); False: a standby."""

    def confirm(self) -> bool:
        """Read the Lease now and return :meth:`acting` (a write is about to be refused: the
        kube-scheduler beside this serve may have taken the Lease since the last poll)."""

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(acting)`` whenever this serve starts or stops acting (from any thread)."""

    def describe(self) -> str:
        """What this serve is and why, for logs, /readyz and the dashboard."""


class AlwaysActing:
    """One replica: serve always acts (no ``--leader-lease``)."""

    def acting(self) -> bool:
        return True

    def confirm(self) -> bool:
        return True

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        return None

    def describe(self) -> str:
        return "acting (one replica: no --leader-lease)"


@dataclass(frozen=True)
class LeaseView:
    """What serve reads of a Lease."""

    holder: str
    renew_time: str
    duration: float

    @classmethod
    def parse(cls, obj: Mapping[str, Any] | None) -> "LeaseView | None":
        """A coordination.k8s.io/v1 Lease as the API server answers it (None: no Lease)."""
        if not isinstance(obj, Mapping):
            return None
        spec = obj.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        duration = spec.get("leaseDurationSeconds")
        seconds = float(duration) if isinstance(duration, (int, float)) and duration > 0 else DEFAULT_LEASE_SECONDS
        return cls(holder=str(spec.get("holderIdentity") or ""), renew_time=str(spec.get("renewTime") or ""),
                   duration=seconds)


def holds(holder: str, identity: str) -> bool:
    """Whether a Lease holder is the kube-scheduler of ``identity`` (``identity`` or ``identity_uuid``)."""
    return bool(identity) and (holder == identity or holder.startswith(identity + "_"))


def parse_lease_ref(ref: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` -> (namespace, name); ValueError saying what is wrong."""
    namespace, _, name = ref.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"--leader-lease {ref!r}: give NAMESPACE/NAME, the Lease kube-scheduler's "
                         "leaderElection names (resourceNamespace/resourceName)")
    return namespace, name


class LeaseFollower:
    """Follows a Lease kube-scheduler elects on; acts while its own kube-scheduler holds it.

    ``read`` returns the Lease as the API server answers it (None when it does not exist) and may
    raise; the clock is monotonic seconds. :meth:`observe` is one read's outcome (the poll thread
    calls it; tests call it directly)."""

    def __init__(self, read: Callable[[], Mapping[str, Any] | None], identity: str, lease: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not identity:
            raise ValueError("--leader-identity: empty (kube-scheduler's identity starts with its host name)")
        self._read, self.identity, self.lease, self.clock = read, identity, lease, clock
        self._lock = threading.Lock()
        self._seen: LeaseView | None = None
        self._seen_at = float("-inf")  # when the current (holder, renewTime) was first seen
        self._duration = DEFAULT_LEASE_SECONDS
        self._error = ""
        self._acting = False  # as last announced to the listeners
        self._listeners: list[Callable[[bool], None]] = []
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._reading = threading.Lock()  # one read of the Lease at a time
        self._read_at = float("-inf")  # when the last read ended
        self._reads = 0  # reads made, in order; observed: the latest read whose outcome was taken
        self._observed = 0

    @classmethod
    def on(cls, kube: Kube, lease: str, identity: str) -> "LeaseFollower":
        namespace, name = parse_lease_ref(lease)
        path = api_path(LEASE_API_VERSION, "leases", namespace, name)
        return cls(lambda: kube.get_or_none(path), identity, lease)

    @property
    def poll(self) -> float:
        return min(MAX_POLL_SECONDS, self._duration / 8)

    @property
    def stand_down_after(self) -> float:
        """Seconds without a renewal seen after which serve stops acting: two polls before another
        replica may take the Lease over."""
        return max(self.poll, self._duration - 2 * self.poll)

    def acting(self) -> bool:
        with self._lock:
            return self._acting_now()

    def _acting_now(self) -> bool:
        seen = self._seen
        return seen is not None and holds(seen.holder, self.identity) \
            and self.clock() - self._seen_at < self.stand_down_after

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        self._listeners.append(listener)

    def describe(self) -> str:
        with self._lock:
            seen, error, acting = self._seen, self._error, self._acting_now()
        role = "acting" if acting else "standby"
        if seen is None:
            why = f"cannot read the Lease: {error}" if error else "the Lease does not exist yet"
        elif not holds(seen.holder, self.identity):
            why = f"held by {seen.holder or 'no one'}"
        elif acting:
            why = "held by this replica's kube-scheduler"
        else:
            why = f"held by this replica's kube-scheduler, not renewed for over {self.stand_down_after:g} s"
        return f"{role} (Lease {self.lease}, identity {self.identity}: {why})"

    def observe(self, obj: Mapping[str, Any] | None, error: str = "", read: int = 0) -> bool:
        """Take one read of the Lease (``error``: the read failed, nothing is known); tell the
        listeners when this serve starts or stops acting. Returns whether it acts. ``read``: the
        read's number (:meth:`poll_once`); a read older than one already taken is ignored — two
        threads read in turn but take their outcomes unordered, and an older one taken last would
        put a Lease already taken over back (seen: a standby for a second after it acted)."""
        view = None if error else LeaseView.parse(obj)
        with self._lock:
            if read:
                if read < self._observed:
                    return self._acting_now()
                self._observed = read
            self._error = error
            if not error:
                if view is None:
                    self._seen, self._seen_at = None, float("-inf")
                elif view != self._seen:
                    # a first sighting is no renewal: what it shows may be old (a holder that died
                    # before this serve started); only a change seen proves the holder alive now
                    fresh = self._seen is not None
                    self._seen, self._duration = view, view.duration
                    self._seen_at = self.clock() if fresh else float("-inf")
            acting = self._acting_now()
            changed = acting != self._acting
            self._acting = acting
        if changed:
            log.warning("phalanx serve is now %s", self.describe())
            for listener in self._listeners:
                try:
                    listener(acting)
                except Exception:  # noqa: BLE001 - one listener must not stop the others
                    log.exception("leadership listener failed")
        return acting

    def poll_once(self) -> bool:
        """Read the Lease and :meth:`observe` it (the listeners run after the read is done)."""
        obj: Mapping[str, Any] | None = None
        with self._reading:
            self._reads += 1
            read = self._reads
            try:
                obj, error = self._read(), ""
            except (KubeError, OSError) as err:
                error = str(err) or type(err).__name__
            except Exception as err:  # noqa: BLE001 - the client raises what urllib3 raises
                error = f"{type(err).__name__}: {err}"
            self._read_at = self.clock()
        return self.observe(obj, error, read)

    def confirm(self) -> bool:
        if self.clock() - self._read_at >= CONFIRM_SECONDS:
            self.poll_once()
        return self.acting()

    def start(self) -> "LeaseFollower":
        if self._thread is None:
            self.poll_once()
            self._thread = threading.Thread(target=self._run, name="phalanx-lease", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.wait(self.poll):
            self.poll_once()
