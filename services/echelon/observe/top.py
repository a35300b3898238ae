"""`echelon top`: the terminal dashboards (Overview and Data plane) live from Prometheus.

The panels and their PromQL are the catalog's, with Grafana's variables filled as
Grafana would fill them; each series shows its current value (in the panel's unit) and
a sparkline of the last minutes (a range query).
"""

from __future__ import annotations

import math
import re
import time

from rich.columns import Columns
from rich.console import Group
from rich.panel import Panel as Box
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from echelon.observe import catalog
from echelon.observe.prometheus import PrometheusAPI, PromQLError

BARS = "▁▂▃▄▅▆▇█"
MAX_SERIES = 8  # per query, the largest first: a panel stays readable
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def _scaled(v: float, steps: tuple[tuple[float, str], ...], suffix: str) -> str:
    for factor, prefix in steps:
        if abs(v) >= factor:
            return f"{v / factor:.3g} {prefix}{suffix}".rstrip()
    return f"{v:.3g} {suffix}".rstrip()


SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
BYTES = ((1 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki"))


def fmt(value: float, unit: str) -> str:
    """A value in a Grafana unit, as a person reads it."""
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if unit == "ops":
        return _scaled(value, SI, "/s")
    if unit == "Bps":
        return _scaled(value, BYTES, "B/s")
    if unit == "s":
        if value == 0:
            return "0 s"
        for factor, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= factor:
                return f"{value / factor:.3g} {name}"
        return f"{value * 1e9:.3g} ns"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    return _scaled(value, SI, "") if unit == "short" else f"{value:.4g}"


def sparkline(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    return "".join(BARS[int((v - low) / span * (len(BARS) - 1))] if math.isfinite(v) else " " for v in values)


def panel_view(api: PrometheusAPI, panel: catalog.Panel, variables: dict[str, str], window: float,
               now: float) -> Box:
    table = Table.grid(padding=(0, 1))
    table.add_column(overflow="ellipsis", no_wrap=True, ratio=3)
    table.add_column(justify="right", no_wrap=True)
    table.add_column(no_wrap=True)
    rows = 0
    for query in panel.queries:
        expr = catalog.instantiate(query.expr, **variables)
        try:
            series = api.query(expr)
            history = {_key(s["metric"]): [float(v) for _, v in s["values"]]
                       for s in api.query_range(expr, now - window, now, window / 30)}
        except PromQLError as e:
            table.add_row(Text(str(e), style="red"), "", "")
            rows += 1
            continue
        series.sort(key=lambda s: -_sortable(float(s["value"][1])))
        for s in series[:MAX_SERIES]:
            value = float(s["value"][1])
            table.add_row(legend(query.legend, s["metric"]), fmt(value, query.unit or panel.unit),
                          Text(sparkline(history.get(_key(s["metric"]), [])), style="cyan"))
            rows += 1
    if not rows:
        table.add_row(Text("no series yet", style="dim"), "", "")
    return Box(table, title=panel.title, title_align="left", border_style="blue" if rows else "dim", expand=True)


def _key(labels: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _sortable(v: float) -> float:
    return v if math.isfinite(v) else (math.inf if v > 0 else -math.inf) if not math.isnan(v) else -math.inf


def screen(api: PrometheusAPI, dashboards=None, topic: str = ".*", region: str = ".*", window: float = 300.0,
           rate_interval: str = "1m") -> Group:
    """One frame: every panel of the terminal dashboards, two to a row."""
    now = time.time()
    variables = {"topic": topic, "region": region, "rate_interval": rate_interval}
    parts = [Text(f"echelon top · {api.url} · {time.strftime('%H:%M:%S')} · topic {topic} · region {region}",
                  style="bold")]
    for d in dashboards or [d for d in catalog.DASHBOARDS if d.terminal]:
        parts.append(Rule(d.title, style="magenta"))
        parts.append(Columns([panel_view(api, p, variables, window, now) for p in d.panels], equal=True,
                             expand=True, width=76))
    return Group(*parts)
