"""Fault injection against a real cluster, and what the clients saw (docs/guarantees.md):
`python -m loadtest.chaos --minutes 5`.

Topology. The cluster is started by the launcher (`echelon.launch`) with
`loadtest.netns.NetnsPlacement`: each agent in its own network namespace on a bridge
(198.18.K.0/24); the three membership replicas and the matcher in the root namespace on
the bridge address, as is this runner, whose clients reach the agents over the bridge.
Where namespaces cannot be created every process runs on loopback and the faults that
need a network of their own (partition, netem) are not run: the report says which mode
ran.

Workload. `producers` publishers on different agents, each numbering its messages
(producer id, sequence) at `rate` per second over `keys` ordering keys, attributes
chosen so the filters match some; one named, acking subscription on every agent (so
every agent is in the topic's LBDD tree) and a second on some, with varied filters.
A subscriber whose stream breaks reopens the same named subscription on the same agent;
on the killed agent it is kept on disk and restored, so it is owed every acked message
with no window around the kill (report.py; with `--wipe-disk`, a window).

Faults, one at a time, each followed by a settle period, repeated while time remains
(`--short`: one round of each, whatever the time, with delay/loss in the background of
the pause and the kill):
  netem      delay 100 ms +- 50 ms, 5 % loss, both directions of two agents' links (tc
             netem; on a kernel without it, a tc redirect into a userspace delayer)
  pause      SIGSTOP of an inner relay for 3 s, then SIGCONT
  kill       kill -9 of an inner relay of producer 0's tree; restarted (new process,
             new incarnation) after `restart_after`
  partition  every packet to and from one agent dropped (tc filters), then healed
  replica    kill -9 of membership replica 0 (the one every member watches), restarted

Security (docs/security.md). Every process runs with mTLS, certificates from a throw-away CA
(`runtime/certs.py`, through the launcher's `tls`; `--no-tls`: plain text), and with
tokens and per-topic ACLs (`--auth`, runtime/auth.py; `--no-auth`: none); the workload's
clients present the cluster's client certificate (a superuser) and its admin token.
Beside the workload an intruder process (`intruder`) tries every second, with no
certificate, one from another CA, ones from the cluster's CA naming someone else, a user
granted nothing, and on the agents' token port no token or a made-up one, to subscribe,
publish, join, relay and push a plan; the report adds its rows: deliveries 0, writes
accepted 0 (by the calls, and by what the subscriptions, the watched views and the plans
show), attempts made > 0.

Measured. Watch streams on all three replicas time every state change, so a DEAD
verdict's detection time is from the fault to the verdict on each replica. After the
schedule the publishers stop, the subscribers drain, and `loadtest.checker` compares the
acknowledged publishes with every subscription's log. Messages are attributed to the
fault during (or after) which they were sent.

Output (in --out, default out/chaos): report.txt (the tables printed at the end),
report.json, deliveries.jsonl (every message sent and every delivery, for a post-mortem),
timeline.png (delivery latency over the run, fault windows shaded, verdicts marked), and
every process's log in logs/ (the short run inside `make test` writes neither
deliveries.jsonl nor timeline.png: `Config.artifacts`).

Counting: see `loadtest.chaos.report`.

The parts, one job each: `config` (the settings), `network` (the placement, and
delay/loss and partitions on a host's link; `loadtest.delayer` where the kernel has no
netem), `observer` (the replicas' verdicts, timed), `workload` (producers, subscribers,
the drain), `schedule` (the faults and their targets), `report` (counting and the
tables), `intruder` (the intruder process and its rows), `artifacts` (deliveries.jsonl, timeline.png), `runner` (one run, start to
teardown), `__main__` (the command).
"""


from loadtest.chaos.config import Config
from loadtest.chaos.observer import DEAD, Change, Observer
from loadtest.chaos.report import Result, build_report
from loadtest.chaos.runner import run
from loadtest.chaos.schedule import Fault
from loadtest.chaos.workload import Received, Sent

__all__ = ["DEAD", "Change", "Config", "Fault", "Observer", "Received", "Result", "Sent", "build_report", "run"]
