"""How ``kubectl phalanx`` reaches phalanx serve: find serve's pod, open a ``pods/portforward``
stream to serve's HTTP port through the API server, and speak HTTP/1.1 over it with the user's
bearer token (see the package docstring for why not the service proxy).

One port-forward per request, closed with it: a command makes one or two requests, and a stream
that outlives its request is one more thing to leak. :class:`Transport` is the boundary: the
commands see only ``request(method, path, body) -> Reply``; tests hand them another transport.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import portforward

#: where the shipped install runs serve: scheduler-config/deployment.yaml (kustomize), the
#: kube-scheduler Deployment's pod in kube-system with serve beside it on 127.0.0.1:8888
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_SELECTOR = "app=phalanx-scheduler"
DEFAULT_PORT = 8888
DEFAULT_TIMEOUT = 30.0  # seconds: a what-if of several gangs is a few solves


class ServeUnreachable(Exception):
    """phalanx serve could not be reached or asked (the message says where it stopped)."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise ServeUnreachable(f"phalanx serve answered HTTP {self.status} with no JSON: "
                                   f"{self.text()[:200]!r}") from None

    def text(self) -> str:
        return self.body.decode(errors="replace").strip()


class Transport(Protocol):
    def request(self, method: str, path: str, body: bytes | None = None) -> Reply: ...


@dataclass(frozen=True)
class ServeLocation:
    """Which pod and port serve listens on: ``pod`` by name, else the Running pod ``selector`` picks
    in ``namespace`` (the kube-scheduler Lease's holder when several match)."""

    namespace: str = DEFAULT_NAMESPACE
    selector: str = DEFAULT_SELECTOR
    pod: str = ""
    port: int = DEFAULT_PORT


def _api_error(err: ApiException, what: str) -> ServeUnreachable:
    why = {401: "the API server does not accept your credentials",
           403: "your user may not do it (RBAC; see docs/kubectl-plugin.md for the rules it needs)",
           404: "not found"}.get(err.status or 0, err.reason or "")
    return ServeUnreachable(f"{what}: HTTP {err.status}: {why}")


def _lease_holders(api: client.ApiClient, namespace: str) -> set[str]:
    """Pod names holding a Lease in ``namespace`` (kube-scheduler's leader election writes
    ``<pod>_<uid>``); empty when the user may not list Leases."""
    try:
        leases = client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    except ApiException:
        return set()
    return {(lease.spec.holder_identity or "").split("_")[0] for lease in leases if lease.spec}


def find_pod(api: client.ApiClient, where: ServeLocation) -> str:
    """The name of serve's pod: ``where.pod``, else a Running pod ``where.selector`` matches,
    preferring the leader (a kube-scheduler Deployment of several replicas has one serve per pod,
    and only the leader's plans)."""
    if where.pod:
        return where.pod
    core = client.CoreV1Api(api)
    try:
        pods = core.list_namespaced_pod(where.namespace, label_selector=where.selector).items
    except ApiException as err:
        raise _api_error(err, f"cannot list pods {where.selector!r} in namespace {where.namespace}") from None
    running = sorted(p.metadata.name for p in pods if p.status and p.status.phase == "Running"
                     and not p.metadata.deletion_timestamp)
    if not running:
        raise ServeUnreachable(f"no Running pod matches {where.selector!r} in namespace {where.namespace} "
                               f"({len(pods)} pods match): is phalanx installed there? "
                               "(--phalanx-namespace, --phalanx-selector, --phalanx-pod)")
    if len(running) > 1:
        leaders = _lease_holders(api, where.namespace)
        running = [name for name in running if name in leaders] or running
    return running[0]


class PortForwardTransport:
    """HTTP/1.1 to ``port`` of pod ``namespace/pod`` over a ``pods/portforward`` stream."""

    def __init__(self, api: client.ApiClient, namespace: str, pod: str, port: int, token: str | None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api, self.namespace, self.pod, self.port = api, namespace, pod, port
        self.token, self.timeout = token, timeout

    @property
    def where(self) -> str:
        return f"pod {self.namespace}/{self.pod} port {self.port}"

    def _open(self) -> Any:
        core = client.CoreV1Api(self.api)
        try:
            return portforward(core.connect_get_namespaced_pod_portforward, self.pod, self.namespace,
                               ports=str(self.port))
        except ApiException as err:
            raise _api_error(err, f"cannot port-forward to {self.where}") from None
        except Exception as err:  # the websocket library's own errors: refused, reset, TLS
            raise ServeUnreachable(f"cannot port-forward to {self.where}: {err}") from None

    def request(self, method: str, path: str, body: bytes | None = None) -> Reply:
        headers = {"Accept": "application/json", "Connection": "close"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        forward = self._open()
        try:
            sock = forward.socket(self.port)
            sock.settimeout(self.timeout)
            conn = http.client.HTTPConnection("localhost", self.port, timeout=self.timeout)
            conn.sock = sock  # HTTP over the forwarded stream: no local port is opened either
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return Reply(response.status, response.read())
            except (OSError, http.client.HTTPException) as err:
                error = forward.error(self.port)
                raise ServeUnreachable(f"{method} {path} through the port-forward to {self.where}: "
                                       f"{error or err or type(err).__name__}") from None
            finally:
                conn.close()
        finally:
            forward.close()
