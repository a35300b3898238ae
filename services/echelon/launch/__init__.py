"""The one cluster launcher: what `echelon up`, `echelon demo`, the chaos runner
(`loadtest.chaos`) and the bulk experiment (`loadtest.bulk`) start their clusters with.

Where it lives, and why: here, in the package, because the CLI uses it (`echelon up`
must work from an installed wheel, without the repository's `loadtest/`). It is split
by job: `placement` (where a process runs and on which ports: `Loopback` here; the
network-namespace placement, `loadtest.netns.NetnsPlacement`, stays with the namespaces
in loadtest and plugs in through the same `Placement` protocol), `cluster` (plan, start
in waves, wait until ready, list, signal, restart, stop) and `every` (the periodic
runner behind `add_aux(..., every=)`).

    cluster = Cluster(agents=4, matchers=2, placement=Loopback(base_port=0))
    for p in cluster.processes:          # planned before anything starts
        print(p.role, p.id, p.region, p.address, p.metrics)
    cluster.add_aux("prometheus", ["prometheus", "--config.file", cfg], address=web, ready_url=f"http://{web}/-/ready")
    cluster.add_aux("replan", [sys.executable, "-m", "some.job"], every=30)
    router = cluster.plan("router", region="eu")
    await cluster.start()                # membership, matchers and routers, agents, then auxiliaries
    cluster.signal("agent-1", signal.SIGKILL); await cluster.launch(cluster.process("agent-1"))
    cluster.stop()                       # auxiliaries first, membership last
"""

from echelon.launch.cluster import Cluster, Process
from echelon.launch.placement import (METRICS_OFFSET, OFFSETS, Loopback, Placement, Site, free_port, free_ports,
                                      stop_process, stop_processes)

__all__ = ["Cluster", "Process", "Loopback", "Placement", "Site", "OFFSETS", "METRICS_OFFSET", "free_port",
           "free_ports", "stop_process", "stop_processes"]
