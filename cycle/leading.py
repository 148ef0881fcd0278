"""Only the acting serve writes: every API write of the cycle passes through :class:`LeaderWriter`.

With several scheduler replicas (cluster/leadership.py) a standby serve keeps its caches warm and
writes nothing: the gate sits on the one interface every write goes through, so no code path (a
verb kube-scheduler still sends in the moment it loses the Lease, a queued status write, a
smallest-change search finishing late) can write from a standby. Before refusing, the gate reads
the Lease once more (its kube-scheduler may have just taken it: it schedules at once, serve's poll
sees it up to a second later). A refused write raises
:class:`~cluster.backend.WriteError` with reason :data:`~cluster.names.REASON_STANDBY` (the
dispatcher drops it at once, a bind fails its plan). Every write is counted by kind and outcome
(``phalanx_api_writes_total``), which is also how a test sees that a standby wrote nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from cluster import names
from cluster.backend import ClusterWriter, Expected, WriteError
from cluster.karpenter import NodeClaimAsk, NodePoolRecord
from cluster.leadership import Leadership
from cluster.provisioning import ProvisioningAsk

from .metrics import CycleMetrics

WRITTEN, FAILED, STANDBY = "written", "failed", "standby"


class LeaderWriter:
    """A :class:`ClusterWriter` that writes only while ``leadership`` acts, and counts every write."""

    def __init__(self, writer: ClusterWriter, leadership: Leadership, metrics: CycleMetrics) -> None:
        self.writer, self.leadership, self.metrics = writer, leadership, metrics
        self.flavor = writer.flavor

    def _do(self, kind: str, call: Callable[[], Any]) -> Any:
        if not self.leadership.acting() and not self.leadership.confirm():
            self.metrics.api_writes.labels(kind=kind, outcome=STANDBY).inc()
            raise WriteError(f"phalanx serve is a standby and writes nothing: {self.leadership.describe()}",
                             0, names.REASON_STANDBY)
        try:
            answer = call()
        except Exception:
            self.metrics.api_writes.labels(kind=kind, outcome=FAILED).inc()
            raise
        self.metrics.api_writes.labels(kind=kind, outcome=WRITTEN).inc()
        return answer

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        self._do("bind", lambda: self.writer.bind(namespace, name, uid, node))

    def evict(self, namespace: str, name: str, uid: str, message: str, respect_pdb: bool) -> None:
        self._do("evict", lambda: self.writer.evict(namespace, name, uid, message, respect_pdb))

    def patch_podgroup_status(self, namespace: str, name: str, status: Mapping[str, Any],
                              resource_version: str = "") -> str:
        return str(self._do("podgroup_status", lambda: self.writer.patch_podgroup_status(
            namespace, name, status, resource_version)) or "")

    def annotate_podgroup(self, namespace: str, name: str, annotations: Mapping[str, str | None],
                          resource_version: str = "", expect: Expected | None = None) -> str:
        return str(self._do("podgroup_annotation", lambda: self.writer.annotate_podgroup(
            namespace, name, annotations, resource_version, expect)) or "")

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        self._do("pod_annotation", lambda: self.writer.annotate_pod(namespace, name, annotations))

    def event(self, regarding: Mapping[str, str], reason: str, note: str, type_: str = "Normal") -> None:
        self._do("event", lambda: self.writer.event(regarding, reason, note, type_))

    def create_provisioning_request(self, ask: ProvisioningAsk) -> None:
        self._do("provisioning_request", lambda: self.writer.create_provisioning_request(ask))

    def delete_provisioning_request(self, namespace: str, name: str, templates: tuple[str, ...]) -> None:
        self._do("provisioning_request", lambda: self.writer.delete_provisioning_request(namespace, name, templates))

    def create_nodeclaim(self, ask: NodeClaimAsk, pool: NodePoolRecord) -> None:
        self._do("nodeclaim", lambda: self.writer.create_nodeclaim(ask, pool))

    def delete_nodeclaim(self, name: str) -> None:
        self._do("nodeclaim", lambda: self.writer.delete_nodeclaim(name))

    def release_nodeclaim(self, name: str, node: str) -> None:
        self._do("nodeclaim", lambda: self.writer.release_nodeclaim(name, node))


def standby(err: WriteError) -> bool:
    """Whether a write failed because this serve is a standby (never worth retrying here)."""
    return err.reason == names.REASON_STANDBY
