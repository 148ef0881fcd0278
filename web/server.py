"""cheroot, the threaded production WSGI server phalanx serves on, set up in one place.

cheroot runs a fixed pool of worker threads, one request at a time each: a handler may block (the
extender's bind waits at the gang barrier, the pod webhook waits for a PodGroup) without holding up
the others as long as the pool has threads to spare, which is why every caller chooses its size.
TLS uses cheroot's builtin adapter, its files re-read when they change (:mod:`web.certs`); a client
CA turns on verification of client certificates.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from cheroot import wsgi

from .certs import ReloadingSSLAdapter

WsgiApp = Callable[..., Any]


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:80`` too) -> ``(host, port)``."""
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


def wsgi_server(addr: str, app: WsgiApp, threads: int, tls_cert: str | None = None, tls_key: str | None = None,
                client_ca: str | None = None, queue: int = 512, timeout: int = 600) -> wsgi.Server:
    """A cheroot server for ``app`` on ``addr`` with ``threads`` workers; HTTPS when given a
    certificate and key, requiring client certificates signed by ``client_ca`` when given one.
    ``timeout`` is the socket timeout of a connection (a bind may wait at the barrier for minutes)."""
    server = wsgi.Server(split_addr(addr), app, numthreads=threads, request_queue_size=queue, timeout=timeout,
                         accepted_queue_size=-1)
    if tls_cert or tls_key or client_ca:
        if not (tls_cert and tls_key):
            raise ValueError("--tls-cert and --tls-key go together (and --client-ca needs them)")
        server.ssl_adapter = ReloadingSSLAdapter(tls_cert, tls_key, client_ca)  # files re-read on change
    return server


class Listener:
    """A cheroot server running on a daemon thread of its own, until :meth:`stop`."""

    def __init__(self, server: wsgi.Server, name: str) -> None:
        self.server, self.name = server, name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.bind_addr[1])

    def start(self) -> "Listener":
        self.server.prepare()  # binds now: a port in use fails here, in the caller
        self._thread = threading.Thread(target=self.server.serve, name=self.name, daemon=True)
        self._thread.start()
        return self

    def serving(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and bool(self.server.ready)

    def stop(self) -> None:
        self.server.stop()
