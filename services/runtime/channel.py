"""The cluster's gRPC channel settings, shared by the services and the client (grpcio only)."""

from __future__ import annotations

import grpc

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
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


def channel(address: str) -> grpc.aio.Channel:
    """An insecure channel with the cluster's message-size and keepalive settings."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
