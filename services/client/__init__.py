"""The Python client SDK, shared by the CLI, the tests and users.

    async with Client("127.0.0.1:7100") as client:
        await client.create_topic("quotes", ["Symbol:string", "High:float:0:500"])
        async with client.subscribe("quotes", 'Symbol = "aapl" and High >= 45') as sub:
            pub = client.publisher()
            await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0})
            msg = await sub.next(timeout=5)
            await msg.ack()

A `Publisher` keeps one stream open, numbers its messages, and on a broken stream
reconnects (to the next address, if several) and resends every unacknowledged message
with the same (producer id, sequence), so receivers drop the second copy. A
`Subscription` grants credits and gives one back per ack, so at most `credits`
deliveries are ever in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import grpc

from echelon.core.filters import Filter
from echelon.core.schema import Attribute, Schema, Value, parse_attribute
from echelon.runtime.server import channel
from echelon.runtime.wire import attributes_from_pb, attributes_to_pb, filter_to_pb, schema_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

ACCEPTED, DELIVERED = ppb.ACK_LEVEL_ACCEPTED, ppb.ACK_LEVEL_DELIVERED
SLICE_BYTES = 4 << 20  # larger payloads are published as slices


class PublishError(Exception):
    """The agent rejected one message; `code` is the gRPC status (e.g. INVALID_ARGUMENT)."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass
class Message:
    topic: str
    attributes: dict[str, Value]
    payload: bytes
    producer_id: str
    sequence: int
    ordering_key: str
    redelivery_count: int
    delivery_id: int
    publish_time_ns: int
    _subscription: "Subscription" = field(repr=False, default=None)  # type: ignore[assignment]

    async def ack(self) -> None:
        await self._subscription.ack(self)


class Client:
    def __init__(self, addresses: str | Iterable[str]):
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.addresses:
            raise ValueError("at least one agent address is needed")
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, i: int = 0) -> grpc.aio.Channel:
        address = self.addresses[i % len(self.addresses)]
        if address not in self._channels:
            self._channels[address] = channel(address)
        return self._channels[address]

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(ch.close() for ch in self._channels.values()), return_exceptions=True)
        self._channels.clear()

    # -- topics --------------------------------------------------------------------

    def _admin(self) -> pgrpc.AdminStub:
        return pgrpc.AdminStub(self.channel())

    async def create_topic(self, name: str, schema: Schema | Iterable[Attribute | str] = ()) -> ppb.Topic:
        if not isinstance(schema, Schema):
            schema = Schema(tuple(a if isinstance(a, Attribute) else parse_attribute(a) for a in schema))
        return await self._admin().CreateTopic(ppb.CreateTopicRequest(name=name, schema=schema_to_pb(schema)))

    async def get_topic(self, name: str):
        return await self._admin().GetTopic(ppb.GetTopicRequest(name=name))

    async def list_topics(self) -> list:
        return list((await self._admin().ListTopics(ppb.ListTopicsRequest())).topics)

    async def delete_topic(self, name: str) -> None:
        await self._admin().DeleteTopic(ppb.DeleteTopicRequest(name=name))

    # -- publish and subscribe --------------------------------------------------------

    def publisher(self, producer_id: str | None = None, ack_level: int = ACCEPTED) -> "Publisher":
        return Publisher(self, producer_id or f"p-{uuid.uuid4().hex[:12]}", ack_level)

    def subscribe(self, topic: str, filter: str | Filter = "", name: str = "", credits: int = 64) -> "Subscription":
        return Subscription(self, topic, filter, name, credits)

    async def unsubscribe(self, name: str) -> None:
        await pgrpc.PubSubStub(self.channel()).Unsubscribe(ppb.UnsubscribeRequest(subscription=name))


class Publisher:
    def __init__(self, client: Client, producer_id: str, ack_level: int, max_retries: int = 20):
        self.client = client
        self.producer_id = producer_id
        self.ack_level = ack_level
        self.max_retries = max_retries
        self._seq = itertools.count(1)
        self._pending: OrderedDict[int, tuple[list[ppb.PublishRequest], asyncio.Future]] = OrderedDict()
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._closed = False

    async def publish(self, topic: str, attributes: Mapping[str, Value] | None = None, payload: bytes = b"",
                      ordering_key: str = "") -> int:
        """Publish one event; returns how many agents held a matching subscription.

        Raises PublishError if the agent rejected it (the error names the reason)."""
        return await self.publish_nowait(topic, attributes, payload, ordering_key)

    def publish_nowait(self, topic: str, attributes: Mapping[str, Value] | None = None, payload: bytes = b"",
                       ordering_key: str = "") -> asyncio.Future:
        """Queue one event and return the future of its ack: many may be in flight at once."""
        if self._closed:
            raise RuntimeError("publisher is closed")
        seq = next(self._seq)
        attrs = attributes_to_pb(attributes or {})
        requests = []
        slices = [payload[i:i + SLICE_BYTES] for i in range(0, len(payload), SLICE_BYTES)] or [b""]
        for i, chunk in enumerate(slices):
            req = ppb.PublishRequest(topic=topic, payload=chunk, ordering_key=ordering_key,
                                     producer_id=self.producer_id, sequence=seq, ack_level=self.ack_level)
            if i == 0:
                for k, v in attrs.items():
                    req.attributes[k].CopyFrom(v)
            if len(slices) > 1:
                req.slice_index, req.slice_count, req.payload_size = i, len(slices), len(payload)
            requests.append(req)
        future = asyncio.get_running_loop().create_future()
        self._pending[seq] = (requests, future)
        self._outbox.put_nowait(requests)
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        return future

    async def flush(self) -> None:
        """Wait until every queued message is acknowledged (or failed)."""
        await asyncio.gather(*(f for _, f in list(self._pending.values())), return_exceptions=True)

    async def close(self) -> None:
        await self.flush()
        self._closed = True
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        attempt = 0
        while True:
            stub = pgrpc.PubSubStub(self.client.channel(attempt))
            # A fresh stream: resend whatever is unacknowledged, in order, then the rest.
            resend = [reqs for reqs, _ in self._pending.values()]
            self._outbox = asyncio.Queue()
            for reqs in resend:
                self._outbox.put_nowait(reqs)

            async def requests(outbox=self._outbox):
                while True:
                    for req in await outbox.get():
                        yield req

            call = stub.Publish(requests())
            try:
                async for ack in call:
                    attempt = 0
                    entry = self._pending.pop(ack.sequence, None)
                    if entry is None or entry[1].done():
                        continue
                    if ack.code:
                        entry[1].set_exception(PublishError(_CODES.get(ack.code, grpc.StatusCode.UNKNOWN), ack.error))
                    else:
                        entry[1].set_result(ack.destinations)
            except grpc.aio.AioRpcError as e:
                attempt += 1
                if attempt > self.max_retries or e.code() not in (grpc.StatusCode.UNAVAILABLE,
                                                                  grpc.StatusCode.CANCELLED,
                                                                  grpc.StatusCode.DEADLINE_EXCEEDED,
                                                                  grpc.StatusCode.INTERNAL):
                    for _, future in self._pending.values():
                        if not future.done():
                            future.set_exception(PublishError(e.code(), e.details() or ""))
                    self._pending.clear()
                    attempt = 0
                await asyncio.sleep(min(0.05 * 2 ** attempt, 2.0))


class Subscription:
    """An async iterator of Messages; use as `async with` so the stream is closed."""

    def __init__(self, client: Client, topic: str, flt: str | Filter, name: str, credits: int):
        if credits < 1:
            raise ValueError("credits must be at least 1")
        self.client = client
        open_ = ppb.SubscriptionOpen(topic=topic, subscription=name, credits=credits)
        if isinstance(flt, Filter):
            open_.filter.CopyFrom(filter_to_pb(flt))
        else:
            open_.filter_text = flt
        self._open = open_
        self._write = asyncio.Lock()  # one write at a time on a stream
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._call = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> "Subscription":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the stream; raises grpc.aio.AioRpcError (e.g. INVALID_ARGUMENT) if refused."""
        self._call = pgrpc.PubSubStub(self.client.channel()).Subscribe()
        await self._call.write(ppb.SubscribeRequest(open=self._open))
        # The agent sends headers once the subscription is registered; a refusal
        # (bad filter, unknown topic) ends the call without them and raises here.
        metadata = await self._call.initial_metadata()
        if not any(k == "x-echelon-subscription" for k, _ in metadata or ()):
            await self._call.read()
            raise RuntimeError("subscription stream ended before it was opened")
        # Reads run in their own task: cancelling a pending read would cancel the RPC,
        # so `next(timeout=...)` waits on this queue instead.
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for delivery in self._call:
                self._inbox.put_nowait(delivery)
            self._inbox.put_nowait(StopAsyncIteration())
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._inbox.put_nowait(e)

    async def next(self, timeout: float | None = None) -> Message:
        """The next delivery; asyncio.TimeoutError after `timeout` seconds (the stream stays open)."""
        d = await asyncio.wait_for(self._inbox.get(), timeout)
        if isinstance(d, BaseException):
            self._inbox.put_nowait(d)  # every later call raises it too
            raise d
        e = d.event
        return Message(e.topic, attributes_from_pb(e.attributes), e.payload, e.id.producer_id, e.id.sequence,
                       e.ordering_key, d.redelivery_count, d.delivery_id, e.publish_time_unix_nanos, self)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        return await self.next()

    async def ack(self, message: Message, credits: int = 1) -> None:
        """Acknowledge one delivery and give its credit back."""
        async with self._write:
            await self._call.write(ppb.SubscribeRequest(
                ack=ppb.SubscriberAck(delivery_ids=[message.delivery_id], credits=credits)))

    async def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
