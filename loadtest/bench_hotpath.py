"""The hot path's per-event pieces, this tree against a base revision, side by side in
one run (docs/performance.md): `make bench-hotpath` or `python -m loadtest.bench_hotpath --base REV`.

The base revision's `services/echelon/` is unpacked (git archive) beside this tree; each round
runs one child process per tree, alternating (base, head, base, head...), and each
child times every piece on identical inputs: microseconds per event, the best of a
few repeats in CPU time. The table gives per piece the median over the rounds for each
tree and the gain (base/head for a cost, head/base for a rate: above 1 is better now).
On this shared machine absolute figures drift with the load; the ratio of alternating
runs is what to read.

The pieces are listed in hotpath_pieces.py (with hotpath_publish.py, hotpath_subscribe.py,
hotpath_inputs.py), the whole-cluster modes in hotpath_cluster.py.
`--cluster SECONDS` runs whole clusters instead (saturation and 1k/s: events/s, latency,
CPU per 1,000 events per service), `--idle SECONDS` clusters doing nothing (CPU ms per
second per tier), and `--base-env NAME=VALUE` sets a variable on the base side only: with
`--base HEAD`, one setting of one tree side by side (e.g. `ECHELON_EVENT_LOOP=asyncio`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(cluster: float, selectivity: int = 2, idle: float = 0.0, publishers: int = 1, only: str = "") -> None:
    # This file runs as a script: its directory is first on sys.path, so the pieces are
    # this tree's code driving the `echelon` package on PYTHONPATH (either tree's).
    from hotpath_cluster import _cluster, _idle
    from hotpath_pieces import PIECES

    if idle:
        import asyncio

        print(json.dumps(asyncio.run(_idle(idle))))
        return
    if cluster:
        try:
            from echelon.runtime.loop import run  # the load generator on the services' loop
        except ImportError:  # a base tree from before runtime/loop.py
            from asyncio import run
        print(json.dumps(run(_cluster(cluster, selectivity, publishers))))
        return
    out = {}
    for name, piece in PIECES.items():
        if only and only not in name:
            continue
        try:
            out[name] = piece()
        except Exception as e:  # noqa: BLE001 - a piece the base lacks: reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


def tree_env(path: str, **extra: str) -> dict[str, str]:
    """The environment of a child that runs one tree: that tree on PYTHONPATH, and gRPC's
    transport as that tree picks it. A parent that imported `echelon` holds its own tree's
    default in GRPC_EXPERIMENTS (echelon/__init__.py), which a base tree would otherwise
    inherit; one set before the parent started stays."""
    env = {**os.environ, "PYTHONPATH": path}
    picked = getattr(sys.modules.get("echelon"), "TRANSPORT", None)
    if picked is not None and env.get("GRPC_EXPERIMENTS") == picked:
        del env["GRPC_EXPERIMENTS"]
    return {**env, **extra}


def unpack(rev: str, into: Path) -> Path:
    """The base revision's `echelon` package and loadtest/ under `into`: services/echelon/, or
    services/ itself in revisions from before the src-style root."""
    # spark/: a revision whose `echelon` command imports the routing job's commands from it.
    spark = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:spark"], capture_output=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "services", "loadtest",
                              *(["spark"] if spark.returncode == 0 else [])],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    package = into / "services" / "echelon"
    (into / "echelon").symlink_to(package if package.is_dir() else into / "services")
    _alias_contract(into / "echelon")
    return into


# Where the contract's modules were before echelon/contract/ (docs/architecture.md, "One contract").
FORMERLY = {"schema": "core", "filters": "core", "filter_text": "core", "errors": "runtime", "wire": "runtime",
            "transport": "runtime", "bearer": "runtime"}


def _alias_contract(package: Path) -> None:
    """In a base tree from before echelon/contract/, `echelon.contract.X` made another name
    for the module it was then, so this tree's pieces import either tree alike."""
    contract = package / "contract"
    if contract.exists():
        return
    contract.mkdir()
    (contract / "__init__.py").write_text("")
    for name, was in FORMERLY.items():
        (contract / f"{name}.py").write_text(f"import sys\nimport echelon.{was}.{name} as _m\n\n"
                                             f"sys.modules[__name__] = _m\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_hotpath", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cluster", type=float, default=0.0, metavar="SECONDS",
                    help="instead of the pieces: a whole cluster per tree and round (saturation and 1k/s "
                         "cells of SECONDS each, 1 publisher): events/s, latency, CPU per service")
    ap.add_argument("--selectivity", type=int, choices=(2, 20), default=2,
                    help="the cluster's workload: 2%% or 20%% of the events match each subscription")
    ap.add_argument("--publishers", type=int, default=1, metavar="N",
                    help="with --cluster: a third cell, saturation with N publishers on the one agent")
    ap.add_argument("--idle", type=float, default=0.0, metavar="SECONDS",
                    help="instead: a whole cluster per tree and round doing nothing, CPU ms per second per tier")
    ap.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the base side's environment (its cluster's processes inherit it): with "
                         "--base HEAD, one setting side by side, e.g. ECHELON_EVENT_LOOP=asyncio")
    ap.add_argument("--only", default="", metavar="TEXT", help="the pieces whose name contains TEXT")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if any("=" not in e for e in args.base_env):
        ap.error("--base-env takes NAME=VALUE")
    if args.child:
        child(args.cluster, args.selectivity, args.idle, args.publishers, args.only)
        return
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench_hotpath.") as tmp:
        base = unpack(args.base, Path(tmp))
        trees = {"base": str(base), "head": str(ROOT)}
        # The head's package root is services/ (the base's `echelon` is a link beside its loadtest/):
        # without it on the path the venv's installed `echelon` (another tree) would be measured.
        paths = {"base": str(base), "head": os.pathsep.join((str(ROOT / "services"), str(ROOT)))}
        for r in range(args.rounds):
            for tree in ("base", "head"):
                env = tree_env(paths[tree], **(dict(e.split("=", 1) for e in args.base_env) if tree == "base" else {}))
                # This file runs as a script in either tree: `echelon` and `loadtest` are that tree's.
                out = subprocess.run([sys.executable, __file__, "--child", "--cluster", str(args.cluster),
                                      "--selectivity", str(args.selectivity), "--publishers", str(args.publishers),
                                      *(["--idle", str(args.idle)] if args.idle else []),
                                      *(["--only", args.only] if args.only else [])], env=env,
                                     cwd=trees[tree], capture_output=True, text=True, timeout=900)
                if out.returncode:
                    raise SystemExit(f"{tree} child failed:\n{out.stderr}")
                runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    print(f"{f'{args.selectivity}% selectivity, ' if args.cluster else ''}"
          f"{'' if args.cluster or args.idle else 'us per event, '}median of {args.rounds} "
          f"alternating rounds; base {args.base} ({rev})"
          f"{' with ' + ' '.join(args.base_env) if args.base_env else ''}, head this tree; "
          f"load average {os.getloadavg()[0]:.1f}")
    unit = "" if args.cluster or args.idle else " us"
    print(f"{'piece':38} {'base' + unit:>9} {'head' + unit:>9} {'gain':>9}   gain per round")
    for name in runs["head"][0]:
        vals = {t: [r[name] for r in runs[t] if isinstance(r.get(name), float)] for t in runs}
        if not vals["base"] or not vals["head"]:
            why = runs["base" if not vals["base"] else "head"][0].get(name, "not measured by that tree")
            print(f"{name:38} {'-':>9} {'-':>9}  ({why})")
            continue
        b, h = statistics.median(vals["base"]), statistics.median(vals["head"])
        # Each round's own ratio too: base and head ran back to back, under about the same load.
        pairs = sorted((hh / bb if name.endswith("/s") else bb / hh) for bb, hh in zip(vals["base"], vals["head"]))
        print(f"{name:38} {b:9.2f} {h:9.2f} {(h / b if name.endswith('/s') else b / h):9.2f}"
              f"   {' '.join(f'{p:.2f}' for p in pairs)}")


if __name__ == "__main__":
    main()
