from echelon.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_LEVEL_UNSPECIFIED: _ClassVar[AckLevel]
    ACK_LEVEL_ACCEPTED: _ClassVar[AckLevel]
    ACK_LEVEL_DELIVERED: _ClassVar[AckLevel]

class StartPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    START_POSITION_UNSPECIFIED: _ClassVar[StartPosition]
    START_POSITION_NOW: _ClassVar[StartPosition]
    START_POSITION_EARLIEST: _ClassVar[StartPosition]

class BacklogPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BACKLOG_POLICY_UNSPECIFIED: _ClassVar[BacklogPolicy]
    BACKLOG_POLICY_DROP_OLDEST: _ClassVar[BacklogPolicy]
    BACKLOG_POLICY_DROP_NEW: _ClassVar[BacklogPolicy]
    BACKLOG_POLICY_REJECT_PUBLISH: _ClassVar[BacklogPolicy]
ACK_LEVEL_UNSPECIFIED: AckLevel
ACK_LEVEL_ACCEPTED: AckLevel
ACK_LEVEL_DELIVERED: AckLevel
START_POSITION_UNSPECIFIED: StartPosition
START_POSITION_NOW: StartPosition
START_POSITION_EARLIEST: StartPosition
BACKLOG_POLICY_UNSPECIFIED: BacklogPolicy
BACKLOG_POLICY_DROP_OLDEST: BacklogPolicy
BACKLOG_POLICY_DROP_NEW: BacklogPolicy
BACKLOG_POLICY_REJECT_PUBLISH: BacklogPolicy

class PublishRequest(_message.Message):
    __slots__ = ("topic", "attributes", "payload", "ordering_key", "producer_id", "sequence", "ack_level", "slice_index", "slice_count", "payload_size", "batch", "coalesce_acks", "zstd", "lean_acks")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.Value, _Mapping]] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ACK_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SLICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SLICE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    COALESCE_ACKS_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    LEAN_ACKS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    attributes: _containers.MessageMap[str, _common_pb2.Value]
    payload: bytes
    ordering_key: str
    producer_id: str
    sequence: int
    ack_level: AckLevel
    slice_index: int
    slice_count: int
    payload_size: int
    batch: _containers.RepeatedCompositeFieldContainer[PublishRequest]
    coalesce_acks: bool
    zstd: bytes
    lean_acks: bool
    def __init__(self, topic: _Optional[str] = ..., attributes: _Optional[_Mapping[str, _common_pb2.Value]] = ..., payload: _Optional[bytes] = ..., ordering_key: _Optional[str] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., ack_level: _Optional[_Union[AckLevel, str]] = ..., slice_index: _Optional[int] = ..., slice_count: _Optional[int] = ..., payload_size: _Optional[int] = ..., batch: _Optional[_Iterable[_Union[PublishRequest, _Mapping]]] = ..., coalesce_acks: _Optional[bool] = ..., zstd: _Optional[bytes] = ..., lean_acks: _Optional[bool] = ...) -> None: ...

class PublishAck(_message.Message):
    __slots__ = ("producer_id", "sequence", "code", "error", "destinations", "duplicate", "acks", "stream_status", "zstd")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DESTINATIONS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    STREAM_STATUS_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    sequence: int
    code: int
    error: str
    destinations: int
    duplicate: bool
    acks: _containers.RepeatedCompositeFieldContainer[PublishAck]
    stream_status: bool
    zstd: bytes
    def __init__(self, producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., destinations: _Optional[int] = ..., duplicate: _Optional[bool] = ..., acks: _Optional[_Iterable[_Union[PublishAck, _Mapping]]] = ..., stream_status: _Optional[bool] = ..., zstd: _Optional[bytes] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("open", "ack", "nack", "in_progress", "term", "close", "batch")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    open: SubscriptionOpen
    ack: SubscriberAck
    nack: SubscriberNack
    in_progress: SubscriberProgress
    term: SubscriberTerm
    close: SubscriptionClose
    batch: _containers.RepeatedCompositeFieldContainer[SubscribeRequest]
    def __init__(self, open: _Optional[_Union[SubscriptionOpen, _Mapping]] = ..., ack: _Optional[_Union[SubscriberAck, _Mapping]] = ..., nack: _Optional[_Union[SubscriberNack, _Mapping]] = ..., in_progress: _Optional[_Union[SubscriberProgress, _Mapping]] = ..., term: _Optional[_Union[SubscriberTerm, _Mapping]] = ..., close: _Optional[_Union[SubscriptionClose, _Mapping]] = ..., batch: _Optional[_Iterable[_Union[SubscribeRequest, _Mapping]]] = ...) -> None: ...

class SubscriptionOpen(_message.Message):
    __slots__ = ("topic", "filter", "filter_text", "subscription", "credits", "batched_deliveries", "durable", "routed", "sid", "encoded_events", "evict", "redelivery")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FILTER_TEXT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    BATCHED_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    ENCODED_EVENTS_FIELD_NUMBER: _ClassVar[int]
    EVICT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    filter: _common_pb2.Filter
    filter_text: str
    subscription: str
    credits: int
    batched_deliveries: bool
    durable: DurableOptions
    routed: bool
    sid: int
    encoded_events: bool
    evict: bool
    redelivery: RedeliveryPolicy
    def __init__(self, topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ..., filter_text: _Optional[str] = ..., subscription: _Optional[str] = ..., credits: _Optional[int] = ..., batched_deliveries: _Optional[bool] = ..., durable: _Optional[_Union[DurableOptions, _Mapping]] = ..., routed: _Optional[bool] = ..., sid: _Optional[int] = ..., encoded_events: _Optional[bool] = ..., evict: _Optional[bool] = ..., redelivery: _Optional[_Union[RedeliveryPolicy, _Mapping]] = ...) -> None: ...

class RedeliveryPolicy(_message.Message):
    __slots__ = ("ack_deadline_ms", "no_ack_deadline", "max_deliveries", "dead_letter_topic")
    ACK_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    NO_ACK_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    ack_deadline_ms: int
    no_ack_deadline: bool
    max_deliveries: int
    dead_letter_topic: str
    def __init__(self, ack_deadline_ms: _Optional[int] = ..., no_ack_deadline: _Optional[bool] = ..., max_deliveries: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ...) -> None: ...

class SubscriberAck(_message.Message):
    __slots__ = ("delivery_ids", "credits", "through", "sid")
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    credits: int
    through: int
    sid: int
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., credits: _Optional[int] = ..., through: _Optional[int] = ..., sid: _Optional[int] = ...) -> None: ...

class SubscriberProgress(_message.Message):
    __slots__ = ("delivery_ids", "sid")
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    sid: int
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., sid: _Optional[int] = ...) -> None: ...

class SubscriberTerm(_message.Message):
    __slots__ = ("delivery_ids", "credits", "sid")
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    credits: int
    sid: int
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., credits: _Optional[int] = ..., sid: _Optional[int] = ...) -> None: ...

class SubscriberNack(_message.Message):
    __slots__ = ("delivery_ids", "delay_ms", "credits", "sid")
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    delivery_ids: _containers.RepeatedScalarFieldContainer[int]
    delay_ms: int
    credits: int
    sid: int
    def __init__(self, delivery_ids: _Optional[_Iterable[int]] = ..., delay_ms: _Optional[int] = ..., credits: _Optional[int] = ..., sid: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "subscription", "event", "redelivery_count", "batch", "chunked", "payload_size", "chunk", "chunk_offset", "last", "aborted", "sid", "opened", "code", "error", "encoded_event", "zstd")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENCODED_EVENT_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    delivery_id: int
    subscription: str
    event: _common_pb2.Event
    redelivery_count: int
    batch: _containers.RepeatedCompositeFieldContainer[Delivery]
    chunked: bool
    payload_size: int
    chunk: bytes
    chunk_offset: int
    last: bool
    aborted: str
    sid: int
    opened: str
    code: int
    error: str
    encoded_event: bytes
    zstd: bytes
    def __init__(self, delivery_id: _Optional[int] = ..., subscription: _Optional[str] = ..., event: _Optional[_Union[_common_pb2.Event, _Mapping]] = ..., redelivery_count: _Optional[int] = ..., batch: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., chunked: _Optional[bool] = ..., payload_size: _Optional[int] = ..., chunk: _Optional[bytes] = ..., chunk_offset: _Optional[int] = ..., last: _Optional[bool] = ..., aborted: _Optional[str] = ..., sid: _Optional[int] = ..., opened: _Optional[str] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., encoded_event: _Optional[bytes] = ..., zstd: _Optional[bytes] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: str
    def __init__(self, subscription: _Optional[str] = ...) -> None: ...

class UnsubscribeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CapsRequest(_message.Message):
    __slots__ = ("principal", "caps", "clear")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CAPS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    principal: str
    caps: _common_pb2.IdentityCaps
    clear: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, principal: _Optional[str] = ..., caps: _Optional[_Union[_common_pb2.IdentityCaps, _Mapping]] = ..., clear: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "schema", "retention_bytes", "retention_seconds", "durable_caps")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_CAPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: _common_pb2.Schema
    retention_bytes: int
    retention_seconds: int
    durable_caps: _common_pb2.DurableCaps
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[_Union[_common_pb2.Schema, _Mapping]] = ..., retention_bytes: _Optional[int] = ..., retention_seconds: _Optional[int] = ..., durable_caps: _Optional[_Union[_common_pb2.DurableCaps, _Mapping]] = ...) -> None: ...

class GetTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[_common_pb2.Topic]
    def __init__(self, topics: _Optional[_Iterable[_Union[_common_pb2.Topic, _Mapping]]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DurableOptions(_message.Message):
    __slots__ = ("start", "max_messages", "max_bytes", "policy", "idle_seconds", "replicas")
    START_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    start: StartPosition
    max_messages: int
    max_bytes: int
    policy: BacklogPolicy
    idle_seconds: int
    replicas: int
    def __init__(self, start: _Optional[_Union[StartPosition, str]] = ..., max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., policy: _Optional[_Union[BacklogPolicy, str]] = ..., idle_seconds: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class AclRequest(_message.Message):
    __slots__ = ("rule",)
    RULE_FIELD_NUMBER: _ClassVar[int]
    rule: _common_pb2.AclRule
    def __init__(self, rule: _Optional[_Union[_common_pb2.AclRule, _Mapping]] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("rules",)
    RULES_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[_common_pb2.AclRule]
    def __init__(self, rules: _Optional[_Iterable[_Union[_common_pb2.AclRule, _Mapping]]] = ...) -> None: ...

class SubscriptionClose(_message.Message):
    __slots__ = ("sid",)
    SID_FIELD_NUMBER: _ClassVar[int]
    sid: int
    def __init__(self, sid: _Optional[int] = ...) -> None: ...

class DeliveryRead(_message.Message):
    __slots__ = ("delivery_id", "subscription", "event", "redelivery_count", "batch", "chunked", "payload_size", "chunk", "chunk_offset", "last", "aborted", "sid", "opened", "code", "error", "encoded_event", "zstd")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    REDELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    SID_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENCODED_EVENT_FIELD_NUMBER: _ClassVar[int]
    ZSTD_FIELD_NUMBER: _ClassVar[int]
    delivery_id: int
    subscription: str
    event: _common_pb2.Event
    redelivery_count: int
    batch: _containers.RepeatedCompositeFieldContainer[DeliveryRead]
    chunked: bool
    payload_size: int
    chunk: bytes
    chunk_offset: int
    last: bool
    aborted: str
    sid: int
    opened: str
    code: int
    error: str
    encoded_event: _common_pb2.Event
    zstd: bytes
    def __init__(self, delivery_id: _Optional[int] = ..., subscription: _Optional[str] = ..., event: _Optional[_Union[_common_pb2.Event, _Mapping]] = ..., redelivery_count: _Optional[int] = ..., batch: _Optional[_Iterable[_Union[DeliveryRead, _Mapping]]] = ..., chunked: _Optional[bool] = ..., payload_size: _Optional[int] = ..., chunk: _Optional[bytes] = ..., chunk_offset: _Optional[int] = ..., last: _Optional[bool] = ..., aborted: _Optional[str] = ..., sid: _Optional[int] = ..., opened: _Optional[str] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., encoded_event: _Optional[_Union[_common_pb2.Event, _Mapping]] = ..., zstd: _Optional[bytes] = ...) -> None: ...
