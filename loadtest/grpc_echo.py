"""What one gRPC message costs at a low rate, per transport, per placement on the CPUs, or
beside a bare stream: `python -m loadtest.grpc_echo [--compare transport|placement|stack]`.

A grpc.aio `Publish` stream on uvloop with no Echelon code behind it: the client writes one
request and reads its answer every millisecond, so nothing can batch. This is how every hop
of an event at 1,000/s travels. Each pair runs two settings alternating, each in a server
and a client process of its own:

- `transport` (default): gRPC's default transport (the EventEngine) and the one `import
  echelon` picks (echelon.TRANSPORT), since gRPC reads GRPC_EXPERIMENTS once;
- `placement`: echelon's transport with each process's threads free to run on any CPU, each
  process on a CPU of its own, and both on one CPU. A process's event loop and gRPC's poller
  thread take turns under the GIL; placed on one CPU, the poller's wakeup of the loop is a
  switch on that CPU, not a wakeup of another (docs/performance.md, "Where the cores go");
- `stack`: echelon's transport beside the same messages over a bare TCP stream of the same
  event loop (each message its length and its protobuf bytes, no HTTP/2, no poller thread):
  what a message costs Python itself, the floor under any transport written in it.

Per run: the CPU per round trip of the client and of the server, and the round trip beyond
the millisecond's sleep (docs/performance.md, "gRPC's transport").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import echelon

SETTINGS = {"gRPC default": "", "iomgr": echelon.TRANSPORT}
# Placements: the CPUs of the server and of the client (None: any), on echelon's transport.
PLACEMENTS = {"free": (None, None), "a CPU each": (0, 1), "one CPU": (0, 0)}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _server() -> None:
    import grpc

    from echelon.v1 import pubsub_pb2 as ppb
    from echelon.v1 import pubsub_pb2_grpc as pgrpc

    class Echo(pgrpc.PubSubServicer):
        async def Publish(self, requests, context):
            async for r in requests:
                yield ppb.PublishAck(sequence=r.sequence)

    server = grpc.aio.server()
    pgrpc.add_PubSubServicer_to_server(Echo(), server)
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()


async def _client(port: int, server_pid: int, n: int) -> None:
    import grpc

    from echelon.v1 import pubsub_pb2 as ppb
    from echelon.v1 import pubsub_pb2_grpc as pgrpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pgrpc.PubSubStub(channel).Publish()

        async def round_trip(i: int) -> None:
            await call.write(ppb.PublishRequest(sequence=i))
            await call.read()

        await _measure(round_trip, server_pid, n)
        call.cancel()


async def _measure(round_trip, server_pid: int, n: int) -> None:
    """A client's run: 100 round trips to warm up, then `n` a millisecond apart; prints the
    client's and the server's CPU and the round trip beyond the sleep, us per round trip."""
    for i in range(100):
        await round_trip(i)
    c0, s0, t0 = cpu_seconds(os.getpid()), cpu_seconds(server_pid), time.perf_counter()
    for i in range(n):
        await round_trip(i)
        await asyncio.sleep(0.001)
    c1, s1, t1 = cpu_seconds(os.getpid()), cpu_seconds(server_pid), time.perf_counter()
    print(f"{(c1 - c0) / n * 1e6:.1f} {(s1 - s0) / n * 1e6:.1f} {((t1 - t0) / n - 0.001) * 1e6:.1f}", flush=True)


async def _bare_server() -> None:
    """The echo over a bare stream: each message a 4-byte length and its protobuf bytes."""
    from echelon.v1 import pubsub_pb2 as ppb

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big")
                r = ppb.PublishRequest.FromString(await reader.readexactly(size))
                data = ppb.PublishAck(sequence=r.sequence).SerializeToString()
                writer.write(len(data).to_bytes(4, "big") + data)
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


async def _bare_client(port: int, server_pid: int, n: int) -> None:
    from echelon.v1 import pubsub_pb2 as ppb

    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def round_trip(i: int) -> None:
        data = ppb.PublishRequest(sequence=i).SerializeToString()
        writer.write(len(data).to_bytes(4, "big") + data)
        await writer.drain()
        size = int.from_bytes(await reader.readexactly(4), "big")
        ppb.PublishAck.FromString(await reader.readexactly(size))

    await _measure(round_trip, server_pid, n)
    writer.close()


def run(setting: str, n: int, cpus: tuple[int | None, int | None] = (None, None),
        bare: bool = False) -> tuple[float, float, float]:
    """(client us, server us, round trip beyond the sleep us) per round trip."""
    env = {**os.environ, "GRPC_EXPERIMENTS": setting}
    me = [sys.executable, "-m", "loadtest.grpc_echo", *(["--bare"] if bare else [])]
    on = [[] if cpu is None else ["--cpu", str(cpu)] for cpu in cpus]
    server = subprocess.Popen([*me, *on[0], "--serve"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        out = subprocess.run([*me, *on[1], "--client", str(port), str(server.pid), str(n)], env=env, check=True,
                             capture_output=True, text=True, timeout=300).stdout
        client, srv, rtt = map(float, out.split())
        return client, srv, rtt
    finally:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.grpc_echo", description=__doc__)
    ap.add_argument("--pairs", type=int, default=6, help="runs of each setting, alternating")
    ap.add_argument("--round-trips", type=int, default=3000)
    ap.add_argument("--compare", choices=("transport", "placement", "stack"), default="transport")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cpu is not None:  # before gRPC starts its threads: they inherit it
        os.sched_setaffinity(0, {args.cpu})
    from echelon.runtime import loop

    if args.serve:
        return loop.run(_bare_server() if args.bare else _server())
    if args.client:
        return loop.run((_bare_client if args.bare else _client)(*args.client))
    if args.compare == "placement" and not {0, 1} <= os.sched_getaffinity(0):
        ap.error("--compare placement needs CPUs 0 and 1")
    free = (None, None)
    settings = {
        "transport": {k: (v, free, False) for k, v in SETTINGS.items()},
        "placement": {k: (echelon.TRANSPORT, cpus, False) for k, cpus in PLACEMENTS.items()},
        "stack": {"grpc.aio": (echelon.TRANSPORT, free, False), "bare stream": (echelon.TRANSPORT, free, True)},
    }[args.compare]
    runs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in settings}
    load0 = os.getloadavg()[0]
    for _ in range(args.pairs):
        for name, (setting, cpus, bare) in settings.items():
            runs[name].append(run(setting, args.round_trips, cpus, bare))
    print(f"one request and its answer every ms, {args.round_trips} per run, {args.pairs} runs per setting "
          f"alternating; load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    first, *others = settings  # each other setting's gain over the first (medians; above 1: cheaper)
    print(f"{'us per round trip':<28}" + "".join(f"{k:>30}" for k in settings)
          + "".join(f"{f'gain, {k}':>20}" for k in others))
    for i, what in enumerate(("client CPU", "server CPU", "round trip beyond the sleep")):
        cols = {k: [r[i] for r in v] for k, v in runs.items()}
        med = {k: statistics.median(v) for k, v in cols.items()}
        cells = "".join(f"{f'{min(v):.0f}-{max(v):.0f} (median {med[k]:.0f})':>30}" for k, v in cols.items())
        print(f"{what:<28}{cells}" + "".join(f"{med[first] / med[k]:>20.2f}" for k in others))


if __name__ == "__main__":
    main()
