"""Waiting for background daemons a run started (a standalone Spark cluster, a Kubernetes
API server): poll until they answer, and fail with the tail of their logs when one exits
or time runs out, so a run that cannot start says why."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable


def wait_ready(ready: Callable[[], bool], timeout: float, what: str, procs: Iterable[subprocess.Popen],
               logs: Iterable[Path], interval: float = 0.5, tail: int = 2000) -> None:
    """`ready()` true within `timeout` seconds (an OSError from it counts as not yet), else
    RuntimeError naming `what`, with the last `tail` characters of every log."""
    procs = list(procs)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except OSError:
            pass
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(interval)
    text = "\n".join(f"--- {p.name}\n{p.read_text()[-tail:]}" for p in sorted(logs))
    raise RuntimeError(f"{what} not ready\n{text}")
