"""The stock-quote workload of Meghdoot's evaluation (Gupta et al., section 5.1).

Schema: Date and Symbol strings, Open/High/Low/Close floats in [0, 500], Volume an int in
[0, 310000000]. Subscriptions come from five templates picked with the paper's
probabilities; events are uniform over the domains (the paper's synthetic set) or
skewed like its real set (prices concentrated in 10..30).

Choices the paper leaves open, written down here because they decide how many
subscriptions an event matches (and so the matching benchmark):
- symbols come from a fixed universe of 5,000 distinct 3-5 letter symbols (about the
  number of listed US stocks), shared by subscriptions and events; uniformly random
  3-5 letter strings would almost never be equal, and no symbol template would match;
- prices are in cents (two decimals), volumes whole shares;
- template parameters are uniform over the domain, except the market-wide alert
  {Volume >= P1}: P1 is drawn from the top 1% of the Volume domain, so such an alert
  fires for about 1 event in 200; with P1 uniform over the domain every such
  subscription would match half of all events, and matching would measure only the
  size of its output;
- skewed events: 90% draw Open/Close in [10, 30] with High/Low within $2 of them, 10%
  are uniform; their symbols come from the first 100 of the universe (the real set had
  100 stocks).
"""

from __future__ import annotations

import datetime as dt

import numpy as np

from echelon.contract.filters import Filter, Op, Predicate
from echelon.contract.schema import Attribute, AttrType, Schema

STOCK_SCHEMA = Schema(
    (
        Attribute("Date", AttrType.STRING),
        Attribute("Symbol", AttrType.STRING),
        Attribute("Open", AttrType.FLOAT, 0.0, 500.0),
        Attribute("High", AttrType.FLOAT, 0.0, 500.0),
        Attribute("Low", AttrType.FLOAT, 0.0, 500.0),
        Attribute("Close", AttrType.FLOAT, 0.0, 500.0),
        Attribute("Volume", AttrType.INT, 0, 310_000_000),
    )
)

TEMPLATES = (
    ("{Symbol = P1 and P2 <= Open <= P3}", 0.20),
    ("{Symbol = P1 and Low <= P2}", 0.35),
    ("{Symbol = P1 and High >= P2}", 0.35),
    ("{Symbol = P1 and Volume >= P2}", 0.05),
    ("{Volume >= P1}", 0.05),
)

PRICE_MAX = 500.0
VOLUME_MAX = 310_000_000
N_SYMBOLS = 5000
HOT_SYMBOLS = 100
FIRST_DAY, LAST_DAY = dt.date(1998, 1, 2), dt.date(2002, 12, 31)
_LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz"))


def symbol_universe(n: int = N_SYMBOLS, seed: int = 1998) -> list[str]:
    """`n` distinct symbols of 3-5 lowercase letters, the same for every call."""
    rng = np.random.default_rng(seed)
    seen: dict[str, None] = {}
    while len(seen) < n:
        length = int(rng.integers(3, 6))
        seen.setdefault("".join(_LETTERS[rng.integers(0, 26, length)]), None)
    return list(seen)


SYMBOLS = symbol_universe()


def _price(x: float) -> float:
    return round(float(x), 2)


def subscriptions(n: int, seed: int = 0) -> list[Filter]:
    """`n` subscriptions from the five templates, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(len(TEMPLATES), size=n, p=[p for _, p in TEMPLATES])
    syms = rng.integers(0, len(SYMBOLS), n)
    a, b = rng.uniform(0, PRICE_MAX, n), rng.uniform(0, PRICE_MAX, n)
    vol = rng.integers(0, VOLUME_MAX + 1, n)
    alert = rng.integers(int(VOLUME_MAX * 0.99), VOLUME_MAX + 1, n)
    out = []
    for i in range(n):
        k = int(kinds[i])
        sym = Predicate("Symbol", Op.EQ, SYMBOLS[syms[i]])
        if k == 0:
            lo, hi = sorted((_price(a[i]), _price(b[i])))
            out.append(Filter((sym, Predicate("Open", Op.BETWEEN, lo, hi))))
        elif k == 1:
            out.append(Filter((sym, Predicate("Low", Op.LE, _price(a[i])))))
        elif k == 2:
            out.append(Filter((sym, Predicate("High", Op.GE, _price(a[i])))))
        elif k == 3:
            out.append(Filter((sym, Predicate("Volume", Op.GE, int(vol[i])))))
        else:
            out.append(Filter((Predicate("Volume", Op.GE, int(alert[i])),)))
    return out


def _date(day: int) -> str:
    d = FIRST_DAY + dt.timedelta(days=day)
    return f"{d.day}/{d:%b}/{d:%y}"


def events(n: int, seed: int = 0, skewed: bool = False) -> list[dict]:
    """`n` stock events: uniform over the domains, or skewed (prices mostly in 10..30)."""
    rng = np.random.default_rng(seed)
    days = rng.integers(0, (LAST_DAY - FIRST_DAY).days + 1, n)
    volume = rng.integers(0, VOLUME_MAX + 1, n)
    prices = rng.uniform(0, PRICE_MAX, (n, 4))  # Open, High, Low, Close
    syms = rng.integers(0, len(SYMBOLS), n)
    if skewed:
        syms = rng.integers(0, HOT_SYMBOLS, n)
        hot = rng.random(n) < 0.9
        o, c = rng.uniform(10, 30, n), rng.uniform(10, 30, n)
        spread = rng.uniform(0, 2, (n, 2))
        skew = np.stack([o, np.maximum(o, c) + spread[:, 0], np.maximum(np.minimum(o, c) - spread[:, 1], 0), c], 1)
        prices = np.where(hot[:, None], skew, prices)
    prices = np.round(prices, 2)
    return [
        {
            "Date": _date(int(days[i])),
            "Symbol": SYMBOLS[syms[i]],
            "Open": float(prices[i, 0]),
            "High": float(prices[i, 1]),
            "Low": float(prices[i, 2]),
            "Close": float(prices[i, 3]),
            "Volume": int(volume[i]),
        }
        for i in range(n)
    ]
