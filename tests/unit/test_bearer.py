"""contract/bearer.py on a real loopback server: the token rides on every kind of call, and
a stream call that ends under a client still writing leaves nothing to be logged."""

from __future__ import annotations

import asyncio
import gc

import grpc

from echelon.contract.transport import Transport

STREAM, UNARY = "/bearer.Test/Stream", "/bearer.Test/Unary"


class Seen(grpc.GenericRpcHandler):
    """Records each call's authorization; the stream call ends after its first request,
    whatever the client still means to write."""

    def __init__(self):
        self.tokens: list[str] = []

    def _token(self, context) -> str:
        return dict(context.invocation_metadata()).get("authorization", "")

    async def _stream(self, requests, context):
        self.tokens.append(self._token(context))
        async for _ in requests:
            return  # ends the call with the client's stream still open
        yield b""  # an async generator handler

    async def _unary(self, request, context):
        self.tokens.append(self._token(context))
        return request

    def service(self, details):
        if details.method == STREAM:
            return grpc.stream_stream_rpc_method_handler(self._stream)
        if details.method == UNARY:
            return grpc.unary_unary_rpc_method_handler(self._unary)
        return None


async def test_every_call_carries_the_token_and_an_ended_stream_logs_nothing():
    loop = asyncio.get_running_loop()
    logged = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    seen = Seen()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((seen,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with Transport(token="s3cret").dial(f"127.0.0.1:{port}") as channel:
            assert await channel.unary_unary(UNARY)(b"x", timeout=5) == b"x"
            for _ in range(3):
                call = channel.stream_stream(STREAM)()
                await call.write(b"first")
                assert [r async for r in call] == []  # the server ended it
                assert await call.code() == grpc.StatusCode.OK
                del call
                for _ in range(3):
                    gc.collect()
                    await asyncio.sleep(0.01)
    finally:
        await server.stop(None)
        loop.set_exception_handler(previous)
    assert seen.tokens == ["Bearer s3cret"] * 4
    assert [c.get("message") for c in logged] == []
