"""Small events side by side: Echelon, nats-server and redis-server pub/sub in one run
on one machine (docs/performance.md, "Small events"). `make bench-events` (about 10 minutes) or
`python -m loadtest.bench_events --quick` (the default suite's structural check).

Per system, selectivity (2%: `Symbol = ...`; 20%: a Price range, which NATS and Redis
filter in the client), publishers (1, 4) and mode (Echelon: `publish_batch()` or
`publish()` per event, at DELIVERED or ACCEPTED), cells at 1k/s, 10k/s and saturation:
published and delivered events/s, p50/p99/p999 delivery latency, CPU s per 1,000 events
of the service processes (/proc/<pid>/stat), bytes on the wire per useful delivery
(tcp_info bytes_sent of every socket of the processes in the run). One load-generator
process (asyncio) runs every publisher and subscriber for all three systems.
Outputs: the table (ratios to NATS), out/bench_events/latency_vs_rate.png and
out/bench_events/bench_events.json; `--profile` adds a py-spy profile of the
publishing agent under saturation. `--base REV` (`make bench-events-base`): Echelon's
cells of this tree against a base revision instead, alternating (versus.py).
"""
