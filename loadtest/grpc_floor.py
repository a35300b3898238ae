"""What gRPC alone costs per message here: `python -m loadtest.grpc_floor`.

The ceiling for a client that sends one event per `PublishRequest` (bench_events' raw-stub
publishers, `raw.py`): no agent reads such a stream faster than a grpc.aio server that
does nothing else. A `PubSub.Publish` handler on uvloop (as the agents run), with no
Echelon code behind it, fed by `raw.RawPublisher` in a child process (one event per
request, `--window` events in flight in sends of 256, as bench_events' saturation cells):

- `read`: the handler reads each request and acks them all, in one message, at the end
  of each 256 (what the client waits for); the cost of a read alone;
- `ack each`: one PublishAck per request (the stubs' plain contract);
- `coalesced`: one PublishAck per write, carrying in `acks` every request read while the
  last one was written (`coalesce_acks`, as the agent answers).
- `agent, ack each` and `agent, coalesced`: the agent's own Publish handler (the reader
  taking single-event requests in runs, agent/publish_reader.py, and admission and acks,
  agent/publishing.py) on a stub node whose dispatcher settles each unit at once
  (hotpath_publish.stub_publishing): the agent's per-request cost with no data plane behind.

Per mode: requests/s, and CPU per request of the server process (its event loop and
gRPC's own threads) and of the client. Put an agent's raw-stub figures (bench_events'
`raw-DELIVERED`, `rawc-DELIVERED`; `--floor` there runs this in the same run) beside
these: the difference is what Echelon itself costs per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("read", "ack each", "coalesced", "agent, ack each", "agent, coalesced")
SEND = 256  # requests per send() of the client (bench_events' BATCH)


def _server(mode: str):
    import grpc

    from echelon.v1 import pubsub_pb2 as ppb
    from echelon.v1 import pubsub_pb2_grpc as pgrpc

    if mode.startswith("agent"):
        sys.path.insert(0, str(ROOT / "loadtest"))  # hotpath_publish imports its neighbours so
        from echelon.agent.publish_reader import coalesce
        from hotpath_publish import stub_publishing

        publishing = stub_publishing("t")

    class Floor(pgrpc.PubSubServicer):
        async def Publish(self, request_iterator, context):
            if mode.startswith("agent"):
                async for ack in coalesce(publishing.stream, request_iterator):
                    yield ack
                return
            if mode == "ack each":
                async for req in request_iterator:
                    yield ppb.PublishAck(producer_id=req.producer_id, sequence=req.sequence)
                return
            if mode == "read":
                async for req in request_iterator:
                    if req.sequence % SEND == 0:
                        yield ppb.PublishAck(producer_id=req.producer_id, sequence=req.sequence)
                return
            read: list = []
            wake = asyncio.Event()
            ended = False

            async def reader():
                nonlocal ended
                try:
                    async for req in request_iterator:
                        read.append(req)
                        wake.set()
                finally:
                    ended = True
                    wake.set()
            task = asyncio.create_task(reader())
            try:
                while True:
                    await wake.wait()
                    wake.clear()
                    if read:
                        ack = ppb.PublishAck()
                        for req in read:
                            ack.acks.add(producer_id=req.producer_id, sequence=req.sequence)
                        read.clear()
                        yield ack
                    elif ended:
                        return
            finally:
                task.cancel()

    server = grpc.aio.server()
    pgrpc.add_PubSubServicer_to_server(Floor(), server)
    return server


def client(address: str, n: int, window: int, coalesce: bool) -> None:
    """The child: `n` requests through raw.RawPublisher; prints its rate and CPU."""
    from echelon.runtime import loop
    from loadtest.bench_events.raw import RawPublisher, attributes

    attrs = attributes({"Symbol": "aapl", "Price": 50.0})
    payload = bytes(16)

    async def run() -> dict:
        pub = RawPublisher(address, 1, coalesce)
        await pub.send("t", [(attrs, payload)] * SEND)  # the stream open, the first acks in
        room = asyncio.Semaphore(max(1, window // SEND))

        async def one():
            async with room:
                await pub.send("t", [(attrs, payload)] * SEND)
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(n // SEND)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        await pub.close()
        return {"requests": n // SEND * SEND, "wall": wall, "cpu": cpu}

    print(json.dumps(loop.run(run())))


def client_command(lang: str, address: str, n: int, window: int, coalesce: bool) -> list[str]:
    """The child publishing `n` requests: raw.RawPublisher (python) or loadtest/node/publish.js
    (node: the client written from protos/ in another language, node.py)."""
    if lang == "node":
        from loadtest.bench_events.node import command

        return command(address, 1, coalesce, "--count", str(n), "--window", str(window))
    return [sys.executable, "-m", "loadtest.grpc_floor", "--client", address, "--requests", str(n),
            "--window", str(window), *(["--coalesce"] if coalesce else [])]


async def cell(mode: str, n: int, window: int, lang: str = "python") -> dict:
    from loadtest.bench_events.workload import cpu_seconds

    server = _server(mode)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        cpu0 = cpu_seconds(os.getpid())
        child = await asyncio.create_subprocess_exec(
            *client_command(lang, f"127.0.0.1:{port}", n, window, mode.endswith("coalesced")),
            stdout=subprocess.PIPE, cwd=str(ROOT))
        out, _ = await child.communicate()
        server_cpu = cpu_seconds(os.getpid()) - cpu0
    finally:
        await server.stop(None)
    if child.returncode:
        raise RuntimeError(f"the {lang} client failed ({child.returncode}) against {mode}")
    r = json.loads(out.decode().strip().splitlines()[-1])
    n = r["requests"]
    # The server's CPU over the client's whole life (its start and its warm-up send
    # included, a few ms at most): a slight over-count, never an under-count.
    return {"mode": mode, "client": lang, "requests_per_s": n / r["wall"],
            "server_us_per_request": server_cpu / (n + SEND) * 1e6, "client_us_per_request": r["cpu"] / n * 1e6}


def table(rows: list[dict]) -> str:
    out = [f"{'gRPC alone, one event a request':34} {'requests/s':>10} {'server us/req':>13} {'client us/req':>13}"]
    for r in rows:
        name = r["mode"] if r.get("client", "python") == "python" else f"{r['mode']} ({r['client']} client)"
        out.append(f"{name:34} {r['requests_per_s']:10,.0f} {r['server_us_per_request']:13.1f} "
                   f"{r['client_us_per_request']:13.1f}")
    return "\n".join(out)


def run(requests: int = 40960, window: int = 4096, modes=MODES, langs=("python",)) -> list[dict]:
    from echelon.runtime import loop

    async def all_() -> list[dict]:
        return [await cell(m, requests, window, lang) for lang in langs for m in modes]
    return loop.run(all_())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.grpc_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40960, help="requests per mode")
    ap.add_argument("--window", type=int, default=4096, help="requests in flight")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--clients", nargs="+", default=["python"], choices=("python", "node"),
                    help="the publishing client: raw.RawPublisher, or loadtest/node/publish.js")
    ap.add_argument("--client", default="", help=argparse.SUPPRESS)
    ap.add_argument("--coalesce", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        client(args.client, args.requests, args.window, args.coalesce)
        return
    rows = run(args.requests, args.window, args.modes, args.clients)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(table(rows))


if __name__ == "__main__":
    main()
