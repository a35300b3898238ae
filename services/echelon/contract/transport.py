"""One transport for every gRPC path: dialing (address, credentials, options), serving
(a plain or a TLS port), the metadata keys both sides use, a call-any-of helper, and the
identity a peer's certificate names (docs/security.md).

grpcio only (no server extras): the client SDK imports it too.

Certificates are files in one directory, the layout of a Kubernetes TLS Secret and of
cert-manager: `tls.crt` (the chain), `tls.key`, `ca.crt` (the CA every peer is checked
against). They are read again whenever they change on disk (mtime, size, inode: a
Secret update swaps a symlink, cert-manager rewrites files):

- serving: grpc's dynamic SSL server credentials ask a fetcher at every handshake; the
  fetcher hands over a new configuration once the files changed and the new key matches
  the new certificate (a half-written pair is skipped and tried again at the next
  handshake). Established connections and their streams keep the session they have.
- dialing: channel credentials are fixed when a channel is made (grpcio has no dynamic
  channel credentials), so `dial` reads the files again when they changed and channels
  made after a rotation present the new certificate. The long-lived channels (relay
  links, membership) ask `stale(generation)` before they reopen a stream and dial anew
  after a rotation; an open stream stays on its connection until it ends. Other cached
  channels keep their certificate for reconnects, so certificates should be renewed
  well before they expire (cert-manager renews at 2/3 of the lifetime).

Services check each other's certificates against `ca.crt` and do not check the host
name: members are dialled at pod addresses that change, so every service certificate
carries the DNS name `SERVER_NAME` and service channels ask for it
(`grpc.ssl_target_name_override`). The client SDK checks the real host name unless told
otherwise.

What grpcio offers for client certificates, and what that means for the agent port:
`ssl_server_credentials(require_client_auth=...)` and `dynamic_ssl_server_credentials`
map False to GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE and True to
GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY; the C core's "request but do
not require" modes are not reachable from Python (grpcio 1.85, checked: with False the
server never asks, so a certificate the client has is not even sent, and
`auth_context()` names no peer). So a port either requires a certificate from the CA or
learns no certificate at all. Echelon's choice: every service port requires one (mTLS);
an agent may open a second, client-only port (`client_port`) that does not ask for
certificates, for clients that authenticate with a bearer token. The same servicers
answer on both ports, so the member requirement is enforced per RPC: a service RPC
(`Relay.Stream`, `Membership.Join`, `Heartbeat`, ...) calls `require_member`, which
refuses a caller whose certificate does not name the member id and role it claims, and
refuses a caller with no certificate over TLS.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Iterable, NamedTuple, TypeVar
from urllib.parse import quote, unquote

import grpc

from echelon.contract.bearer import AUTHORIZATION_KEY, BearerChannel, BlockingBearer  # noqa: F401 - re-exported
from echelon.contract.errors import PermissionDenied, Unauthenticated

log = logging.getLogger("echelon.transport")

# -- metadata keys (lower case: gRPC metadata keys are) -------------------------------------
MEMBER_KEY = "x-echelon-member"  # Relay.Stream: the sending member (checked against its certificate)
SUBSCRIPTION_KEY = "x-echelon-subscription"  # Subscribe: initial metadata naming the subscription
REDELIVERY_KEY = "x-echelon-redelivery"  # Subscribe: the agent enforces RedeliveryPolicy (agent/redelivery.py)
INCARNATION_KEY = "echelon-incarnation"  # a refused (stale) Join: the recorded incarnation, trailing
# AUTHORIZATION_KEY ("authorization": "Bearer <token>", for callers without a certificate)
# is defined with the interceptors that send it (contract/bearer.py) and imported above.

# -- options ------------------------------------------------------------------------------
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# gRPC turns the keepalive timeout into the socket's TCP_USER_TIMEOUT, so a short one
# kills healthy streams on a saturated uplink ("sendmsg: Connection timed out"). Who is
# dead is membership's business (heartbeats); keepalive only clears half-open sockets.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 120_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A fixed HTTP/2 stream window instead of one grown by BDP probing: a receiver that stops
    # reading (back-pressure on a bulk payload) otherwise lets gRPC buffer as much as the
    # grown window in its own memory (docs/performance-history.md, "Measurements once in
    # docstrings"). 1 MiB per stream still fills a 20 MB/s path at 50 ms round trips.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1 << 20),
]
SERVER_OPTIONS = CHANNEL_OPTIONS + [("grpc.http2.min_ping_interval_without_data_ms", 5_000)]
# gRPC backs off up to 120 s between connection attempts: a restarted peer would be out of
# reach for minutes. Channels to members retry within a second.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000)]
# Every channel owns its subchannels. gRPC shares them by default between the process's
# channels to one address, backoff state included: after a peer restarts on its old
# address, a channel dialled anew would inherit a stale channel's backoff and fail at once
# with the old "connection refused" for up to max_reconnect_backoff (120 s by default).
OWN_SUBCHANNEL = [("grpc.use_local_subchannel_pool", 1)]

# -- certificates -------------------------------------------------------------------------
TLS_DIR_ENV = "ECHELON_TLS_DIR"
TOKEN_ENV = "ECHELON_TOKEN"  # a client's bearer token when none is given (the SDK, the CLI, the routing job)
SERVER_NAME = "echelon"  # a DNS name every service certificate carries (see the module doc)
TRUST_DOMAIN = "echelon"
# Roles a certificate can name: the members' (membership.proto Role, lower case, without
# ROLE_), the routing job, and clients (identities for access's ACLs).
MEMBER_ROLES = ("agent", "matcher", "router", "membership")
ROLES = MEMBER_ROLES + ("replan", "client")


# A certificate naming this id speaks for every member of its role: the identity of a
# Secret that all pods of a component mount (the chart's `tls.source: secrets`), where a
# certificate per member cannot be had. A forged member then needs that component's key,
# not just the CA's trust; per-member certificates (cert-manager's csi-driver, `echelon
# up --tls`) keep the member id checked too.
ANY_MEMBER = "*"


class PeerIdentity(NamedTuple):
    role: str
    id: str

    def names(self, member_id: str) -> bool:
        return self.id in (member_id, ANY_MEMBER)


def spiffe_id(role: str, name: str) -> str:
    """The URI SAN of a certificate: `spiffe://echelon/<role>/<name>`, the name
    percent-encoded (a member id may hold any character but '/' and spaces)."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: one of {', '.join(ROLES)}")
    if not name:
        raise ValueError("a certificate names a non-empty id")
    return f"spiffe://{TRUST_DOMAIN}/{role}/{quote(name, safe='')}"


def parse_spiffe_id(uri: str) -> PeerIdentity | None:
    prefix = f"spiffe://{TRUST_DOMAIN}/"
    if not uri.startswith(prefix):
        return None
    parts = uri[len(prefix):].split("/")
    if len(parts) != 2 or parts[0] not in ROLES or not parts[1]:
        return None
    return PeerIdentity(parts[0], unquote(parts[1]))


def peer_certificate_identity(context) -> PeerIdentity | None:
    """The role and id the peer's verified TLS certificate names, or None (no TLS, no
    client certificate, or no single Echelon identity in it).

    The naming scheme: a certificate names exactly one identity, as a URI SAN
    `spiffe://echelon/<role>/<id>` (`spiffe_id`), role one of `ROLES`:
    `agent|matcher|router|membership` for members (id: the member id, percent-encoded),
    `replan` for the routing job, `client` for a client identity (id: what ACLs name).
    Service certificates also carry the DNS name `echelon` (SERVER_NAME). grpc puts the
    URI SANs of a verified peer certificate in the auth context (`peer_uri`); a
    certificate with two Echelon URIs is ambiguous and names nobody."""
    auth = context.auth_context() or {}
    found = {parse_spiffe_id(u.decode("utf-8", "replace")) for u in auth.get("peer_uri", ())} - {None}
    return found.pop() if len(found) == 1 else None


def is_tls(context) -> bool:
    auth = context.auth_context() or {}
    return auth.get("transport_security_type") == [b"ssl"]


def role_of(name: str) -> str:
    """A membership.proto role name (`ROLE_AGENT`) as certificates spell it (`agent`)."""
    return name.removeprefix("ROLE_").lower()


def require_member(context, member_id: str | None, roles: str | tuple[str, ...], what: str) -> None:
    """Refuse `what` unless the peer's certificate names one of `roles` and (unless
    `member_id` is None) the member id the call claims: UNAUTHENTICATED without a
    certificate, PERMISSION_DENIED with another identity. Over plain text (a cluster
    run without TLS) nobody is named and nothing is checked: such a cluster trusts its
    network, as before TLS."""
    if not is_tls(context):
        return
    roles = (roles,) if isinstance(roles, str) else roles
    peer = peer_certificate_identity(context)
    wanted = f"spiffe://{TRUST_DOMAIN}/{'|'.join(roles)}/{member_id if member_id is not None else '<id>'}"
    if peer is None:
        raise Unauthenticated(f"{what} needs a member certificate naming {wanted}; the peer presented none")
    if peer.role not in roles or (member_id is not None and not peer.names(member_id)):
        claim = f"{'|'.join(roles)} {member_id!r}" if member_id is not None else "|".join(roles)
        raise PermissionDenied(f"{what}: the certificate names {peer.role} {peer.id!r}, the call needs {claim}")


@dataclass(frozen=True)
class TlsDir:
    """Certificates in a Secret-style directory (`tls.crt`, `tls.key`, `ca.crt`). A client
    without a certificate of its own (it sends a token) has only `ca.crt`."""

    path: Path
    server_name: str | None = SERVER_NAME  # None: check the dialled host name (the client SDK)

    @property
    def cert(self) -> Path:
        return self.path / "tls.crt"

    @property
    def key(self) -> Path:
        return self.path / "tls.key"

    @property
    def ca(self) -> Path:
        return self.path / "ca.crt"

    @classmethod
    def from_env(cls) -> "TlsDir | None":
        value = os.environ.get(TLS_DIR_ENV, "")
        return cls(Path(value)) if value else None

    def stamp(self) -> tuple:
        """Changes whenever one of the files does."""
        out = []
        for p in (self.cert, self.key, self.ca):
            try:
                s = p.stat()
            except FileNotFoundError:
                out.append(None)
                continue
            out.append((s.st_ino, s.st_size, s.st_mtime_ns))
        return tuple(out)

    def load(self) -> tuple[bytes | None, bytes | None, bytes]:
        """(key, chain, ca), checked: PEM, and the key belongs to the certificate (a pair
        read in the middle of a rotation is refused with ValueError). Key and chain are
        None when neither file exists (a client without a certificate)."""
        import ssl  # stdlib; only to check that key and certificate match

        ca = self.ca.read_bytes()
        if not self.key.exists() and not self.cert.exists():
            key = chain = None
        else:
            key, chain = self.key.read_bytes(), self.cert.read_bytes()
        for name, data in (("tls.key", key), ("tls.crt", chain), ("ca.crt", ca)):
            if data is not None and b"-----BEGIN" not in data:
                raise ValueError(f"{self.path / name}: not PEM")
        if key is None:
            return key, chain, ca
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(self.cert, self.key)
        except ssl.SSLError as e:
            raise ValueError(f"{self.path}: tls.key does not match tls.crt ({e})") from None
        return key, chain, ca


T = TypeVar("T")
A = TypeVar("A")


@dataclass
class Transport:
    """How one node (or one client) dials and serves: plain text, or TLS from `tls`.
    `token`: a bearer token every call it dials carries (AUTHORIZATION_KEY), "" for none:
    a node's member token or a client's token (runtime/auth.py)."""

    tls: TlsDir | None = None
    token: str = ""
    _loaded: tuple | None = field(default=None, repr=False)  # (stamp, key, chain, ca)
    generation: int = 0  # how many times the files were read: a channel made at an older one is stale

    def files(self) -> tuple[bytes | None, bytes | None, bytes]:
        """The current (key, chain, ca), read again when the files changed; on a bad read
        the previous ones stay (logged), and the first read must succeed."""
        assert self.tls is not None
        try:
            stamp = self.tls.stamp()
            if self._loaded is None or self._loaded[0] != stamp:
                self._loaded = (stamp, *self.tls.load())
                self.generation += 1
                log.info("TLS certificates loaded from %s", self.tls.path)
        except (OSError, ValueError) as e:
            if self._loaded is None:
                raise
            log.warning("TLS certificates in %s not reloaded: %s (keeping the previous ones)", self.tls.path, e)
        return self._loaded[1:]

    def _target(self, options: Iterable[tuple[str, object]]) -> list[tuple[str, object]]:
        options = list(CHANNEL_OPTIONS) + OWN_SUBCHANNEL + list(options)
        if self.tls is not None and self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return options

    def credentials(self) -> grpc.ChannelCredentials:
        key, chain, ca = self.files()
        return grpc.ssl_channel_credentials(ca, key, chain)

    def stale(self, generation: int) -> bool:
        """Whether a channel dialled at `generation` predates the current files (plain
        text: never). Reads the files if they changed."""
        if self.tls is None:
            return False
        self.files()
        return generation != self.generation

    def dial(self, address: str, options: Iterable[tuple[str, object]] = ()) -> grpc.aio.Channel:
        """An asyncio channel with the cluster's settings (plus `options`), sending the
        token on every call if there is one."""
        opts = self._target(options)
        channel = grpc.aio.insecure_channel(address, options=opts) if self.tls is None else \
            grpc.aio.secure_channel(address, self.credentials(), options=opts)
        return BearerChannel(channel, self.token) if self.token else channel

    def dial_blocking(self, address: str, options: Iterable[tuple[str, object]] = ()) -> grpc.Channel:
        """A blocking channel (the routing job's calls), same settings."""
        opts = self._target(options)
        channel = grpc.insecure_channel(address, options=opts) if self.tls is None else \
            grpc.secure_channel(address, self.credentials(), options=opts)
        return grpc.intercept_channel(channel, BlockingBearer(self.token)) if self.token else channel

    def serve(self, server, address: str, client_certificates: bool = True) -> int:
        """Bind `address` on a grpc (aio) server; with TLS, every handshake takes the
        current files. `client_certificates`: require one from the CA (service ports),
        or ask for none (a client port; see the module doc). Returns the port."""
        if self.tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.server_credentials(client_certificates))

    def server_credentials(self, client_certificates: bool = True) -> grpc.ServerCredentials:
        key, chain, ca = self.files()
        if key is None:
            raise ValueError(f"{self.tls.path}: a server needs tls.crt and tls.key")
        served = [self._loaded[0]]

        def fetch():
            # Called by grpc at every handshake, on its own thread: cheap (a stat) unless
            # the files changed. None keeps the current configuration.
            key, chain, ca = self.files()
            if self._loaded[0] == served[0] or key is None:
                return None
            served[0] = self._loaded[0]
            return grpc.ssl_server_certificate_configuration([(key, chain)], ca)

        first = grpc.ssl_server_certificate_configuration([(key, chain)], ca)
        return grpc.dynamic_ssl_server_credentials(first, fetch, require_client_authentication=client_certificates)


PLAIN = Transport()


async def call_any(targets: Iterable[A], call: Callable[[A], Awaitable[T]],
                   retry: Callable[[BaseException], bool]) -> T:
    """`call(target)` on each target (an address, or an index of one) in turn until one
    answers; an error for which `retry(error)` is false ends the loop at once (a refusal
    is an answer). Raises the last error when every target failed."""
    last: BaseException | None = None
    for target in targets:
        try:
            return await call(target)
        except Exception as e:  # noqa: BLE001 - the caller says which errors move on
            if not retry(e):
                raise
            last = e
    if last is None:
        raise ValueError("no address to call")
    raise last


def unavailable(error: BaseException) -> bool:
    """The usual `retry` of `call_any`: the server could not be reached (a grpc error or
    the client's `Unavailable`). A missed deadline is not retried: the call may have
    been applied."""
    code = error.code() if isinstance(error, grpc.RpcError) else getattr(error, "code", None)
    return code == grpc.StatusCode.UNAVAILABLE
