"""mTLS of the gRPC endpoint, its certificate files re-read when they change.

phalanx-scheduler dials ``phalanx serve``'s gRPC endpoint across the pod network when the two do
not share a pod (the chart's ``tls.enabled``): the server presents ``--grpc-tls-cert`` and only a
client whose certificate ``--grpc-client-ca`` signed completes the handshake. Certificates are
rotated by replacing the files (a Secret volume swaps them atomically); grpcio asks for the
current configuration before each new handshake, and :class:`ServerCertificates` answers with the
files' contents when any of them changed since the last read (established connections keep the
certificate they were made with). A file caught half-written, or a key that does not fit its
certificate, keeps the previous configuration and is logged: a rotation never takes the endpoint down.
"""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass

import grpc

from web.certs import WatchedFiles, server_context

log = logging.getLogger("phalanx.grpc.tls")


@dataclass(frozen=True)
class GrpcTls:
    """The server's certificate and key, and the CA its clients' certificates must be signed by."""

    cert: str
    key: str
    client_ca: str


def _check_pair(cert: bytes, key: bytes, ca: bytes) -> None:
    """Raise ssl.SSLError (or ValueError) unless ``key`` fits ``cert`` and ``ca`` is PEM (grpcio
    would take a bad pair and fail every handshake after)."""
    with tempfile.TemporaryDirectory() as d:  # ssl reads a pair from files only
        cert_path, key_path = os.path.join(d, "c"), os.path.join(d, "k")
        with open(cert_path, "wb") as f:
            f.write(cert)
        with open(key_path, "wb") as f:
            f.write(key)
        context = server_context(cert_path, key_path, None)
    context.load_verify_locations(cadata=ca.decode())


class ServerCertificates:
    """The server's current certificate configuration, re-read from ``tls``'s files on change."""

    def __init__(self, tls: GrpcTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self.files = WatchedFiles(tls.cert, tls.key, tls.client_ca)
        self.initial = self._configuration()  # unreadable or mismatched files at start fail here
        self.reloads = 0

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        with open(self.tls.cert, "rb") as f:
            cert = f.read()
        with open(self.tls.key, "rb") as f:
            key = f.read()
        with open(self.tls.client_ca, "rb") as f:
            ca = f.read()
        _check_pair(cert, key, ca)
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """grpcio's fetcher: a new configuration when the files changed, else None (keep the current)."""
        with self._lock:
            try:
                stamps = self.files.changed()
                if stamps is None:
                    return None
                config = self._configuration()
            except (OSError, ssl.SSLError, ValueError) as err:
                log.warning("gRPC TLS files changed but cannot be used yet, keeping the previous ones: %s", err)
                return None
            self.files.accept(stamps)
            self.reloads += 1
            log.info("gRPC TLS certificate or client CA reloaded from %s", self.tls.cert)
            return config


def server_credentials(tls: GrpcTls) -> tuple[grpc.ServerCredentials, ServerCertificates]:
    """mTLS credentials (client certificates required) that follow the files' changes."""
    certificates = ServerCertificates(tls)
    credentials = grpc.dynamic_ssl_server_credentials(certificates.initial, certificates.fetch,
                                                      require_client_authentication=True)
    return credentials, certificates
