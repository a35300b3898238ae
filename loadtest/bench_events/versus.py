"""`--base REV`: Echelon's cells of bench_events, this tree against a base revision, side by
side in one run (docs/performance.md, "Against a base revision").

The base revision's package is unpacked as bench_hotpath does (either layout); each round
runs one child process per tree, alternating (base, head, head, base, base, head...), each
child this tree's driver (`python -m loadtest.bench_events` with the other arguments given)
on that tree's `echelon`: its own cluster, its own SDK. Per cell, the median over rounds of each
tree's published and delivered events/s, p50 and p99 and the services' CPU per 1,000
events, the gain (head/base for a rate, base/head for a latency or a cost: above 1 is
better now) and each round's own gain (the two ran back to back, under about the same
load: a round that met a busy moment shows there).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (column, key in a cell, higher is better)
MEASURES = (("pub/s", "published_per_s", True), ("dlv/s", "delivered_per_s", True), ("p50 ms", "p50_ms", False),
            ("p99 ms", "p99_ms", False), ("cpu ms/1k", "cpu_ms_per_1k", False),
            ("sub cpu/1k", "sub_agents_cpu_ms_per_1k", False), ("B/dlv", "bytes_per_useful_delivery", False))


def without(argv: list[str], *options: str) -> list[str]:
    """`argv` less each of `options` and its value."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(o + "=") for o in options):
            out.append(a)
    return out


def side_by_side(base: str, rounds: int, argv: list[str], base_env: dict[str, str] | None = None) -> str:
    """Run the rounds; the table. `base_env`: variables set on the base side only."""
    from loadtest.bench_hotpath import unpack

    passed = without(argv, "--base", "--rounds", "--out", "--systems", "--base-env")
    runs: dict[str, list[list[dict]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench_events.") as tmp:
        (Path(tmp) / "base").mkdir()
        tree = unpack(base, Path(tmp) / "base")
        # Either tree runs this tree's driver: a folder holding only it comes first on the path
        # (and is the children's cwd, so the cluster's processes find that tree's `echelon`).
        driver = Path(tmp) / "driver"
        driver.mkdir()
        (driver / "loadtest").symlink_to(ROOT / "loadtest")
        paths = {"base": os.pathsep.join((str(driver), str(tree))),
                 "head": os.pathsep.join((str(driver), str(ROOT / "services"), str(ROOT)))}
        for r in range(rounds):
            # base, head, then head, base: a load that rises (or falls) through the run falls on
            # both trees alike instead of always on the second.
            for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
                runs[side].append(_child(passed, paths[side], driver, Path(tmp) / f"{side}-{r}",
                                         env=base_env if side == "base" else None))
            print(f"round {r + 1}/{rounds} done (load average {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", base], capture_output=True,
                         text=True).stdout.strip()
    kept = sum(b is not None and h is not None for b, h in zip(runs["base"], runs["head"]))
    with_env = "".join(f" {k}={v}" for k, v in (base_env or {}).items())
    return report(runs, f"Echelon's cells, median of {kept} of {rounds} alternating rounds; base {base} ({rev}){with_env}, "
                        f"head this tree; load average {os.getloadavg()[0]:.1f} at the end")


def _child(passed: list[str], path: str, driver: Path, out: Path, attempts: int = 2,
           env: dict[str, str] | None = None) -> list[dict] | None:
    """One tree's cells (None: its cluster failed twice, e.g. not up in time on a loaded
    machine; the round then counts for neither tree)."""
    from loadtest.bench_hotpath import tree_env

    for attempt in range(attempts):
        done = subprocess.run([sys.executable, "-m", "loadtest.bench_events", *passed, "--systems", "echelon",
                               "--out", str(out / str(attempt))], env=tree_env(path, **(env or {})),
                              cwd=driver, capture_output=True, text=True, timeout=3600)
        if done.returncode == 0:
            return json.loads((out / str(attempt) / "bench_events.json").read_text())["cells"]
        print(f"a child failed ({'retried' if attempt + 1 < attempts else 'round left out'}):\n"
              f"{done.stderr[-1500:]}", file=sys.stderr, flush=True)
    return None


def _key(c: dict) -> tuple:
    return c["mode"], c["selectivity"], c["publishers"], str(c["rate"])


def _value(c: dict, key: str) -> float | None:
    if key == "cpu_ms_per_1k":
        return 1000 * c["cpu_s_per_1k_services"]
    if key == "sub_agents_cpu_ms_per_1k":  # the subscribing agents: every agent but the publishers' (agent-0)
        return 1000 * sum(v for k, v in c.get("cpu_s_per_1k", {}).items() if k.startswith("agent-") and k != "agent-0")
    return c.get(key)


def report(runs: dict[str, list[list[dict]]], title: str) -> str:
    """Per cell and measure: base and head medians, the gain, and each round's gain."""
    head = f"{'cell':30}" + "".join(f" {name + ' base':>14} {'head':>8} {'gain':>5}" for name, _, _ in MEASURES)
    lines = [title, head, "-" * len(head)]
    per_round: list[str] = []
    whole = [(b, h) for b, h in zip(runs["base"], runs["head"]) if b is not None and h is not None]
    if not whole:
        return f"{title}\nno round where both trees ran"
    for key in [_key(c) for c in whole[0][1]]:
        b_rows = [next((c for c in b if _key(c) == key), None) for b, _ in whole]
        h_rows = [next((c for c in h if _key(c) == key), None) for _, h in whole]
        mode, sel, pubs, rate = key
        row = f"{f'{mode} {sel}% {pubs}p {rate}':30}"
        gains = []
        for name, k, higher in MEASURES:
            pairs = [(_value(b, k), _value(h, k)) for b, h in zip(b_rows, h_rows) if b and h]
            pairs = [(b, h) for b, h in pairs if b and h]  # a cell with nothing delivered has no latency
            if not pairs:
                row += f" {'-':>14} {'-':>8} {'-':>5}"
                continue
            b, h = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
            gain = h / b if higher else b / h
            row += f" {b:14.2f} {h:8.2f} {gain:5.2f}"
            gains.append(f"{name} " + " ".join(f"{(hh / bb if higher else bb / hh):.2f}" for bb, hh in pairs))
        lines.append(row)
        per_round.append(f"{f'{mode} {sel}% {pubs}p {rate}':30} " + "; ".join(gains))
    loads = {side: " ".join(f"{statistics.fmean(v for c in pair[k] for v in c.get('load_average', [0])):.0f}"
                            for pair in whole) for k, side in enumerate(("base", "head"))}
    return "\n".join(lines + ["", "gain per round (base and head back to back)"] + per_round
                     + ["", f"load average per round, the mean over its cells: base {loads['base']}, "
                            f"head {loads['head']}"])
