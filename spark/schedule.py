"""`echelon up --replan-every 60s`: the routing job as a periodic child process of the local
cluster, so the loop runs on the embedded default as it would on Kubernetes (a CronJob).

Each round runs `python -m spark` (its own JVM, so the cluster's supervisor never holds
Spark) against the cluster's membership, scraping /metrics for half the interval (at
most 30 s); the full output goes to replan.log in the log directory and one progress
line to the console. A round still running when the next is due is waited for, never
doubled; on stop the child gets SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Callable


def summary(output: str, code: int) -> str:
    """The line worth showing from one run's output."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    for key in ("REFUSED", "pushed plan", "nothing to push", "dry run", "replan failed", "layout change"):
        for ln in reversed(lines):
            if key in ln:
                return ln.strip()
    return f"exit {code}: " + (lines[-1].strip() if lines else "no output")


async def replan_every(interval: float, membership: str, log: Path, stop: asyncio.Event,
                       say: Callable[[str], None]) -> None:
    window = f"{min(30.0, max(2.0, interval / 2)):.0f}s"
    cmd = [sys.executable, "-m", "spark", "--membership", membership, "--window", window]
    k = 0
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval)
            return
        except asyncio.TimeoutError:
            pass
        k += 1
        say(f"replan #{k}: running (metrics window {window})")
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        waiter = asyncio.create_task(proc.communicate())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            proc.terminate()
            await waiter
            return
        stopper.cancel()
        out = waiter.result()[0].decode(errors="replace")
        with open(log, "a") as f:
            f.write(f"--- replan #{k} at {time.strftime('%H:%M:%S')} exit {proc.returncode}\n{out}\n")
        say(f"replan #{k} ({time.monotonic() - start:.0f}s): {summary(out, proc.returncode)}")
