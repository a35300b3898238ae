# Echelon — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SYSTEM := $(VENV)/.system
NODE   := tests/interop/node/node_modules/.package-lock.json
NODE_LOAD := loadtest/node/node_modules/.package-lock.json

.PHONY: install proto dashboards docs-diagram demo up test test-slow chaos abuse kube-check bench bench-replan bench-events bench-events-base bench-hotpath bench-lowrate trace-hops bench-durable bench-overload bench-tls bench-auth replan-loop bulk-scale clean

$(STAMP): pyproject.toml setup.py services/echelon/runtime/_fill.c
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) on PATH"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[server,dev,spark]'
	touch $(STAMP)

# Machine packages the tests use: promtool/prometheus (metrics), iproute2 (namespaces),
# nats-server and redis-server (the peers of the small-event benchmark).
# Installed with apt when we are root and they are missing; otherwise those tests skip.
$(SYSTEM): | $(STAMP)
	@if ! command -v promtool >/dev/null || ! command -v ip >/dev/null || ! command -v tc >/dev/null \
	    || ! command -v nats-server >/dev/null || ! command -v redis-server >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus iproute2 \
	      nats-server redis-server >/dev/null; \
	  else echo "note: promtool/iproute2/nats-server/redis-server missing and not root: their tests will skip"; fi; \
	fi
	touch $(SYSTEM)

# The Node.js client written from protos/ alone (tests/interop): its two npm packages.
$(NODE): tests/interop/node/package-lock.json
	@if command -v npm >/dev/null; then npm ci -s --no-audit --no-fund --prefix tests/interop/node; \
	else echo "note: npm missing: the other-language client test will skip"; fi

# The benchmark's Node publisher (loadtest/node, bench-events' node-* modes; tests/interop).
$(NODE_LOAD): loadtest/node/package-lock.json
	@if command -v npm >/dev/null; then npm ci -s --no-audit --no-fund --prefix loadtest/node; \
	else echo "note: npm missing: bench-events runs without its node-* modes, their test skips"; fi

install: $(STAMP) $(SYSTEM) $(NODE) $(NODE_LOAD)

proto: $(STAMP)
	$(PY) -m echelon.tools.genproto

# Grafana dashboards and Prometheus rules from services/echelon/observe/catalog.py (a test checks they are fresh).
dashboards: $(STAMP)
	$(PY) -m echelon.observe.generate

# The layers picture in docs/ (docs/architecture.md, the README): the layer rules of
# services/echelon/tools/layers.py and the imports of the code today.
docs-diagram: $(STAMP)
	$(PY) -m echelon.tools.diagram

demo: $(STAMP)
	$(VENV)/bin/echelon demo

up: $(STAMP)
	$(VENV)/bin/echelon up --agents 4 --matchers 2

test: $(STAMP) $(SYSTEM) $(NODE) $(NODE_LOAD)
	$(PY) -m pytest -q --durations=30

chaos: $(STAMP) $(SYSTEM)
	$(PY) -m pytest -q -m chaos tests/chaos

# The property and simulation tests at their full counts: `make test` runs each with fewer
# examples or a shorter simulated time (the packaging test, from PyPI, runs in CI on its own);
# and the durable crash at every case of every step (`make test` runs one case per step).
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow tests/unit --ignore=tests/unit/test_client_packaging.py
	$(PY) -m pytest -q -m slow tests/integration/test_durable_crash.py

# The chart on a real kube-apiserver (shared/kube-kit builds it, about 10 minutes): every
# ci/*-values.yaml scenario installed into a namespace enforcing PodSecurity restricted,
# the pods its controllers create, upgrade, uninstall. KUBE_BIN: kube-kit's bin directory;
# CRDs from $$KUBE_KIT/crds (tests/kube/crds.sh). Skips, saying why, without the binaries.
KUBE_BIN ?= $(HOME)/.cache/echelon-kube/bin
kube-check: $(STAMP)
	$(PY) -m tests.kube.kube_check --bin $(KUBE_BIN)

# Hostile clients against a cluster with --auth and one with --auth --tls, beside honest
# ones (a few minutes): the table of attacks, statuses, state changed, the victim agent's
# RSS and CPU, honest p99 before and during, false DEAD verdicts (docs/security.md).
abuse: $(STAMP)
	$(PY) -m loadtest.abuse --out out/abuse
	$(PY) -m loadtest.abuse --tls --out out/abuse-tls

# Benchmarks print tables of ratios measured side by side in one run, and write plots.
bench: $(STAMP)
	$(PY) -m loadtest.bench_match --out out/bench_match
	$(PY) -m loadtest.lbdd_sim --out out/lbdd

# The routing job on 1M and 10M metric rows: pandas, Spark local[2] from Parquet and from a
# real Prometheus (the production path: executors fetch time shards), and both on a standalone
# master + 2 workers started from the pyspark wheel; ratios side by side (docs/performance.md).
# `make bench-replan BENCH_ARGS=--quick`: 1M rows only. And the control loop measured on 4
# matcher processes with 150k subscriptions (a table and out/replan_loop/*.png).
bench-replan: $(STAMP) $(SYSTEM)
	$(PY) -m loadtest.bench_replan --out out/bench_replan $(BENCH_ARGS)

# Small events, Echelon beside nats-server and redis-server in one run (about 10 minutes on a
# quiet machine): the table of ratios to NATS, the small-event targets MET / NOT MET
# (docs/performance.md), CPU per service, out/bench_events/{latency_vs_rate.png,bench_events.json},
# and a py-spy profile of the publishing agent under saturation. `make bench-events BENCH_ARGS=--short`: the cells the
# targets are read from (DELIVERED), 2 s each, in about half the time.
bench-events: $(STAMP) $(SYSTEM) $(NODE_LOAD)
	$(PY) -m loadtest.bench_events --out out/bench_events --profile $(BENCH_ARGS)

# Echelon's cells of bench-events, this tree against BASE (default main), alternating rounds
# of a run per tree (loadtest/bench_events/versus.py). By default the quick version, usable on
# a loaded machine (about 15 minutes): DELIVERED, 2% selectivity, 1 publisher, 2 s cells, 4
# rounds (each tree first in half of them); `VERSUS_ARGS=--rounds 4` for every cell of the grid.
VERSUS_ARGS ?= --short --modes batch-DELIVERED single-DELIVERED --selectivity 2 --publishers 1 --rounds 4
bench-events-base: $(STAMP)
	$(PY) -m loadtest.bench_events --base $(BASE) $(VERSUS_ARGS)

# The hot path's per-event pieces, then whole clusters, then idle clusters, this tree against
# BASE (default main), alternating in one run (a few minutes each): microseconds per event,
# CPU per service, CPU per second of a cluster doing nothing.
BASE ?= main
bench-hotpath: $(STAMP)
	$(PY) -m loadtest.bench_hotpath --base $(BASE)
	$(PY) -m loadtest.bench_hotpath --base $(BASE) --cluster 3
	$(PY) -m loadtest.bench_hotpath --base $(BASE) --idle 10

# One event's latency hop by hop (publisher, agent, matcher, relay, subscriber) at 50/s and
# 1,000/s on the bench cluster, and the GC passes in each process (about a minute).
trace-hops: $(STAMP)
	$(PY) -m loadtest.trace_hops

# Every 1,000/s cell of bench-events, this tree against BASE on whole clusters, alternating
# (about 2 minutes a round): p50/p99, stream messages per event, CPU per 1,000 events.
bench-lowrate: $(STAMP)
	$(PY) -m loadtest.bench_lowrate --base $(BASE)

# Durable vs ephemeral subscriptions, throughput and p99 side by side, per fsync policy
# (a cluster of processes per policy, a few minutes): a table and out/bench_durable/*.png.
bench-durable: $(STAMP)
	$(PY) -m loadtest.bench_durable --out out/bench_durable

# Overload (about 75 s): two publishers offering more than four subscribers of each kind
# take; offered/accepted/delivered rates, publisher stall, peak RSS per member, lost per
# subscription kind (loadtest/bench_overload.py; `BENCH_ARGS=--short` in a few seconds).
bench-overload: $(STAMP)
	$(PY) -m loadtest.bench_overload --out out/bench_overload $(BENCH_ARGS)

# What mTLS costs: the same cluster with TLS off and on, cells alternating, in one run (a few
# minutes): throughput and p50/p99 side by side, on/off ratios, out/bench_tls/bench_tls.json.
bench-tls: $(STAMP)
	$(PY) -m loadtest.bench_tls --out out/bench_tls

# What the access checks cost on the hot path (a few minutes, docs/security.md "What the
# checks cost"): the checks themselves in CPU time, alternating with none, then the same
# cluster with auth off and on, alternating: ratios with their spread.
bench-auth: $(STAMP)
	$(PY) -m loadtest.bench_auth --pieces --rounds 12
	$(PY) -m loadtest.bench_auth --rounds 8

replan-loop: $(STAMP)
	$(PY) -m loadtest.replan_loop --out out/replan_loop

# The distribution as a wheel in dist/: `pip install dist/echelon_pubsub-*.whl` is the client
# alone (grpcio, protobuf), `pip install 'dist/echelon_pubsub-*.whl[server]'` adds the services
# and the `echelon` command (docs/cli.md, "Install").
.PHONY: dist
dist: $(STAMP)
	rm -rf dist build
	ECHELON_PURE=1 $(PY) -m pip wheel -q --no-deps -w dist .  # pure Python, any platform (setup.py)
	@ls dist/*.whl

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis

# OctopiA (router tier): the paper's burst simulation (70 routers, a few minutes), then the
# real-router run in network namespaces with throttled iLinks (needs root): tables and plots in out/.
.PHONY: octopia
octopia: $(STAMP) $(SYSTEM)
	$(PY) -m loadtest.octopia_sim --out out/octopia
	$(PY) -m loadtest.octopia_net --out out/octopia_net
	$(PY) -m pytest -q -m netns tests/chaos/test_octopia_net.py

# OctopiA's control plane (advertisements, subscriptions, SRT/PRT, CIB_SET) beside the paper's TID
# baseline (PADRES) on the 70-router overlay, simulated: two tables beside the paper's figures.
.PHONY: octopia-control
octopia-control: $(STAMP)
	$(PY) -m loadtest.octopia_control_sim

# The same control-plane figures on real router processes (4 regions x 3 routers on loopback, both
# systems, a few minutes), read from the routers, beside the paper and the simulation at that size.
.PHONY: octopia-control-real
octopia-control-real: $(STAMP)
	$(PY) -m loadtest.octopia_control_real

# Regions that stand alone as real processes: a region's router paused (SIGSTOP) and resumed,
# local traffic unaffected, the far regions catch up (the in-process version runs in make test).
.PHONY: regions
regions: $(STAMP)
	$(PY) -m pytest -q -m slow tests/integration/test_regions_processes.py

# Regions that stand alone, cut by the network: region-2's routers' cable out, then in, every
# router and agent in a network namespace of its own (needs root and `ip netns`; where those are
# unavailable it says why and exits 2).
.PHONY: regions-cut
regions-cut: $(STAMP)
	$(PY) -m loadtest.regions_cut --events 40

# Meghdoot's section 5 on the zone code (100, 1,000 and 10,000 peers; 150,000 subscriptions at
# 10,000 peers; the 100-peer run with uniform alert thresholds), each figure beside the paper's.
# Long: about 20 minutes on a quiet machine.
.PHONY: meghdoot
meghdoot: $(STAMP)
	$(PY) -m loadtest.meghdoot_sim --out out/meghdoot
	$(PY) -m loadtest.meghdoot_sim --peers 100 --uniform-alert --out out/meghdoot-uniform-alert
	$(PY) -m loadtest.meghdoot_sim --peers 10000 --subs 150000 --out out/meghdoot-150k

# OctopiA's burst at the paper's full counts with the in-cluster hops, and the sensitivity table
# over link rates, broker CPU and the HRP (long: about an hour on a quiet machine).
.PHONY: octopia-burst
octopia-burst: $(STAMP)
	$(PY) -m loadtest.octopia_sim --rates 100000 --sensitivity --out out/octopia-burst

# The paper's bulk experiment in network namespaces (needs root; about 15 minutes): tables, out/bulk/*.png.
.PHONY: bulk
bulk: $(STAMP) $(SYSTEM)
	$(PY) -m loadtest.bulk --out out/bulk

# Bulk at the paper's size on loopback (no namespaces, no shaping; about 15 minutes): one 8 GiB
# payload to 11 subscribers, completion time and every agent's peak RSS.
.PHONY: bulk-scale
bulk-scale: $(STAMP)
	$(PY) -m loadtest.bulk_scale --size-mb 8192 --out out/bulk-scale
