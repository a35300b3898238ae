"""Run a command again and again: `python -m echelon.launch.every SECONDS -- ARGV...`.

What a periodic auxiliary process (`Cluster.add_aux(..., every=...)`) is: one
long-lived child of the launcher, so it is listed, logged and stopped like every other
process. A run starts `SECONDS` after the previous one started, or when it ends if it
took longer (runs never overlap). SIGTERM ends the current run (SIGTERM, then SIGKILL
after 10 s) and then this loop; each run's exit is one line on stderr.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from echelon.launch.placement import stop_process


def repeat(every: float, argv: list[str], stop: threading.Event, out=sys.stderr) -> int:
    """Run argv every `every` seconds until `stop` is set; the number of runs."""
    runs = 0
    while not stop.is_set():
        runs += 1
        started = time.monotonic()
        proc = subprocess.Popen(argv)
        while proc.poll() is None and not stop.wait(0.1):
            pass
        code = proc.returncode if proc.returncode is not None else stop_process(proc, 10.0)
        print(f"every: run {runs} exited {code} after {time.monotonic() - started:.1f}s", file=out, flush=True)
        stop.wait(max(0.0, started + every - time.monotonic()))
    return runs


def main(args: list[str]) -> None:
    if len(args) < 3 or args[1] != "--":
        sys.exit("usage: python -m echelon.launch.every SECONDS -- ARGV...")
    every = float(args[0])
    if not 0 < every <= 86400:
        sys.exit(f"every: {every} seconds is not in (0, 86400]")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    repeat(every, args[2:], stop)


if __name__ == "__main__":
    main(sys.argv[1:])
