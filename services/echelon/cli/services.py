"""The services' commands: `echelon agent|matcher|router|membership` run one process.

Every option can also come from the environment: `ECHELON_<COMMAND>_<OPTION>`, e.g.
`ECHELON_AGENT_PORT=7200 echelon agent`. Services run on uvloop when it is installed;
`ECHELON_EVENT_LOOP=asyncio` runs them on asyncio's own loop (runtime/loop.py).
"""

from __future__ import annotations

import click

from echelon.runtime.log import setup_logging
from echelon.runtime.node import NodeConfig


def _split(values) -> list[str]:
    return [x for v in values for x in v.split(",") if x]


def service_options(f):
    """The flags every service shares, validated once by NodeConfig."""
    for opt in reversed([
        click.option("--id", "member_id", required=True, help="Member id, unique in the cluster."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind."),
        click.option("--port", default=0, type=click.IntRange(0, 65535), show_default=True,
                     help="gRPC port (0 picks one)."),
        click.option("--advertise", default="", help="host:port others dial (default host:port)."),
        click.option("--metrics-port", default=None, type=click.IntRange(0, 65535),
                     help="Prometheus /metrics port (unset: no endpoint)."),
        click.option("--region", default="local", show_default=True),
        click.option("--beat-interval", default=0.2, type=click.FloatRange(0.01, 10), show_default=True,
                     help="Heartbeat interval T, seconds: members beat every 2 T, silence is SUSPECT after 5 T."),
        click.option("--grace", default=5.0, type=click.FloatRange(0, 300), show_default=True,
                     help="Seconds to drain on SIGTERM."),
        click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning", "error"])),
        click.option("--tls-dir", default=None, envvar="ECHELON_TLS_DIR",
                     type=click.Path(file_okay=False, exists=True, path_type=str),
                     help="TLS certificates (tls.crt, tls.key, ca.crt, reloaded when they change): mTLS on "
                          "every port and channel [env ECHELON_TLS_DIR]."),
        click.option("--health-port", default=None, type=click.IntRange(0, 65535),
                     help="A plain-text port with the health service alone, for probes that speak no TLS "
                          "(Kubernetes' gRPC probes)."),
        *AUTH_OPTIONS,
    ]):
        f = opt(f)
    return f


# Client identity and ACLs (runtime/auth.py); the same environment variables for every service.
AUTH_OPTIONS = [
    click.option("--auth", default="none", envvar="ECHELON_AUTH", show_default=True,
                 type=click.Choice(["none", "tokens", "jwt"]),
                 help="Who may call: anyone (none), static bearer tokens from --tokens-file, or JWTs checked "
                      "against --jwks; TLS client certificates name callers in both [env ECHELON_AUTH]."),
    click.option("--tokens-file", default=None, envvar="ECHELON_TOKENS_FILE", type=click.Path(dir_okay=False),
                 help="Static tokens (JSON, re-read when it changes); with --auth jwt, accepted too "
                      "[env ECHELON_TOKENS_FILE]."),
    click.option("--jwks", default=None, envvar="ECHELON_JWKS",
                 help="The identity provider's keys: a JWKS file or an https URL [env ECHELON_JWKS]."),
    click.option("--jwt-issuer", default="", envvar="ECHELON_JWT_ISSUER",
                 help="Required `iss` of JWTs (empty: not checked) [env ECHELON_JWT_ISSUER]."),
    click.option("--jwt-audience", default="echelon", envvar="ECHELON_JWT_AUDIENCE", show_default=True,
                 help="Required `aud` of JWTs [env ECHELON_JWT_AUDIENCE]."),
    click.option("--member-token", default="", envvar="ECHELON_MEMBER_TOKEN", show_default=False,
                 help="This service's own token, for calls to other members without TLS; prefer the "
                      "environment (argv is visible to ps) [env ECHELON_MEMBER_TOKEN]."),
    click.option("--superusers", default="", envvar="ECHELON_SUPERUSERS",
                 help="User names (comma list) in the admins group whatever their credential, e.g. a client "
                      "certificate's [env ECHELON_SUPERUSERS]."),
    click.option("--limits", default="", envvar="ECHELON_LIMITS",
                 help="Per-identity limits over the defaults, e.g. publish_rate=500,publish_burst=1000,"
                      "subscriptions=100,streams_per_identity=1000,streams_per_connection=500,"
                      "max_message_bytes=8388608 (a server's receive limit), max_request_bytes (an agent's, "
                      "6 MiB: docs/security.md); caps on durable subscriptions: durable_max_messages, "
                      "durable_max_bytes, durable_max_idle_seconds, durable_max_replicas; filter caps: filter_max_bytes, "
                      "filter_max_predicates, filter_max_depth, filter_max_terms [env ECHELON_LIMITS]."),
    click.option("--identity-caps", default="", envvar="ECHELON_IDENTITY_CAPS",
                 help="Caps per principal over --limits, JSON: {\"user:ann\": {\"durable_subscriptions\": 20}} "
                      "(fields: subscriptions, durable_subscriptions, durable_max_messages, durable_max_bytes, "
                      "durable_max_idle_seconds, durable_max_replicas); those set with `echelon acl cap` win "
                      "[env ECHELON_IDENTITY_CAPS]."),
]


def _auth(auth, tokens_file, jwks, jwt_issuer, jwt_audience, member_token, superusers, limits, identity_caps):
    from echelon.runtime.auth import AuthConfig
    from echelon.runtime.limits import parse_identity_caps, parse_limits

    return AuthConfig(mode=auth, tokens_file=tokens_file or "", jwks=jwks or "", issuer=jwt_issuer,
                      audience=jwt_audience, member_token=member_token, superusers=tuple(_split([superusers])),
                      limits=parse_limits(limits), identity_caps=parse_identity_caps(identity_caps))


def _config(member_id, host, port, advertise, metrics_port, region, beat_interval, grace, tls_dir, health_port,
            membership=(), client_port=None, **auth):
    try:
        return NodeConfig(id=member_id, host=host, port=port, advertise=advertise, metrics_port=metrics_port,
                          membership=_split(membership), region=region, beat_interval=beat_interval, grace=grace,
                          tls_dir=tls_dir or "", client_port=client_port, health_port=health_port,
                          auth=_auth(**auth))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _serve(make_node) -> None:
    """Build the node inside the event loop (grpc.aio binds to the running loop) and serve,
    on uvloop unless ECHELON_EVENT_LOOP=asyncio (runtime/loop.py)."""
    from echelon.runtime import loop
    from echelon.runtime.server import run_until_signalled

    async def main() -> None:
        node = make_node()

        async def start() -> None:
            await node.start()
            loop.started()  # the GC's settings for a long-lived process

        await run_until_signalled(start, node.stop)

    loop.run(main())


@click.command()
@service_options
@click.option("--membership", multiple=True, required=True, help="Membership replica addresses (comma list).")
@click.option("--max-backlog", default=10_000, type=click.IntRange(1), show_default=True,
              help="Messages a subscription may hold before it lags (its publishers slow down) or, if it "
                   "chose eviction, is closed with RESOURCE_EXHAUSTED.")
@click.option("--max-backlog-bytes", default=64 << 20, type=click.IntRange(1 << 10), show_default=True,
              help="Bytes a subscription may hold, beside --max-backlog.")
@click.option("--stall-seconds", default=30.0, type=click.FloatRange(0.5, 3600), show_default=True,
              help="A lagging subscription that acknowledges nothing this long stops holding its publishers "
                   "back: closed if ephemeral, shedding its oldest if named (docs/guarantees.md).")
@click.option("--dissemination", default="lbdd", type=click.Choice(["lbdd", "p2p"]), show_default=True,
              help="lbdd: subscribers relay along LBDD trees; p2p: this agent sends every copy itself.")
@click.option("--slice-bytes", default=65536, type=click.IntRange(1024, 16 << 20), show_default=True,
              help="Payloads above this size travel as slices of this size, forwarded as they arrive.")
@click.option("--stripes", default=8, type=click.IntRange(1, 64), show_default=True,
              help="LBDD trees a sliced payload is striped over (1: plain LBDD).")
@click.option("--direct-upto", default=4, type=click.IntRange(0, 64), show_default=True,
              help="Topics with at most this many subscribing agents: small events go straight to each "
                   "destination, not down the LBDD tree (0: always the tree). The same on every agent.")
@click.option("--window-bytes", default=8 << 20, type=click.IntRange(64 << 10), show_default=True,
              help="Unacknowledged bytes per outgoing relay link (backpressure).")
@click.option("--reconcile-seconds", default=30.0, type=click.FloatRange(0.1, 3600), show_default=True,
              help="How often the agent compares its subscriptions with what the matchers hold for it.")
@click.option("--data-dir", envvar="ECHELON_DATA_DIR", default=None, type=click.Path(file_okay=False),
              help="Where durable subscriptions' log lives (SQLite, WAL). Unset: in memory (only the replica "
                   "agent outlives this process).")
@click.option("--fsync", default="batch", type=click.Choice(["always", "batch", "never"]), show_default=True,
              help="always: every commit fsynced; batch: every --fsync-batch-ms; never: left to the OS "
                   "(the loss window, on power loss or kill -9: see agent/durable/store.py).")
@click.option("--fsync-batch-ms", default=10, type=click.IntRange(1, 10_000), show_default=True)
@click.option("--durable-max-bytes", default=64 << 20, type=click.IntRange(1), show_default=True,
              help="Default backlog bound in bytes of a durable subscription (messages: --max-backlog).")
@click.option("--durable-idle-seconds", default=7 * 86400, type=click.IntRange(0), show_default=True,
              help="Default idle time after which a durable subscription with no stream is deleted (0: never).")
@click.option("--retention-seconds", default=3600, type=click.IntRange(1), show_default=True,
              help="Default retention (replay) of a topic's events, for topics that set none.")
@click.option("--retention-bytes", default=256 << 20, type=click.IntRange(1), show_default=True)
@click.option("--client-port", default=None, type=click.IntRange(0, 65535),
              help="With --tls-dir: a second port that asks clients for no certificate (they send a token).")
@click.option("--max-compressed-streams", default=256, type=click.IntRange(0), show_default=True,
              help="Client streams compressed at once (the SDK's compress=True; each holds a zstd context); past "
                   "it a stream that offers zstd stays plain (docs/compression.md).")
def agent(log_level, max_backlog, max_backlog_bytes, stall_seconds, dissemination, slice_bytes, stripes, direct_upto,
          window_bytes,
          reconcile_seconds,
          data_dir, fsync, fsync_batch_ms, durable_max_bytes, durable_idle_seconds, retention_seconds,
          retention_bytes, max_compressed_streams, **kw) -> None:
    """Run an agent: the client API, local delivery, relaying."""
    from echelon.agent.durable import Defaults
    from echelon.agent.server import AgentNode

    setup_logging("agent", log_level)
    durable = Defaults(max_messages=max_backlog, max_bytes=durable_max_bytes, idle_seconds=durable_idle_seconds,
                       retention_seconds=retention_seconds, retention_bytes=retention_bytes)
    _serve(lambda: AgentNode(_config(**kw), max_backlog=max_backlog, window_bytes=window_bytes,
                             dissemination=dissemination, slice_bytes=slice_bytes, stripes=stripes,
                             direct_upto=direct_upto, reconcile_seconds=reconcile_seconds, data_dir=data_dir, fsync=fsync,
                             fsync_batch_ms=fsync_batch_ms, durable=durable, max_backlog_bytes=max_backlog_bytes,
                             stall_seconds=stall_seconds, max_compressed_streams=max_compressed_streams))


@click.command()
@service_options
@click.option("--membership", multiple=True, required=True, help="Membership replica addresses (comma list).")
@click.option("--deadline", default=8.0, type=click.FloatRange(0.5, 120), show_default=True,
              help="Seconds a Register or Match may wait for the zones to settle (a matcher died, a plan "
                   "switches) before UNAVAILABLE.")
@click.option("--park-seconds", default=30.0, type=click.FloatRange(0.1, 3600), show_default=True,
              help="An agent DEAD or LEFT this long loses its subscriptions (the agents' park time).")
@click.option("--refill-seconds", default=30.0, type=click.FloatRange(1, 3600), show_default=True,
              help="After a start, Match waits until every alive agent has refilled this matcher, or this long "
                   "(matcher/refill.py).")
def matcher(log_level, deadline, park_seconds, refill_seconds, **kw) -> None:
    """Run a matcher: a share of the subscription index (content zones, CDM in each)."""
    from echelon.matcher.server import MatcherNode

    setup_logging("matcher", log_level)
    _serve(lambda: MatcherNode(_config(**kw), deadline=deadline, park_seconds=park_seconds,
                               refill_seconds=refill_seconds))


@click.command()
@service_options
@click.option("--membership", multiple=True, required=True, help="Membership replica addresses (comma list).")
@click.option("--routing", default="idr", type=click.Choice(["snr", "idr"]), show_default=True,
              help="OctopiA's static routing (one copy per region over its iLink) or IDR (around congested iLinks).")
@click.option("--delta", default=10, type=click.IntRange(0), show_default=True,
              help="A link is congested when its CE >= 1 and more than this many frames are queued.")
@click.option("--interval", default=0.5, type=click.FloatRange(0.01, 60), show_default=True,
              help="Seconds between measurements of each link's CE and queue length.")
@click.option("--control", default="scot", type=click.Choice(["scot", "tid"]), show_default=True,
              help="OctopiA's control plane, or the PADRES (TID) baseline the paper measures it against: "
                   "advertisements to every router, no routing by summaries (docs/papers.md).")
def router(log_level, routing, delta, interval, control, **kw) -> None:
    """Run a router: the region's gateway on the inter-region overlay (set --region)."""
    from echelon.router.server import RouterNode

    setup_logging("router", log_level)
    _serve(lambda: RouterNode(_config(**kw), routing=routing, delta=delta, interval=interval, control=control))


@click.command()
@service_options
@click.option("--peers", multiple=True, help="All membership replica addresses, this one included (comma list).")
@click.option("--tombstone-ttl", default=300.0, type=click.FloatRange(0), show_default=True,
              help="Seconds a DEAD or LEFT member stays in the view before it is dropped.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              help="Where topics, ACLs and the routing plan are kept (SQLite, WAL, fsynced). Unset: in memory.")
def membership(log_level, peers, tombstone_ttl, data_dir, **kw) -> None:
    """Run a membership replica: views, topics, routing plans, replicated with its peers."""
    from echelon.membership.server import MembershipNode

    setup_logging("membership", log_level)
    _serve(lambda: MembershipNode(_config(**kw), peers=_split(peers), tombstone_ttl=tombstone_ttl,
                                  data_dir=data_dir))


