"""The agent's metrics (prometheus.io naming); the per-peer link series are with the
links (linkset.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from echelon.runtime.metrics import LATENCY_BUCKETS


class AgentMetrics:
    def __init__(self, r):
        # `topic` only on accepted publishes (a refused one may name any topic: unbounded).
        self.published = Counter("echelon_agent_published_total", "Publish requests, by topic and result.",
                                 ["topic", "result"], registry=r)
        self.deliveries = Counter("echelon_agent_deliveries_total", "Deliveries sent to subscriber streams.",
                                  ["topic"], registry=r)
        self.acks = Counter("echelon_agent_acks_total", "Deliveries acknowledged by subscribers.", ["topic"],
                            registry=r)
        self.backlog_max = Gauge("echelon_agent_subscription_backlog_max", "The deepest backlog (queued and "
                                 "unacknowledged messages) of any subscription held.", registry=r)
        self.backlog_bound = Gauge("echelon_agent_subscription_backlog_bound", "The backlog bound past which a "
                                   "subscription is closed with RESOURCE_EXHAUSTED.", registry=r)
        self.redeliveries = Counter("echelon_agent_redeliveries_total", "Deliveries sent again after a stream "
                                    "ended unacknowledged.", registry=r)
        self.duplicates = Counter("echelon_agent_duplicates_dropped_total", "Messages dropped by the dedup window.",
                                  registry=r)
        self.overflows = Counter("echelon_agent_backlog_overflows_total", "Subscriptions closed past their "
                                 "backlog bound (RESOURCE_EXHAUSTED).", registry=r)
        self.stalls = Counter("echelon_agent_subscription_stalls_total", "Lagging subscriptions that acknowledged "
                              "nothing for the stall bound and stopped holding their publishers back (by kind): ephemeral "
                              "ones closed, named and durable ones shedding.", ["kind"], registry=r)
        self.shed = Counter("echelon_agent_backlog_shed_total", "Messages a stalled named subscription dropped "
                            "(its oldest queued) to stay within its bound.", registry=r)
        self.subscriptions = Gauge("echelon_agent_subscriptions", "Subscriptions held.", registry=r)
        self.reconciled = Counter("echelon_agent_subscriptions_reconciled_total", "Differences reconciliation "
                                  "fixed: tier (held by the matchers, not here: removed there), agent (held here, "
                                  "lost by the matchers: registered again), stream (ephemeral, no stream: closed "
                                  "here).", ["direction"], registry=r)
        self.removals_queued = Gauge("echelon_agent_subscription_removals_queued", "Subscription removals not "
                                     "yet acknowledged by a matcher (retried).", registry=r)
        self.latency = Histogram("echelon_agent_delivery_latency_seconds", "Publish to local enqueue (one sample per "
                                 "relay frame: its first event delivered, the others came with it).",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.copies = Counter("echelon_agent_copies_sent_total", "Frames sent, as tree root or as relay.",
                              ["as"], registry=r)
        self.dropped = Counter("echelon_agent_frames_undelivered_total", "Frames whose peer left before "
                               "acknowledging (their messages are re-routed).", registry=r)
        self.rerouted = Counter("echelon_agent_rerouted_messages_total", "Messages and slices re-routed by a "
                                "path update after their target left the view.", registry=r)
        self.lost = Counter("echelon_agent_destinations_lost_total", "Destinations dropped from a copy: the "
                            "member left the view, or stayed DEAD past the park time or bound.", registry=r)
        self.parked = Counter("echelon_agent_destinations_parked_total", "Destinations parked because their "
                              "member was DEAD in this agent's view.", registry=r)
        self.unparked = Counter("echelon_agent_destinations_unparked_total", "Parked destinations sent on after "
                                "their member came back ALIVE.", registry=r)
        self.parked_now = Gauge("echelon_agent_parked_destinations", "Destinations parked now, waiting for a "
                                "DEAD member to come back.", registry=r)
        self.reassembling = Gauge("echelon_agent_payloads_reassembling", "Sliced payloads partly received.",
                                  registry=r)
        # Dead messages (agent/redelivery.py), by the subscription's topic (failures: the dead-letter topic's).
        self.expired = Counter("echelon_agent_ack_deadline_expired_total", "Deliveries not settled within their "
                               "ack deadline: taken back and redelivered (or dead-lettered).", ["topic"], registry=r)
        self.terminated = Counter("echelon_agent_terminated_total", "Deliveries the subscriber terminated (term): "
                                  "settled, never redelivered.", ["topic"], registry=r)
        self.dead_lettered = Counter("echelon_agent_dead_lettered_total", "Messages past their subscription's max "
                                     "deliveries, published to its dead-letter topic and settled.", ["topic"],
                                     registry=r)
        self.dead_letter_failures = Counter("echelon_agent_dead_letter_failures_total", "Dead-letter publishes "
                                            "that failed (the message is kept and the publish retried), by "
                                            "dead-letter topic.", ["topic"], registry=r)
        self.dead_letters_pending = Gauge("echelon_agent_dead_letters_pending", "Messages on their way to a "
                                          "dead-letter topic (publishing, or waiting to retry).", registry=r)
        self.bulk_aborted = Counter("echelon_agent_bulk_aborted_total", "Sliced payloads a subscription lost "
                                    "mid-payload (its stream ended, nacked or stalled, or the payload's slices "
                                    "stopped coming): not redelivered, nothing holds a copy.", registry=r)
        # Which schema check admission runs (runtime/schema_code.py): the compiled twin, or the
        # Python reference (no C compiler at install, or ECHELON_PURE).
        self.compressed_streams = Gauge("echelon_agent_compressed_client_streams", "Client streams whose zstd "
                                        "offer was accepted, open now (agent/compressed.py).", registry=r)
        self.compiled = Gauge("echelon_agent_compiled_hot_path", "1 when the publishing path's schema check runs "
                              "compiled (runtime/_fill.c), 0 when it runs its Python reference.", registry=r)
