"""A publisher written against the generated stubs only (echelon.v1), not the SDK: what
a Go, Java or grpcurl user writes from protos/. One Publish stream, one event per
PublishRequest, many requests in flight, each acked (one PublishAck per request, or
the documented `coalesce_acks` form when `coalesce`). Nothing of the client SDK's
coalescing: whatever makes this fast is the agent's (agent/publish_reader.py).

`send(ids)` writes one request per event and returns once the last one is acked (acks
come in request order)."""

from __future__ import annotations

import asyncio
import time
from collections import deque

import grpc

from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc


class RawPublisher:
    def __init__(self, address: str, level: int, coalesce: bool = False):
        self.channel = grpc.aio.insecure_channel(address)
        self.level, self.coalesce = level, coalesce
        self.queue: asyncio.Queue = asyncio.Queue()
        self.waiting: deque[tuple[int, asyncio.Future]] = deque()  # (last sequence of a send, its future)
        self.seq = 0
        self.producer = f"raw-{id(self):x}-{time.time_ns()}"  # a run has several publishers in turn
        self.call = None
        self.reader = None
        self.error: BaseException | None = None

    async def _requests(self):
        while True:
            batch = await self.queue.get()
            if batch is None:
                return
            for req in batch:
                yield req

    async def _read(self) -> None:
        try:
            async for ack in self.call:
                for a in ack.acks or (ack,):
                    if a.code:
                        self.error = RuntimeError(f"publish {a.sequence} refused: {a.code} {a.error}")
                    while self.waiting and self.waiting[0][0] <= a.sequence:
                        _, f = self.waiting.popleft()
                        if not f.done():
                            f.set_exception(self.error) if self.error else f.set_result(None)
        except BaseException as e:  # noqa: BLE001 - every waiter learns it
            self.error = e
        for _, f in self.waiting:
            if not f.done():
                f.set_exception(self.error or RuntimeError("publish stream ended"))
        self.waiting.clear()

    async def send(self, topic: str, events: list[tuple[dict[str, pb.Value], bytes]]) -> None:
        if self.call is None:
            self.call = pgrpc.PubSubStub(self.channel).Publish(self._requests())
            self.reader = asyncio.create_task(self._read())
        if self.error is not None:
            raise self.error
        reqs = []
        for attributes, payload in events:
            self.seq += 1
            reqs.append(ppb.PublishRequest(topic=topic, attributes=attributes, payload=payload,
                                           producer_id=self.producer, sequence=self.seq, ack_level=self.level,
                                           coalesce_acks=self.coalesce))
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((self.seq, future))
        self.queue.put_nowait(reqs)
        await future

    async def close(self) -> None:
        self.queue.put_nowait(None)
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (asyncio.TimeoutError, grpc.aio.AioRpcError):
                pass
        await self.channel.close()


def attributes(values: dict) -> dict[str, pb.Value]:
    """The bench's attributes as the stubs take them (str, float, int)."""
    kinds = {str: "string_value", float: "float_value", int: "int_value"}
    return {k: pb.Value(**{kinds[type(v)]: v}) for k, v in values.items()}
