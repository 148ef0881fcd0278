"""Leader election on a ``coordination.k8s.io/v1`` Lease, so two replicas never both write.

The rules of client-go's leader election: a replica takes the Lease when it is free, its own, or
not renewed for ``lease_duration`` *as observed on this replica's clock* (so clock skew between
replicas does not matter); every write carries the Lease's resourceVersion, so of two replicas
racing for it exactly one wins. The leader renews every ``retry_period``; when it cannot renew
within ``renew_deadline`` it stops leading (``on_lost``) before anyone else may take over.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from typing import Any, Callable

from cluster import kinds
from cluster.kube import KubeError, api_path

log = logging.getLogger(__name__)


def _micro_time() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector(threading.Thread):
    def __init__(self, kube: Any, namespace: str, name: str, identity: str, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0,
                 on_started: Callable[[], None] = lambda: None, on_lost: Callable[[], None] = lambda: None):
        super().__init__(name=f"leader-election-{name}", daemon=True)
        self.kube, self.namespace, self.lease_name, self.identity = kube, namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_started, self.on_lost = on_started, on_lost
        self._leading = threading.Event()
        self._halt = threading.Event()
        self._observed: tuple[Any, float] = (None, 0.0)  # (holder, renewTime) and when we saw it change

    def is_leader(self) -> bool:
        return self._leading.is_set()

    def stop(self, release: bool = True) -> None:
        self._halt.set()
        self.join(5)
        if release and self._leading.is_set():
            self._release()
        self._leading.clear()

    @property
    def _path(self) -> str:
        return api_path("coordination.k8s.io/v1", "leases", self.namespace, self.lease_name)

    def run(self) -> None:
        while not self._halt.is_set():
            if self._try_acquire_or_renew():
                if not self._leading.is_set():
                    self._leading.set()
                    log.info("%s is now the leader (Lease %s/%s)", self.identity, self.namespace, self.lease_name)
                    self.on_started()
                last_renew = time.monotonic()
                while not self._halt.wait(self.retry_period):
                    if self._try_acquire_or_renew():
                        last_renew = time.monotonic()
                    elif time.monotonic() - last_renew > self.renew_deadline:
                        self._leading.clear()
                        log.error("%s lost the Lease %s/%s", self.identity, self.namespace, self.lease_name)
                        self.on_lost()
                        return
                return
            self._halt.wait(self.retry_period)

    def _spec(self, transitions: int, acquire_time: str | None, now: str | None = None) -> dict[str, Any]:
        now = now or _micro_time()
        return {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_duration)),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    def _try_acquire_or_renew(self) -> bool:
        try:
            lease = self.kube.get_or_none(self._path)
            if lease is None:
                body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.lease_name, "namespace": self.namespace},
                        "spec": self._spec(0, None)}
                self.kube.create(api_path("coordination.k8s.io/v1", "leases", self.namespace), body)
                return True
            current = kinds.lease(lease)
            record = (current.holder or None, current.renew_time or None)
            if record != self._observed[0]:
                self._observed = (record, time.monotonic())
            expired = time.monotonic() - self._observed[1] > (current.duration or self.lease_duration)
            if current.holder and current.holder != self.identity and not expired:
                return False
            ours = current.holder == self.identity
            now = _micro_time()
            acquired = (current.acquire_time or None) if ours else None
            spec = self._spec(current.transitions + (0 if ours else 1), acquired, now)
            self.kube.request("PUT", self._path, kinds.with_lease_spec(lease, spec))  # carries resourceVersion
            self._observed = ((self.identity, now), time.monotonic())
            return True
        except KubeError as err:
            log.warning("leader election: %s", err)
            return False

    def _release(self) -> None:
        try:
            lease = self.kube.get_or_none(self._path)
            if lease and kinds.lease(lease).holder == self.identity:
                released = {**kinds.lease(lease).raw_spec, "holderIdentity": None, "renewTime": _micro_time(),
                            "leaseDurationSeconds": 1}
                self.kube.request("PUT", self._path, kinds.with_lease_spec(lease, released))
        except KubeError as err:
            log.warning("releasing the Lease: %s", err)
