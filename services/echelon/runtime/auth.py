"""Who is calling, and may they: one server interceptor, used by every service
(docs/security.md).

Identity. Every call is identified once, in `AuthInterceptor`, by the first of:
1. a TLS client certificate, verified in the handshake against the cluster's CA
   (contract/transport.py: `spiffe://echelon/<role>/<id>`): role `client` is the user
   `<id>` (`user:<id>` in ACLs, no groups); a member's role (agent, matcher, router,
   membership) or the routing job's (`replan`) is a member;
2. a bearer token in the `authorization` metadata (`Bearer <token>`), checked by the
   mode's authenticator:
   - `tokens`: static tokens from a JSON file (`echelon up --auth` writes
     one; runtime/credentials.py): `{"tokens": [{"token": "...", "name": "ann", "groups": ["traders"]},
     {"token": "...", "name": "cluster", "member": true}]}`. The file is re-read when it
     changes (checked at most once a second), so a token is revoked without a restart.
   - `jwt`: JSON Web Tokens signed by an identity provider, verified against the public
     keys of a JWKS (by `kid`; a file, or a URL fetched at start and again for an unknown
     `kid`), with `exp` and `sub` required, `aud` checked (`echelon` by default) and `iss`
     when configured; `sub` is the name, the `groups` claim the groups, and
     `"echelon_member": true` marks a member's token. A tokens file is taken too in
     this mode (service accounts, the members' token): a token with two dots is a JWT.
Names in `superusers` (`--superusers`) are put in the `admins` group whatever their
credential, the way to make a certificate's user, which carries no groups, an admin.
Both present: the certificate wins and the token is not looked at. A certificate is
bound to the connection and checked in the handshake, a token is a header any hop can
add; this is Kafka's rule for an SSL listener (the TLS principal) and NATS's
`verify_and_map`. So a client that needs another identity than its certificate's uses
another certificate, or the agent's client port (no certificates asked) with a token.

Member identities (the cluster's own services, service to service) are a kind apart:
a member passes every rule (it carries traffic an agent already checked), while a
client passes only what the ACLs grant it (core/acl.py). In token mode one member token
is shared by the cluster's services; with TLS each member's certificate names it (and
membership checks the id it claims, transport.require_member).

Mode `none` (the default of a plain local cluster and of tests that do not ask for
auth): every caller is `anonymous`, a member in the `admins` group, so nothing is
refused but the limits, which are counted per connection. With `--tls` and mode `none`
the certificates still keep strangers off the service ports, but every caller that gets
through may do anything. Auth is opt-in because a local cluster on loopback has no one
to keep out; a cluster on a shared network runs `--auth tokens|jwt` (and `--tls`).

Authorization, by method (`POLICY`, every RPC of every service has a row; a method
without one is refused, so a new RPC cannot slip through): health and reflection are
open (Kubernetes probes, grpcurl); the client API needs any identity, with per-topic
rights checked where the topic is known (`Access.publish_checker`, `Access.open_subscription`,
`Access.require`; a topic's own admin right for CreateTopic/DeleteTopic); ACL changes,
the Control API (routing plans) and the read-only views of the cluster's inner services
need the cluster admin (admin on `*`); joining, beating, relaying, matching and
replicating are for members only. A refused call changes no state: the check runs
before the handler (or, per topic, before the handler touches anything).

Refusals, for operators and for tools that provoke them (the chaos intruder): every one
is counted in `echelon_refused_calls_total{service,reason}`, `service` the full gRPC
service name (`echelon.v1.PubSub`), and `reason` one of `REASONS`, which are stable:
- `unauthenticated` (UNAUTHENTICATED): no credentials, a malformed `authorization`
  header, an unknown static token, a JWT that fails verification (signature, unknown
  `kid`, expired, wrong audience or issuer, missing claims);
- `permission_denied` (PERMISSION_DENIED): a known identity without the right: a missing
  ACL right (the message names the identity, the right and the topic: "user:ann lacks
  the 'subscribe' right on topic 'quotes'"), a member-only or admin-only RPC, a method
  without a policy row;
- `publish_rate`, `subscriptions`, `streams` (RESOURCE_EXHAUSTED): the limits
  (runtime/limits.py).
The series exist from the start at 0 for every service a server runs. In a publish
stream an event refused for its right or rate is answered in its own ack (the stream
stays open) and counted once per event.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry, Counter

from echelon.core.acl import CAP_FIELDS, CAPS_PATTERN, RIGHTS, SUPERUSERS, Acl, Identity, Rule
from echelon.contract.errors import EchelonError, InvalidArgument, PermissionDenied, ResourceExhausted, Unauthenticated
from echelon.runtime.credentials import JwtKeys, StaticTokens, is_url
from echelon.runtime.limits import Limits, Quotas
from echelon.contract.transport import AUTHORIZATION_KEY, PeerIdentity, peer_certificate_identity

log = logging.getLogger("echelon.auth")

MODES = ("none", "tokens", "jwt")
ANONYMOUS = Identity("anonymous", frozenset({SUPERUSERS}), member=True)

OPEN, CLIENT, TOPIC_ADMIN, ADMIN, MEMBER = "open", "client", "topic-admin", "admin", "member"
_V1 = "echelon.v1."
POLICY: dict[str, str] = {
    "grpc.health.v1.Health/Check": OPEN,
    "grpc.health.v1.Health/Watch": OPEN,
    "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": OPEN,
    **{_V1 + m: CLIENT for m in ("PubSub/Publish", "PubSub/Subscribe", "PubSub/Unsubscribe",
                                 "Admin/GetTopic", "Admin/ListTopics")},
    **{_V1 + m: TOPIC_ADMIN for m in ("Admin/CreateTopic", "Admin/DeleteTopic")},
    **{_V1 + m: ADMIN for m in ("Admin/GrantAcl", "Admin/RevokeAcl", "Admin/ListAcls", "Admin/SetCaps", "Admin/ListCaps",
                                "Control/GetPlan", "Control/PushPlan", "Control/WatchPlan", "Control/ReportRun",
                                "Membership/Watch", "Matcher/ListZones", "Matcher/Holdings", "Matcher/Sample",
                                "Router/Describe")},
    **{_V1 + m: MEMBER for m in ("Membership/Join", "Membership/Heartbeat", "Membership/Leave",
                                 "Membership/Suspect", "Replication/Digest", "Replication/Pull",
                                 "Replication/Push", "Relay/Stream", "Matcher/Register", "Matcher/Remove",
                                 "Matcher/Match", "Matcher/Store", "Matcher/Drop", "Matcher/Revoke",
                                 "Matcher/Sync", "Matcher/Reconcile", "Durable/Apply", "Durable/Fetch",
                                 "Crawl/Step", "Router/Control")},
    # Durable subscriptions by name: any identity lists and reads them; Seek and
    # DeleteSubscription need the subscribe right on the subscription's topic (checked
    # by the handler once the topic is known, agent/durable/rpc.py).
    **{_V1 + m: CLIENT for m in ("Durable/ListSubscriptions", "Durable/GetSubscription", "Durable/Seek",
                                 "Durable/DeleteSubscription")},
}
REASONS = ("unauthenticated", "permission_denied", "publish_rate", "subscriptions", "streams", "malformed")


@dataclass(frozen=True)
class AuthConfig:
    """Validated once at start. `jwks`: a JWKS file or an http(s) URL. In `jwt` mode a
    `tokens_file` is optional and its static tokens are taken too (service accounts, the
    members' token). `member_token`: this process's own token, sent on every call it
    makes to another member (without TLS). `superusers`: user names in the `admins`
    group whatever their credential (Kafka's `super.users`): the way to make a client
    certificate's user, which carries no groups, a cluster admin."""

    mode: str = "none"
    tokens_file: str = ""
    jwks: str = ""
    audience: str = "echelon"
    issuer: str = ""
    member_token: str = ""
    superusers: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    # principal -> caps (core/acl.py CAP_FIELDS) from the operator's configuration (the
    # chart's auth.identityCaps); those the cluster admin sets (`echelon acl cap`) win.
    identity_caps: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"auth mode {self.mode!r}: one of {', '.join(MODES)}")
        if self.mode == "tokens" and not self.tokens_file:
            raise ValueError("--auth tokens needs --tokens-file")
        if self.mode == "jwt" and not self.jwks:
            raise ValueError("--auth jwt needs --jwks (a JWKS file or URL)")
        for path in (self.tokens_file, "" if is_url(self.jwks) else self.jwks):
            if path and not Path(path).is_file():
                raise ValueError(f"{path}: no such file")


@dataclass(frozen=True)
class Caller:
    """The identity of the call being served, the key its limits are counted under, and
    whether they apply (not to members, but to everyone when auth is off); `token`: the
    bearer token it was identified by ("": a certificate, or auth off)."""

    identity: Identity
    key: str
    peer: str
    limited: bool
    token: str = field(default="", repr=False)


@dataclass(eq=False)
class OpenStream:
    """A streaming call being served, re-checked every RECHECK seconds (`Access.recheck`):
    its token must still identify the same caller and it must still hold `needs` (the
    rights its handler relies on, e.g. subscribe on its topic). `final`, if the handler
    set it, makes the message that carries a refusal's status in-band before the stream
    ends (grpc/grpc#36066 can turn the status itself into INTERNAL at the client)."""

    caller: Caller
    service: str
    task: asyncio.Task | None
    needs: list[tuple[str, str, Callable | None]] = field(default_factory=list)
    final: Callable[[EchelonError], object] | None = None
    revoked: EchelonError | None = None
    # Out in gRPC, sending a message the handler gave: a cancellation landing there is
    # grpcio's own (it ends the call sending no status at all), so `end` leaves the
    # stream to end itself once the write is done.
    writing: bool = False


CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("echelon_caller", default=None)
STREAM: contextvars.ContextVar[OpenStream | None] = contextvars.ContextVar("echelon_stream", default=None)
RECHECK = 1.0  # seconds between re-checks of the open streams (revocation, JWT expiry)
FINAL_GRACE = 5.0  # seconds a stream's last (status) message may take to go out
LOG_INTERVAL = 60.0  # seconds between two log lines of one (host, reason) refusal
_NOTED = 10_000  # (host, reason) pairs remembered for that


def certificate_identity(peer: PeerIdentity) -> Identity:
    """A verified certificate's identity: a `client` certificate is the user its id names
    (`user:<id>` in ACLs, no groups); a member's or the routing job's is a member."""
    if peer.role == "client":
        return Identity(peer.id)
    return Identity(f"{peer.role}/{peer.id}", member=True)


def caps_dict(caps) -> dict[str, int]:
    """An IdentityCaps message's set fields."""
    return {f: getattr(caps, f) for f in CAP_FIELDS if getattr(caps, f)}


def acl_cache(version: Callable[[], object], rules: Callable[[], Mapping]) -> Callable[[], Acl]:
    """An `Acl` over the AclRule messages `rules()` returns, rebuilt when `version()` moves
    (from the view's version: every ACL change is a new view version)."""
    cached: list = [None, Acl()]

    def current() -> Acl:
        v = version()
        if cached[0] != v:
            entries = list(rules().values())
            cached[:] = [v, Acl((Rule(r.principal, r.pattern, frozenset(r.rights)) for r in entries
                                 if r.pattern != CAPS_PATTERN),
                                {r.principal: caps_dict(r.caps) for r in entries if r.pattern == CAPS_PATTERN})]
        return cached[1]

    return current


class Access:
    """One server's authenticator, ACLs, limits and refusal counter."""

    def __init__(self, config: AuthConfig | None, registry: CollectorRegistry):
        self.config = config or AuthConfig()
        self.on = self.config.mode != "none"
        c = self.config
        self.tokens = StaticTokens(c.tokens_file) if self.on and c.tokens_file else None
        self.jwt = JwtKeys(c.jwks, c.audience, c.issuer) if c.mode == "jwt" else None
        self.acl: Callable[[], Acl] = Acl  # the node points it at its view's rules
        self.quotas = Quotas(self.config.limits)
        self._caps: tuple[object, Acl] = (None, Acl())  # (the Acl they were merged from, merged)
        self.streams: set[OpenStream] = set()  # streaming calls being served (recheck)
        self._noted: dict[tuple[str, str], float] = {}  # (host, reason) -> when last logged (note)
        self.refused = Counter("echelon_refused_calls_total",
                               "Calls (or events in a publish stream) refused, by gRPC service and reason.",
                               ["service", "reason"], registry=registry)

    def limit(self, identity: Identity, name: str) -> int:
        """The limit `name` (a Limits field) for `identity`: its caps (core/acl.py
        `caps_for`; the cluster admin's over the configuration's, per principal and
        field), else the agent's --limits."""
        acl = self.acl()
        if self._caps[0] is not acl:
            merged = {p: dict(c) for p, c in self.config.identity_caps.items()}
            for p, c in acl.caps.items():
                merged.setdefault(p, {}).update(c)
            self._caps = (acl, Acl(caps=merged))
        return self._caps[1].caps_of(identity).get(name) or getattr(self.config.limits, name)

    def count(self, service: str, reason: str) -> None:
        self.refused.labels(service, reason).inc()

    def note(self, peer: str, reason: str, message: str, now: float) -> None:
        """Log a refusal at most once per (peer host, reason) per LOG_INTERVAL, one line, no
        traceback: a client sending garbage or bad credentials in a loop cannot flood the
        log (every refusal is counted all the same)."""
        host = peer.rpartition(":")[0] or peer  # the connection's port left out: one line per host
        key = (host, reason)
        if now - self._noted.get(key, float("-inf")) < LOG_INTERVAL:
            return
        if len(self._noted) >= _NOTED:
            self._noted.clear()
        self._noted[key] = now
        log.warning("refused %s from %s: %s (logged once per %.0f s per host and reason)", reason, host,
                    message[:200], LOG_INTERVAL)

    def identify(self, context) -> Identity:
        return self.credential(context)[0]

    def credential(self, context) -> tuple[Identity, str]:
        """The caller's identity and the bearer token it was identified by ("" for none)."""
        if not self.on:
            return ANONYMOUS, ""
        peer = peer_certificate_identity(context)
        if peer is not None:  # the certificate wins over a token (module doc)
            return self._super(certificate_identity(peer)), ""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION_KEY:
                scheme, _, token = str(value).partition(" ")
                if scheme.lower() != "bearer" or not token:
                    raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
        if not token:
            raise Unauthenticated("no credentials: send a bearer token ('authorization: Bearer <token>', "
                                  "--token, $ECHELON_TOKEN) or a client certificate")
        return self._by_token(token), token

    def _by_token(self, token: str) -> Identity:
        # A JWT has three dot-separated parts; static tokens (token_urlsafe) have no dot.
        if self.jwt is not None and token.count(".") == 2:
            identity = self.jwt.identify(token)
        elif self.tokens is not None:
            identity = self.tokens.identify(token)
        else:
            raise Unauthenticated("invalid token: not a JWT")
        return self._super(identity)

    def _super(self, identity: Identity) -> Identity:
        if identity.name in self.config.superusers and not identity.member:
            return Identity(identity.name, identity.groups | {SUPERUSERS})
        return identity

    def admit(self, method: str, rule: str, request, context,
              credential: tuple[Identity, str] | None = None) -> Caller:
        """The caller of a call under `rule`, or the domain error refusing it (`credential`:
        the caller's, if already identified)."""
        identity, token = credential or self.credential(context)
        peer = context.peer() or "unknown"
        caller = Caller(identity, str(identity) if self.on else f"connection {peer}", peer,
                        not (self.on and identity.member), token)
        if rule == MEMBER and not identity.member:
            raise PermissionDenied(f"{identity} may not call {method}: it is for cluster members only")
        if rule in (ADMIN, TOPIC_ADMIN):
            topic = request.name if rule == TOPIC_ADMIN else "*"
            refusal = self.acl().refusal(identity, "admin", topic)
            if refusal:
                raise PermissionDenied(f"{method}: {refusal}")
        return caller

    # -- where the topic is known (the agent's handlers) -------------------------------

    def require(self, right: str, topic: str, service: str) -> Caller | None:
        """Raise PermissionDenied (counted under `service`) unless the calling identity holds
        `right` on `topic`; the caller, or None when nothing is checked (a member, or a call
        from outside an admitted RPC)."""
        caller = CALLER.get()
        if caller is None or not caller.limited:
            return None
        refusal = self.acl().refusal(caller.identity, right, topic)
        if refusal:
            self.count(service, "permission_denied")
            raise PermissionDenied(refusal)
        return caller

    def sees(self, topic: str) -> bool:
        """Describe rights: a client sees a topic (and reads it, and its subscriptions'
        existence) only if it holds some right on it; members and in-process calls see
        everything. A topic it may not see is answered as one that does not exist."""
        caller = CALLER.get()
        if caller is None or not caller.limited:
            return True
        acl = self.acl()
        return any(acl.allows(caller.identity, right, topic) for right in RIGHTS)

    def require_member(self, what: str, service: str) -> None:
        """Raise PermissionDenied unless the caller is a member: the `local` forms of the
        Durable RPCs, which one agent sends another, act on one copy without the checks."""
        caller = CALLER.get()
        if self.on and caller is not None and not caller.identity.member:
            self.count(service, "permission_denied")
            raise PermissionDenied(f"{caller.identity} may not call {what}: it is for cluster members only")

    def publish_checker(self, now: float, n: int = 1) -> tuple[Callable[[str], None], Callable[[], None]]:
        """The check of each of one publish request's `n` events at `now` (raises
        PermissionDenied or ResourceExhausted), and the call that ends them. Each topic's
        right is looked up once per request (not per event); the rate's tokens are taken
        for the `n` at once and used one per event, in order: the events over the rate are
        those a token taken per event would refuse (a bucket does not refill at one `now`),
        and the tokens of events refused before the rate (a right not held, a bad batch
        element) are given back by the end."""
        caller = CALLER.get()
        if caller is None or not caller.limited:
            return _unchecked, _ended
        allowed: set[str] = set()
        bucket = self.quotas.publish_bucket(caller.key, now)
        left = bucket.take_up_to(now, n)

        def check(topic: str) -> None:
            nonlocal left
            if topic not in allowed:
                self.require("publish", topic, _V1 + "PubSub")
                allowed.add(topic)
            if not left:
                self.count(_V1 + "PubSub", "publish_rate")
                raise ResourceExhausted(self.quotas.over_rate(caller.key))
            left -= 1

        def end() -> None:
            nonlocal left
            bucket.give_back(left)
            left = 0

        return check, end

    def open_subscription(self, topic: str, on_revoke: Callable[[EchelonError], None] | None = None
                          ) -> Callable[[], None]:
        """Check the right and the count; returns the release to call when the stream ends
        (calling it again does nothing). The right is re-checked while the stream is open
        (recheck): lost, it ends the stream, or calls `on_revoke` (one subscription of a
        shared stream ends alone)."""
        caller = self.require("subscribe", topic, _V1 + "PubSub")
        if caller is None:
            return lambda: None
        over = self.quotas.open_subscription(caller.key, self.limit(caller.identity, "subscriptions"))
        if over:
            self.count(_V1 + "PubSub", "subscriptions")
            raise ResourceExhausted(over)
        held = [True]
        stream, need = STREAM.get(), ("subscribe", topic, on_revoke)
        if stream is not None:  # re-checked while the stream is open (recheck)
            stream.needs.append(need)

        def release() -> None:
            if held.pop() if held else False:
                self.quotas.close_subscription(caller.key)
                if stream is not None and need in stream.needs:
                    stream.needs.remove(need)

        return release

    # -- revocation reaches open streams -------------------------------------------------

    def recheck(self) -> int:
        """Every open stream checked again: its token (the tokens file re-read if it
        changed, a JWT's signature against the current keys and its `exp`) and the rights
        it relies on under the current ACLs. One that no longer passes is ended with
        UNAUTHENTICATED or PERMISSION_DENIED (`end`). Each distinct token is verified once
        per pass. Returns how many were ended."""
        if not self.on or not self.streams:
            return 0
        if self.jwt is not None:
            self.jwt.refresh()
        acl, verdicts, ended = self.acl(), {}, 0
        for s in list(self.streams):
            if s.revoked is not None:
                continue
            identity, why = s.caller.identity, None
            if s.caller.token:
                v = verdicts.get(s.caller.token)
                if v is None:
                    try:
                        v = self._by_token(s.caller.token)
                    except Unauthenticated as e:
                        v = e
                    verdicts[s.caller.token] = v
                if isinstance(v, Unauthenticated):
                    why = Unauthenticated(f"the credentials this stream was opened with are no longer valid "
                                          f"({v.message})")
                else:
                    identity = v  # groups may have changed
            for right, topic, part in () if why else list(s.needs):
                refusal = acl.refusal(identity, right, topic)
                if refusal and part is not None:  # one subscription of a shared stream: it alone ends
                    self.count(s.service, "permission_denied")
                    part(PermissionDenied(f"{refusal} any longer"))
                    ended += 1
                elif refusal:
                    why = PermissionDenied(f"{refusal} any longer")
                    break
            if why is not None:
                self.end(s, why)
                ended += 1
        return ended

    def end(self, stream: OpenStream, why: EchelonError) -> None:
        """End an open stream with `why`: its task is cancelled and the interceptor turns
        the cancellation into `why`'s status (with `final` first, if set). A task out in
        gRPC writing a message is not: cancelled there, grpcio would drop the call without
        a status, leaving the client waiting (`OpenStream.writing`)."""
        stream.revoked = why
        self.count(stream.service, _REASON[why.code])
        if stream.task is not None:
            if not stream.writing:  # else it ends itself once gRPC has sent its message
                stream.task.cancel()
            cancel_after(stream.task)  # the in-band status may not go out to a client that reads nothing

    async def recheck_loop(self) -> None:
        while True:
            await asyncio.sleep(RECHECK)
            try:
                self.recheck()
            except Exception:  # noqa: BLE001 - one bad pass must not stop the next ones
                log.exception("re-checking open streams failed")


def cancel_after(task: asyncio.Task | None = None, seconds: float = FINAL_GRACE) -> None:
    """Cancel `task` (the current one) in `seconds` unless it is done by then: a stream
    ending with an in-band status (OpenStream.final) writes one more message, which a
    client that reads nothing would otherwise hold up for ever."""
    task = task or asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().call_later(seconds, task.cancel)


def _unchecked(topic: str) -> None:
    """A member's or an in-process caller's publish: nothing to check."""


def _ended() -> None:
    """The end of unchecked publishes: no token to give back."""


_REASON = {grpc.StatusCode.UNAUTHENTICATED: "unauthenticated", grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
           grpc.StatusCode.RESOURCE_EXHAUSTED: "streams"}


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Identifies and admits every call before its handler runs (inside StatusInterceptor,
    which turns the refusals raised here into statuses and counts them as RPCs)."""

    def __init__(self, access: Access):
        self.access = access

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method.lstrip("/")
        service = method.split("/")[0]
        rule = POLICY.get(method)
        if rule == OPEN:
            return handler
        access = self.access

        def admit(request, context, credential=None) -> Caller:
            try:
                if rule is None:
                    log.error("no access rule for %s: refused", method)
                    raise PermissionDenied(f"{method} has no access rule")
                caller = access.admit(method, rule, request, context, credential)
            except EchelonError as e:
                refused(context, e)
                raise
            CALLER.set(caller)
            return caller

        def refused(context, e: EchelonError) -> None:
            reason = _REASON.get(e.code, "malformed")
            access.count(service, reason)
            access.note(context.peer() or "unknown", reason, f"{method}: {e.message}", time.monotonic())

        async def first(requests, context):
            """Authenticate before decoding: a call with one request message is served as a
            client stream (handlers below), so the caller is identified from its metadata
            before its body is read; an unauthenticated caller's body is never read (what
            it can make the server buffer is the HTTP/2 flow-control window, not its
            message), and a body that does not decode is INVALID_ARGUMENT, not a traceback."""
            try:
                credential = access.credential(context)
            except EchelonError as e:
                refused(context, e)
                raise
            raw = await anext(requests, None)
            if raw is None:
                raise InvalidArgument(f"{method}: no request message")
            try:
                request = deserialize(raw) if deserialize is not None else raw
            except Exception:  # noqa: BLE001 - any decoding failure is the caller's
                e = InvalidArgument(f"{method}: the request is not a valid {method.split('/')[1]} request")
                refused(context, e)
                raise e from None
            admit(request, context, credential)
            return request

        deserialize = handler.request_deserializer
        if not access.on and not handler.request_streaming and not handler.response_streaming:
            async def plain_unary(request, context):  # nobody to keep out: read as gRPC reads it
                admit(request, context)
                return await handler.unary_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(plain_unary, deserialize, handler.response_serializer)

        if not handler.request_streaming and not handler.response_streaming:
            async def unary(requests, context):
                request = await first(requests, context)
                return await handler.unary_unary(request, context)

            return _unary_request(grpc.stream_unary_rpc_method_handler(unary, None, handler.response_serializer))

        if not handler.response_streaming:
            async def stream_unary(request_iterator, context):
                admit(None, context)
                return await handler.stream_unary(request_iterator, context)

            return grpc.stream_unary_rpc_method_handler(stream_unary, handler.request_deserializer,
                                                        handler.response_serializer)

        behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream

        async def streaming(request, context):
            if handler.request_streaming or not access.on:
                caller = admit(None if handler.request_streaming else request, context)
            else:  # one request message: read once its caller is known (`first`)
                request = await first(request, context)
                caller = CALLER.get()
            counted = caller.limited
            if counted:
                over = access.quotas.open_stream(caller.key, caller.peer)
                if over:
                    access.count(service, "streams")
                    raise ResourceExhausted(over)
            stream = None
            if access.on:  # re-checked while open (Access.recheck)
                stream = OpenStream(caller, service, asyncio.current_task())
                STREAM.set(stream)
                access.streams.add(stream)
            last = None
            responses = behavior(request, context)
            try:
                async for response in responses:
                    last = response
                    if stream is None:
                        yield response
                        continue
                    stream.writing = True
                    yield response
                    stream.writing = False
                    if stream.revoked is not None:  # ended while gRPC sent it (Access.end)
                        close = getattr(responses, "aclose", None)  # the handler's own cleanup first
                        if close is not None:
                            await close()
                        raise asyncio.CancelledError
            except asyncio.CancelledError:
                if stream is None or stream.revoked is None:
                    raise
                if stream.final is not None:
                    yield stream.final(stream.revoked)
                raise stream.revoked from None
            except EchelonError as e:  # the handler's refusal: in-band too, unless it sent it itself
                if stream is not None and stream.final is not None:
                    final = stream.final(e)
                    if final != last:
                        cancel_after()
                        yield final
                raise
            finally:
                if stream is not None:
                    access.streams.discard(stream)
                if counted:
                    access.quotas.close_stream(caller.key, caller.peer)

        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming, handler.request_deserializer,
                                                         handler.response_serializer)
        if not access.on:
            return grpc.unary_stream_rpc_method_handler(streaming, deserialize, handler.response_serializer)
        return _unary_request(grpc.stream_stream_rpc_method_handler(streaming, None, handler.response_serializer))


class _UnaryRequest(type(grpc.stream_stream_rpc_method_handler(None))):
    """A handler served as a client stream so that its one request is read after
    admission (AuthInterceptor `first`); StatusInterceptor still labels it by its kind in
    the contract (`unary_request`)."""

    __slots__ = ()
    unary_request = True


def _unary_request(handler) -> _UnaryRequest:
    return _UnaryRequest(*handler)
