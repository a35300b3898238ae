from echelon.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Subscription(_message.Message):
    __slots__ = ("id", "agent", "topic", "filter", "version")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent: str
    topic: str
    filter: _common_pb2.Filter
    version: int
    def __init__(self, id: _Optional[str] = ..., agent: _Optional[str] = ..., topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ..., version: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("subscriptions", "refill")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REFILL_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    refill: str
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., refill: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("registered",)
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: int
    def __init__(self, registered: _Optional[int] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("ids", "version")
    IDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    version: int
    def __init__(self, ids: _Optional[_Iterable[str]] = ..., version: _Optional[int] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("batch_id", "events", "agents_only", "topic", "layout", "zones", "zstd")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_ONLY_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.Event]
    agents_only: bool
    topic: str
    layout: str
    zones: _containers.RepeatedCompositeFieldContainer[ZoneEvents]
    zstd: bytes
    def __init__(self, batch_id: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_common_pb2.Event, _Mapping]]] = ..., agents_only: _Optional[bool] = ..., topic: _Optional[str] = ..., layout: _Optional[str] = ..., zones: _Optional[_Iterable[_Union[ZoneEvents, _Mapping]]] = ..., zstd: _Optional[bytes] = ...) -> None: ...

class AgentMatches(_message.Message):
    __slots__ = ("agent", "subscriptions")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    subscriptions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, agent: _Optional[str] = ..., subscriptions: _Optional[_Iterable[str]] = ...) -> None: ...

class MatchResult(_message.Message):
    __slots__ = ("agents",)
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[AgentMatches]
    def __init__(self, agents: _Optional[_Iterable[_Union[AgentMatches, _Mapping]]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("batch_id", "results", "stale", "entry", "zstd")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    results: _containers.RepeatedCompositeFieldContainer[MatchResult]
    stale: str
    entry: str
    zstd: bytes
    def __init__(self, batch_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[MatchResult, _Mapping]]] = ..., stale: _Optional[str] = ..., entry: _Optional[str] = ..., zstd: _Optional[bytes] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("sender", "topic", "layouts", "subscriptions")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    sender: str
    topic: str
    layouts: _containers.RepeatedScalarFieldContainer[str]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, sender: _Optional[str] = ..., topic: _Optional[str] = ..., layouts: _Optional[_Iterable[str]] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...

class DropRequest(_message.Message):
    __slots__ = ("sender", "ids", "versions", "sent_to")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SENT_TO_FIELD_NUMBER: _ClassVar[int]
    sender: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    versions: _containers.RepeatedScalarFieldContainer[int]
    sent_to: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sender: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ..., versions: _Optional[_Iterable[int]] = ..., sent_to: _Optional[_Iterable[str]] = ...) -> None: ...

class DropResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, removed: _Optional[_Iterable[str]] = ...) -> None: ...

class ZoneEvents(_message.Message):
    __slots__ = ("zone", "events")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    zone: str
    events: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, zone: _Optional[str] = ..., events: _Optional[_Iterable[int]] = ...) -> None: ...

class LayoutStatus(_message.Message):
    __slots__ = ("topic", "adopted", "pushed", "filled", "active", "complete")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    PUSHED_FIELD_NUMBER: _ClassVar[int]
    FILLED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    adopted: str
    pushed: bool
    filled: bool
    active: str
    complete: bool
    def __init__(self, topic: _Optional[str] = ..., adopted: _Optional[str] = ..., pushed: _Optional[bool] = ..., filled: _Optional[bool] = ..., active: _Optional[str] = ..., complete: _Optional[bool] = ...) -> None: ...

class SyncRequest(_message.Message):
    __slots__ = ("member", "incarnation", "seq", "layouts")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LAYOUTS_FIELD_NUMBER: _ClassVar[int]
    member: str
    incarnation: int
    seq: int
    layouts: _containers.RepeatedCompositeFieldContainer[LayoutStatus]
    def __init__(self, member: _Optional[str] = ..., incarnation: _Optional[int] = ..., seq: _Optional[int] = ..., layouts: _Optional[_Iterable[_Union[LayoutStatus, _Mapping]]] = ...) -> None: ...

class SyncResponse(_message.Message):
    __slots__ = ("empty", "lease_ms")
    EMPTY_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    empty: _containers.RepeatedCompositeFieldContainer[ZoneRef]
    lease_ms: int
    def __init__(self, empty: _Optional[_Iterable[_Union[ZoneRef, _Mapping]]] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ListZonesRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class ZoneInfo(_message.Message):
    __slots__ = ("topic", "id", "low", "high", "members", "subscriptions", "mirrors")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    MIRRORS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    id: str
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    members: _containers.RepeatedScalarFieldContainer[str]
    subscriptions: int
    mirrors: int
    def __init__(self, topic: _Optional[str] = ..., id: _Optional[str] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ..., members: _Optional[_Iterable[str]] = ..., subscriptions: _Optional[int] = ..., mirrors: _Optional[int] = ...) -> None: ...

class TopicLayout(_message.Message):
    __slots__ = ("topic", "active", "pending", "source", "zones")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    active: str
    pending: str
    source: str
    zones: _containers.RepeatedCompositeFieldContainer[ZoneInfo]
    def __init__(self, topic: _Optional[str] = ..., active: _Optional[str] = ..., pending: _Optional[str] = ..., source: _Optional[str] = ..., zones: _Optional[_Iterable[_Union[ZoneInfo, _Mapping]]] = ...) -> None: ...

class ListZonesResponse(_message.Message):
    __slots__ = ("member", "copies", "topics")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    COPIES_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    member: str
    copies: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicLayout]
    def __init__(self, member: _Optional[str] = ..., copies: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicLayout, _Mapping]]] = ...) -> None: ...

class Holding(_message.Message):
    __slots__ = ("id", "version")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: int
    def __init__(self, id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ReconcileRequest(_message.Message):
    __slots__ = ("agent", "digests")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    digests: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, agent: _Optional[str] = ..., digests: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ReconcileResponse(_message.Message):
    __slots__ = ("buckets", "holdings", "matchers")
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    MATCHERS_FIELD_NUMBER: _ClassVar[int]
    buckets: _containers.RepeatedScalarFieldContainer[int]
    holdings: _containers.RepeatedCompositeFieldContainer[Holding]
    matchers: int
    def __init__(self, buckets: _Optional[_Iterable[int]] = ..., holdings: _Optional[_Iterable[_Union[Holding, _Mapping]]] = ..., matchers: _Optional[int] = ...) -> None: ...

class HoldingsRequest(_message.Message):
    __slots__ = ("agent",)
    AGENT_FIELD_NUMBER: _ClassVar[int]
    agent: str
    def __init__(self, agent: _Optional[str] = ...) -> None: ...

class HoldingsResponse(_message.Message):
    __slots__ = ("holdings",)
    HOLDINGS_FIELD_NUMBER: _ClassVar[int]
    holdings: _containers.RepeatedCompositeFieldContainer[Holding]
    def __init__(self, holdings: _Optional[_Iterable[_Union[Holding, _Mapping]]] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("topic", "max_points")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    max_points: int
    def __init__(self, topic: _Optional[str] = ..., max_points: _Optional[int] = ...) -> None: ...

class PointSample(_message.Message):
    __slots__ = ("zone", "total", "coordinates")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    COORDINATES_FIELD_NUMBER: _ClassVar[int]
    zone: str
    total: int
    coordinates: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, zone: _Optional[str] = ..., total: _Optional[int] = ..., coordinates: _Optional[_Iterable[float]] = ...) -> None: ...

class TopicSample(_message.Message):
    __slots__ = ("topic", "dims", "layout", "source", "subscriptions", "events")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    dims: int
    layout: str
    source: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[PointSample]
    events: PointSample
    def __init__(self, topic: _Optional[str] = ..., dims: _Optional[int] = ..., layout: _Optional[str] = ..., source: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[PointSample, _Mapping]]] = ..., events: _Optional[_Union[PointSample, _Mapping]] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("member", "topics")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    member: str
    topics: _containers.RepeatedCompositeFieldContainer[TopicSample]
    def __init__(self, member: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[TopicSample, _Mapping]]] = ...) -> None: ...

class ZoneRef(_message.Message):
    __slots__ = ("topic", "layout", "zone")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    layout: str
    zone: str
    def __init__(self, topic: _Optional[str] = ..., layout: _Optional[str] = ..., zone: _Optional[str] = ...) -> None: ...

class RevokeRequest(_message.Message):
    __slots__ = ("sender", "zones")
    SENDER_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    sender: str
    zones: _containers.RepeatedCompositeFieldContainer[ZoneRef]
    def __init__(self, sender: _Optional[str] = ..., zones: _Optional[_Iterable[_Union[ZoneRef, _Mapping]]] = ...) -> None: ...

class RevokeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
