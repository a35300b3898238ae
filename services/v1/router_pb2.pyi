from echelon.v1 import relay_pb2 as _relay_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class AttachRequest(_message.Message):
    __slots__ = ("member_id", "region")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    region: str
    def __init__(self, member_id: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class AttachResponse(_message.Message):
    __slots__ = ("router_id",)
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    def __init__(self, router_id: _Optional[str] = ...) -> None: ...
