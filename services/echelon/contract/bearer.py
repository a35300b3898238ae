"""A bearer token on every call of a channel (`authorization: Bearer <token>`), for the
clients and members that authenticate with one (runtime/auth.py reads it). grpcio only:
the client SDK uses it.

Call metadata rather than call credentials: gRPC sends those only over TLS, and tokens
also work on a plain-text cluster."""

from __future__ import annotations

from collections import namedtuple

import grpc

AUTHORIZATION_KEY = "authorization"  # "Bearer <token>" (transport.py re-exports it with the other keys)


class _Bearer:
    """Adds `authorization: Bearer <token>` to every call on a channel. One class per call
    kind: a grpc.aio channel files each interceptor under one kind only."""

    def __init__(self, token: str):
        self.metadata = ((AUTHORIZATION_KEY, f"Bearer {token}"),)

    def _with_token(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()), *self.metadata)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _UnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _UnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _StreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


class _StreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


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


def bearer_interceptors(token: str) -> list:
    """The asyncio client interceptors adding `token` to every call."""
    return [kind(token) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]
