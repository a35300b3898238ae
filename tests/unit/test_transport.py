"""contract/transport.py: certificate files read again when they change (and a mismatched
pair, as in the middle of a rotation, refused), call_any, and, with real loopback servers, a
channel dialled to a server back on its old port reaching it at once."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.launch import free_port
from echelon.runtime.certs import Authority
from echelon.contract.errors import NotFound, Unavailable
from echelon.contract.transport import TlsDir, Transport, call_any, unavailable


def test_files_follow_the_directory_and_skip_a_mismatched_pair(tmp_path):
    ca = Authority.create()
    d = ca.write(tmp_path / "agent-0", "agent", "agent-0")
    t = Transport(TlsDir(d))
    key1, chain1, _ = t.files()
    assert t.files()[1] is chain1  # unchanged files: not read again
    made = t.generation
    assert not t.stale(made)
    ca.write(d, "agent", "agent-0")
    assert t.stale(made)  # long-lived channels dial again before their next stream
    key2, chain2, _ = t.files()
    assert chain2 != chain1 and key2 != key1
    # A rotation caught half-way: the new key beside the old certificate is not taken.
    (d / "tls.crt").write_bytes(chain1)
    assert t.files()[:2] == (key2, chain2)
    (d / "tls.crt").write_bytes(chain2)
    assert t.files()[:2] == (key2, chain2)


def test_a_client_directory_may_hold_only_the_ca(tmp_path):
    ca = Authority.create()
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    t = Transport(TlsDir(tmp_path, server_name=None))
    assert t.files() == (None, None, ca.pem)
    assert isinstance(t.credentials(), grpc.ChannelCredentials)
    with pytest.raises(ValueError, match="a server needs tls.crt and tls.key"):
        t.server_credentials()


def test_a_directory_without_certificates_fails_at_once(tmp_path):
    with pytest.raises(OSError):
        Transport(TlsDir(tmp_path)).files()


async def test_call_any_moves_on_only_past_unreachable_targets():
    tried = []

    async def call(target):
        tried.append(target)
        if target < 2:
            raise Unavailable(f"{target} down")
        if target == 2:
            raise NotFound("no such topic")
        return target

    with pytest.raises(NotFound):  # a refusal is an answer: 3 is never asked
        await call_any(range(4), call, retry=unavailable)
    assert tried == [0, 1, 2]
    with pytest.raises(Unavailable, match="1 down"):  # every target down: the last error
        await call_any(range(2), call, retry=unavailable)
    assert await call_any([3], call, retry=unavailable) == 3


UNARY = "/transport.Test/Unary"


async def echo_server(port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "transport.Test", {"Unary": grpc.unary_unary_rpc_method_handler(lambda request, _: request)}),))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    await server.start()
    return server


async def answer(channel) -> str:
    try:
        return (await channel.unary_unary(UNARY)(b"ok", timeout=5)).decode()
    except grpc.aio.AioRpcError as e:
        return e.code().name


async def test_a_new_channel_reaches_a_restarted_server_while_a_stale_one_backs_off():
    """A stale channel (a client that outlived the server) keeps its subchannel in backoff.
    With gRPC's default process-wide subchannel pool, a channel dialled after the server
    came back shares that subchannel and fails at once with the old "connection refused":
    a restarted agent refused every new client for up to two minutes."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = await echo_server(port)
    stale = Transport().dial(address)
    shared = grpc.aio.insecure_channel(address)  # the default pool: the control
    try:
        assert [await answer(stale), await answer(shared)] == ["ok", "ok"]
        await server.stop(0)
        await asyncio.sleep(0.2)
        assert [await answer(stale), await answer(shared)] == ["UNAVAILABLE", "UNAVAILABLE"]
        server = await echo_server(port)
        async with Transport().dial(address) as fresh, grpc.aio.insecure_channel(address) as default:
            assert await answer(fresh) == "ok"
            # The scenario is real: gRPC's default pool fails here (if a gRPC release stops
            # sharing backoff, this line says so and the option may go).
            assert await answer(default) == "UNAVAILABLE"
    finally:
        await stale.close()
        await shared.close()
        await server.stop(0)
