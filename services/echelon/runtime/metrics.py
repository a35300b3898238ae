"""Prometheus plumbing: a registry per service (several services may share a process
in tests), the standard `grpc_server_*` RPC metrics, and the `/metrics` endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class RpcMetrics:
    """grpc_server_started_total / handled_total / handling_seconds, as go-grpc-prometheus names them."""

    def __init__(self, registry: CollectorRegistry):
        labels = ["grpc_type", "grpc_service", "grpc_method"]
        self.started = Counter("grpc_server_started_total", "RPCs started on the server.", labels, registry=registry)
        self.handled = Counter("grpc_server_handled_total", "RPCs completed on the server, by status code.",
                               labels + ["grpc_code"], registry=registry)
        self.seconds = Histogram("grpc_server_handling_seconds", "Time to complete a unary RPC.", labels,
                                 buckets=LATENCY_BUCKETS, registry=registry)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0"):
    """Start the `/metrics` HTTP endpoint in a daemon thread (port 0 picks one).

    Returns the HTTP server: `.server_port` is the bound port, `.shutdown()` stops it."""
    server, _ = start_http_server(port, addr=host, registry=registry)
    return server


__all__ = ["CollectorRegistry", "Counter", "Gauge", "Histogram", "RpcMetrics", "serve_metrics", "LATENCY_BUCKETS"]
