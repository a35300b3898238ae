"""Why an address is not the service it was given as, in words a person can act on.

gRPC's own text names the transport's symptom ("failed to connect to all addresses",
"Expected SETTINGS frame", "Method not found!"); `probe` asks the address what it is
instead: the standard health service (open to any caller, runtime/auth.py) says which
Echelon services a process serves, and a plain TCP probe tells a closed port from one
that speaks HTTP (a Prometheus /metrics port) or TLS. Used by `Client.connect()` and by
every command of the CLI (docs/cli.md, "When a command cannot connect").
"""

from __future__ import annotations

import asyncio
import ssl

import grpc

from echelon.contract.transport import Transport

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING, NOT_SERVING = 1, 2  # grpc.health.v1.HealthCheckResponse.ServingStatus

AGENT = "echelon.v1.PubSub"
MEMBERSHIP = "echelon.v1.Membership"
ROLES = {AGENT: "an agent", MEMBERSHIP: "a membership replica", "echelon.v1.Matcher": "a matcher",
         "echelon.v1.Router": "a router"}
HINTS = {AGENT: "is `echelon up` running? it printed the agents' addresses; `echelon context` shows them",
         MEMBERSHIP: "is `echelon up` running? `echelon context` shows the membership replicas"}
LISTS = {AGENT: " (`echelon context` lists the agents)", MEMBERSHIP: " (`echelon context` lists the replicas)"}


def _request(service: str) -> bytes:
    """A HealthCheckRequest (field 1, the service name), encoded by hand: the client
    needs no grpcio-health-checking."""
    name = service.encode()
    return b"\x0a" + bytes([len(name)]) + name


def _status(reply: bytes) -> int:
    """A HealthCheckResponse's status (field 1, a one-byte varint)."""
    return reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0


async def _check(channel: grpc.aio.Channel, service: str, timeout: float) -> int:
    call = channel.unary_unary(HEALTH_CHECK, request_serializer=None, response_deserializer=None)
    return _status(await call(_request(service), timeout=timeout))


async def probe(address: str, transport: Transport, want: str = AGENT, timeout: float = 5.0,
                channel: grpc.aio.Channel | None = None) -> str | None:
    """None when `address` serves `want`; otherwise why not, as a sentence naming the cause."""
    role = ROLES[want]
    own = channel is None
    channel = channel or transport.dial(address)
    try:
        try:
            status = await _check(channel, want, timeout)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.NOT_FOUND:  # a health service that does not know `want`
                for other, name in ROLES.items():
                    if other != want:
                        try:
                            if await _check(channel, other, timeout) == SERVING:
                                return f"{address} is {name}, not {role}{LISTS.get(want, '')}"
                        except grpc.aio.AioRpcError:
                            pass
                return f"{address} is a gRPC server but not {role} of Echelon"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return f"{address} is a gRPC server without a health service: not {role} of Echelon"
            return await _transport_failure(address, want, e, timeout)
        if status == SERVING:
            return None
        if status == NOT_SERVING:
            return f"{role} at {address} is shutting down"
        return f"{address} answered the health check with status {status}: not a serving {role}"
    finally:
        if own:
            await channel.close()


async def _transport_failure(address: str, want: str, e: grpc.aio.AioRpcError, timeout: float) -> str:
    role, hint = ROLES[want], HINTS.get(want, "")
    details = e.details() or ""
    if "DNS resolution failed" in details or "name resolution" in details.lower():
        return f"cannot resolve the host of {address}"
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer from {address} within {timeout:g}s: no {role.split(' ', 1)[1]} there, or it is stuck"
    host, _, port = address.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout)
    except (OSError, ValueError, asyncio.TimeoutError):
        return f"no {role.split(' ', 1)[1]} at {address} ({hint})" if hint else f"nothing listens at {address}"
    try:
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.read(64), min(timeout, 2.0))
    except (OSError, asyncio.TimeoutError):
        head = b""
    finally:
        writer.close()
    if head.startswith(b"HTTP/"):
        return (f"{address} answers HTTP, not gRPC: a /metrics port? (`echelon up --base-port N` puts each "
                f"process's /metrics 1000 above its gRPC port){LISTS.get(want, '')}")
    lowered = details.lower()
    if not head and await _speaks_tls(host.strip("[]"), int(port), timeout):
        return (f"{address} serves TLS and this client does not: give the cluster's certificate directory with "
                f"--tls-dir (or ECHELON_TLS_DIR; `echelon up --tls` printed it and `echelon context` shows it)")
    if head[:1] == b"\x15" or "ssl" in lowered or "handshake" in lowered or "certificate" in lowered:
        return (f"{address} and this client disagree on TLS: give the cluster's certificate directory with "
                f"--tls-dir (or ECHELON_TLS_DIR), or drop it for a plain-text cluster ({details})")
    return f"{address} is not {role} of Echelon: {details}"


async def _speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Does the port complete a TLS handshake (certificates unchecked: only the protocol is asked)?"""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=context), min(timeout, 2.0))
    except ssl.SSLError as e:  # a TLS server that wants a client certificate may refuse at the end
        return "WRONG_VERSION" not in str(e).upper() and "RECORD" not in str(e).upper()
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True
