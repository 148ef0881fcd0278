"""``phalanx controller``: the StatefulSet controller and its webhooks in one process.

Every replica serves the webhooks (they only read the API); only the replica holding the Lease
reconciles and writes. Losing the Lease ends the process (exit 1) so it restarts as a follower,
as client-go controllers do.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import uuid

from cluster.access import AccessReviewer
from cluster.kube import Kube

from .admission import PodMutator
from .runtime import DEFAULT_SCHEDULING_SETTLE, Controller
from .webhook import WebhookServer

log = logging.getLogger(__name__)


def run(kubeconfig: str | None, webhook_addr: str, tls_cert: str, tls_key: str, lease_namespace: str,
        workers: int = 16, identity: str | None = None, scheduling_settle: float = DEFAULT_SCHEDULING_SETTLE) -> int:
    identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    kube = Kube(kubeconfig)
    lost, stop = threading.Event(), threading.Event()
    controller = Controller(kube, identity, lease_namespace, workers, on_lost_leadership=lost.set,
                            scheduling_settle=scheduling_settle)
    mutator = PodMutator(kube, controller.reconciler, controller.flavor, kick=controller.kick)
    # /metrics: a bearer token the API server authorizes (the webhooks and /healthz stay open)
    server = WebhookServer(webhook_addr, tls_cert, tls_key, mutator.review, controller.registry,
                           gate=AccessReviewer(kube).answer).start()
    log.info("phalanx controller %s: %s flavor, webhooks on https://%s", identity,
             "built-in" if controller.flavor.builtin else "CRD", webhook_addr)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    controller.start()
    while not (stop.wait(0.5) or lost.is_set()):
        pass
    controller.stop(release_lease=not lost.is_set())
    server.stop()
    return 1 if lost.is_set() else 0
