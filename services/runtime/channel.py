"""The cluster's gRPC channel settings, shared by the services and the client (grpcio only)."""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
AUTHORIZATION = "authorization"  # metadata key of a bearer token ("Bearer <token>"), read by runtime/auth.py
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
]

# This process's own credentials as a member (set once by `use_member_token` when a
# service starts): every channel a service dials to another member carries them.
_member_token = ""


class _Bearer:
    """Adds `authorization: Bearer <token>` to every call on a channel. Call metadata
    rather than call credentials: gRPC sends those only over TLS, tokens also work without.
    One class per call kind: a grpc.aio channel files each interceptor under one kind only."""

    def __init__(self, token: str):
        self.metadata = ((AUTHORIZATION, f"Bearer {token}"),)

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


def use_member_token(token: str) -> None:
    """Set this process's member token (services call it once at start; empty: none)."""
    global _member_token
    _member_token = token


def interceptors(token: str | None = None) -> list:
    """The client interceptors for `token`; None: this process's member credentials."""
    token = _member_token if token is None else token
    return [kind(token) for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)] if token else []


def channel(address: str, token: str | None = None, options: list | None = None) -> grpc.aio.Channel:
    """An insecure channel with the cluster's message-size and keepalive settings. `token`:
    the bearer token it sends ("" for none); None, the process's member token (a service
    dialing another member)."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS if options is None else options,
                                     interceptors=interceptors(token))
