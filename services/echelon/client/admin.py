"""What the Client's admin calls return: plain dataclasses, not protobuf messages.

    t = await client.get_topic("quotes")
    print(t.name, [str(a) for a in t.attributes])     # quotes ['Symbol:string', 'High:float:0:500']
    info = await client.get_subscription("billing")
    print(info.backlog_messages, info.holders)

Field names are the wire's (protos/echelon/v1), so reading code written against the
messages keeps working; `as_dict()` gives JSON-ready values.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.contract.wire import filter_from_pb, schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import pubsub_pb2 as ppb


def attribute_spec(a: Attribute) -> str:
    """The `name:type[:min:max]` form `create_topic` takes (docs/filters.md)."""
    if a.type is AttrType.STRING:
        return f"{a.name}:string" + (f":{a.max_length}" if a.max_length else "")
    if a.min is None and a.max is None:
        return f"{a.name}:{a.type.value}"

    def bound(x: float | None) -> str:
        return "" if x is None else f"{x:g}"

    return f"{a.name}:{a.type.value}:{bound(a.min)}:{bound(a.max)}"


@dataclass(frozen=True)
class DurableCaps:
    """What a durable subscription of a topic may ask for, under the agents' own caps; 0 is
    no cap of the topic's own (docs/security.md)."""
    max_messages: int = 0
    max_bytes: int = 0
    idle_seconds: int = 0
    replicas: int = 0


@dataclass(frozen=True)
class Topic:
    name: str
    schema: Schema
    created_unix_ms: int = 0
    retention_bytes: int = 0  # 0: the agents' default
    retention_seconds: int = 0
    durable_caps: DurableCaps = field(default_factory=lambda: DurableCaps())

    @property
    def attributes(self) -> tuple[Attribute, ...]:
        return self.schema.attributes

    @classmethod
    def from_pb(cls, t: pb.Topic) -> "Topic":
        return cls(t.name, schema_from_pb(t.schema), t.created_unix_ms, t.retention_bytes, t.retention_seconds,
                   DurableCaps(t.durable_caps.max_messages, t.durable_caps.max_bytes,
                               t.durable_caps.idle_seconds, t.durable_caps.replicas))

    def as_dict(self) -> dict:
        return {"name": self.name, "attributes": [attribute_spec(a) for a in self.attributes],
                "created_unix_ms": self.created_unix_ms, "retention_bytes": self.retention_bytes,
                "retention_seconds": self.retention_seconds, "durable_caps": asdict(self.durable_caps)}


@dataclass(frozen=True)
class AclRule:
    principal: str
    pattern: str
    rights: tuple[str, ...]

    @classmethod
    def from_pb(cls, r: pb.AclRule) -> "AclRule":
        return cls(r.principal, r.pattern, tuple(r.rights))

    def as_dict(self) -> dict:
        return {"principal": self.principal, "pattern": self.pattern, "rights": list(self.rights)}


def caps_from_pb(caps: pb.IdentityCaps) -> dict[str, int]:
    """An identity's caps as a dict of the fields set."""
    return {f.name: v for f, v in caps.ListFields()}


def _name(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower().replace("_", "-")


@dataclass(frozen=True)
class SubscriptionInfo:
    """A durable subscription's record and backlog, as the answering holder has them."""

    name: str
    topic: str
    filter: str  # in the filter language ("" matches everything)
    holders: tuple[str, ...]  # the first alive one serves its stream
    start: str  # "now" or "earliest"
    policy: str  # past the bound: "lag", "drop-oldest", "drop-new", "reject-publish"
    max_messages: int
    max_bytes: int
    idle_seconds: int
    replicas: int
    created_unix_nanos: int
    last_active_unix_nanos: int
    backlog_messages: int
    backlog_bytes: int
    oldest_unacked_unix_nanos: int  # 0: no backlog
    dropped: int  # messages lost to the backlog policy
    attached: bool
    answered_by: str
    seeks: int
    # Its redelivery policy (docs/guarantees.md, "Dead messages"); 0 max_deliveries: no bound.
    ack_deadline: float = 60.0  # seconds; 0: none
    max_deliveries: int = 0
    dead_letter_topic: str = ""

    @classmethod
    def from_pb(cls, s: dpb.DurableSubscription) -> "SubscriptionInfo":
        o = s.options
        return cls(s.name, s.topic, str(filter_from_pb(s.filter)) if s.HasField("filter") else "", tuple(s.holders),
                   _name(ppb.StartPosition, o.start, "START_POSITION_"),
                   _name(ppb.BacklogPolicy, o.policy, "BACKLOG_POLICY_").replace("unspecified", "lag"), o.max_messages, o.max_bytes,
                   o.idle_seconds, o.replicas, s.created_unix_nanos, s.last_active_unix_nanos, s.backlog_messages,
                   s.backlog_bytes, s.oldest_unacked_unix_nanos, s.dropped, s.attached, s.answered_by, s.seeks,
                   *_redelivery(s))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["holders"] = list(self.holders)
        return d


def _redelivery(s: dpb.DurableSubscription) -> tuple[float, int, str]:
    """(ack deadline in seconds, max deliveries, dead-letter topic); a record from before
    the policy existed has the defaults."""
    r = s.redelivery
    if not s.HasField("redelivery"):
        return 60.0, 0, ""
    return (0.0 if r.no_ack_deadline else (r.ack_deadline_ms or 60_000) / 1000), r.max_deliveries, r.dead_letter_topic
