from echelon.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_AGENT: _ClassVar[Role]
    ROLE_MATCHER: _ClassVar[Role]
    ROLE_ROUTER: _ClassVar[Role]
    ROLE_MEMBERSHIP: _ClassVar[Role]

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_ALIVE: _ClassVar[MemberState]
    MEMBER_STATE_SUSPECT: _ClassVar[MemberState]
    MEMBER_STATE_DEAD: _ClassVar[MemberState]
    MEMBER_STATE_LEFT: _ClassVar[MemberState]
ROLE_UNSPECIFIED: Role
ROLE_AGENT: Role
ROLE_MATCHER: Role
ROLE_ROUTER: Role
ROLE_MEMBERSHIP: Role
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_ALIVE: MemberState
MEMBER_STATE_SUSPECT: MemberState
MEMBER_STATE_DEAD: MemberState
MEMBER_STATE_LEFT: MemberState

class Member(_message.Message):
    __slots__ = ("id", "role", "address", "region", "capacity", "incarnation", "state", "publishes", "subscribes", "last_beat_unix_ms", "metrics_address")
    ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBES_FIELD_NUMBER: _ClassVar[int]
    LAST_BEAT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: str
    role: Role
    address: str
    region: str
    capacity: int
    incarnation: int
    state: MemberState
    publishes: _containers.RepeatedScalarFieldContainer[str]
    subscribes: _containers.RepeatedScalarFieldContainer[str]
    last_beat_unix_ms: int
    metrics_address: str
    def __init__(self, id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., address: _Optional[str] = ..., region: _Optional[str] = ..., capacity: _Optional[int] = ..., incarnation: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ..., publishes: _Optional[_Iterable[str]] = ..., subscribes: _Optional[_Iterable[str]] = ..., last_beat_unix_ms: _Optional[int] = ..., metrics_address: _Optional[str] = ...) -> None: ...

class View(_message.Message):
    __slots__ = ("version", "members", "topics", "acls")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    version: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.Topic]
    acls: _containers.RepeatedCompositeFieldContainer[_common_pb2.AclRule]
    def __init__(self, version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[_common_pb2.Topic, _Mapping]]] = ..., acls: _Optional[_Iterable[_Union[_common_pb2.AclRule, _Mapping]]] = ...) -> None: ...

class ViewDelta(_message.Message):
    __slots__ = ("from_version", "version", "upserted", "topics_upserted", "topics_deleted", "removed", "acls_upserted", "acls_deleted")
    FROM_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    TOPICS_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    TOPICS_DELETED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    ACLS_UPSERTED_FIELD_NUMBER: _ClassVar[int]
    ACLS_DELETED_FIELD_NUMBER: _ClassVar[int]
    from_version: int
    version: int
    upserted: _containers.RepeatedCompositeFieldContainer[Member]
    topics_upserted: _containers.RepeatedCompositeFieldContainer[_common_pb2.Topic]
    topics_deleted: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    acls_upserted: _containers.RepeatedCompositeFieldContainer[_common_pb2.AclRule]
    acls_deleted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, from_version: _Optional[int] = ..., version: _Optional[int] = ..., upserted: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., topics_upserted: _Optional[_Iterable[_Union[_common_pb2.Topic, _Mapping]]] = ..., topics_deleted: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., acls_upserted: _Optional[_Iterable[_Union[_common_pb2.AclRule, _Mapping]]] = ..., acls_deleted: _Optional[_Iterable[str]] = ...) -> None: ...

class ViewUpdate(_message.Message):
    __slots__ = ("snapshot", "delta", "keepalive")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    snapshot: View
    delta: ViewDelta
    keepalive: int
    def __init__(self, snapshot: _Optional[_Union[View, _Mapping]] = ..., delta: _Optional[_Union[ViewDelta, _Mapping]] = ..., keepalive: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("member",)
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    member: Member
    def __init__(self, member: _Optional[_Union[Member, _Mapping]] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("view", "heartbeat_interval_ms")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    view: View
    heartbeat_interval_ms: int
    def __init__(self, view: _Optional[_Union[View, _Mapping]] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class Beat(_message.Message):
    __slots__ = ("member_id", "incarnation", "has_topics", "publishes", "subscribes")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HAS_TOPICS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBES_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    incarnation: int
    has_topics: bool
    publishes: _containers.RepeatedScalarFieldContainer[str]
    subscribes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, member_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., has_topics: _Optional[bool] = ..., publishes: _Optional[_Iterable[str]] = ..., subscribes: _Optional[_Iterable[str]] = ...) -> None: ...

class BeatReply(_message.Message):
    __slots__ = ("state", "incarnation", "view_version")
    STATE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    VIEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    state: MemberState
    incarnation: int
    view_version: int
    def __init__(self, state: _Optional[_Union[MemberState, str]] = ..., incarnation: _Optional[int] = ..., view_version: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("member_id", "known_version")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    known_version: int
    def __init__(self, member_id: _Optional[str] = ..., known_version: _Optional[int] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("member_id", "incarnation")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    incarnation: int
    def __init__(self, member_id: _Optional[str] = ..., incarnation: _Optional[int] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SuspectRequest(_message.Message):
    __slots__ = ("reporter", "member_id", "incarnation", "reason")
    REPORTER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    reporter: str
    member_id: str
    incarnation: int
    reason: str
    def __init__(self, reporter: _Optional[str] = ..., member_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class SuspectResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunReport(_message.Message):
    __slots__ = ("result", "reason")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    result: str
    reason: str
    def __init__(self, result: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReportRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Zone(_message.Message):
    __slots__ = ("id", "topic", "low", "high", "owner", "replicas")
    ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    id: str
    topic: str
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    owner: str
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., topic: _Optional[str] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ..., owner: _Optional[str] = ..., replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class Clique(_message.Message):
    __slots__ = ("id", "members")
    ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class BucketHint(_message.Message):
    __slots__ = ("member_id", "weight")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    weight: float
    def __init__(self, member_id: _Optional[str] = ..., weight: _Optional[float] = ...) -> None: ...

class RoutingPlan(_message.Message):
    __slots__ = ("version", "epoch", "zones", "cliques", "bucket_hints", "origin", "created_unix_ms", "predicted_gain")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    CLIQUES_FIELD_NUMBER: _ClassVar[int]
    BUCKET_HINTS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_GAIN_FIELD_NUMBER: _ClassVar[int]
    version: int
    epoch: int
    zones: _containers.RepeatedCompositeFieldContainer[Zone]
    cliques: _containers.RepeatedCompositeFieldContainer[Clique]
    bucket_hints: _containers.RepeatedCompositeFieldContainer[BucketHint]
    origin: str
    created_unix_ms: int
    predicted_gain: float
    def __init__(self, version: _Optional[int] = ..., epoch: _Optional[int] = ..., zones: _Optional[_Iterable[_Union[Zone, _Mapping]]] = ..., cliques: _Optional[_Iterable[_Union[Clique, _Mapping]]] = ..., bucket_hints: _Optional[_Iterable[_Union[BucketHint, _Mapping]]] = ..., origin: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., predicted_gain: _Optional[float] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchPlanRequest(_message.Message):
    __slots__ = ("known_version",)
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    known_version: int
    def __init__(self, known_version: _Optional[int] = ...) -> None: ...

class PushPlanResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class Stamp(_message.Message):
    __slots__ = ("version", "origin")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    version: int
    origin: str
    def __init__(self, version: _Optional[int] = ..., origin: _Optional[str] = ...) -> None: ...

class TopicEntry(_message.Message):
    __slots__ = ("name", "stamp", "topic", "deleted")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    name: str
    stamp: Stamp
    topic: _common_pb2.Topic
    deleted: bool
    def __init__(self, name: _Optional[str] = ..., stamp: _Optional[_Union[Stamp, _Mapping]] = ..., topic: _Optional[_Union[_common_pb2.Topic, _Mapping]] = ..., deleted: _Optional[bool] = ...) -> None: ...

class PlanEntry(_message.Message):
    __slots__ = ("stamp", "plan")
    STAMP_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    stamp: Stamp
    plan: RoutingPlan
    def __init__(self, stamp: _Optional[_Union[Stamp, _Mapping]] = ..., plan: _Optional[_Union[RoutingPlan, _Mapping]] = ...) -> None: ...

class ReplicaState(_message.Message):
    __slots__ = ("origin", "topics", "plan", "acls")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    origin: str
    topics: _containers.RepeatedCompositeFieldContainer[TopicEntry]
    plan: PlanEntry
    acls: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, origin: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[TopicEntry, _Mapping]]] = ..., plan: _Optional[_Union[PlanEntry, _Mapping]] = ..., acls: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class AclEntry(_message.Message):
    __slots__ = ("key", "stamp", "rule", "deleted")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STAMP_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    key: str
    stamp: Stamp
    rule: _common_pb2.AclRule
    deleted: bool
    def __init__(self, key: _Optional[str] = ..., stamp: _Optional[_Union[Stamp, _Mapping]] = ..., rule: _Optional[_Union[_common_pb2.AclRule, _Mapping]] = ..., deleted: _Optional[bool] = ...) -> None: ...

class DigestRequest(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: str
    def __init__(self, origin: _Optional[str] = ...) -> None: ...

class DigestResponse(_message.Message):
    __slots__ = ("origin", "topics", "plan", "acls")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    origin: str
    topics: str
    plan: str
    acls: str
    def __init__(self, origin: _Optional[str] = ..., topics: _Optional[str] = ..., plan: _Optional[str] = ..., acls: _Optional[str] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: str
    def __init__(self, origin: _Optional[str] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
