from echelon.v1 import common_pb2 as _common_pb2
from echelon.v1 import pubsub_pb2 as _pubsub_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DurableSubscription(_message.Message):
    __slots__ = ("name", "topic", "filter", "options", "holders", "created_unix_nanos", "last_active_unix_nanos", "backlog_messages", "backlog_bytes", "oldest_unacked_unix_nanos", "dropped", "attached", "answered_by", "seeks", "redelivery")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    SEEKS_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic: str
    filter: _common_pb2.Filter
    options: _pubsub_pb2.DurableOptions
    holders: _containers.RepeatedScalarFieldContainer[str]
    created_unix_nanos: int
    last_active_unix_nanos: int
    backlog_messages: int
    backlog_bytes: int
    oldest_unacked_unix_nanos: int
    dropped: int
    attached: bool
    answered_by: str
    seeks: int
    redelivery: _pubsub_pb2.RedeliveryPolicy
    def __init__(self, name: _Optional[str] = ..., topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ..., options: _Optional[_Union[_pubsub_pb2.DurableOptions, _Mapping]] = ..., holders: _Optional[_Iterable[str]] = ..., created_unix_nanos: _Optional[int] = ..., last_active_unix_nanos: _Optional[int] = ..., backlog_messages: _Optional[int] = ..., backlog_bytes: _Optional[int] = ..., oldest_unacked_unix_nanos: _Optional[int] = ..., dropped: _Optional[int] = ..., attached: _Optional[bool] = ..., answered_by: _Optional[str] = ..., seeks: _Optional[int] = ..., redelivery: _Optional[_Union[_pubsub_pb2.RedeliveryPolicy, _Mapping]] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("local", "owner")
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    local: bool
    owner: str
    def __init__(self, local: _Optional[bool] = ..., owner: _Optional[str] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[DurableSubscription]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[DurableSubscription, _Mapping]]] = ...) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("name", "local")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    local: bool
    def __init__(self, name: _Optional[str] = ..., local: _Optional[bool] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("name", "time_unix_nanos", "message", "local")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    time_unix_nanos: int
    message: _common_pb2.MessageId
    local: bool
    def __init__(self, name: _Optional[str] = ..., time_unix_nanos: _Optional[int] = ..., message: _Optional[_Union[_common_pb2.MessageId, _Mapping]] = ..., local: _Optional[bool] = ...) -> None: ...

class SeekResponse(_message.Message):
    __slots__ = ("backlog_messages",)
    BACKLOG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    backlog_messages: int
    def __init__(self, backlog_messages: _Optional[int] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("name", "local")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    local: bool
    def __init__(self, name: _Optional[str] = ..., local: _Optional[bool] = ...) -> None: ...

class DeleteSubscriptionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DurableChange(_message.Message):
    __slots__ = ("name", "create", "acks", "seek", "delete", "touch_unix_nanos", "full")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    TOUCH_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    name: str
    create: DurableSubscription
    acks: DurableAcks
    seek: SeekRequest
    delete: bool
    touch_unix_nanos: int
    full: BacklogFull
    def __init__(self, name: _Optional[str] = ..., create: _Optional[_Union[DurableSubscription, _Mapping]] = ..., acks: _Optional[_Union[DurableAcks, _Mapping]] = ..., seek: _Optional[_Union[SeekRequest, _Mapping]] = ..., delete: _Optional[bool] = ..., touch_unix_nanos: _Optional[int] = ..., full: _Optional[_Union[BacklogFull, _Mapping]] = ...) -> None: ...

class BacklogFull(_message.Message):
    __slots__ = ("topic", "filter", "full")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    filter: _common_pb2.Filter
    full: bool
    def __init__(self, topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ..., full: _Optional[bool] = ...) -> None: ...

class DurableAcks(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedCompositeFieldContainer[_common_pb2.MessageId]
    def __init__(self, ids: _Optional[_Iterable[_Union[_common_pb2.MessageId, _Mapping]]] = ...) -> None: ...

class ApplyResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DurableState(_message.Message):
    __slots__ = ("record", "backlog", "sender_started_unix_nanos", "acked")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    SENDER_STARTED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    record: DurableSubscription
    backlog: _containers.RepeatedCompositeFieldContainer[_common_pb2.Event]
    sender_started_unix_nanos: int
    acked: _containers.RepeatedCompositeFieldContainer[_common_pb2.MessageId]
    def __init__(self, record: _Optional[_Union[DurableSubscription, _Mapping]] = ..., backlog: _Optional[_Iterable[_Union[_common_pb2.Event, _Mapping]]] = ..., sender_started_unix_nanos: _Optional[int] = ..., acked: _Optional[_Iterable[_Union[_common_pb2.MessageId, _Mapping]]] = ...) -> None: ...
