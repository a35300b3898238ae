"""Server bootstrap shared by every service.

A `Server` is a `grpc.aio` server with the standard health service, reflection, one
interceptor that maps domain errors to precise statuses and counts every RPC in the
standard `grpc_server_*` metrics, and inside it the one that identifies and admits every
call (runtime/auth.py). `run()` serves until SIGTERM/SIGINT, then marks the
health NOT_SERVING, lets in-flight calls drain for `grace` seconds, and stops.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import os
import signal
import time
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from echelon.runtime.auth import REASONS, Access, AuthConfig, AuthInterceptor
from echelon.contract.errors import status_of
from echelon.runtime.metrics import RpcMetrics
from echelon.contract.transport import MAX_MESSAGE_BYTES, PLAIN, SERVER_OPTIONS, Transport

log = logging.getLogger("echelon.server")


class StatusInterceptor(grpc.aio.ServerInterceptor):
    """Domain exceptions -> statuses; every RPC counted and timed."""

    def __init__(self, metrics: RpcMetrics):
        self.metrics = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        _, service, method = details.method.split("/")
        # A one-request call served as a client stream (runtime/auth.py) keeps its kind.
        streaming_request = handler.request_streaming and not getattr(handler, "unary_request", False)
        kind = ("bidi_stream" if streaming_request else "server_stream") if handler.response_streaming \
            else ("client_stream" if streaming_request else "unary")
        labels = (kind, service, method)
        m = self.metrics

        def finish(context, code: grpc.StatusCode) -> None:
            m.handled.labels(*labels, code.name).inc()

        async def guard(exc: BaseException, context) -> None:
            status = status_of(exc)
            if status is None:
                log.exception("unhandled error in %s", details.method, exc_info=exc)
                status = (grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
            finish(context, status[0])
            # gRPC keeps the abort's exception, and this one as its context, with the call's
            # state: without its traceback, the frames' locals (a request's data) are not kept.
            exc.__traceback__ = None
            await context.abort(*status)

        def code_of(context) -> grpc.StatusCode:
            code = context.code()
            return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK

        if handler.response_streaming:
            behavior = handler.stream_stream if handler.request_streaming else handler.unary_stream

            async def streaming(request, context):
                m.started.labels(*labels).inc()
                try:
                    responses = behavior(request, context)
                    if inspect.isawaitable(responses):  # a handler that writes with context.write (Health.Watch)
                        await responses
                    else:
                        async for response in responses:
                            yield response
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    finish(context, code_of(context) if context.code() else grpc.StatusCode.CANCELLED)
                    raise
                except Exception as exc:  # noqa: BLE001 - mapped to a status
                    await guard(exc, context)
                else:
                    finish(context, code_of(context))

            wrap = grpc.stream_stream_rpc_method_handler if handler.request_streaming \
                else grpc.unary_stream_rpc_method_handler
            return wrap(streaming, handler.request_deserializer, handler.response_serializer)

        behavior = handler.stream_unary if handler.request_streaming else handler.unary_unary

        async def unary(request, context):
            m.started.labels(*labels).inc()
            start = time.perf_counter()
            try:
                response = await behavior(request, context)
            except grpc.aio.AbortError:
                finish(context, code_of(context))
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status
                await guard(exc, context)
            else:
                finish(context, code_of(context))
                return response
            finally:
                m.seconds.labels(*labels).observe(time.perf_counter() - start)

        wrap = grpc.stream_unary_rpc_method_handler if handler.request_streaming \
            else grpc.unary_unary_rpc_method_handler
        return wrap(unary, handler.request_deserializer, handler.response_serializer)


class Server:
    """One grpc.aio server: add servicers, `start(address)`, later `stop(grace)`. Its
    ports are plain or TLS as `transport` says (contract/transport.py)."""

    def __init__(self, registry: CollectorRegistry | None = None, transport: Transport = PLAIN,
                 auth: AuthConfig | None = None, receive_bytes: int | None = None):
        self.transport = transport
        self.registry = registry or CollectorRegistry()
        self.rpc_metrics = RpcMetrics(self.registry)
        self.access = Access(auth, self.registry)
        self.health = health.aio.HealthServicer()
        # gRPC core refuses a larger message (RESOURCE_EXHAUSTED) before Python receives it:
        # received, a message is copied on the event loop, whatever the handler then does.
        size = min(receive_bytes or MAX_MESSAGE_BYTES, self.access.config.limits.max_message_bytes)
        self.receive_bytes = size
        # Of a key given twice, gRPC takes the first: the default is left out, not overridden.
        options = [o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
        options.append(("grpc.max_receive_message_length", size))
        self.grpc = grpc.aio.server(interceptors=[StatusInterceptor(self.rpc_metrics), AuthInterceptor(self.access)],
                                    options=options)
        self.service_names: list[str] = [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                                         reflection.SERVICE_NAME]
        self.port = 0
        self.client_port = 0
        self.health_port = 0
        self._health_only: grpc.aio.Server | None = None
        self._recheck: asyncio.Task | None = None
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)

    def add(self, register: Callable[[Any, grpc.aio.Server], None], servicer: Any, full_name: str) -> None:
        """Register a servicer (`add_XServicer_to_server`) under its full service name."""
        register(servicer, self.grpc)
        self.service_names.append(full_name)

    async def start(self, address: str, client_address: str | None = None, health_address: str | None = None) -> int:
        """Serve on `address` (with TLS: client certificates required) and, if given, on
        `client_address` (with TLS: none asked for, for token clients) and on
        `health_address`: plain text, the health service alone, for Kubernetes' native gRPC
        probes, which speak no TLS. It tells whether the process serves, nothing more."""
        if health_address is not None:
            self._health_only = grpc.aio.server(options=SERVER_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_only)
            self.health_port = self._health_only.add_insecure_port(health_address)
            if self.health_port == 0:
                raise OSError(f"cannot bind the health port to {health_address}")
            await self._health_only.start()
        self.port = self.transport.serve(self.grpc, address)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {address}")
        if client_address is not None:
            self.client_port = self.transport.serve(self.grpc, client_address, client_certificates=False)
            if self.client_port == 0:
                raise OSError(f"cannot bind gRPC client port to {client_address}")
        reflection.enable_server_reflection(self.service_names, self.grpc)
        await self.grpc.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        for name in self.service_names[2:]:  # zeros from the start, past health and reflection
            for reason in REASONS:
                self.access.refused.labels(name, reason)
        if self.access.on:  # revocation reaches open streams (runtime/auth.py)
            self._recheck = asyncio.create_task(self.access.recheck_loop(), name="auth-recheck")
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
        await self.health.enter_graceful_shutdown()
        await self.grpc.stop(grace)
        if self._health_only is not None:
            await self._health_only.stop(0)


async def run_until_signalled(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]]) -> None:
    """Start, wait for SIGTERM or SIGINT, stop. The service's main loop."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    if not follow_parent():
        log.warning("the launcher (pid %s) is gone: not starting", os.environ[PARENT_ENV])
        return
    await start()
    await stopping.wait()
    log.info("signal received: draining")
    await stop()
    log.info("stopped")


# Set by a launcher (`echelon up`, launch/cluster.py) to its own pid: the service stops when
# that process dies, however it dies. The services run in sessions of their own (a Ctrl-C
# reaches the launcher only, which stops them in order), so a launcher killed outright would
# otherwise leave the whole cluster running, unowned.
PARENT_ENV = "ECHELON_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def follow_parent() -> bool:
    """With PARENT_ENV set: have the kernel send SIGTERM (the drain) when the parent dies;
    False if it has died already. Without it, or off Linux, nothing to follow: True."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as e:
        log.warning("cannot follow the launcher's death (%s): stop this process by its pid", e)
        return True
    # The parent may have died between fork and prctl: then we are someone else's child.
    return os.getppid() == int(parent)
