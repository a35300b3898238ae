"""The run: a cluster through the launcher on the chosen placement, the observer, the
workload, the schedule, the drain, and the report (also on Ctrl-C everything is torn down)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

from echelon.client import Client
from echelon.launch import Cluster
from loadtest.chaos import durable, intruder
from loadtest.chaos.artifacts import dump, plot
from loadtest.chaos.config import Config
from loadtest.chaos.network import Hosts, make_hosts
from loadtest.chaos.observer import Observer
from loadtest.chaos.report import Result, build_report
from loadtest.chaos.schedule import Schedule, choose_roles
from loadtest.chaos.workload import FILTERS, SCHEMA, TOPIC, Producer, Subscriber, drain, wait_opened

METRICS = ("echelon_agent_destinations_lost_total", "echelon_agent_destinations_parked_total",
           "echelon_agent_destinations_unparked_total", "echelon_agent_rerouted_messages_total",
           "echelon_agent_duplicates_dropped_total", "echelon_agent_redeliveries_total",
           "echelon_agent_backlog_overflows_total")
SERVICE_FLAGS = ["--grace", "1", "--beat-interval", "0.2"]
# A subscription's backlog bound (messages), as NATS's default pending limit. The agents'
# default, 10,000, is 16 s of the unfiltered subscription at 10x (600/s): less than a 10 s
# partition of its agent plus its subscriber's reconnect, so the slow-consumer policy (close
# it, counted) fired where the run measures faults. Overflows are still counted and named.
AGENT_FLAGS = ["--max-backlog", "65536"]


def agent_counters(cluster: Cluster) -> dict[str, float]:
    """METRICS summed over the agents now running (best effort)."""
    out = dict.fromkeys(METRICS, 0.0)
    for p in cluster.by_role("agent"):
        for name, value in p.scrape(METRICS).items():
            out[name] += value
    return out


async def drive(cfg: Config, hosts: Hosts, cluster: Cluster) -> Result:
    log = cfg.log
    observer = Observer(cluster.replicas, cluster.transport)
    tls, token = cluster.client_tls, cluster.admin_token
    spy = None
    producers: list[Producer] = []
    subscribers: list[Subscriber] = []
    durables: list[durable.DurableSubscriber] = []
    tasks: list[asyncio.Task] = []
    try:
        started = time.monotonic()
        log(f"starting {len(cluster.processes)} processes ({hosts.mode}); logs in {cluster.log_dir}")
        await cluster.start()
        observer.start()
        roles = choose_roles(cluster, cfg.producers)
        log(f"roles: {json.dumps({k: v for k, v in roles.items() if k != 'tree'})}")
        agents = {p.id: p for p in cluster.by_role("agent")}
        admin = Client(agents["agent-0"].address, tls=tls, token=token)
        await admin.create_topic(TOPIC, SCHEMA)
        await admin.close()
        n = 0
        for i, a in enumerate(agents.values()):
            for j in range(2 if i % 2 else 1):
                subscribers.append(Subscriber(f"s{i}-{j}", a.id, a.address, FILTERS[n % len(FILTERS)], tls, token))
                n += 1
        durables = durable.subscribers(cluster, roles)
        tasks += [asyncio.create_task(s.run()) for s in [*subscribers, *durables]]
        await wait_opened([*subscribers, *durables], 30.0)
        producers = [Producer(i, agents[a].address, cfg.rate, cfg.keys, tls, token)
                     for i, a in enumerate(roles["producers"])]
        t0 = time.monotonic()
        log(f"publishing from {t0 - started:.0f}s after the start (cluster up, subscriptions open)")
        until = t0 + cfg.minutes * 60
        tasks += [asyncio.create_task(p.run(until)) for p in producers]
        if cfg.with_intruder:
            spy = intruder.launch(cluster, roles["kill"][0], cfg.out, until - time.monotonic())
        await asyncio.sleep(cfg.warmup)
        schedule = Schedule(cfg, cluster, observer, hosts, roles)
        log(f"faults ({', '.join(schedule.plan())}), until +{cfg.minutes * 60:.0f}s:")
        await schedule.run(until - cfg.settle / 2, t0)
        if cfg.rounds:  # its rounds ran: the last one settles, then publishing stops
            await asyncio.sleep(cfg.settle)
            for p in producers:
                p.until = 0.0
        else:
            await asyncio.sleep(max(0.0, until - time.monotonic()))
        log(f"publishing stopped at +{time.monotonic() - t0:.0f}s; draining")
        if spy and cfg.rounds:
            spy.finish()
        counting = asyncio.ensure_future(spy.counts()) if spy else None  # while the subscribers drain
        await asyncio.gather(*(p.close(20.0) for p in producers))
        log(f"publishers flushed at +{time.monotonic() - t0:.0f}s")
        await asyncio.gather(drain(producers, subscribers, schedule.faults, cfg.drain, cfg.wipe_disk),
                             durable.drain(producers, durables, cfg.drain))
        log(f"drained at +{time.monotonic() - t0:.0f}s")
        counts = await counting if counting else None
        metrics = agent_counters(cluster)
        if cfg.artifacts:
            dump(cfg.out / "deliveries.jsonl", producers, subscribers, t0)
            plot(cfg.out / "timeline.png", schedule.faults, observer, producers, subscribers, t0)
        log(f"deliveries and timeline written at +{time.monotonic() - t0:.0f}s")
        result = build_report(cfg, hosts, schedule.faults, observer, producers, subscribers, roles, t0, metrics)
        result.add(*durable.report(producers, durables))
        if spy:
            seen = intruder.evidence([*subscribers, *durables], observer.changes,
                                     await intruder.current_plans(cluster.replicas, cluster.transport))
            result.add(*intruder.report(counts, seen, spy.why_not()))
        return result
    finally:
        if spy:
            spy.stop()
        for s in [*subscribers, *durables]:
            s.stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in producers:
            await p.client.close()
        for s in durables:
            await s.close()
        await observer.stop()


def run(cfg: Config) -> Result:
    """Start the cluster, run the schedule, check, tear everything down (also on Ctrl-C)."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    hosts = make_hosts(cfg.agents, cfg.loopback)
    own = hosts.net is None and threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _exit) if own else None  # netns.Network handles its own
    cluster = None
    try:
        # One router: one region needs none, but with routers a plan's cliques make regions,
        # and the schedule's bad-clique plan must be refused (membership/plans.py).
        cluster = Cluster(agents=cfg.agents, matchers=1, memberships=3, routers=1, placement=hosts.placement,
                          log_dir=cfg.out / "logs", common=SERVICE_FLAGS, extra={"agent": AGENT_FLAGS},
                          tls=cfg.tls, auth=cfg.auth)
        if cfg.with_intruder and cfg.tls and cfg.auth:
            intruder.open_client_ports(cluster)  # the token port the intruder tries too
        result = asyncio.run(drive(cfg, hosts, cluster))
    finally:
        if cluster is not None:  # also when the run was cut short: no process outlives it
            cluster.stop()
        hosts.close()
        if own:
            signal.signal(signal.SIGTERM, old)
    (cfg.out / "report.txt").write_text(result.text + "\n")
    (cfg.out / "report.json").write_text(json.dumps({
        "mode": result.mode, "reason": result.reason, "rows": [r.__dict__ for r in result.rows],
        "totals": result.totals, "targets": {k: {"ok": ok, "value": v} for k, (ok, v) in result.targets.items()},
        "notes": result.notes}, indent=2))
    return result


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)
