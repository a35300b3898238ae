"""The `Client`: topics, publishers, subscriptions, and drain/close with NATS's semantics."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path
from typing import Iterable, Mapping

import grpc

from echelon.client.admin import AclRule, SubscriptionInfo, Topic, caps_from_pb
from echelon.client.compressed import check
from echelon.client.connection import Connection, ConnectionEvent, Hook, Reconnect, with_port
from echelon.client.deadlines import ACK_DEADLINE
from echelon.client.diagnose import probe
from echelon.client.durable import Durable, seek_target
from echelon.client.errors import InvalidArgument, Timeout, Unavailable, translating
from echelon.client.publisher import AckLevel, Publisher
from echelon.client.subscription import MAX_OUTSTANDING_BYTES, MAX_WHOLE, Callback, Subscription
from echelon.contract.filters import Filter
from echelon.contract.schema import Attribute, Schema, parse_attribute
from echelon.contract.transport import TOKEN_ENV, TlsDir, Transport, call_any, unavailable
from echelon.contract.wire import schema_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import durable_pb2_grpc as dgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc


class Client:
    """A connection to Echelon agents (one address, or several to fail over to).

        async with Client("127.0.0.1:7200") as client:
            await client.create_topic("quotes", ["Symbol:string", "High:float:0:500"])
            ...
        # leaving the block closed it: publishers flushed, subscriptions closed

    `timeout` bounds every topic call (seconds). `tls`: a directory with `ca.crt` (the
    cluster's CA) and, for a client certificate, `tls.crt` and `tls.key`; the agents'
    host names are checked against their certificates. `token`: a bearer token sent with
    every call (a static token or a JWT, whatever the cluster's `--auth` takes); default
    `$ECHELON_TOKEN`, none if unset. A client certificate names the caller instead of
    the token when both are there (runtime/auth.py). Every failure raises an
    `echelon.client.errors.EchelonError` subclass (a refused call: Unauthenticated or
    PermissionDenied, naming the topic and the right that was missing).

    `await client.connect()` asks the agents at once whether they serve and fails fast
    with the cause; without it, calls dial when they need to. A named or durable
    subscription whose agent dies reopens on the next agent of the list, and a publisher
    resends there (`reconnect`: the policy); `on_disconnect` and `on_reconnect` (sync or
    async) receive a ConnectionEvent for each stream lost and opened again (docs/cli.md,
    "Subscriptions across an agent's death"). Admin calls return dataclasses
    (client/admin.py).

    `compress=True`: publish and subscription streams offer zstd and, where the agent
    accepts (it may not: an earlier release, or one at its bound of compressed streams),
    travel compressed: about four times fewer bytes for some CPU at each end
    (docs/compression.md). Needs the `zstd` extra (`pip install 'echelon-pubsub[zstd]'`):
    FailedPrecondition names it if missing."""

    def __init__(self, addresses: str | Iterable[str], timeout: float = 30.0,
                 tls: str | os.PathLike | None = None, token: str | None = None, *,
                 reconnect: Reconnect = Reconnect(), on_disconnect: Hook | None = None,
                 on_reconnect: Hook | None = None, compress: bool = False):
        addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        addresses = [with_port(a) for a in addresses if a.strip()]
        if not addresses:
            raise InvalidArgument("at least one agent address is needed")
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        transport = Transport(TlsDir(Path(tls), server_name=None) if tls else None, token=token)
        if compress:
            check()  # the `zstd` extra, named in the error if missing
        self._conn = Connection(addresses, transport, timeout, reconnect, on_disconnect, on_reconnect, compress)

    @property
    def state(self) -> str:
        """"open", "draining" or "closed"."""
        return self._conn.state

    @property
    def addresses(self) -> list[str]:
        return self._conn.addresses

    @property
    def timeout(self) -> float:
        return self._conn.timeout

    @property
    def transport(self) -> Transport:
        return self._conn.transport

    @property
    def _channels(self) -> dict[str, grpc.aio.Channel]:
        return self._conn._channels  # noqa: SLF001 - the chaos workload dials its own

    @property
    def _shared_stream(self):
        return self._conn.shared_stream

    @_shared_stream.setter
    def _shared_stream(self, stream) -> None:
        self._conn.shared_stream = stream

    async def connect(self, timeout: float = 5.0) -> list[str]:
        """Fail fast: ask every agent of the list, at once, whether it serves (its health
        service, open to any caller); the ones that do, in the list's order. Raises
        Unavailable naming each address's cause ("no agent at ...", "... is a membership
        replica, not an agent", "... answers HTTP, not gRPC: a /metrics port?", ...) when
        none does within `timeout` seconds. Optional: every call dials when it needs to."""
        conn = self._conn
        conn.check_open()
        causes = await asyncio.gather(*(probe(a, conn.transport, timeout=timeout, channel=conn.channel(i))
                                        for i, a in enumerate(conn.addresses)))
        serving = [a for a, cause in zip(conn.addresses, causes) if cause is None]
        if not serving:
            raise Unavailable("; ".join(causes))
        conn.current = conn.addresses.index(serving[0])
        return serving

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- topics ------------------------------------------------------------------------

    async def create_topic(self, name: str, schema: Schema | Iterable[Attribute | str] = (),
                           timeout: float | None = None, retention_bytes: int = 0,
                           retention_seconds: int = 0, durable_caps: Mapping[str, int] | None = None) -> Topic:
        """Create a topic (again with the same schema: no change).

            await client.create_topic("quotes", ["Symbol:string", "High:float:0:500", "Volume:int"])

        An empty schema takes any attributes. Raises InvalidArgument for a bad attribute
        spec, AlreadyExists if the topic exists with another schema. `retention_*` bound the
        events kept for durable subscriptions' replay (0: the agents' defaults).
        `durable_caps` (max_messages, max_bytes, idle_seconds, replicas) bound what a
        durable subscription of the topic may ask for (docs/security.md)."""
        with translating():
            if not isinstance(schema, Schema):
                schema = Schema(tuple(a if isinstance(a, Attribute) else parse_attribute(a) for a in schema))
        try:
            caps = pb.DurableCaps(**(durable_caps or {}))
        except (ValueError, TypeError) as e:
            raise InvalidArgument(f"durable_caps: {e}") from None
        return Topic.from_pb(await self._admin("CreateTopic", ppb.CreateTopicRequest(
            name=name, schema=schema_to_pb(schema), retention_bytes=retention_bytes,
            retention_seconds=retention_seconds, durable_caps=caps), timeout))

    async def get_topic(self, name: str, timeout: float | None = None) -> Topic:
        """The topic and its schema; NotFound if there is none."""
        return Topic.from_pb(await self._admin("GetTopic", ppb.GetTopicRequest(name=name), timeout))

    async def list_topics(self, timeout: float | None = None) -> list[Topic]:
        return [Topic.from_pb(t) for t in (await self._admin("ListTopics", ppb.ListTopicsRequest(), timeout)).topics]

    async def delete_topic(self, name: str, timeout: float | None = None) -> None:
        await self._admin("DeleteTopic", ppb.DeleteTopicRequest(name=name), timeout)

    # -- access control (the cluster admin only: admin on "*") ---------------------------

    async def grant_acl(self, principal: str, pattern: str, rights: Iterable[str],
                        timeout: float | None = None) -> AclRule:
        """Add `rights` ("publish", "subscribe", "admin") for `principal` ("user:<name>",
        "group:<name>" or "*") on the topics `pattern` names ("quotes", "quotes.*", "*");
        returns the rule as it now stands."""
        rule = pb.AclRule(principal=principal, pattern=pattern, rights=list(rights))
        return AclRule.from_pb(await self._admin("GrantAcl", ppb.AclRequest(rule=rule), timeout))

    async def revoke_acl(self, principal: str, pattern: str, rights: Iterable[str],
                         timeout: float | None = None) -> AclRule:
        """Remove `rights` from the rule; the rule goes when none are left (returned with
        no rights). NotFound when there is no such rule."""
        rule = pb.AclRule(principal=principal, pattern=pattern, rights=list(rights))
        return AclRule.from_pb(await self._admin("RevokeAcl", ppb.AclRequest(rule=rule), timeout))

    async def list_acls(self, timeout: float | None = None) -> list[AclRule]:
        return [AclRule.from_pb(r) for r in (await self._admin("ListAcls", ppb.ListAclsRequest(), timeout)).rules]

    async def set_caps(self, principal: str, caps: Mapping[str, int] | None = None, clear: Iterable[str] = (),
                       timeout: float | None = None) -> dict[str, int]:
        """Set caps of `principal` ("user:<name>", "group:<name>" or "*"): what it may hold
        and ask for (subscriptions, durable_subscriptions, durable_max_messages,
        durable_max_bytes, durable_max_idle_seconds, durable_max_replicas), over the
        agents' limits; `clear` removes some. Returns its caps as they now stand."""
        try:
            msg = pb.IdentityCaps(**(caps or {}))
        except (ValueError, TypeError) as e:
            raise InvalidArgument(f"caps: {e}") from None
        request = ppb.CapsRequest(principal=principal, caps=msg, clear=list(clear))
        return caps_from_pb((await self._admin("SetCaps", request, timeout)).caps)

    async def list_caps(self, timeout: float | None = None) -> dict[str, dict[str, int]]:
        """principal -> its caps, for every principal that has some."""
        listed = await self._admin("ListCaps", ppb.ListAclsRequest(), timeout)
        return {r.principal: caps_from_pb(r.caps) for r in listed.rules}

    # -- publish and subscribe ---------------------------------------------------------

    def publisher(self, producer_id: str | None = None, ack_level: AckLevel = AckLevel.ACCEPTED) -> Publisher:
        """A publisher with its own stream and producer id (a retry with the same id and
        sequence, even through another agent, is delivered once).

            async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
                await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0})"""
        self._conn.check_open()
        try:
            ack_level = AckLevel(ack_level)
        except ValueError:
            raise InvalidArgument(f"ack level {ack_level!r}: one of {', '.join(a.name for a in AckLevel)}") from None
        # 48 random bits, as base64 (8 characters, not 12 in hex): the id rides in every copy
        # of every event down the trees and to the subscribers (docs/performance.md).
        publisher = Publisher(self._conn, producer_id or "p-" + base64.urlsafe_b64encode(os.urandom(6)).decode(),
                              ack_level)
        self._conn.track(publisher)
        return publisher

    def subscribe(self, topic: str, filter: str | Filter = "", *, name: str = "", max_outstanding: int = 64,
                  callback: Callback | None = None, durable: Durable | bool | None = None,
                  max_whole: int = MAX_WHOLE, shared: bool = True, reconnect: bool | None = None,
                  ack_deadline: float = ACK_DEADLINE, max_deliveries: int = 0,
                  dead_letter_topic: str = "", evict: bool = False,
                  max_outstanding_bytes: int = MAX_OUTSTANDING_BYTES) -> Subscription:
        """A subscription to the events of `topic` that match `filter`; open it with `async with`.

            async with client.subscribe("quotes", 'Symbol = "aapl" and High >= 45') as sub:
                msg = await sub.next(timeout=5)
                await msg.ack()

        `name` makes it durable (it outlives the stream; a later stream with that name
        resumes it). With `callback`, each message goes to `callback(msg)` (sync or
        async; a return acks it, an exception nacks it), at most `max_outstanding` at
        once, from the moment it is made (inside a running loop; `await sub.start()` waits
        for the open and raises how it failed); without, iterate. Either way the agent has at most `max_outstanding`
        deliveries unsettled, and sends no more while those received and unsettled hold
        `max_outstanding_bytes` (0: no byte bound; subscription.py, "Flow control"). `durable` (with `name`) makes it a cluster object that outlives
        any agent (client/durable.py). A payload above `max_whole` bytes is read with
        `msg.chunks()` as it arrives (subscription.py). `shared`: on the stream the client's
        other subscriptions share (client/shared.py); a durable one has its own.
        `reconnect` (default: with a `name`): when its agent dies the subscription opens a
        new stream on the next agent of the list by itself; a durable one resumes without
        handing out again what was acked, a named one records its gap in `sub.gaps`
        (docs/cli.md, "Subscriptions across an agent's death"). `ack_deadline` (seconds, 0:
        none): a message not settled by then is redelivered (`msg.in_progress()` extends
        it); `max_deliveries` (0: no bound): a message delivered that often goes to
        `dead_letter_topic` instead (enforced by the agents: docs/guarantees.md, "Dead messages"). `evict` (unnamed only): past its
        bound at the agent it is closed (RESOURCE_EXHAUSTED, its loss counted) rather than
        slow the publishers down, as NATS core does (docs/guarantees.md, "Flow control")."""
        self._conn.check_open()
        if durable and not name:
            raise InvalidArgument("a durable subscription needs a name")
        options = (durable if isinstance(durable, Durable) else Durable()).to_pb() if durable else None
        if reconnect is None:
            reconnect = bool(name)
        sub = Subscription(self._conn, topic, filter, name, max_outstanding, callback, options, max_whole, shared,
                           reconnect, ack_deadline, max_deliveries, dead_letter_topic, evict, max_outstanding_bytes)
        if callback is not None:
            sub._start_soon()
        return sub

    async def unsubscribe(self, name: str, timeout: float | None = None) -> None:
        """Remove a named subscription and drop its backlog; NotFound if the agent has none."""
        self._conn.check_open()
        with translating():
            await pgrpc.PubSubStub(self._conn.channel()).Unsubscribe(ppb.UnsubscribeRequest(subscription=name),
                                                                timeout=timeout or self.timeout)

    # -- durable subscriptions (any agent answers for the cluster) ----------------------

    async def list_subscriptions(self, timeout: float | None = None) -> list[SubscriptionInfo]:
        return [SubscriptionInfo.from_pb(s) for s in
                (await self._durable("ListSubscriptions", dpb.ListSubscriptionsRequest(), timeout)).subscriptions]

    async def get_subscription(self, name: str, timeout: float | None = None) -> SubscriptionInfo:
        """Its record and backlog (messages, bytes, oldest); NotFound if there is none."""
        return SubscriptionInfo.from_pb(await self._durable("GetSubscription", dpb.GetSubscriptionRequest(name=name),
                                                            timeout))

    async def seek(self, name: str, time=None, message: tuple[str, int] | None = None,
                   timeout: float | None = None) -> int:
        """Owe `name` every retained event from `time` (datetime or Unix seconds) or from
        `message` (producer id, sequence) on, acked or not; OutOfRange if the message is
        not retained. Returns the backlog it then has."""
        with translating():
            target = seek_target(time, message)
        request = dpb.SeekRequest(name=name, **target)
        return (await self._durable("Seek", request, timeout)).backlog_messages

    async def delete_subscription(self, name: str, timeout: float | None = None) -> None:
        await self._durable("DeleteSubscription", dpb.DeleteSubscriptionRequest(name=name), timeout)

    async def _durable(self, method: str, request, timeout: float | None):
        self._conn.check_open()
        with translating():
            return await getattr(dgrpc.DurableStub(self._conn.channel()), method)(request,
                                                                             timeout=timeout or self.timeout)

    # -- drain and close ---------------------------------------------------------------

    async def drain(self, timeout: float = 30.0) -> None:
        """Finish cleanly, as NATS's drain: subscriptions hand out nothing more and wait
        until every message handed out is settled (callbacks may still publish); then
        publishers take no new publishes and flush; then the client closes. Raises
        Timeout (after closing everything) if `timeout` seconds were not enough."""
        conn = self._conn
        if conn.state != "open":
            return await self.close()
        conn.state = "draining"
        deadline = time.monotonic() + timeout
        results = await asyncio.gather(*(s.drain(timeout) for s in self._members(Subscription)),
                                       return_exceptions=True)
        left = max(0.0, deadline - time.monotonic())
        results += await asyncio.gather(*(p.close(left) for p in self._members(Publisher)), return_exceptions=True)
        await self.close()
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def close(self, timeout: float = 10.0) -> None:
        """Close now: subscriptions end (acks already sent count; the rest is redelivered to
        named subscriptions), publishers flush for up to `timeout` seconds, channels close."""
        conn = self._conn
        if conn.state == "closed":
            return
        conn.state = "closed"
        results = []
        try:
            await asyncio.gather(*(s.close() for s in self._members(Subscription)), return_exceptions=True)
            results = await asyncio.gather(*(p.close(timeout) for p in self._members(Publisher)),
                                           return_exceptions=True)
        finally:
            await conn.close()
        for r in results:
            if isinstance(r, Timeout):
                raise r

    # -- internals ---------------------------------------------------------------------

    def _members(self, kind: type) -> list:
        return [m for m in self._conn.members if isinstance(m, kind)]

    async def _admin(self, method: str, request, timeout: float | None):
        """A topic call, trying each address in turn while they are unreachable."""
        conn = self._conn
        conn.check_open()

        async def one(i: int):
            with translating():
                return await getattr(pgrpc.AdminStub(conn.channel(conn.current + i)), method)(request,
                                                                               timeout=timeout or self.timeout)

        return await call_any(range(len(self.addresses)), one, retry=unavailable)
