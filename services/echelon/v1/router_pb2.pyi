from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

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
    __slots__ = ("router_id", "region", "position", "region_index", "regions", "routing", "links")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REGION_INDEX_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    region: str
    position: int
    region_index: int
    regions: _containers.RepeatedScalarFieldContainer[str]
    routing: str
    links: _containers.RepeatedCompositeFieldContainer[LinkStatus]
    def __init__(self, router_id: _Optional[str] = ..., region: _Optional[str] = ..., position: _Optional[int] = ..., region_index: _Optional[int] = ..., regions: _Optional[_Iterable[str]] = ..., routing: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkStatus, _Mapping]]] = ...) -> None: ...
