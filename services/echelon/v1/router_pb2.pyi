from echelon.v1 import common_pb2 as _common_pb2
from echelon.v1 import matcher_pb2 as _matcher_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ControlKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONTROL_KIND_UNSPECIFIED: _ClassVar[ControlKind]
    CONTROL_KIND_SUB: _ClassVar[ControlKind]
    CONTROL_KIND_UNSUB: _ClassVar[ControlKind]
    CONTROL_KIND_CIB_SET: _ClassVar[ControlKind]
    CONTROL_KIND_CIB_CLEAR: _ClassVar[ControlKind]
    CONTROL_KIND_ADV: _ClassVar[ControlKind]
    CONTROL_KIND_UNADV: _ClassVar[ControlKind]
CONTROL_KIND_UNSPECIFIED: ControlKind
CONTROL_KIND_SUB: ControlKind
CONTROL_KIND_UNSUB: ControlKind
CONTROL_KIND_CIB_SET: ControlKind
CONTROL_KIND_CIB_CLEAR: ControlKind
CONTROL_KIND_ADV: ControlKind
CONTROL_KIND_UNADV: ControlKind

class Advertisement(_message.Message):
    __slots__ = ("topic", "bounds")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    bounds: _common_pb2.Filter
    def __init__(self, topic: _Optional[str] = ..., bounds: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ...) -> None: ...

class Subgroup(_message.Message):
    __slots__ = ("topic", "filter")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    filter: _common_pb2.Filter
    def __init__(self, topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("kind", "sender", "region", "subscriptions", "ids", "subgroups", "full", "last", "complete", "advertisements")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    SUBGROUPS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ADVERTISEMENTS_FIELD_NUMBER: _ClassVar[int]
    kind: ControlKind
    sender: str
    region: str
    subscriptions: _containers.RepeatedCompositeFieldContainer[_matcher_pb2.Subscription]
    ids: _containers.RepeatedScalarFieldContainer[str]
    subgroups: _containers.RepeatedCompositeFieldContainer[Subgroup]
    full: bool
    last: bool
    complete: bool
    advertisements: _containers.RepeatedCompositeFieldContainer[Advertisement]
    def __init__(self, kind: _Optional[_Union[ControlKind, str]] = ..., sender: _Optional[str] = ..., region: _Optional[str] = ..., subscriptions: _Optional[_Iterable[_Union[_matcher_pb2.Subscription, _Mapping]]] = ..., ids: _Optional[_Iterable[str]] = ..., subgroups: _Optional[_Iterable[_Union[Subgroup, _Mapping]]] = ..., full: _Optional[bool] = ..., last: _Optional[bool] = ..., complete: _Optional[bool] = ..., advertisements: _Optional[_Iterable[_Union[Advertisement, _Mapping]]] = ...) -> None: ...

class ControlReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LinkStatus(_message.Message):
    __slots__ = ("peer", "kind", "queue_length", "congestion_element", "congested")
    PEER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONGESTION_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    CONGESTED_FIELD_NUMBER: _ClassVar[int]
    peer: str
    kind: str
    queue_length: int
    congestion_element: float
    congested: bool
    def __init__(self, peer: _Optional[str] = ..., kind: _Optional[str] = ..., queue_length: _Optional[int] = ..., congestion_element: _Optional[float] = ..., congested: _Optional[bool] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("router_id", "region", "position", "region_index", "regions", "routing", "links", "subgroups", "complete", "summaries", "advertisements", "srt", "control_sent", "control", "control_applied_ns", "advertisement_applied_ns")
    class ControlSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REGION_INDEX_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    SUBGROUPS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    ADVERTISEMENTS_FIELD_NUMBER: _ClassVar[int]
    SRT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_SENT_FIELD_NUMBER: _ClassVar[int]
    CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONTROL_APPLIED_NS_FIELD_NUMBER: _ClassVar[int]
    ADVERTISEMENT_APPLIED_NS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    region: str
    position: int
    region_index: int
    regions: _containers.RepeatedScalarFieldContainer[str]
    routing: str
    links: _containers.RepeatedCompositeFieldContainer[LinkStatus]
    subgroups: int
    complete: bool
    summaries: _containers.RepeatedCompositeFieldContainer[RegionSummary]
    advertisements: int
    srt: int
    control_sent: _containers.ScalarMap[str, int]
    control: str
    control_applied_ns: int
    advertisement_applied_ns: int
    def __init__(self, router_id: _Optional[str] = ..., region: _Optional[str] = ..., position: _Optional[int] = ..., region_index: _Optional[int] = ..., regions: _Optional[_Iterable[str]] = ..., routing: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkStatus, _Mapping]]] = ..., subgroups: _Optional[int] = ..., complete: _Optional[bool] = ..., summaries: _Optional[_Iterable[_Union[RegionSummary, _Mapping]]] = ..., advertisements: _Optional[int] = ..., srt: _Optional[int] = ..., control_sent: _Optional[_Mapping[str, int]] = ..., control: _Optional[str] = ..., control_applied_ns: _Optional[int] = ..., advertisement_applied_ns: _Optional[int] = ...) -> None: ...

class RegionSummary(_message.Message):
    __slots__ = ("region", "complete", "subgroups", "answered")
    REGION_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SUBGROUPS_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    region: str
    complete: bool
    subgroups: int
    answered: int
    def __init__(self, region: _Optional[str] = ..., complete: _Optional[bool] = ..., subgroups: _Optional[int] = ..., answered: _Optional[int] = ...) -> None: ...
