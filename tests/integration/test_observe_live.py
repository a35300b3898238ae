"""Every query we ship, against live data: a real local cluster (processes: two regions
joined by one router each), a real Prometheus scraping it every second with the catalog's
rules, a workload long enough for rates to exist that crosses the regions (published in
region-0, subscribed in both), a plan pushed the way the routing job pushes it (with a
predicted gain) and a refused one, then every panel query of every dashboard, every
dashboard variable, every recording rule and the inputs of every alert through
Prometheus' HTTP API. A query that errors or returns no series fails its own test, named
by dashboard and panel.
"""

from __future__ import annotations

import asyncio
import io
import math
import re
import shutil
import signal
import time
from dataclasses import dataclass

import grpc
import promql_parser
import pytest

from echelon.client import Client, errors
from echelon.launch import Cluster, Loopback
from echelon.observe import catalog
from echelon.observe.prometheus import Prometheus, PrometheusAPI, cluster_targets
from echelon.contract.transport import PLAIN
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from loadtest import steady
from echelon.replan import cluster as job

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus (Debian package prometheus) not installed")

RATE_INTERVAL = "10s"  # what Grafana's $__rate_interval is at a 1 s scrape, with room
GAIN = 0.25  # the predicted gain of the plan the test pushes


@dataclass
class Live:
    api: PrometheusAPI
    cluster: Cluster
    counts: steady.Counts
    victim: str


def wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        time.sleep(0.5)


def selectors(expr) -> list[str]:
    """The vector selectors of a PromQL expression (what must exist for it to mean anything)."""
    if isinstance(expr, str):
        expr = promql_parser.parse(expr)
    if isinstance(expr, promql_parser.VectorSelector):
        return [expr.prettify()]
    out = []
    for name in ("lhs", "rhs", "expr", "vector_selector", "args"):
        child = getattr(expr, name, None)
        for c in child if isinstance(child, list) else [child] if child is not None else []:
            out += selectors(c)
    return out


def queries_of(panel: catalog.Panel) -> list[str]:
    return [catalog.instantiate(q.expr, rate_interval=RATE_INTERVAL) for q in panel.queries]


def all_answer(api: PrometheusAPI) -> bool:
    exprs = [e for _, p in catalog.panels() for e in queries_of(p)]
    exprs += [r.record for r in catalog.RECORDS]
    return all(api.query(e) for e in exprs)


async def refused_requests(agent: str, membership: str) -> None:
    """An unknown topic (an error by gRPC code) and a stale routing plan (a refused plan)."""
    async with Client(agent) as c:
        with pytest.raises(errors.NotFound):
            await c.get_topic("no-such-topic")
    async with PLAIN.dial(membership) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await mgrpc.ControlStub(ch).PushPlan(mpb.RoutingPlan(version=0), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def dead_messages(agent: str) -> None:
    """One delivery of each kind the "Dead messages" panel counts (agent/redelivery.py): past
    its ack deadline, terminated, dead-lettered, and a dead letter that fails (its topic is
    deleted after the open) and is still held."""
    async with Client(agent) as c:
        for topic in ("jobs", "jobs.dead", "gone.dead"):
            await c.create_topic(topic)
        async with c.subscribe("jobs", "", name="workers", ack_deadline=0.2, max_deliveries=2,
                               dead_letter_topic="jobs.dead") as sub, \
                c.subscribe("jobs", "", name="doomed", max_deliveries=1, dead_letter_topic="gone.dead") as doomed:
            await c.delete_topic("gone.dead")
            await asyncio.sleep(1.0)  # the registrations reach the matchers, the deletion the agents
            async with c.publisher() as pub:
                await pub.publish_batch("jobs", [{"n": 1}, {"n": 2}])
            termed = dead = False
            while not (termed and dead):
                m = await sub.next(timeout=30)
                if m.attributes["n"] == 1:
                    await m.term()
                    termed = True
                elif m.redelivery_count:  # back after its deadline: its second delivery, nacked, is its last
                    await m.nack()
                    dead = True
                # else left alone past its deadline
            for m in [await doomed.next(timeout=30) for _ in range(2)]:
                await m.nack()  # past max deliveries, with no topic to go to: held and retried
            await asyncio.sleep(2.0)


def push_gain(membership: str) -> int:
    """A plan with a predicted gain, through the routing job's own push (GetPlan + 1, PushPlan)."""
    return job.push(membership, mpb.RoutingPlan(origin="echelon replan", predicted_gain=GAIN))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    base = tmp_path_factory.mktemp("observe")
    # Five agents over two regions (0, 2, 4 in region-0; 1, 3 in region-1), one router each:
    # four carry the workload, the fifth (in no tree, so no link changes) dies.
    cluster = Cluster(agents=5, matchers=2, memberships=1, regions=2, routers=1, placement=Loopback(0),
                      log_dir=base / "logs")
    asyncio.run(cluster.start())
    prom = Prometheus(cluster_targets([p.as_dict() for p in cluster.processes]), interval=1.0, data_dir=base / "prometheus")
    try:
        prom.start()
        api = prom.client()
        wait(lambda: len(api.query("up == 1")) == len(cluster.processes), 30, "every target scraped")
        agents = cluster.agent_addresses()
        counts = asyncio.run(steady.run(agents[:4], seconds=6.0, rate=40.0, slow=True))
        assert counts.published and counts.received and counts.refused, counts
        membership = cluster.by_role("membership")[0].address
        asyncio.run(refused_requests(agents[0], membership))
        asyncio.run(dead_messages(agents[0]))
        assert push_gain(membership) == 1
        victim = cluster.by_role("agent")[-1]
        cluster.signal(victim.id, signal.SIGKILL)  # a member dies: detection, the DEAD state, the alert
        try:
            wait(lambda: all_answer(api), 60, "every panel answers")
        except TimeoutError:
            pass  # the tests below name what is missing
        yield Live(api, cluster, counts, victim.id)
    finally:
        prom.stop()
        cluster.stop()


PANELS = catalog.panels()


@pytest.mark.parametrize("board,panel", PANELS, ids=[f"{d.title}: {p.title}" for d, p in PANELS])
def test_panel_returns_series(live, board, panel):
    for query, expr in zip(panel.queries, queries_of(panel)):
        result = live.api.query(expr)  # raises PromQLError naming the error
        assert result, f"{board.title} / {panel.title} / {query.legend or expr}: no series for {expr}"


@pytest.mark.parametrize("board", catalog.DASHBOARDS, ids=lambda d: d.uid)
def test_dashboard_variables_have_values(live, board):
    regions = live.api.label_values("region", 'up{job=~"agent|matcher|membership|router"}')
    assert regions == ["local", "region-0", "region-1"]  # the control tier is "local"
    assert steady.TOPIC in live.api.label_values("topic", "echelon_agent_published_total")


@pytest.mark.parametrize("record", catalog.RECORDS, ids=lambda r: r.record)
def test_recording_rule_has_series(live, record):
    assert live.api.query(record.record), f"{record.record}: Prometheus recorded nothing ({record.expr})"


@pytest.mark.parametrize("alert", catalog.ALERTS, ids=lambda a: a.alert)
def test_alert_expression_runs_on_series_that_exist(live, alert):
    live.api.query(alert.expr)  # no error; empty while the alert is inactive
    for sel in selectors(alert.expr):
        if sel in TLS_ONLY:  # this cluster runs without TLS; tests/integration/test_tls.py scrapes it
            continue
        assert live.api.query(sel), f"{alert.alert}: its input {sel} has no series"


TLS_ONLY = {"echelon_tls_certificate_expiry_timestamp_seconds"}


def test_every_target_but_the_killed_one_scrapes_cleanly(live):
    bad = [(t["labels"]["member"], t["lastError"]) for t in live.api.targets()
           if t["labels"]["member"] != live.victim and (t["health"] != "up" or t["lastError"])]
    assert not bad, bad


def test_every_rule_evaluates_without_error(live):
    rules = live.api.rules()
    assert {r["name"] for r in rules} == {r.record for r in catalog.RECORDS} | {a.alert for a in catalog.ALERTS}
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad


def firing(api: PrometheusAPI, name: str) -> list[dict]:
    return [a for a in api.alerts() if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_router_panels_show_the_ilinks_the_workload_crossed(live):
    """Published in region-0 and subscribed in both: region-0's router sends to region-1's."""
    crossing = ("router-0-0", "router-1-0")
    for title in ("Router link bandwidth", "Router link queue length", "Router link congestion element CE"):
        panel = next(p for p in catalog.DATA_PLANE.panels if p.title == title)
        links = {(s["metric"]["member"], s["metric"]["peer"]) for s in live.api.query(queries_of(panel)[0])}
        assert crossing in links, (title, links)
    sent = live.api.query(f'echelon_relay_sent_bytes_total{{member="{crossing[0]}", peer="{crossing[1]}"}}')
    assert float(sent[0]["value"][1]) > 0, sent  # the rate may be 0 by now: the workload is over


def test_the_pushed_plan_shows_its_predicted_gain_and_its_push(live):
    board = catalog.MEMBERSHIP
    gain = next(p for p in board.panels if p.title == "Routing-job predicted gain")
    wait(lambda: [float(s["value"][1]) for s in live.api.query(queries_of(gain)[0])] == [GAIN], 30,
         f"the pushed plan's gain {GAIN} scraped")
    pushes = next(p for p in board.panels if p.title == "Routing-job pushes")
    by_result = {s["metric"]["result"]: float(s["value"][1]) for s in live.api.query(queries_of(pushes)[0])}
    assert by_result["accepted"] > 0 and by_result["stale"] > 0, by_result


def test_a_refused_plan_fires_plan_refused(live):
    alerts = wait(lambda: firing(live.api, "EchelonPlanRefused"), 30, "EchelonPlanRefused firing")
    assert [a["labels"]["result"] for a in alerts] == ["stale"]


def test_a_killed_member_shows_in_detection_latency_and_fires_member_dead(live):
    wait(lambda: firing(live.api, "EchelonMemberDead"), 30, "EchelonMemberDead firing")
    panel = next(p for p in catalog.MEMBERSHIP.panels if p.title == "Detection latency")
    p99 = float(live.api.query(queries_of(panel)[1])[0]["value"][1])
    assert not math.isnan(p99) and 0 < p99 <= 10, p99
    dead = live.api.query('max(echelon_membership_members{job="membership", state="dead"})')
    assert float(dead[0]["value"][1]) == 1


def test_top_shows_every_terminal_panel_with_data(live):
    from rich.console import Console

    from echelon.observe.top import screen

    console = Console(record=True, width=200, file=io.StringIO())
    console.print(screen(live.api))
    text = console.export_text()
    for board in (d for d in catalog.DASHBOARDS if d.terminal):
        for panel in board.panels:
            assert panel.title in text
    assert "no series yet" not in text and "bad_data" not in text and "execution" not in text
    assert "quotes" in text  # the per-topic rows


def test_topology_draws_members_and_measured_links(live, tmp_path):
    from click.testing import CliRunner

    from echelon.cli.observe import topology

    out = tmp_path / "topo.png"
    membership = live.cluster.by_role("membership")[0].address
    result = CliRunner().invoke(topology, ["--prometheus", live.api.url, "--membership", membership,
                                           "--topic", steady.TOPIC, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    members = int(re.search(r"\((\d+) members", result.output).group(1))
    links = int(re.search(r"(\d+) measured links", result.output).group(1))
    assert members == len(live.cluster.processes) and links > 0, result.output
