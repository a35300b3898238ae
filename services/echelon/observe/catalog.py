"""The one definition of what we watch: dashboards of panels (PromQL, unit, description),
recording rules for the expensive queries, and alerts.

Grafana JSON, the Prometheus rules file, `echelon top` and the live test of every query
all read these lists; nothing else holds a query. Series carry the scrape target's
labels `job` (the role), `member` and `region` (see `prometheus.scrape_config`; on
Kubernetes the ServiceMonitor's relabelings must set the same three), so every panel
filters on `$region`; series with a `topic` label filter on `$topic`.

Congestion follows OctopiA (docs/papers.md, "OctopiA"): CE =
enqueued / dequeued over an interval; a link is congested when CE >= 1 and its queue is
longer than delta, or when nothing was dequeued while the queue is not empty.

Routers export the agents' link families (`echelon_link_*{peer}`, `echelon_relay_*`; one
LinkSet) under `job="router"`, plus the CE they measure themselves for IDR
(`echelon_link_congestion_element`, iLinks only). The routing job is a batch process (a run,
then exit) that a scrape would miss, so it exports nothing: every plan it pushes lands in
membership's `Control.PushPlan`, which counts pushes by result and exports the current
plan's `predicted_gain`; the control-loop panels read those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

N = 'namespace=~"$namespace"'  # one release's namespace (none locally: `.*` matches the absent label)
R = f'{N}, region=~"$region"'
T = 'topic=~"$topic"'
RATE = "$__rate_interval"

CONGESTED_QUEUE = 100  # delta: frames waiting on a link before CE >= 1 counts as congestion
CONGESTED_FOR = "2m"
BACKLOG_NEAR = 0.8  # of a subscription's backlog bound
MATCHER_SHARE_FACTOR = 2
MATCHER_SHARE_FLOOR = 1000  # subscriptions in the tier below which imbalance is not worth a page
DEAD_LETTER_FAILING = "5m"  # failed dead-letter publishes in every window this long, for this long
VIEW_AGE_STALE = 10  # seconds; membership sends a keepalive every second
JOB_STALE_AFTER = 3600  # seconds without a good run of the routing job (the chart runs it every 15 min)
CERT_EXPIRY_WARNING = 6 * 3600  # seconds; cert-manager renews 8 h ahead of expiry by default
# Where the runbooks are, relative to the repository's root (an alert links its own section).
RUNBOOKS = "docs/operations.md"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    unit: str = ""  # when not the panel's


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str  # a Grafana unit id: ops, s, Bps, short, percentunit, none
    description: str
    kind: str = "timeseries"  # or "stat"


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    terminal: bool = False  # shown by `echelon top`


@dataclass(frozen=True)
class Record:
    record: str
    expr: str


@dataclass(frozen=True)
class Alert:
    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def runbook_url(self) -> str:
        """The alert's runbook: its section of docs/operations.md (the heading is the alert's name)."""
        return f"{RUNBOOKS}#{self.alert.lower()}"


def q(expr: str, legend: str = "", unit: str = "") -> Query:
    return Query(" ".join(expr.split()), legend, unit)


# -- recording rules: evaluated once by Prometheus, read by panels, alerts and the routing job

# Every aggregation keeps `namespace`: releases in different namespaces never mix (shares
# and fair shares are per release).
RECORDS = (
    Record("topic:echelon_agent_published:rate1m",
           'sum by (namespace, region, topic) (rate(echelon_agent_published_total{result="ok"}[1m]))'),
    Record("topic:echelon_agent_deliveries:rate1m",
           "sum by (namespace, region, topic) (rate(echelon_agent_deliveries_total[1m]))"),
    Record("le:echelon_agent_delivery_latency_seconds_bucket:rate1m",
           "sum by (namespace, region, le) (rate(echelon_agent_delivery_latency_seconds_bucket[1m]))"),
    Record("link:echelon_link_congestion_element:ratio1m",
           "rate(echelon_link_enqueued_total[1m]) / rate(echelon_link_dequeued_total[1m])"),
    Record("member:echelon_matcher_subscriptions:share",
           "sum by (namespace, region, member) (echelon_matcher_zone_subscriptions)"
           " / on (namespace) group_left sum by (namespace) (echelon_matcher_zone_subscriptions)"),
    Record("member:echelon_matcher_events:share1m",
           "sum by (namespace, region, member) (rate(echelon_matcher_zone_events_total[1m]))"
           " / on (namespace) group_left sum by (namespace) (rate(echelon_matcher_zone_events_total[1m]))"),
    Record("echelon:matcher_fair_share:ratio", "1 / count by (namespace) (echelon_matcher_copies)"),
)

# -- dashboards

OVERVIEW = Dashboard("echelon-overview", "Echelon / Overview", "Traffic, latency, errors and the cluster's state.", (
    Panel("Publish rate by topic", (q(f'sum by (topic) (topic:echelon_agent_published:rate1m{{{R}, {T}}})',
                                      "{{topic}}"),),
          "ops", "Events accepted per second at the publishers' agents (publish acks with result ok)."),
    Panel("Delivery rate by topic", (q(f"sum by (topic) (topic:echelon_agent_deliveries:rate1m{{{R}, {T}}})",
                                       "{{topic}}"),),
          "ops", "Deliveries sent to subscriber streams per second, over every agent."),
    Panel("End-to-end delivery latency", (
        q(f"histogram_quantile(0.5, sum by (le) (le:echelon_agent_delivery_latency_seconds_bucket:rate1m{{{R}}}))",
          "p50"),
        q(f"histogram_quantile(0.99, sum by (le) (le:echelon_agent_delivery_latency_seconds_bucket:rate1m{{{R}}}))",
          "p99")),
          "s", "From the publish at the producer's agent to the event's enqueue at the subscriber's agent."),
    Panel("Acks", (
        q(f"sum by (result) (rate(echelon_agent_published_total{{{R}, {T}}}[{RATE}]))", "publish {{result}}"),
        q(f"sum by (topic) (rate(echelon_agent_acks_total{{{R}, {T}}}[{RATE}]))", "subscriber acks {{topic}}")),
          "ops", "Publish acks by result (ok or the gRPC code of the refusal) and deliveries acknowledged by "
                 "subscribers."),
    Panel("Dead messages", (
        q(f"sum by (topic) (rate(echelon_agent_ack_deadline_expired_total{{{R}, {T}}}[{RATE}]))",
          "past deadline {{topic}}"),
        q(f"sum by (topic) (rate(echelon_agent_terminated_total{{{R}, {T}}}[{RATE}]))", "terminated {{topic}}"),
        q(f"sum by (topic) (rate(echelon_agent_dead_lettered_total{{{R}, {T}}}[{RATE}]))", "dead-lettered {{topic}}"),
        q(f"sum by (topic) (rate(echelon_agent_dead_letter_failures_total{{{R}, {T}}}[{RATE}]))",
          "dead-letter publish failed, to {{topic}}"),
        q(f"sum(echelon_agent_dead_letters_pending{{{R}}})", "waiting to be dead-lettered", "short")),
          "ops", "Deliveries the agents took back past their ack deadline, terminated by subscribers, and sent "
                 "to a dead-letter topic past max deliveries (by the subscription's topic); failed dead-letter "
                 "publishes (by dead-letter topic) and the messages held until theirs goes through "
                 "(docs/guarantees.md, \"Dead messages\")."),
    Panel("Errors by gRPC code", (
        q(f'sum by (job, grpc_code) (rate(grpc_server_handled_total{{grpc_code!="OK", {R}}}[{RATE}]))',
          "{{job}} {{grpc_code}}"),),
          "ops", "RPCs that ended with a status other than OK, by service and code."),
    Panel("Members by state", (q(f'max by (state) (echelon_membership_members{{job="membership", {N}}})', "{{state}}"),),
          "short", "Members in the membership view by state (the largest count any replica holds).", kind="stat"),
    Panel("Plan version", (
        q(f'max(echelon_membership_plan_version{{job="membership", {N}}})', "stored"),
        q(f'min by (job) (echelon_membership_plan_version{{job!="membership", {R}}})', "oldest adopted, {{job}}")),
          "none", "Routing-plan version membership stores, and the oldest version any member has adopted "
                  "(a gap that stays means a member did not switch).", kind="stat"),
), terminal=True)

DATA_PLANE = Dashboard("echelon-data-plane", "Echelon / Data plane",
                       "Links between agents and routers: bandwidth, queues, congestion, re-routing.", (
    Panel("Link bandwidth", (
        q(f'sum by (member, peer) (rate(echelon_relay_sent_bytes_total{{job="agent", {R}}}[{RATE}]))',
          "{{member}} -> {{peer}}"),),
          "Bps", "Bytes per second each agent sends to each peer (agent -> agent links)."),
    Panel("Link queue length", (q(f'echelon_link_queue_length{{job="agent", {R}}}', "{{member}} -> {{peer}}"),),
          "short", "Unacknowledged frames per outgoing agent link."),
    Panel("Enqueued vs dequeued", (
        q(f'sum by (member) (rate(echelon_link_enqueued_total{{job="agent", {R}}}[{RATE}]))', "enqueued {{member}}"),
        q(f'sum by (member) (rate(echelon_link_dequeued_total{{job="agent", {R}}}[{RATE}]))',
          "dequeued {{member}}")),
          "ops", "Frames put on and acknowledged off each agent's outgoing links, per second."),
    Panel("Congestion element CE", (
        q(f'link:echelon_link_congestion_element:ratio1m{{job="agent", {R}}}', "{{member}} -> {{peer}}"),),
          "none", f"OctopiA's CE = enqueued / dequeued over 1m per agent link; CE >= 1 with a queue over "
                  f"{CONGESTED_QUEUE} frames is congestion (+Inf: nothing dequeued)."),
    Panel("Copies sent as root vs relay", (
        q(f'sum by (as) (rate(echelon_agent_copies_sent_total{{{R}}}[{RATE}]))', "{{as}}"),
        q(f'sum(rate(echelon_agent_copies_sent_total{{as="relay", {R}}}[{RATE}])) '
          f'/ sum(rate(echelon_agent_copies_sent_total{{{R}}}[{RATE}]))', "share carried by subscribers", "percentunit")),
          "ops", "Frames sent by publishers' agents as LBDD tree roots and by subscribers' agents as relays; "
                 "the share is how much of the fan-out the subscribers carry."),
    Panel("Parked, re-routed and lost destinations", (
        q(f"sum(rate(echelon_agent_destinations_parked_total{{{R}}}[{RATE}]))", "parked"),
        q(f"sum(rate(echelon_agent_rerouted_messages_total{{{R}}}[{RATE}]))", "re-routed"),
        q(f"sum(rate(echelon_agent_destinations_lost_total{{{R}}}[{RATE}]))", "lost"),
        q(f"sum(echelon_agent_parked_destinations{{{R}}})", "parked now", "short")),
          "ops", "Destinations parked while their member is DEAD, messages re-routed by a path update, and "
                 "destinations dropped for good (left the view, or DEAD past the park time)."),
    Panel("Slow-subscriber backlog", (
        q(f"echelon_agent_subscription_backlog_max{{{R}}} / echelon_agent_subscription_backlog_bound{{{R}}}",
          "{{member}}"),
        q(f"sum by (member) (rate(echelon_agent_backlog_overflows_total{{{R}}}[{RATE}]))", "overflows {{member}}", "ops")),
          "percentunit", f"The deepest subscription backlog on each agent as a fraction of the bound (past "
                         f"{BACKLOG_NEAR:.0%} it alerts; at 100% the stream ends RESOURCE_EXHAUSTED), and such "
                         f"overflows per second."),
    Panel("Router link bandwidth", (
        q(f'sum by (member, peer) (rate(echelon_relay_sent_bytes_total{{job="router", {R}}}[{RATE}]))',
          "{{member}} -> {{peer}}"),),
          "Bps", "Bytes per second each router sends to each peer: routers of other regions (iLinks) and "
                 "its own region's agents (aLinks)."),
    Panel("Router link queue length", (q(f'echelon_link_queue_length{{job="router", {R}}}', "{{member}} -> {{peer}}"),),
          "short", "Unacknowledged frames per outgoing router link (iLinks and aLinks)."),
    Panel("Router link congestion element CE", (
        q(f'echelon_link_congestion_element{{job="router", {R}}}', "{{member}} -> {{peer}}"),),
          "none", "The CE each router measures per iLink every interval (OctopiA's link status table), the "
                  "input of IDR's rerouting; 0 while idle, +Inf when nothing was dequeued with frames queued."),
    Panel("IDR decisions", (
        q(f'sum by (rule) (rate(echelon_router_idr_decisions_total{{{R}}}[{RATE}]))', "{{rule}}"),
        q(f'sum by (link) (rate(echelon_router_messages_total{{{R}}}[{RATE}]))', "messages on {{link}}"),
        q(f'sum(rate(echelon_router_unmatched_total{{{R}}}[{RATE}]))', "sent to a region, matched nobody there"),
        q(f'sum(rate(echelon_router_regions_skipped_total{{{R}}}[{RATE}]))', "not sent: the region's summary")),
          "ops", "Routers' routing decisions by IDR rule (none: no target iLink congested, the same sends as "
                 "SNR), the messages they send per link kind, the events sent to a region with its own "
                 "matcher tier that matched no subscription there, and the copies for a region that its "
                 "summary spared (docs/event-path.md, Regions that stand alone)."),
), terminal=True)

MATCHING = Dashboard("echelon-matching", "Echelon / Matching",
                     "The matcher tier by matcher and content zone (Meghdoot zones, CDM in each).", (
    Panel("Subscriptions stored", (
        q(f"sum by (member, zone) (echelon_matcher_zone_subscriptions{{{R}, {T}}})", "{{member}} {{zone}}"),),
          "short", "Primary subscription copies each matcher indexes per zone (active layout)."),
    Panel("Events matched", (
        q(f"sum by (member, zone) (rate(echelon_matcher_zone_events_total{{{R}, {T}}}[{RATE}]))",
          "{{member}} {{zone}}"),),
          "ops", "Events matched per second in each zone."),
    Panel("Match latency p99", (
        q(f"histogram_quantile(0.99, sum by (le, member, zone) "
          f"(rate(echelon_matcher_zone_match_seconds_bucket{{{R}, {T}}}[{RATE}])))", "zone {{member}} {{zone}}"),
        q(f"histogram_quantile(0.99, sum by (le, member) (rate(echelon_matcher_batch_seconds_bucket{{{R}}}[{RATE}])))",
          "entry {{member}}")),
          "s", "Time to match one batch in a zone, and to answer a whole Match batch as the entry matcher."),
    Panel("Load share", (
        q(f"member:echelon_matcher_subscriptions:share{{{R}}}", "subscriptions {{member}}"),
        q(f"member:echelon_matcher_events:share1m{{{R}}}", "events {{member}}"),
        q("echelon:matcher_fair_share:ratio", "fair share")),
          "percentunit", f"Each matcher's share of the stored subscriptions and of the matching work, against "
                         f"the fair share 1/M: the imbalance the routing job removes (over "
                         f"{MATCHER_SHARE_FACTOR}x alerts)."),
    Panel("Hand-offs", (
        q(f"sum by (member) (rate(echelon_matcher_handoffs_total{{{R}}}[{RATE}]))", "layouts {{member}}"),
        q(f"sum by (member) (rate(echelon_matcher_handoff_copies_total{{{R}}}[{RATE}]))", "copies {{member}}")),
          "ops", "Layouts a matcher finished pushing after a plan or membership change, and the subscription "
                 "copies it sent to their new holders."),
))

MEMBERSHIP = Dashboard("echelon-membership", "Echelon / Membership and control loop",
                       "Failure detection, views and routing plans.", (
    Panel("Heartbeats", (q(f"sum by (member) (rate(echelon_membership_heartbeats_total{{{R}}}[{RATE}]))",
                           "{{member}}"),),
          "ops", "Heartbeats each membership replica receives per second."),
    Panel("Suspicions and verdicts", (
        q(f"sum by (to_state) (rate(echelon_membership_transitions_total{{{R}}}[{RATE}]))", "to {{to_state}}"),
        q(f"sum by (outcome) (rate(echelon_membership_evidence_total{{{R}}}[{RATE}]))", "evidence {{outcome}}"),
        q(f"sum by (kind) (rate(echelon_membership_suspicions_refuted_total{{{R}}}[{RATE}]))", "refuted by {{kind}}")),
          "ops", "Member state transitions, peers' reports of broken streams by outcome, and suspects that "
                 "proved alive."),
    Panel("Detection latency", (
        q(f"histogram_quantile(0.5, sum by (le) (rate(echelon_membership_detection_seconds_bucket{{{R}}}[5m])))",
          "p50"),
        q(f"histogram_quantile(0.99, sum by (le) (rate(echelon_membership_detection_seconds_bucket{{{R}}}[5m])))",
          "p99")),
          "s", "Silence before a member was declared DEAD (its last beat to the verdict), over 5m."),
    Panel("View age", (q(f'max by (member) (echelon_membership_view_age_seconds{{job!="membership", {R}}})',
                         "{{member}}"),),
          "s", f"Seconds since each member last heard from membership (update or keepalive, every second); "
               f"growing past {VIEW_AGE_STALE}s alerts."),
    Panel("Plan pushes", (q(f"sum by (result) (rate(echelon_membership_plan_pushes_total{{{R}}}[{RATE}]))",
                            "{{result}}"),),
          "ops", "Routing plans pushed to Control: accepted, refused as invalid, refused as stale."),
    Panel("Routing-job pushes", (
        q(f"sum by (result) (increase(echelon_membership_plan_pushes_total{{{R}}}[1h]))", "{{result}}"),),
          "short", "Plans pushed in the last hour by result, as membership counted them (the routing job is a "
                   "batch with no metrics of its own; its runs that push nothing are in its log).", kind="stat"),
    Panel("Routing-job predicted gain", (
        q(f'max(echelon_membership_plan_predicted_gain{{job="membership", {N}}})', "current plan"),),
          "percentunit", "What the pusher of the current plan predicted it gains over the plan it replaced: the "
                         "largest relative fall of a topic's zone imbalance (0 for a clique or hint change).",
          kind="stat"),
))

DASHBOARDS = (OVERVIEW, DATA_PLANE, MATCHING, MEMBERSHIP)

# -- alerts

ALERTS = (
    Alert("EchelonLinkCongested",
          f"(link:echelon_link_congestion_element:ratio1m >= 1 or rate(echelon_link_dequeued_total[1m]) == 0)"
          f" and echelon_link_queue_length > {CONGESTED_QUEUE}",
          CONGESTED_FOR, "warning", "Link {{ $labels.member }} -> {{ $labels.peer }} congested",
          f"CE >= 1 (or nothing dequeued) with more than {CONGESTED_QUEUE} frames queued for {CONGESTED_FOR}."),
    Alert("EchelonMemberDead", 'max by (namespace) (echelon_membership_members{job="membership", state="dead"}) > 0',
          "0m",
          "critical", "{{ $value }} member(s) DEAD",
          "Membership declared members DEAD; `echelon status` names them. Resolves when they come back or "
          "their tombstone expires."),
    Alert("EchelonTargetDown", 'up{job=~"agent|matcher|membership|router"} == 0', "1m", "critical",
          "{{ $labels.job }} {{ $labels.member }} not scraped", "Prometheus cannot scrape this process for 1m."),
    Alert("EchelonMatcherOverShare",
          f"member:echelon_matcher_subscriptions:share"
          f" > on (namespace) group_left {MATCHER_SHARE_FACTOR} * echelon:matcher_fair_share:ratio"
          f" and on (namespace) sum by (namespace) (echelon_matcher_zone_subscriptions) > {MATCHER_SHARE_FLOOR}",
          "10m", "warning", "Matcher {{ $labels.member }} holds {{ $value | humanizePercentage }} of the subscriptions",
          f"Over {MATCHER_SHARE_FACTOR}x its fair share for 10m; the routing job's next plan should split its zones."),
    Alert("EchelonSubscriberBacklogNearBound",
          f"echelon_agent_subscription_backlog_max / echelon_agent_subscription_backlog_bound > {BACKLOG_NEAR}", "1m",
          "warning", "A subscription on {{ $labels.member }} is near its backlog bound",
          "Past the bound its stream ends with RESOURCE_EXHAUSTED; the subscriber is too slow."),
    Alert("EchelonDeadLetterPublishFailing",
          f"increase(echelon_agent_dead_letter_failures_total[{DEAD_LETTER_FAILING}]) > 0", DEAD_LETTER_FAILING,
          "warning", "Dead letters from {{ $labels.member }} to {{ $labels.topic }} keep failing",
          "The messages are kept (within their subscription's backlog bound) and retried every 30s at most; "
          "the agent's log says why each publish failed."),
    Alert("EchelonViewAgeGrowing",
          f'echelon_membership_view_age_seconds{{job!="membership"}} > {VIEW_AGE_STALE}'
          f' and deriv(echelon_membership_view_age_seconds{{job!="membership"}}[1m]) > 0.5',
          "1m", "warning", "{{ $labels.member }} has not heard from membership for {{ $value }}s",
          "Its view is stale: it routes on an old view until a replica answers."),
    Alert("EchelonPlanRefused", 'increase(echelon_membership_plan_pushes_total{result!="accepted"}[10m]) > 0', "0m",
          "warning", "A routing plan was refused ({{ $labels.result }})",
          "Control refused a pushed plan; the old one stays. The routing job's log says why."),
    # The routing job reports every run to membership (Control.ReportRun): a batch has no
    # /metrics of its own, and a job that never reaches membership shows up as stale.
    Alert("EchelonRoutingJobFailed",
          'sum by (namespace) (increase(echelon_membership_replan_runs_total{result="failed"}[1h])) > 0', "0m",
          "warning", "A routing job run failed in namespace {{ $labels.namespace }}",
          "The run pushed nothing (missing or partial metrics, a member that did not answer, its deadline); "
          "the cluster keeps its plan. The job's log (or membership's) says why."),
    Alert("EchelonRoutingJobStale",
          f"time() - max by (namespace) (echelon_membership_replan_last_success_timestamp_seconds)"
          f" > {JOB_STALE_AFTER}",
          "30m", "warning", "No routing job run has succeeded in namespace {{ $labels.namespace }} for over an hour",
          "The job is not running (schedule, the spark-operator not watching the namespace, no image) or every "
          "run fails: routing keeps a plan made for an older load."),
    Alert("EchelonCertificateExpiring",
          f"echelon_tls_certificate_expiry_timestamp_seconds > 0"
          f" and echelon_tls_certificate_expiry_timestamp_seconds - time() < {CERT_EXPIRY_WARNING}",
          "5m", "critical", "The certificate of {{ $labels.member }} expires in under 6 hours",
          "It was not renewed (cert-manager renews 8h before expiry by default; a Secret must be rotated by hand). "
          "Past expiry its peers refuse its connections."),
)

_VARIABLES = re.compile(r"\$(__rate_interval|namespace|region|topic)\b")


def instantiate(expr: str, region: str = ".*", topic: str = ".*", rate_interval: str = "1m",
                namespace: str = ".*") -> str:
    """A panel's PromQL with Grafana's variables filled, as Grafana would send it."""
    values = {"__rate_interval": rate_interval, "namespace": namespace, "region": region, "topic": topic}
    return _VARIABLES.sub(lambda m: values[m.group(1)], expr)


def panels() -> list[tuple[Dashboard, Panel]]:
    return [(d, p) for d in DASHBOARDS for p in d.panels]
