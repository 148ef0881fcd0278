"""Certificate files that change under a running server (a Secret volume swaps them; cert-manager
renews them): noticed by their identity, so each new handshake can use the current ones.

:class:`WatchedFiles` says whether any of a set of files changed since the read that was last
accepted; the HTTPS listener (:class:`ReloadingSSLAdapter`) and the gRPC endpoint
(``rpc.tls``) re-read their files then, and keep the previous ones when the new ones cannot be
used yet (a file caught half-written), so a rotation never takes a listener down.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from typing import Any

from cheroot.ssl.builtin import BuiltinSSLAdapter

log = logging.getLogger("phalanx.web.certs")

Stamp = tuple[int, int, int]


def _stamp(path: str) -> Stamp:
    st = os.stat(path)  # follows the symlinks a Secret volume swaps
    return st.st_ino, st.st_mtime_ns, st.st_size


class WatchedFiles:
    """``paths`` and the identity (inode, mtime, size) each had when last accepted."""

    def __init__(self, *paths: str) -> None:
        self.paths = paths
        self._seen = self.stamps()

    def stamps(self) -> tuple[Stamp, ...]:
        return tuple(_stamp(p) for p in self.paths)

    def changed(self) -> tuple[Stamp, ...] | None:
        """The files' stamps now when any differs from the accepted ones, else None (OSError
        when one cannot be stat'ed)."""
        now = self.stamps()
        return None if now == self._seen else now

    def accept(self, stamps: tuple[Stamp, ...]) -> None:
        self._seen = stamps


def server_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """A TLS server context with ``cert``/``key``, requiring client certificates ``client_ca``
    signed when given one. Raises ssl.SSLError or OSError for files that cannot be used."""
    context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=client_ca)
    return context


class ReloadingSSLAdapter(BuiltinSSLAdapter):
    """cheroot's TLS adapter with a context rebuilt from the files when they changed, checked
    before each connection's handshake (connections already made keep theirs)."""

    def __init__(self, cert: str, key: str, client_ca: str | None = None) -> None:
        super().__init__(cert, key)
        self.client_ca = client_ca
        self.context = server_context(cert, key, client_ca)
        self.files = WatchedFiles(*(p for p in (cert, key, client_ca) if p))
        self.reloads = 0
        self._lock = threading.Lock()

    def _reload(self) -> None:
        with self._lock:
            try:
                stamps = self.files.changed()
                if stamps is None:
                    return
                self.context = server_context(self.certificate, self.private_key, self.client_ca)
            except (OSError, ssl.SSLError) as err:
                log.warning("TLS files changed but cannot be used yet, keeping the previous ones: %s", err)
                return
            self.files.accept(stamps)
            self.reloads += 1
            log.info("TLS certificate or client CA reloaded from %s", self.certificate)

    def wrap(self, sock: Any) -> Any:
        self._reload()
        return super().wrap(sock)  # type: ignore[no-untyped-call]
