"""gRPC's transport as `import echelon` picks it (echelon/__init__.py, docs/performance.md,
"gRPC's transport"): each case a fresh interpreter, since gRPC reads the setting once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import echelon

SERVICES = str(Path(echelon.__file__).resolve().parent.parent)

# Round trips on a loopback stream, then the CPU gRPC's EventEngine threads used meanwhile
# (clock ticks): their work is what the setting moves onto the poller thread.
CHILD = """
import asyncio, json, os, sys
import echelon
import grpc
from echelon.v1 import pubsub_pb2 as ppb, pubsub_pb2_grpc as pgrpc

class Echo(pgrpc.PubSubServicer):
    async def Publish(self, requests, context):
        async for r in requests:
            yield ppb.PublishAck(sequence=r.sequence)

def engine_ticks():
    ticks = 0
    for t in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{t}/stat") as f:
            stat = f.read()
        if "(event_engine)" in stat:
            fields = stat.rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks

async def main():
    server = grpc.aio.server()
    pgrpc.add_PubSubServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pgrpc.PubSubStub(channel).Publish()
        before = engine_ticks()
        for i in range(int(sys.argv[1])):
            await call.write(ppb.PublishRequest(sequence=i))
            assert (await call.read()).sequence == i
        after = engine_ticks()
        call.cancel()
    await server.stop(None)
    print(json.dumps({"env": os.environ.get("GRPC_EXPERIMENTS"), "ticks": after - before}))

asyncio.run(main())
"""


def _child(env_value: str | None, round_trips: int = 0) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | {"PYTHONPATH": SERVICES}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    out = subprocess.run([sys.executable, "-c", CHILD, str(round_trips)], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_picks_the_transport_and_an_operators_setting_wins():
    # gRPC's default does each message's socket work on its EventEngine threads; the picked
    # transport does it on the poller thread. A gRPC that drops the setting fails here.
    picked, default = _child(None, 1500), _child("", 1500)  # set empty: gRPC's own default
    assert picked["env"] == echelon.TRANSPORT and picked["ticks"] == 0
    assert default["env"] == "" and default["ticks"] > 0
    assert _child("-event_engine_dns")["env"] == "-event_engine_dns"
