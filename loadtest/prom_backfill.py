"""A real Prometheus holding a benchmark's series: samples written as OpenMetrics text,
turned into TSDB blocks by `promtool tsdb create-blocks-from openmetrics` (Prometheus' own
backfill), then served by Debian's `prometheus` on a free loopback port, stopped by its pid.

Used by `make bench-replan` for the routing job's production ingest path (the executors
fetch time shards with query_range, services/echelon/replan/main.py). A data directory is
reused when it already holds the same samples (its `loaded.json` says which), since the
backfill of ten million samples takes minutes and is not what is measured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np

from echelon.observe.prometheus import Prometheus

LABELS = ("member", "topic", "zone", "peer")


def write_openmetrics(table: dict[str, np.ndarray], scrapes: int, base: int, values: Callable, path: Path) -> int:
    """Every series of `table` (as bench_replan.series_table) at times base + t, t < scrapes,
    series after series (each in time order, as the backfill wants), valued
    `values(sid, t)`. Empty labels are left out (Prometheus has no empty label). Returns
    the number of samples."""
    t = np.arange(scrapes, dtype=np.int64)
    stamps = (base + t).tolist()
    n = 0
    with open(path, "w") as f:
        for sid in range(len(table["name"])):
            labels = ",".join(f'{k}="{table[k][sid]}"' for k in LABELS if table[k][sid])
            head = f"{table['name'][sid]}{{{labels}}} "
            v = values(np.full(scrapes, sid, dtype=np.int64), t).astype(np.float64).tolist()
            # A float's str is its shortest exact form: Prometheus reads back the same double.
            f.write("".join([f"{head}{x} {s}\n" for x, s in zip(v, stamps)]))
            n += scrapes
        f.write("# EOF\n")
    return n


def load(root: Path, table: dict[str, np.ndarray], scrapes: int, base: int, values: Callable) -> Path:
    """`root`/data holding the samples (backfilled unless `root` already has these)."""
    key = {"series": len(table["name"]), "scrapes": scrapes, "base": base}
    marker = root / "loaded.json"
    if marker.exists() and json.loads(marker.read_text()) == key:
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    text = root / "samples.om"
    write_openmetrics(table, scrapes, base, values, text)
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(root / "data")],
                       capture_output=True, text=True, timeout=3600)
    text.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"promtool backfill failed ({r.returncode}): {r.stderr[-2000:]}")
    marker.write_text(json.dumps(key))
    return root


def serve(root: Path) -> Prometheus:
    """Prometheus over `root`/data, scraping nothing, keeping old blocks (the samples'
    times are fixed when they are written; a short retention would delete them)."""
    prom = Prometheus([], data_dir=root, retention="100y")
    prom.start(timeout=120)
    return prom
