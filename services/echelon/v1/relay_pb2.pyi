from echelon.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RelayFrame(_message.Message):
    __slots__ = ("seq", "source", "messages", "source_key", "ack_may_wait", "zstd")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_KEY_FIELD_NUMBER: _ClassVar[int]
    ACK_MAY_WAIT_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    seq: int
    source: str
    messages: _containers.RepeatedCompositeFieldContainer[RelayMessage]
    source_key: str
    ack_may_wait: bool
    zstd: bytes
    def __init__(self, seq: _Optional[int] = ..., source: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[RelayMessage, _Mapping]]] = ..., source_key: _Optional[str] = ..., ack_may_wait: _Optional[bool] = ..., zstd: _Optional[bytes] = ...) -> None: ...

class RelayMessage(_message.Message):
    __slots__ = ("event", "destinations", "slice_index", "slice_count", "payload_size", "stripe", "aborted", "encoded_event")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    SLICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SLICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    ENCODED_EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _common_pb2.Event
    destinations: _containers.RepeatedScalarFieldContainer[str]
    slice_index: int
    slice_count: int
    payload_size: int
    stripe: int
    aborted: bool
    encoded_event: bytes
    def __init__(self, event: _Optional[_Union[_common_pb2.Event, _Mapping]] = ..., destinations: _Optional[_Iterable[str]] = ..., slice_index: _Optional[int] = ..., slice_count: _Optional[int] = ..., payload_size: _Optional[int] = ..., stripe: _Optional[int] = ..., aborted: _Optional[bool] = ..., encoded_event: _Optional[bytes] = ...) -> None: ...

class RelayAck(_message.Message):
    __slots__ = ("seqs",)
    SEQS_FIELD_NUMBER: _ClassVar[int]
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, seqs: _Optional[_Iterable[int]] = ...) -> None: ...
