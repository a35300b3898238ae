"""Metric rows: one schema for the three sources the routing job reads.

A row is one sample of one series at one time:

    ts (unix seconds), member, name, topic, zone, peer, value

`name` is the sample name (`echelon_link_enqueued_total`), `topic`/`zone`/`peer` its
labels ("" when the family has none). Only the families in FAMILIES are kept, so every
row has one of these label sets and no other label is dropped by accident.

Sources:
- `scrape`: the services' own `/metrics` (their addresses come from the membership view),
  read every `step` seconds for `window` seconds;
- `prometheus`: `query_range` over the window on Prometheus' HTTP API; the member is the
  series' `member` label, else its `instance` looked up among the view's metrics addresses;
- `read_jsonl` / `write_jsonl`: snapshot files written by `echelon metrics dump` (Parquet
  is written and read through Spark, in main.py, with the same columns).

No Spark here: the dump command runs without a JVM.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families

# Every service exports it (no labels): a member with a sample of it in the window was measured.
PRESENCE = "echelon_membership_plan_version"
# name -> the labels the job reads
FAMILIES: dict[str, tuple[str, ...]] = {
    "echelon_matcher_zone_events_total": ("topic", "zone"),
    "echelon_matcher_zone_subscriptions": ("topic", "zone"),
    "echelon_link_queue_length": ("peer",),
    "echelon_link_enqueued_total": ("peer",),
    "echelon_link_dequeued_total": ("peer",),
    "echelon_relay_sent_bytes_total": ("peer",),
    "echelon_peer_rtt_seconds": ("peer",),
    PRESENCE: (),
}
COLUMNS = ("ts", "member", "name", "topic", "zone", "peer", "value")
# Label matchers of a Prometheus selector: `name op "value"`, comma-separated.
MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


class MetricsIncomplete(RuntimeError):
    """The window's metrics miss members the plan is about: deciding on them would treat
    the missing as idle (and clear their hints), so the run fails instead."""


def check_selector(text: str) -> str:
    """`text` if it is a list of label matchers (`namespace="a",pod=~"b-.*"`); else ValueError."""
    rest = text.strip()
    while rest:
        m = MATCHER.match(rest)
        if not m:
            raise ValueError(f"not a label matcher list: {text!r} (e.g. namespace=\"echelon\",pod=~\"echelon-.*\")")
        rest = rest[m.end():]
        if rest and not rest.startswith(","):
            raise ValueError(f"label matchers are separated by commas: {text!r}")
        rest = rest[1:]
    return text.strip()


def missing(present: set[str], required: Iterable[str]) -> list[str]:
    """The required members with no sample in the window."""
    return sorted(set(required) - present)


@dataclass(frozen=True)
class Row:
    ts: float
    member: str
    name: str
    topic: str
    zone: str
    peer: str
    value: float


def parse_exposition(text: str, member: str, ts: float) -> list[Row]:
    """The rows of one `/metrics` body (Prometheus text format) for the kept families."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in FAMILIES:
                out.append(Row(ts, member, s.name, s.labels.get("topic", ""), s.labels.get("zone", ""),
                               s.labels.get("peer", ""), float(s.value)))
    return out


def _get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (cluster-internal http)
        return r.read().decode()


def scrape(endpoints: Mapping[str, str], window: float, step: float, timeout: float = 2.0) -> tuple[list[Row], int]:
    """Scrape `{member: host:port}` every `step` s for `window` s (at least two rounds).

    Returns (rows, failed scrapes): an endpoint that does not answer is counted, not fatal.
    """
    rows: list[Row] = []
    failed = 0
    rounds = max(2, int(window / step) + 1)
    start = time.monotonic()
    for k in range(rounds):
        for member, address in sorted(endpoints.items()):
            try:
                text = _get(f"http://{address}/metrics", timeout)
            except OSError:
                failed += 1
                continue
            rows += parse_exposition(text, member, time.time())
        if k + 1 < rounds:
            time.sleep(max(0.0, start + (k + 1) * step - time.monotonic()))
    return rows, failed


def query(selector: str = "") -> str:
    """The PromQL selector of the kept families, narrowed by `selector` (label matchers
    naming the release: its namespace and pods), so two releases never mix in one input."""
    inner = "__name__=~\"" + "|".join(sorted(FAMILIES)) + "\""
    return "{" + inner + ("," + check_selector(selector) if selector.strip() else "") + "}"


def _api(url: str, path: str, params: dict, timeout: float) -> dict:
    """The `data` of a Prometheus HTTP API answer; RuntimeError with Prometheus' error."""
    try:
        body = json.loads(_get(f"{url.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout))
    except urllib.error.HTTPError as e:  # 400/422: Prometheus says why in a JSON body
        try:
            body = json.loads(e.read().decode())
        except ValueError:
            raise RuntimeError(f"prometheus: HTTP {e.code}") from None
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


def _range_tuples(url: str, window: float, step: float, instances: Mapping[str, str] | None, end: float,
                  timeout: float, selector: str) -> Iterator[tuple]:
    """`query_range` over [end - window, end] as row tuples in COLUMNS order."""
    data = _api(url, "query_range", {"query": query(selector), "start": end - window, "end": end, "step": step},
                timeout)
    for series in data["result"]:
        labels = series["metric"]
        member = labels.get("member") or (instances or {}).get(labels.get("instance", ""), labels.get("instance", ""))
        head = (member, labels["__name__"], labels.get("topic", ""), labels.get("zone", ""), labels.get("peer", ""))
        for ts, value in series["values"]:
            yield (float(ts), *head, float(value))


def prometheus(url: str, window: float, step: float, instances: Mapping[str, str] | None = None,
               end: float | None = None, timeout: float = 10.0, selector: str = "") -> list[Row]:
    """`query_range` for the kept families over [end - window, end] at `step`.

    `instances` maps a scrape address (the `instance` label) to a member id, for series
    without a `member` label. Raises RuntimeError with Prometheus' error on a bad answer.
    """
    end = time.time() if end is None else end
    return [Row(*t) for t in _range_tuples(url, window, step, instances, end, timeout, selector)]


def series_count(url: str, at: float, selector: str = "", timeout: float = 10.0) -> int:
    """How many series of the kept families Prometheus holds at `at` (one instant query)."""
    result = _api(url, "query", {"query": f"count({query(selector)})", "time": at}, timeout)["result"]
    return int(float(result[0]["value"][1])) if result else 0


# Prometheus refuses a query_range of more points than this per series.
MAX_POINTS = 11_000
# Rows one shard brings into one Python worker: its JSON answer is parsed whole, so this
# bounds a task's memory whatever the window and the cluster's size.
SHARD_ROWS = 250_000


def shard_count(points: int, series: int, parallelism: int) -> int:
    """Shards of a window of `points` steps over `series` series: every task busy, no
    shard above SHARD_ROWS rows or MAX_POINTS points (docs/operations.md, "The routing job")."""
    by_rows = -(-points * series // SHARD_ROWS)
    return max(1, min(points, max(parallelism, by_rows, -(-points // MAX_POINTS))))


def shards(start: float, end: float, step: float, n: int) -> list[tuple[float, float]]:
    """[start, end] cut into at most `n` query_range windows on the step grid that
    together hold every sample time start + k*step once (query_range includes both ends)."""
    if step <= 0:
        raise ValueError(f"step {step}: must be positive")
    points = int((end - start) // step) + 1
    n = max(1, min(n, points))
    bounds = [round(points * i / n) for i in range(n + 1)]
    return [(start + bounds[i] * step, start + (bounds[i + 1] - 1) * step) for i in range(n)
            if bounds[i + 1] > bounds[i]]


def prometheus_shard(url: str, shard: tuple[float, float], step: float, instances: Mapping[str, str],
                     selector: str = "", timeout: float = 60.0) -> list[tuple]:
    """One time shard's rows as tuples (what an executor fetches and hands to Spark)."""
    start, end = shard
    return list(_range_tuples(url, end - start, step, instances, end, timeout, selector))


def write_jsonl(rows: Iterable[Row], path: Path) -> int:
    n = 0
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(dict(zip(COLUMNS, astuple(r)))) + "\n")
            n += 1
    return n


def read_jsonl(path: Path) -> Iterator[Row]:
    """Rows of a snapshot; a line that is not a row raises ValueError naming it."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                yield Row(float(d["ts"]), str(d["member"]), str(d["name"]), str(d.get("topic", "")),
                          str(d.get("zone", "")), str(d.get("peer", "")), float(d["value"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{i}: not a metric row ({e})") from None
