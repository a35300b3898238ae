"""The services' event loop choice (runtime/loop.py): uvloop by default, asyncio's on request,
and gRPC's asyncio API working on the chosen one (a real server and channel on loopback)."""

import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from echelon.runtime import loop


def test_choice_follows_the_environment(monkeypatch):
    monkeypatch.delenv(loop.ENV, raising=False)
    assert loop.chosen() == "uvloop"  # a server dependency: installed wherever the services are
    monkeypatch.setenv(loop.ENV, "asyncio")
    assert loop.chosen() == "asyncio"
    monkeypatch.setenv(loop.ENV, "UVloop")
    assert loop.chosen() == "uvloop"
    monkeypatch.setenv(loop.ENV, "trio")
    with pytest.raises(ValueError, match="ECHELON_EVENT_LOOP"):
        loop.chosen()


async def _health_round_trip() -> tuple[str, int]:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    finally:
        await server.stop(0)
    return loop.running(), reply.status


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_serves_grpc_on_the_chosen_loop(monkeypatch, name):
    monkeypatch.setenv(loop.ENV, name)
    assert loop.run(_health_round_trip()) == (name, health_pb2.HealthCheckResponse.SERVING)


def test_a_service_process_logs_its_loop(tmp_path):
    """`echelon membership` starts on uvloop and says so in its start line."""
    proc = subprocess.Popen([sys.executable, "-m", "echelon", "membership", "--id", "m0", "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if '"started"' in line:
                assert '"loop": "uvloop"' in line, line
                break
        else:
            pytest.fail("the process ended before it started")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def test_async_tests_run_on_the_loop_conftest_chose():
    """tests/conftest.py: async tests on asyncio's loop, on uvloop when ECHELON_EVENT_LOOP=uvloop."""
    want = "uvloop" if os.environ.get(loop.ENV, "").strip().lower() == "uvloop" else "asyncio"
    assert loop.running() == want
