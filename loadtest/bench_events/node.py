"""A publisher in another language: loadtest/node/publish.js (@grpc/grpc-js, protos/ loaded
at start, one event per PublishRequest), driven from the benchmark's loop (`node-*` modes).

The node process writes the requests and reads the acks; Python hands it each send's event
ids and pool entries as one stdin line and learns on stdout when the last one is acked, so
the per-request work on the client side is Node's, not Python's (one line per 256 events).
The payload's send time is Node's `process.hrtime` (CLOCK_MONOTONIC, the clock of
`time.perf_counter_ns` here), so latencies are measured as for the other modes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
SCRIPT = NODE_DIR / "publish.js"


def missing() -> str:
    """Why the Node client cannot run here ('' when it can): `make node-client` installs it."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir() or \
            not (NODE_DIR / "node_modules" / "@grpc" / "proto-loader").is_dir():
        return f"the Node client's packages are not installed (make node-client: npm ci in {NODE_DIR})"
    return ""


def install() -> str:
    """`npm ci` of the pinned packages (package-lock.json) if node and npm exist; '' or why not."""
    if not missing():
        return ""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node or npm is not installed"
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=300)
    return "" if done.returncode == 0 and not missing() else f"npm ci failed: {done.stderr.strip()[-300:]}"


def command(address: str, level: int, coalesce: bool, *extra: str) -> list[str]:
    return ["node", str(SCRIPT), "--address", address, "--level", str(level),
            *(["--coalesce"] if coalesce else []), *extra]


def typed(attributes: dict) -> dict:
    """The SDK's attribute form as proto-loader's Value objects (str, float, int)."""
    kinds = {str: "string_value", float: "float_value", int: "int_value"}
    return {k: {kinds[type(v)]: v if type(v) is not int else str(v)} for k, v in attributes.items()}


class NodePublisher:
    """One publish.js process and its Publish stream: `send(ids_and_pool)` returns once
    every event of it is acked, or raises with the agent's refusal."""

    def __init__(self, address: str, level: int, coalesce: bool, pool: list[dict], topic: str):
        self.address, self.level, self.coalesce, self.topic = address, level, coalesce, topic
        self.pool_file = tempfile.NamedTemporaryFile("w", suffix=".json", prefix="echelon-node-pool-", delete=False)
        json.dump([typed(a) for a in pool], self.pool_file)
        self.pool_file.close()
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None
        self.tags = itertools.count()
        self.waiting: dict[str, asyncio.Future] = {}

    async def start(self, attempts: int = 2) -> None:
        """The process started and its channel connected (its `ready` line). Once, on a
        loaded machine, node died (SIGSEGV) before that line: it is started again then."""
        for attempt in range(attempts):
            with tempfile.TemporaryFile() as err:
                self.proc = await asyncio.create_subprocess_exec(
                    *command(self.address, self.level, self.coalesce, "--stdin", "--pool", self.pool_file.name,
                             "--topic", self.topic),
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
                assert self.proc.stdout is not None
                line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
                if line.strip() == b"ready":
                    self.reader = asyncio.create_task(self._read())
                    return
                code = await self.proc.wait()
                err.seek(0)
                why = f"node publisher did not start ({code}): {line!r} {err.read()[-500:].decode(errors='replace')}"
            print(why, file=sys.stderr, flush=True)
        raise RuntimeError(why)

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            tag, _, rest = line.decode().strip().partition(" ")
            f = self.waiting.pop(tag, None)
            if f is not None and not f.done():
                f.set_result(None) if rest == "ok" else f.set_exception(RuntimeError(f"node publisher: {rest}"))
        for f in self.waiting.values():
            if not f.done():
                f.set_exception(RuntimeError(f"node publisher exited ({await self.proc.wait()})"))
        self.waiting.clear()

    async def send(self, events: list[tuple[int, int]]) -> None:
        """`events`: (event id, pool index) pairs; their payloads are workload.PAYLOAD."""
        if self.proc is None:
            await self.start()
        assert self.proc is not None and self.proc.stdin is not None
        if self.proc.returncode is not None:
            raise RuntimeError(f"node publisher exited ({self.proc.returncode})")
        tag = str(next(self.tags))
        f = self.waiting[tag] = asyncio.get_running_loop().create_future()
        self.proc.stdin.write(f"{tag} {' '.join(f'{i}:{k}' for i, k in events)}\n".encode())
        await f

    async def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
            if self.reader is not None:
                await asyncio.gather(self.reader, return_exceptions=True)
        Path(self.pool_file.name).unlink(missing_ok=True)
