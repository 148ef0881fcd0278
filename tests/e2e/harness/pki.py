"""Throwaway PKI for a loopback control plane, made with the ``openssl`` CLI (no Python deps).

One self-signed CA signs the API server's serving certificate (127.0.0.1, localhost and the
in-cluster names) and the client certificates of the admin and the control-plane components; a
separate RSA key pair signs and verifies service-account tokens.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("the e2e harness needs the `openssl` command (apt-get install openssl)")
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path

    def client(self, name: str, common_name: str, organization: str | None = None) -> ClientCert:
        """Issue (once) a client certificate CN=common_name, O=organization, signed by the CA."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        if not cert.exists():
            subject = f"/CN={common_name}" + (f"/O={organization}" if organization else "")
            _issue(self.directory, name, subject, self.ca_cert, self.ca_key,
                   ["extendedKeyUsage=clientAuth", "keyUsage=critical,digitalSignature,keyEncipherment"])
        return ClientCert(cert=cert, key=key)

    def server(self, name: str, sans: list[str]) -> ClientCert:
        """Issue (once) a serving certificate for e.g. a webhook on 127.0.0.1 (sans: "IP:..", "DNS:..").
        Its files carry a ``-serving`` suffix: a component's client certificate may have the same
        name (a kube-scheduler started as "phalanx-extender"), and one must never stand in for
        the other."""
        stem = f"{name}-serving"
        cert, key = self.directory / f"{stem}.crt", self.directory / f"{stem}.key"
        if not cert.exists():
            _issue(self.directory, stem, f"/CN={name}", self.ca_cert, self.ca_key,
                   [f"subjectAltName={','.join(sans)}", "extendedKeyUsage=serverAuth",
                    "keyUsage=critical,digitalSignature,keyEncipherment"])
        return ClientCert(cert=cert, key=key)


def _issue(d: Path, name: str, subject: str, ca_cert: Path, ca_key: Path, extensions: list[str]) -> None:
    ext = d / f"{name}.ext"
    ext.write_text("".join(f"{e}\n" for e in ["basicConstraints=CA:FALSE", *extensions]))
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", str(ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "2", "-sha256", "-extfile", ext.name, "-out", f"{name}.crt",
             cwd=d)


def make_pki(directory: Path) -> Pki:
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=phalanx-e2e-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=d)
    sans = ",".join([
        "IP:127.0.0.1", "IP:10.0.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
    ])
    _issue(d, "apiserver", "/CN=kube-apiserver", d / "ca.crt", d / "ca.key",
           [f"subjectAltName={sans}", "extendedKeyUsage=serverAuth",
            "keyUsage=critical,digitalSignature,keyEncipherment"])
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return Pki(directory=d, ca_cert=d / "ca.crt", ca_key=d / "ca.key",
               serving_cert=d / "apiserver.crt", serving_key=d / "apiserver.key",
               sa_key=d / "sa.key", sa_pub=d / "sa.pub")
