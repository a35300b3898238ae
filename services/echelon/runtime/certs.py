"""Certificates for a TLS cluster (docs/security.md), with `cryptography`: a throw-away
CA and one certificate per member for `echelon up --tls` and the tests, and the expiry
time a service exports. The naming scheme is `transport.peer_certificate_identity`'s.

A directory per identity in the layout of a Kubernetes TLS Secret (`tls.crt`, `tls.key`,
`ca.crt`), so a service reads a generated directory and a mounted Secret alike. Files
are replaced by rename, never rewritten in place, so a reader sees the old pair or the
new one (a reader that still catches a mismatched pair keeps its previous one).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import CollectorRegistry, Gauge

from echelon.contract.transport import SERVER_NAME, Transport, spiffe_id

DAY = datetime.timedelta(days=1)


@dataclass
class Authority:
    """A CA that signs member and client certificates (P-256 ECDSA: cheap handshakes)."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str = "echelon throw-away CA", days: float = 30) -> "Authority":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + days * DAY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, role: str, name: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
              days: float = 7) -> tuple[bytes, bytes]:
        """(key PEM, certificate PEM) naming `spiffe://echelon/<role>/<name>`, for both
        ends of a connection, with the DNS name `echelon` and `hosts` (names or IPs)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_id(role, name)),
                                         x509.DNSName(SERVER_NAME)]
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{role}/{name}")]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + days * DAY)
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(self.key, hashes.SHA256()))
        pem_key = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return pem_key, cert.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path, role: str, name: str, **kw) -> Path:
        """Issue a certificate into `directory` (tls.key, tls.crt, ca.crt; created)."""
        key, cert = self.issue(role, name, **kw)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for file, data in (("ca.crt", self.pem), ("tls.key", key), ("tls.crt", cert)):
            _replace(directory / file, data, 0o600 if file == "tls.key" else 0o644)
        return directory

    def save(self, directory: Path) -> None:
        """The CA itself (ca.crt, ca.key), to issue more certificates later."""
        directory.mkdir(parents=True, exist_ok=True)
        _replace(directory / "ca.crt", self.pem, 0o644)
        _replace(directory / "ca.key", self.key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()), 0o600)


def _replace(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def not_after(chain: bytes) -> float:
    """The expiry (Unix seconds) of the first certificate of a PEM chain."""
    return x509.load_pem_x509_certificate(chain).not_valid_after_utc.timestamp()


def expiry_gauge(transport: Transport, registry: CollectorRegistry) -> Gauge:
    """`echelon_tls_certificate_expiry_timestamp_seconds`: when the certificate this
    service presents now expires (it follows a reload). Alert on `- time() < 7d`."""
    cache: dict[bytes, float] = {}

    def value() -> float:
        _, chain, _ = transport.files()
        if chain is None:
            return 0.0
        if chain not in cache:
            cache.clear()
            cache[chain] = not_after(chain)
        return cache[chain]

    gauge = Gauge("echelon_tls_certificate_expiry_timestamp_seconds",
                  "Expiry (Unix time) of the TLS certificate this service presents.", registry=registry)
    gauge.set_function(value)
    return gauge
