from echelon.v1 import membership_pb2 as _membership_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CrawlStepRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: _membership_pb2.Role
    def __init__(self, role: _Optional[_Union[_membership_pb2.Role, str]] = ...) -> None: ...

class CrawlStepResponse(_message.Message):
    __slots__ = ("holders", "neighbours", "view_age_seconds")
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOURS_FIELD_NUMBER: _ClassVar[int]
    VIEW_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    holders: _containers.RepeatedCompositeFieldContainer[_membership_pb2.Member]
    neighbours: _containers.RepeatedCompositeFieldContainer[_membership_pb2.Member]
    view_age_seconds: float
    def __init__(self, holders: _Optional[_Iterable[_Union[_membership_pb2.Member, _Mapping]]] = ..., neighbours: _Optional[_Iterable[_Union[_membership_pb2.Member, _Mapping]]] = ..., view_age_seconds: _Optional[float] = ...) -> None: ...
