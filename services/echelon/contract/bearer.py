"""A bearer token on every call of a channel (`authorization: Bearer <token>`), for the
clients and members that authenticate with one (runtime/auth.py reads it). grpcio only:
the client SDK uses it.

Call metadata rather than call credentials: gRPC sends those only over TLS, and tokens
also work on a plain-text cluster."""

from __future__ import annotations

from collections import namedtuple

import grpc

AUTHORIZATION_KEY = "authorization"  # "Bearer <token>" (transport.py re-exports it with the other keys)


class _WithToken:
    """One method of a channel, calling it with the token added to the call's metadata."""

    __slots__ = ("_call", "_metadata")

    def __init__(self, call, metadata: tuple):
        self._call, self._metadata = call, metadata

    def __call__(self, *args, metadata=None, **kwargs):
        return self._call(*args, metadata=(*(metadata or ()), *self._metadata), **kwargs)


class BearerChannel:
    """An asyncio channel whose every call carries `authorization: Bearer <token>`.

    A proxy handing out methods that add the token, rather than grpc.aio client
    interceptors: an intercepted stream call feeds its `write()`s through an async generator
    of grpcio's own, a task hop per message, which grpcio drops unfinished when the call
    ends under it; its finalizer then fails ("aclose(): asynchronous generator is already
    running", logged as a task exception never retrieved)."""

    def __init__(self, channel: grpc.aio.Channel, token: str):
        self._channel = channel
        self._metadata = ((AUTHORIZATION_KEY, f"Bearer {token}"),)

    def unary_unary(self, *args, **kwargs):
        return _WithToken(self._channel.unary_unary(*args, **kwargs), self._metadata)

    def unary_stream(self, *args, **kwargs):
        return _WithToken(self._channel.unary_stream(*args, **kwargs), self._metadata)

    def stream_unary(self, *args, **kwargs):
        return _WithToken(self._channel.stream_unary(*args, **kwargs), self._metadata)

    def stream_stream(self, *args, **kwargs):
        return _WithToken(self._channel.stream_stream(*args, **kwargs), self._metadata)

    def __getattr__(self, name):  # close, channel_ready, get_state, wait_for_state_change
        return getattr(self._channel, name)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self._channel.close(None)


class BlockingBearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """The same for a blocking channel (the routing job's Control calls)."""

    class _Details(namedtuple("_Details", "method timeout metadata credentials wait_for_ready compression"),
                   grpc.ClientCallDetails):
        pass

    def __init__(self, token: str):
        self.metadata = ((AUTHORIZATION_KEY, f"Bearer {token}"),)

    def _with_token(self, d):
        return self._Details(d.method, d.timeout, (*(d.metadata or ()), *self.metadata), d.credentials,
                             getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)
