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
    # A fixed HTTP/2 stream window instead of one grown by BDP probing: a receiver that stops
    # reading (back-pressure on a bulk payload) otherwise lets gRPC buffer as much as the
    # grown window in its own memory (measured: the publishing agent's peak RSS 241 MiB with
    # probing, 96 MiB without, on the same 256 MiB payload). 1 MiB per stream still fills a
    # 20 MB/s path at 50 ms round trips.
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1 << 20),
]


def channel(address: str) -> grpc.aio.Channel:
    """An insecure channel with the cluster's message-size and keepalive settings."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
