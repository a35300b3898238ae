"""Every gRPC status reaches the application as its class in `echelon.client.errors`,
carrying the server's message and trailing metadata; no `grpc.aio.AioRpcError` escapes.

From a real Echelon cluster (the `cluster` fixture): INVALID_ARGUMENT, NOT_FOUND,
ALREADY_EXISTS, FAILED_PRECONDITION, UNIMPLEMENTED (a client pointed at a membership
replica), UNAVAILABLE (nothing listening), DEADLINE_EXCEEDED (a client-side wait), and
RESOURCE_EXHAUSTED (`test_pubsub.py::test_backlog_overflow_ends_the_stream_with_resource_exhausted`).
Echelon cannot produce the rest on demand: PERMISSION_DENIED and UNAUTHENTICATED (no
client identity or ACLs yet), INTERNAL (only on a bug), CANCELLED, UNKNOWN, ABORTED,
OUT_OF_RANGE, DATA_LOSS. Every code, these included, is also sent by a real grpc.aio
server on loopback standing in for an agent (`Refusing`): the client's channel, the wire
and the status travel as in production; only the server's reason is made up.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
import pytest_asyncio

from echelon.client import Client, errors
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import free_port

CODES = [c for c in grpc.StatusCode if c != grpc.StatusCode.OK]
EXPECTED = {  # written out, not derived from errors.BY_CODE: an independent table
    grpc.StatusCode.CANCELLED: errors.Cancelled, grpc.StatusCode.UNKNOWN: errors.Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument, grpc.StatusCode.DEADLINE_EXCEEDED: errors.Timeout,
    grpc.StatusCode.NOT_FOUND: errors.NotFound, grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition, grpc.StatusCode.ABORTED: errors.Aborted,
    grpc.StatusCode.OUT_OF_RANGE: errors.OutOfRange, grpc.StatusCode.UNIMPLEMENTED: errors.Unimplemented,
    grpc.StatusCode.INTERNAL: errors.Internal, grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.DATA_LOSS: errors.DataLoss, grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
}
SCHEMA = ["Symbol:string", "High:float:0:500"]


class Refusing(pgrpc.AdminServicer, pgrpc.PubSubServicer):
    """Answers every call with `self.code`, its reason and a trailing detail."""

    code = grpc.StatusCode.UNKNOWN
    hold: asyncio.Event | None = None  # set: GetTopic waits for it (a deadline runs out)

    async def _refuse(self, context):
        context.set_trailing_metadata((("x-echelon-reason", f"because {self.code.name}"),))
        await context.abort(self.code, f"refused with {self.code.name}")

    async def GetTopic(self, request, context):
        if self.hold is not None:
            await self.hold.wait()
        await self._refuse(context)

    async def Subscribe(self, request_iterator, context):
        await self._refuse(context)
        yield  # pragma: no cover - makes this a streaming handler

    async def Publish(self, request_iterator, context):
        async for req in request_iterator:  # a refusal per message, in its ack: the stream stays open
            yield ppb.PublishAck(producer_id=req.producer_id, sequence=req.sequence, code=self.code.value[0],
                                 error=f"refused with {self.code.name}")


@pytest_asyncio.fixture
async def refusing():
    server = grpc.aio.server()
    servicer = Refusing()
    pgrpc.add_AdminServicer_to_server(servicer, server)
    pgrpc.add_PubSubServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with Client(f"127.0.0.1:{port}") as client:
            yield servicer, client
    finally:
        await server.stop(0)


def test_the_table_covers_every_status_code():
    assert set(EXPECTED) == set(CODES) == set(errors.BY_CODE)
    for code, cls in EXPECTED.items():
        assert errors.BY_CODE[code] is cls and cls.code == code and issubclass(cls, errors.EchelonError)
        assert type(errors.from_status(code.value[0], "m")) is cls  # as a PublishAck carries it


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
async def test_every_status_code_becomes_its_class_with_message_and_details(refusing, code):
    servicer, client = refusing
    servicer.code = code
    cls = EXPECTED[code]
    with pytest.raises(cls) as err:  # a unary call
        await client.get_topic("t")
    assert type(err.value) is cls and err.value.code == code
    assert err.value.message == f"refused with {code.name}"
    assert err.value.details["x-echelon-reason"] == f"because {code.name}"
    assert str(err.value) == f"{code.name}: refused with {code.name}"
    assert isinstance(err.value.__cause__, grpc.aio.AioRpcError)  # kept for debugging, never raised

    with pytest.raises(cls) as err:  # a stream refused when it opens
        await client.subscribe("t", "").start()
    assert err.value.message == f"refused with {code.name}"

    async with client.publisher() as pub:  # a publish refused in its ack
        with pytest.raises(cls) as err:
            await pub.publish("t", {"x": 1})
        assert err.value.message == f"refused with {code.name}" and err.value.code == code


async def test_a_deadline_that_runs_out_on_the_wire_is_timeout(refusing):
    servicer, client = refusing
    servicer.hold = asyncio.Event()
    try:
        with pytest.raises(errors.Timeout) as err:
            await client.get_topic("t", timeout=0.2)
        assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert isinstance(err.value, asyncio.TimeoutError)  # old `except asyncio.TimeoutError` still works
    finally:
        servicer.hold.set()


# -- from a real cluster ------------------------------------------------------------------


async def test_invalid_argument_from_the_cluster(cluster):
    c = cluster.client(0)
    await c.create_topic("quotes", SCHEMA)
    async with c.publisher() as pub:
        with pytest.raises(errors.InvalidArgument) as err:
            await pub.publish("quotes", {"High": 900.0})
        assert "'High'" in err.value.message and "outside [0, 500]" in err.value.message
    with pytest.raises(errors.InvalidArgument) as err:
        await c.subscribe("quotes", "High >=").start()
    assert "position 7" in err.value.message
    with pytest.raises(errors.InvalidArgument):  # checked here, before anything is sent
        await c.create_topic("bad", ["Symbol:stringy"])
    with pytest.raises(errors.InvalidArgument):
        c.publisher().publish_nowait("quotes", {"Symbol": None})


async def test_not_found_from_the_cluster(cluster):
    c = cluster.client(0)
    with pytest.raises(errors.NotFound) as err:
        await c.get_topic("absent")
    assert "'absent'" in err.value.message
    with pytest.raises(errors.NotFound):
        await c.unsubscribe("nobody")
    with pytest.raises(errors.NotFound):
        await c.subscribe("absent", "").start()


async def test_already_exists_and_failed_precondition_from_the_cluster(cluster):
    c = cluster.client(1)
    await c.create_topic("quotes", SCHEMA)
    await c.create_topic("other")
    with pytest.raises(errors.AlreadyExists):
        await c.create_topic("quotes", ["Symbol:string"])  # another schema
    async with c.subscribe("quotes", "", name="durable"):
        with pytest.raises(errors.AlreadyExists) as err:
            await c.subscribe("quotes", "", name="durable").start()
        assert "attached to another stream" in err.value.message
    with pytest.raises(errors.FailedPrecondition) as err:
        await c.subscribe("other", "", name="durable").start()
    assert "is on topic 'quotes'" in err.value.message


async def test_unimplemented_from_a_server_that_is_not_an_agent(cluster):
    async with Client(cluster.replicas[0]) as c:  # membership serves Admin, not PubSub
        async with c.publisher() as pub:
            with pytest.raises(errors.Unimplemented):
                await pub.publish("t", {"x": 1})
        with pytest.raises(errors.Unimplemented):
            await c.subscribe("t", "").start()


async def test_unavailable_when_nothing_listens():
    async with Client(f"127.0.0.1:{free_port()}", timeout=5) as c:
        with pytest.raises(errors.Unavailable):
            await c.get_topic("t")
        with pytest.raises(errors.Unavailable):
            await c.subscribe("t", "").start()


async def test_waiting_for_a_message_times_out_as_timeout(cluster):
    c = cluster.client(0)
    await c.create_topic("t")
    async with c.subscribe("t", "") as sub:
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=0.2)
        async with c.publisher() as pub:
            await pub.publish("t", {"x": 1})
        assert (await sub.next(timeout=5)).attributes == {"x": 1}  # the stream stayed open
