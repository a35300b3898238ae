"""The run's settings: the schedule's durations, the workload's size, where output goes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KILL_MAYBE_BEFORE = 10.0  # seconds before a kill whose messages a subscription on a wiped disk may miss


@dataclass
class Config:
    minutes: float = 5.0
    agents: int = 6
    producers: int = 3
    # Messages per second per producer: 600/s in all, 10x the 20/s of before batching. The
    # 5-minute netns run at this rate: 180,003 sent, 0 lost, 0 duplicated, 0 reordered.
    rate: float = 200.0
    keys: int = 4
    netem_seconds: float = 30.0
    pause_seconds: float = 3.0
    partition_seconds: float = 10.0
    restart_after: float = 6.0
    settle: float = 12.0
    warmup: float = 8.0
    drain: float = 60.0
    loopback: bool = False  # force loopback even where namespaces work
    skip: tuple[str, ...] = ()  # fault kinds left out of the schedule
    reorder_target: bool = True  # order per key a target (0 reordered); False: measured only
    wipe_disk: bool = False  # a killed agent restarts on an empty data dir (durables.py)
    tls: bool = True  # mTLS between every process and for the clients (runtime/certs.py issues them)
    auth: bool = True  # --auth tokens everywhere; the workload's clients send the admin token (launch/cluster.py)
    intruder: bool | None = None  # the intruder (intruder.py) runs beside the workload; None: with TLS
    rounds: int = 0  # rounds of every fault kind (0: as many as fit in `minutes`)
    overlap: bool = False  # delay/loss in the background of the pause and the kill (schedule.py)
    artifacts: bool = True  # deliveries.jsonl and timeline.png beside the report (seconds on a loaded machine)
    out: Path = Path("out/chaos")
    log: object = print

    @property
    def with_intruder(self) -> bool:
        return self.tls if self.intruder is None else self.intruder

    @classmethod
    def short(cls, **kw) -> "Config":
        """One of each fault, whatever the time they take (a loaded machine restarts
        processes slowly; none is left out), in about a minute on a quiet one: shorter
        phases, and delay/loss during the pause and the kill. `minutes` only bounds it."""
        return cls(**{"minutes": 6.0, "rounds": 1, "overlap": True, "netem_seconds": 6.0, "pause_seconds": 3.0,
                      "partition_seconds": 8.0, "restart_after": 1.5, "settle": 3.0, "warmup": 3.0,
                      "drain": 45.0, "artifacts": False, **kw})
