"""The hot path's per-event pieces, this tree against a base revision, side by side in
one run (issue 12): `make bench-hotpath` or `python -m loadtest.bench_hotpath --base REV`.

The base revision's `services/` is unpacked (git archive) beside this tree; each round
runs one child process per tree, alternating (base, head, base, head...), and each
child times every piece on identical inputs: microseconds per event, the best of a
few repeats. The table gives per piece the median over the rounds for each tree and
their ratio (base / head: above 1 is faster now). On this shared machine absolute
microseconds drift with the load; the ratio of alternating runs is what to read.

Pieces (the 2% and 20% workload of loadtest.bench_events: `Symbol`, `Price`):
- `deliver`: a subscribing agent's local delivery of one relay frame (dedup, filter
  check over its 17 local subscriptions, offer), for a frame of 170 events and of 1;
- `admit`: the publishing agent's per-event admission (conversion, schema check, dedup
  digest and window, the Event built);
- `match`: a matcher's CDM index, 50 subscriptions, a batch of 256 events;
- `client encode`: the publisher's request of one event.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _events(n: int, seed: int = 3):
    import random

    from loadtest.bench_events.workload import SYMBOLS

    rnd = random.Random(seed)
    return [{"Symbol": rnd.choice(SYMBOLS), "Price": rnd.uniform(0.0, 100.0)} for _ in range(n)]


def _best(fn, per: int, number: int = 20, repeat: int = 5) -> float:
    """Microseconds per event: the best of `repeat` timings of `number` calls of `fn`
    (each handling `per` events)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number / per * 1e6


def _deliver_piece(sel: int, frame: int) -> float:
    import time

    from prometheus_client import CollectorRegistry

    from echelon.agent.delivery import LocalDelivery
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.subscriptions import Subscription
    from echelon.core.dedup import DedupWindow
    from echelon.core.filters import parse
    from echelon.runtime.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb
    from loadtest.bench_events.workload import subscriptions

    subs = {}
    for s in subscriptions(sel, 50):
        if s.index % 3 == 0:  # one subscribing agent's share of the 50
            sub = Subscription(f"a/{s.index}", f"~{s.index}", "bench", parse(s.echelon_filter()), 1 << 30)
            sub.attach(1 << 30)
            subs[sub.name] = sub
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), lambda s: None)
    now = time.time_ns()
    events = [pb.Event.FromString(pb.Event(id=pb.MessageId(producer_id="p", sequence=i + 1), topic="bench",
                                     attributes=attributes_to_pb(a), publish_time_unix_nanos=now).SerializeToString())
              for i, a in enumerate(_events(frame))]
    many = getattr(d, "deliver_many", None)

    def once():
        d.dedup = DedupWindow()
        if many is not None:
            many(events)
        else:
            for e in events:
                d.deliver(e)
        for sub in subs.values():
            sub.backlog.clear()

    return _best(once, frame, number=max(5, 2000 // frame))


def _admit_piece() -> float:
    from types import SimpleNamespace

    from echelon.agent.pubsub import PubSubServicer
    from echelon.agent.topics import Topics
    from echelon.core.schema import parse_attribute
    from echelon.runtime.wire import attributes_to_pb, schema_to_pb
    from echelon.core.schema import Schema
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import pubsub_pb2 as ppb
    from loadtest.bench_events.workload import SCHEMA

    topic = pb.Topic(name="bench", created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))
    node = SimpleNamespace(topics=Topics(lambda: None, None), durables=SimpleNamespace(refuse=lambda t, a: None))
    servicer = PubSubServicer.__new__(PubSubServicer)
    servicer.node = node
    outer = ppb.PublishRequest(batch=[ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a),
                                                         payload=i.to_bytes(16, "little"), sequence=i + 1)
                                      for i, a in enumerate(_events(256))])
    reqs = ppb.PublishRequest.FromString(outer.SerializeToString()).batch  # as parsed off the wire
    from echelon.core.dedup import DedupWindow

    def once():
        servicer.accepted = DedupWindow(capacity=200_000)
        for r in reqs:
            servicer._admit(topic, r, "p", r.sequence, r.payload)

    return _best(once, len(reqs))


def _match_piece(sel: int) -> float:
    from echelon.core.cdm import CountingIndex, Subscription
    from echelon.core.filters import parse
    from loadtest.bench_events.workload import subscriptions

    index = CountingIndex(Subscription(str(s.index), f"agent-{s.index % 3}", parse(s.echelon_filter()))
                          for s in subscriptions(sel, 50))
    events = _events(256)
    return _best(lambda: index.match_agents(events), len(events))


def _encode_piece() -> float:
    from echelon.client.publisher import Publisher

    events = _events(256)
    payload = bytes(16)
    return _best(lambda: [Publisher._requests(None, "bench", a, payload, "") for a in events], len(events))


PIECES = {
    "deliver 2%, frame of 170": lambda: _deliver_piece(2, 170),
    "deliver 20%, frame of 170": lambda: _deliver_piece(20, 170),
    "deliver 2%, frame of 1": lambda: _deliver_piece(2, 1),
    "admit (publishing agent)": _admit_piece,
    "match 2% (matcher CDM)": lambda: _match_piece(2),
    "match 20% (matcher CDM)": lambda: _match_piece(20),
    "client encode (publish)": _encode_piece,
}


def child() -> None:
    out = {}
    for name, piece in PIECES.items():
        try:
            out[name] = piece()
        except Exception as e:  # noqa: BLE001 - a piece the base lacks: reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


def unpack(rev: str, into: Path) -> Path:
    """The base revision's services/ (as the `echelon` package) and loadtest/ under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "services", "loadtest"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "echelon").symlink_to(into / "services")
    return into


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_hotpath", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child()
        return
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench_hotpath.") as tmp:
        base = unpack(args.base, Path(tmp))
        trees = {"base": str(base), "head": str(ROOT)}
        for r in range(args.rounds):
            for tree in ("base", "head"):
                env = {**os.environ, "PYTHONPATH": trees[tree]}
                out = subprocess.run([sys.executable, "-m", "loadtest.bench_hotpath", "--child"], env=env,
                                     cwd=trees[tree], capture_output=True, text=True, timeout=600)
                if out.returncode:
                    raise SystemExit(f"{tree} child failed:\n{out.stderr}")
                runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    print(f"us per event, median of {args.rounds} alternating rounds; base {args.base} ({rev}), head this tree; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'piece':28} {'base us':>9} {'head us':>9} {'base/head':>9}")
    for name in PIECES:
        vals = {t: [r[name] for r in runs[t] if isinstance(r[name], float)] for t in runs}
        if not vals["base"] or not vals["head"]:
            why = runs["base" if not vals["base"] else "head"][0][name]
            print(f"{name:28} {'-':>9} {'-':>9}  ({why})")
            continue
        b, h = statistics.median(vals["base"]), statistics.median(vals["head"])
        print(f"{name:28} {b:9.2f} {h:9.2f} {b / h:9.2f}")


if __name__ == "__main__":
    main()
