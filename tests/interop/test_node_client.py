"""A client in another language, written from `protos/` alone: Node.js with @grpc/grpc-js
and @grpc/proto-loader reading the .proto files at run time (tests/interop/node/client.mjs),
against a real cluster. It is the user the contract is for: no SDK coalescing, no batched
deliveries, one event per request, each delivery acked by id.

What it must see: every matching event exactly once (against a brute-force oracle written
here, not the matcher), DELIVERED acks naming destinations, and precise codes for a filter
that does not parse and for events the topic refuses. Needs node and `npm ci` in
tests/interop/node (`make install` runs it when npm is on the machine); skips otherwise,
saying so."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from pathlib import Path

import grpc
import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = Path(__file__).parent / "node"
SCHEMA = ["Symbol:string:8", "High:float:0:500", "Volume:int", "n:int"]
SYMBOLS = ["aapl", "msft", "goog", "ibm", "orcl"]
FILTER = 'Symbol in ("aapl", "ibm") and High >= 45 and not Volume > 5000 or Symbol = "orcl" and High < 20'

pytestmark = pytest.mark.skipif(
    not shutil.which("node") or not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir(),
    reason="node or tests/interop/node/node_modules absent (`make install` runs npm ci when npm is present)")


def oracle(e: dict) -> bool:
    """The filter above, by hand: what the matcher must agree with."""
    return (e["Symbol"] in ("aapl", "ibm") and e["High"] >= 45 and not e["Volume"] > 5000
            or e["Symbol"] == "orcl" and e["High"] < 20)


def events(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"Symbol": rng.choice(SYMBOLS), "High": round(rng.uniform(0, 100), 2) + 0.25,
             "Volume": rng.randrange(0, 10_000), "n": i} for i in range(count)]


def as_values(e: dict) -> dict:
    """JavaScript has one number type: the Python side says which Value each attribute is."""
    kind = {str: "string_value", float: "float_value", int: "int_value"}
    return {k: {kind[type(v)]: v} for k, v in e.items()}


async def node(**spec) -> dict:
    spec["protos"] = str(ROOT / "protos")
    proc = await asyncio.create_subprocess_exec(
        "node", str(NODE_DIR / "client.mjs"), json.dumps(spec),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-2000:]
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_a_node_client_gets_every_matching_event_once(cluster):
    await cluster.client(0).create_topic("quotes", SCHEMA)
    sent = events(400, seed=7)
    agents = [a.address for a in cluster.agent_nodes]
    # Subscriber and publisher on different agents: the event crosses the data plane.
    got = await node(scenario="roundtrip", subscribe_agent=agents[1], publish_agent=agents[0],
                     topic="quotes", filter=FILTER, credits=8, idle_ms=1500,
                     events=[as_values(e) for e in sent])
    assert [a[:2] for a in got["acks"]] == [[i + 1, 0] for i in range(len(sent))]
    expected = [e["n"] for e in sent if oracle(e)]
    assert 20 < len(expected) < len(sent)  # the filter selects some, not all
    assert all(a[2] >= 1 for a, e in zip(got["acks"], sent) if oracle(e))  # matched: a destination named
    assert sorted(got["received"]) == expected  # each matching event once, no other
    assert got["batched"] == 0  # batching is opt-in: this client never asked


async def test_a_node_client_is_told_why_its_filter_is_refused(cluster):
    await cluster.client(0).create_topic("quotes", SCHEMA)
    got = await node(scenario="bad-filter", subscribe_agent=cluster.agent_nodes[0].address,
                     topic="quotes", filter='Symbol = "aapl" and High >= ' + "(" * 5000)
    codes = {got["status"] and got["status"]["code"], got["inband"] and got["inband"]["code"]} - {None}
    assert grpc.StatusCode.INVALID_ARGUMENT.value[0] in codes, got
    said = (got["status"] or got["inband"]).get("details") or got["inband"]["error"]
    assert len(said) < 400  # an excerpt of the input, not all of it


async def test_a_node_client_gets_a_code_for_each_refused_event(cluster):
    await cluster.client(0).create_topic("quotes", SCHEMA)
    bad = [{"Symbol": {"string_value": "aapl"}, "High": {"string_value": "high"}},  # wrong type
           {"Symbol": {"string_value": "aapl"}, "High": {"float_value": 600.5}},   # out of range
           {"Symbol": {"string_value": "a" * 9}},                                   # too long
           {"Colour": {"string_value": "red"}}]                                     # not in the schema
    good = [as_values(e) for e in events(2, seed=1)]
    got = await node(scenario="bad-publish", publish_agent=cluster.agent_nodes[0].address,
                     topic="quotes", events=bad + good)
    codes = {seq: code for seq, code, _, _ in got["acks"]}
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert codes == {1: invalid, 2: invalid, 3: invalid, 4: invalid, 5: 0, 6: 0}, got
