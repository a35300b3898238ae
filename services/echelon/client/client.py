"""The `Client`: topics, publishers, subscriptions, and drain/close with NATS's semantics."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Iterable

import grpc

from echelon.client.durable import Durable, seek_target
from echelon.client.errors import ClientClosed, InvalidArgument, Timeout, translating
from echelon.client.publisher import AckLevel, Publisher
from echelon.client.subscription import MAX_WHOLE, Callback, Subscription
from echelon.core.filters import Filter
from echelon.core.schema import Attribute, Schema, parse_attribute
from echelon.runtime.transport import TOKEN_ENV, TlsDir, Transport, call_any, unavailable
from echelon.runtime.wire import schema_to_pb
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
    PermissionDenied, naming the topic and the right that was missing)."""

    def __init__(self, addresses: str | Iterable[str], timeout: float = 30.0,
                 tls: str | os.PathLike | None = None, token: str | None = None):
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.addresses:
            raise InvalidArgument("at least one agent address is needed")
        self.timeout = timeout
        token = os.environ.get(TOKEN_ENV, "") if token is None else token
        self.transport = Transport(TlsDir(Path(tls), server_name=None) if tls else None, token=token)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._publishers: set[Publisher] = set()
        self._subscriptions: set[Subscription] = set()
        self._acked: dict[str, OrderedDict] = {}  # durable subscription -> message ids acked (client/durable.py)
        self._seeks: dict[str, str] = {}  # durable subscription -> its seek count when last opened
        self._shared_stream = None  # the stream its subscriptions share (client/shared.py)
        self._state = "open"  # open -> draining -> closed

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- topics ------------------------------------------------------------------------

    async def create_topic(self, name: str, schema: Schema | Iterable[Attribute | str] = (),
                           timeout: float | None = None, retention_bytes: int = 0,
                           retention_seconds: int = 0) -> ppb.Topic:
        """Create a topic (again with the same schema: no change).

            await client.create_topic("quotes", ["Symbol:string", "High:float:0:500", "Volume:int"])

        An empty schema takes any attributes. Raises InvalidArgument for a bad attribute
        spec, AlreadyExists if the topic exists with another schema. `retention_*` bound the
        events kept for durable subscriptions' replay (0: the agents' defaults)."""
        with translating():
            if not isinstance(schema, Schema):
                schema = Schema(tuple(a if isinstance(a, Attribute) else parse_attribute(a) for a in schema))
        return await self._admin("CreateTopic", ppb.CreateTopicRequest(
            name=name, schema=schema_to_pb(schema), retention_bytes=retention_bytes,
            retention_seconds=retention_seconds), timeout)

    async def get_topic(self, name: str, timeout: float | None = None) -> ppb.Topic:
        """The topic and its schema; NotFound if there is none."""
        return await self._admin("GetTopic", ppb.GetTopicRequest(name=name), timeout)

    async def list_topics(self, timeout: float | None = None) -> list[ppb.Topic]:
        return list((await self._admin("ListTopics", ppb.ListTopicsRequest(), timeout)).topics)

    async def delete_topic(self, name: str, timeout: float | None = None) -> None:
        await self._admin("DeleteTopic", ppb.DeleteTopicRequest(name=name), timeout)

    # -- access control (the cluster admin only: admin on "*") ---------------------------

    async def grant_acl(self, principal: str, pattern: str, rights: Iterable[str],
                        timeout: float | None = None) -> pb.AclRule:
        """Add `rights` ("publish", "subscribe", "admin") for `principal` ("user:<name>",
        "group:<name>" or "*") on the topics `pattern` names ("quotes", "quotes.*", "*");
        returns the rule as it now stands."""
        rule = pb.AclRule(principal=principal, pattern=pattern, rights=list(rights))
        return await self._admin("GrantAcl", ppb.AclRequest(rule=rule), timeout)

    async def revoke_acl(self, principal: str, pattern: str, rights: Iterable[str],
                         timeout: float | None = None) -> pb.AclRule:
        """Remove `rights` from the rule; the rule goes when none are left (returned with
        no rights). NotFound when there is no such rule."""
        rule = pb.AclRule(principal=principal, pattern=pattern, rights=list(rights))
        return await self._admin("RevokeAcl", ppb.AclRequest(rule=rule), timeout)

    async def list_acls(self, timeout: float | None = None) -> list[pb.AclRule]:
        return list((await self._admin("ListAcls", ppb.ListAclsRequest(), timeout)).rules)

    # -- publish and subscribe ---------------------------------------------------------

    def publisher(self, producer_id: str | None = None, ack_level: AckLevel = AckLevel.ACCEPTED) -> Publisher:
        """A publisher with its own stream and producer id (a retry with the same id and
        sequence, even through another agent, is delivered once).

            async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
                await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0})"""
        self._check_open()
        try:
            ack_level = AckLevel(ack_level)
        except ValueError:
            raise InvalidArgument(f"ack level {ack_level!r}: one of {', '.join(a.name for a in AckLevel)}") from None
        publisher = Publisher(self, producer_id or f"p-{uuid.uuid4().hex[:12]}", ack_level)
        self._publishers.add(publisher)
        return publisher

    def subscribe(self, topic: str, filter: str | Filter = "", *, name: str = "", max_outstanding: int = 64,
                  callback: Callback | None = None, durable: Durable | bool | None = None,
                  max_whole: int = MAX_WHOLE, shared: bool = True, evict: bool = False) -> Subscription:
        """A subscription to the events of `topic` that match `filter`; open it with `async with`.

            async with client.subscribe("quotes", 'Symbol = "aapl" and High >= 45') as sub:
                msg = await sub.next(timeout=5)
                await msg.ack()

        `name` makes it durable (it outlives the stream; a later stream with that name
        resumes it). With `callback`, each message goes to `callback(msg)` (sync or
        async; a return acks it, an exception nacks it), at most `max_outstanding` at
        once; without, iterate. Either way the agent has at most `max_outstanding`
        deliveries unsettled. `durable` (with `name`) makes it a cluster object that outlives
        any agent (client/durable.py). A payload above `max_whole` bytes is read with
        `msg.chunks()` as it arrives (subscription.py). `shared`: on the stream the client's
        other subscriptions share (client/shared.py); a durable one has its own. `evict`
        (unnamed only): past its bound at the agent it is closed (RESOURCE_EXHAUSTED, its
        loss counted) rather than slow the publishers down, as NATS core does."""
        self._check_open()
        if durable and not name:
            raise InvalidArgument("a durable subscription needs a name")
        options = (durable if isinstance(durable, Durable) else Durable()).to_pb() if durable else None
        return Subscription(self, topic, filter, name, max_outstanding, callback, options, max_whole, shared, evict)

    async def unsubscribe(self, name: str, timeout: float | None = None) -> None:
        """Remove a named subscription and drop its backlog; NotFound if the agent has none."""
        self._check_open()
        with translating():
            await pgrpc.PubSubStub(self._channel()).Unsubscribe(ppb.UnsubscribeRequest(subscription=name),
                                                                timeout=timeout or self.timeout)

    # -- durable subscriptions (any agent answers for the cluster) ----------------------

    async def list_subscriptions(self, timeout: float | None = None) -> list[dpb.DurableSubscription]:
        return list((await self._durable("ListSubscriptions", dpb.ListSubscriptionsRequest(),
                                         timeout)).subscriptions)

    async def get_subscription(self, name: str, timeout: float | None = None) -> dpb.DurableSubscription:
        """Its record and backlog (messages, bytes, oldest); NotFound if there is none."""
        return await self._durable("GetSubscription", dpb.GetSubscriptionRequest(name=name), timeout)

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

    def _seen_seeks(self, name: str, seeks: str) -> None:
        """Forget what was acked under `name` when it was sought since."""
        if self._seeks.get(name, seeks) != seeks:
            self._acked.get(name, OrderedDict()).clear()
        self._seeks[name] = seeks

    async def _durable(self, method: str, request, timeout: float | None):
        self._check_open()
        with translating():
            return await getattr(dgrpc.DurableStub(self._channel()), method)(request,
                                                                             timeout=timeout or self.timeout)

    # -- drain and close ---------------------------------------------------------------

    async def drain(self, timeout: float = 30.0) -> None:
        """Finish cleanly, as NATS's drain: subscriptions hand out nothing more and wait
        until every message handed out is settled (callbacks may still publish); then
        publishers take no new publishes and flush; then the client closes. Raises
        Timeout (after closing everything) if `timeout` seconds were not enough."""
        if self._state != "open":
            return await self.close()
        self._state = "draining"
        deadline = time.monotonic() + timeout
        results = await asyncio.gather(*(s.drain(timeout) for s in list(self._subscriptions)),
                                       return_exceptions=True)
        left = max(0.0, deadline - time.monotonic())
        results += await asyncio.gather(*(p.close(left) for p in list(self._publishers)), return_exceptions=True)
        await self.close()
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def close(self, timeout: float = 10.0) -> None:
        """Close now: subscriptions end (acks already sent count; the rest is redelivered to
        named subscriptions), publishers flush for up to `timeout` seconds, channels close."""
        if self._state == "closed":
            return
        self._state = "closed"
        try:
            await asyncio.gather(*(s.close() for s in list(self._subscriptions)), return_exceptions=True)
            results = await asyncio.gather(*(p.close(timeout) for p in list(self._publishers)),
                                           return_exceptions=True)
        finally:
            await asyncio.gather(*(ch.close() for ch in self._channels.values()), return_exceptions=True)
            self._channels.clear()
        for r in results:
            if isinstance(r, Timeout):
                raise r

    # -- internals ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise ClientClosed(f"client is {self._state}")

    def _channel(self, i: int = 0) -> grpc.aio.Channel:
        address = self.addresses[i % len(self.addresses)]
        if address not in self._channels:
            self._channels[address] = self.transport.dial(address)
        return self._channels[address]

    def _track(self, sub: Subscription) -> None:
        self._subscriptions.add(sub)

    def _forget(self, member: Publisher | Subscription) -> None:
        self._publishers.discard(member)
        self._subscriptions.discard(member)

    async def _admin(self, method: str, request, timeout: float | None):
        """A topic call, trying each address in turn while they are unreachable."""
        self._check_open()

        async def one(i: int):
            with translating():
                return await getattr(pgrpc.AdminStub(self._channel(i)), method)(request,
                                                                               timeout=timeout or self.timeout)

        return await call_any(range(len(self.addresses)), one, retry=unavailable)
