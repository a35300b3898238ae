"""CDM's path for a few events (core/cdm_runs.py `Run.match_small`, no numpy) beside its
numpy path, per batch size, on one index: `python -m loadtest.bench_cdm_small`.

At a low rate events reach a matcher nearly alone, and numpy's fixed cost per call is most
of a lone event's match (docs/performance.md, "Latency under load"). Indexes: bench_events'
2% workload (50 `Symbol = ...` filters), stock subscriptions (loadtest/stock.py) and wide
Price ranges (many candidates per event: where Python per candidate costs more than numpy's
calls). The microseconds per `match_agents` call are the best of REPEAT timings (the least
disturbed by other work on the machine); both paths answer alike (tests/unit/test_cdm.py).
"""

from __future__ import annotations

import argparse
import timeit

from echelon.contract.filters import parse
from echelon.core import cdm
from echelon.core.cdm import CountingIndex, Entry
from loadtest import stock

REPEAT = 15


def _time(index: CountingIndex, events: list[dict], small: int, candidates: int, number: int) -> float:
    saved = cdm.SMALL, cdm.SMALL_CANDIDATES
    cdm.SMALL, cdm.SMALL_CANDIDATES = small, candidates
    try:
        index.match_agents(events)  # builds the runs (and their views) outside the timing
        return min(timeit.repeat(lambda: index.match_agents(events), number=number, repeat=REPEAT)) / number * 1e6
    finally:
        cdm.SMALL, cdm.SMALL_CANDIDATES = saved


def indexes() -> list[tuple[str, CountingIndex, list[dict]]]:
    symbols = [Entry(f"s{i}", f"agent{i % 4}", parse(f'Symbol = "s{i:02d}"')) for i in range(50)]
    wide = [Entry(f"w{i}", f"agent{i % 4}", parse(f"Price between {i % 100} and {i % 100 + 20}")) for i in range(1000)]
    stocks = [Entry(f"k{i}", f"agent{i % 7}", f) for i, f in enumerate(stock.subscriptions(2000, seed=4))]
    return [("2%, 50 Symbol filters", CountingIndex(symbols), [{"Symbol": f"s{j % 50:02d}", "Price": 1.0} for j in range(64)]),
            ("stock, 2,000", CountingIndex(stocks), stock.events(64, seed=5)),
            ("Price ranges, 1,000", CountingIndex(wide), [{"Price": float(j * 7 % 100)} for j in range(64)])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--number", type=int, default=50, help="calls per timing")
    args = ap.parse_args()
    print(f"us per match_agents call, best of {REPEAT}; default path: Python up to {cdm.SMALL} events and "
          f"{cdm.SMALL_CANDIDATES} candidates per run")
    print(f"{'index':24s} {'events':>6s} {'numpy':>8s} {'python':>8s} {'default':>8s} {'numpy/default':>14s}")
    for name, index, events in indexes():
        for n in args.sizes:
            batch = events[:n]
            numpy_us = _time(index, batch, 0, 0, args.number)
            python_us = _time(index, batch, 10**9, 10**9, args.number)
            default_us = _time(index, batch, cdm.SMALL, cdm.SMALL_CANDIDATES, args.number)
            print(f"{name:24s} {n:6d} {numpy_us:8.1f} {python_us:8.1f} {default_us:8.1f} {numpy_us / default_us:14.2f}")


if __name__ == "__main__":
    main()
