"""Limits that keep one client from hurting the others, per identity on one server.

- Publish rate: a token bucket per identity (`publish_rate` events/s, `publish_burst`
  deep). An event over the rate is refused in its own ack with RESOURCE_EXHAUSTED and
  the stream stays open: the producer slows down and retries, nothing else is affected.
- Subscriptions: at most `subscriptions` open subscription streams per identity.
- Streams: at most `streams_per_identity` concurrent streaming calls per identity and
  `streams_per_connection` per connection (gRPC's peer address), so one client cannot
  hold all of an agent's memory in stream state.
- Sizes: `max_message_bytes` is the server's gRPC receive limit; an agent's is lower,
  `max_request_bytes`, the largest request a client sends it (a publish slice or batch),
  so that gRPC core refuses a larger one before Python receives a byte of it
  (agent/server.py `receive_limit`; docs/security.md, "The agent's receive limit").
  Attribute and payload sizes are the topic schema's (`max_length`, `max_attribute_bytes`).
- Durable subscriptions: `durable_subscriptions` an identity may own in the cluster,
  `durable_max_messages`, `durable_max_bytes`,
  `durable_max_idle_seconds`, `durable_max_replicas` cap what a client may ask for
  (agent/durable/caps.py; docs/security.md).
- Filters: `filter_max_bytes`, `filter_max_predicates`, `filter_max_depth`,
  `filter_max_terms` bound what one subscription's filter may cost, for every identity
  (contract/filters.py `FilterLimits`; docs/filters.md, "Caps").

The cluster admin may set `subscriptions` and the durable caps per identity, replacing
these for it (core/acl.py CAP_FIELDS, `echelon acl cap`; `Access.limit`).

Everything is on by default with values a real workload does not reach (tens of
thousands of events per second per identity on one agent; the loadtests stay well
below). Members (the cluster's own services) are not limited: their traffic is what the
clients' limits already shaped. All decisions take `now` from the caller.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

from echelon.core.acl import AclError, make_caps
from echelon.contract.filters import DEFAULT_LIMITS, FilterLimits
from echelon.contract.transport import MAX_MESSAGE_BYTES

_IDLE_BUCKETS = 10_000  # past this many buckets, full (idle) ones are dropped


@dataclass(frozen=True)
class Limits:
    publish_rate: float = 50_000.0
    publish_burst: int = 100_000
    subscriptions: int = 10_000
    streams_per_identity: int = 20_000
    streams_per_connection: int = 5_000
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # An agent's receive limit: the SDK's largest request, a 4 MiB slice, or a batch closed
    # past 1 MiB with one more event of 4 MiB, each with up to 1 MiB of attributes, plus framing.
    max_request_bytes: int = (6 << 20) + (64 << 10)
    # Caps on what a client may ask of a durable subscription (agent/durable/caps.py).
    durable_subscriptions: int = 1_000
    durable_max_messages: int = 1_000_000
    durable_max_bytes: int = 1 << 30
    durable_max_idle_seconds: int = 30 * 86400
    durable_max_replicas: int = 3
    # What one filter may cost (contract/filters.py); an operator may only tighten or loosen these
    # four, the derived caps of the normal form follow from them.
    filter_max_bytes: int = DEFAULT_LIMITS.max_bytes
    filter_max_predicates: int = DEFAULT_LIMITS.max_predicates
    filter_max_depth: int = DEFAULT_LIMITS.max_depth
    filter_max_terms: int = DEFAULT_LIMITS.max_terms

    def filters(self) -> FilterLimits:
        return FilterLimits(max_bytes=self.filter_max_bytes, max_predicates=self.filter_max_predicates,
                            max_depth=self.filter_max_depth, max_terms=self.filter_max_terms,
                            max_expanded=max(DEFAULT_LIMITS.max_expanded, self.filter_max_predicates))

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            if getattr(self, name) <= 0:
                raise ValueError(f"limit {name} must be positive, not {getattr(self, name)}")


def parse_limits(text: str) -> Limits:
    """`publish_rate=500,subscriptions=100` (any of Limits' fields; the rest keep their
    defaults) -> Limits; ValueError names what is wrong."""
    fields = {f: type(getattr(Limits(), f)) for f in Limits.__dataclass_fields__}
    values = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, _, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in fields:
            raise ValueError(f"limit {name!r}: one of {', '.join(fields)}")
        try:
            values[name] = fields[name](value.strip())
        except ValueError:
            raise ValueError(f"limit {name}={value!r}: not a number") from None
    return Limits(**values)


def parse_identity_caps(text: str) -> dict[str, dict[str, int]]:
    """`{"user:ann": {"durable_subscriptions": 20}}` (JSON; "" for none) -> principal ->
    caps (core/acl.py CAP_FIELDS); ValueError names what is wrong."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"identity caps: not JSON ({e})") from None
    if not isinstance(data, dict) or not all(isinstance(c, dict) for c in data.values()):
        raise ValueError("identity caps: a JSON object of principal -> {cap: number}")
    try:  # a YAML number may come through a template as a float ("1e+06")
        return {p: make_caps(p, {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in c.items()})
                for p, c in data.items()}
    except AclError as e:
        raise ValueError(f"identity caps: {e}") from None


class TokenBucket:
    """`rate` tokens per second, at most `burst` held; starts full."""

    def __init__(self, rate: float, burst: float, now: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = float(burst), now

    def take_up_to(self, now: float, n: int) -> int:
        """Up to `n` whole tokens at once: as many as `n` events taking one each would get
        (the first ones; the rest would be refused, nothing refilling at one `now`)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        k = min(n, int(self.tokens))
        self.tokens -= k
        return k

    def give_back(self, n: int) -> None:
        """Tokens taken by `take_up_to` and not used (at the same `now`)."""
        self.tokens = min(self.burst, self.tokens + n)

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.at) * self.rate >= self.burst


class Quotas:
    """The counters of one server. Keys are identity keys and connection (peer) names."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._buckets: dict[str, TokenBucket] = {}
        self.streams: Counter[str] = Counter()
        self.connections: Counter[str] = Counter()
        self.subscriptions: Counter[str] = Counter()

    def publish_bucket(self, who: str, now: float) -> TokenBucket:
        """The identity's publish rate (made full for a new one)."""
        bucket = self._buckets.get(who)
        if bucket is None:
            if len(self._buckets) >= _IDLE_BUCKETS:
                self._buckets = {k: b for k, b in self._buckets.items() if not b.full(now)}
            bucket = self._buckets[who] = TokenBucket(self.limits.publish_rate, self.limits.publish_burst, now)
        return bucket

    def over_rate(self, who: str) -> str:
        """Why an event of `who` is refused by its rate."""
        return (f"publish rate of {who} over its limit of {self.limits.publish_rate:g} events/s "
                f"(burst {self.limits.publish_burst}): slow down and retry")

    def open_stream(self, who: str, peer: str) -> str | None:
        """Count a streaming call; None, or why it is refused (then nothing was counted)."""
        lim = self.limits
        if self.streams[who] >= lim.streams_per_identity:
            return f"{who} holds {self.streams[who]} streams on this server, the limit is {lim.streams_per_identity}"
        if self.connections[peer] >= lim.streams_per_connection:
            return (f"connection {peer} holds {self.connections[peer]} streams, "
                    f"the limit is {lim.streams_per_connection}")
        self.streams[who] += 1
        self.connections[peer] += 1
        return None

    def close_stream(self, who: str, peer: str) -> None:
        for counter, key in ((self.streams, who), (self.connections, peer)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

    def open_subscription(self, who: str, most: int | None = None) -> str | None:
        """Count an open subscription of `who` (at most `most`, default the limit)."""
        most = self.limits.subscriptions if most is None else most
        if self.subscriptions[who] >= most:
            return f"{who} holds {self.subscriptions[who]} subscriptions here, the limit is subscriptions={most}"
        self.subscriptions[who] += 1
        return None

    def close_subscription(self, who: str) -> None:
        self.subscriptions[who] -= 1
        if self.subscriptions[who] <= 0:
            del self.subscriptions[who]
