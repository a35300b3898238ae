from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttributeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTRIBUTE_TYPE_UNSPECIFIED: _ClassVar[AttributeType]
    ATTRIBUTE_TYPE_INT: _ClassVar[AttributeType]
    ATTRIBUTE_TYPE_FLOAT: _ClassVar[AttributeType]
    ATTRIBUTE_TYPE_STRING: _ClassVar[AttributeType]

class Operator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OPERATOR_UNSPECIFIED: _ClassVar[Operator]
    OPERATOR_EQ: _ClassVar[Operator]
    OPERATOR_NE: _ClassVar[Operator]
    OPERATOR_LT: _ClassVar[Operator]
    OPERATOR_LE: _ClassVar[Operator]
    OPERATOR_GT: _ClassVar[Operator]
    OPERATOR_GE: _ClassVar[Operator]
    OPERATOR_BETWEEN: _ClassVar[Operator]
    OPERATOR_PREFIX: _ClassVar[Operator]
ATTRIBUTE_TYPE_UNSPECIFIED: AttributeType
ATTRIBUTE_TYPE_INT: AttributeType
ATTRIBUTE_TYPE_FLOAT: AttributeType
ATTRIBUTE_TYPE_STRING: AttributeType
OPERATOR_UNSPECIFIED: Operator
OPERATOR_EQ: Operator
OPERATOR_NE: Operator
OPERATOR_LT: Operator
OPERATOR_LE: Operator
OPERATOR_GT: Operator
OPERATOR_GE: Operator
OPERATOR_BETWEEN: Operator
OPERATOR_PREFIX: Operator

class Value(_message.Message):
    __slots__ = ("int_value", "float_value", "string_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    float_value: float
    string_value: str
    def __init__(self, int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ...) -> None: ...

class AttributeSpec(_message.Message):
    __slots__ = ("name", "type", "min", "max", "max_length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: AttributeType
    min: float
    max: float
    max_length: int
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[AttributeType, str]] = ..., min: _Optional[float] = ..., max: _Optional[float] = ..., max_length: _Optional[int] = ...) -> None: ...

class Schema(_message.Message):
    __slots__ = ("attributes", "max_attribute_bytes")
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTRIBUTE_BYTES_FIELD_NUMBER: _ClassVar[int]
    attributes: _containers.RepeatedCompositeFieldContainer[AttributeSpec]
    max_attribute_bytes: int
    def __init__(self, attributes: _Optional[_Iterable[_Union[AttributeSpec, _Mapping]]] = ..., max_attribute_bytes: _Optional[int] = ...) -> None: ...

class Topic(_message.Message):
    __slots__ = ("name", "schema", "created_unix_ms", "retention_bytes", "retention_seconds", "durable_caps")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_CAPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: Schema
    created_unix_ms: int
    retention_bytes: int
    retention_seconds: int
    durable_caps: DurableCaps
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[_Union[Schema, _Mapping]] = ..., created_unix_ms: _Optional[int] = ..., retention_bytes: _Optional[int] = ..., retention_seconds: _Optional[int] = ..., durable_caps: _Optional[_Union[DurableCaps, _Mapping]] = ...) -> None: ...

class DurableCaps(_message.Message):
    __slots__ = ("max_messages", "max_bytes", "idle_seconds", "replicas")
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    max_messages: int
    max_bytes: int
    idle_seconds: int
    replicas: int
    def __init__(self, max_messages: _Optional[int] = ..., max_bytes: _Optional[int] = ..., idle_seconds: _Optional[int] = ..., replicas: _Optional[int] = ...) -> None: ...

class Predicate(_message.Message):
    __slots__ = ("attribute", "op", "value", "upper")
    ATTRIBUTE_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    attribute: str
    op: Operator
    value: Value
    upper: Value
    def __init__(self, attribute: _Optional[str] = ..., op: _Optional[_Union[Operator, str]] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., upper: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("predicates", "any_of")
    PREDICATES_FIELD_NUMBER: _ClassVar[int]
    ANY_OF_FIELD_NUMBER: _ClassVar[int]
    predicates: _containers.RepeatedCompositeFieldContainer[Predicate]
    any_of: _containers.RepeatedCompositeFieldContainer[Filter]
    def __init__(self, predicates: _Optional[_Iterable[_Union[Predicate, _Mapping]]] = ..., any_of: _Optional[_Iterable[_Union[Filter, _Mapping]]] = ...) -> None: ...

class MessageId(_message.Message):
    __slots__ = ("producer_id", "sequence")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    sequence: int
    def __init__(self, producer_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "topic", "attributes", "payload", "ordering_key", "publish_time_unix_nanos")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    id: MessageId
    topic: str
    attributes: _containers.MessageMap[str, Value]
    payload: bytes
    ordering_key: str
    publish_time_unix_nanos: int
    def __init__(self, id: _Optional[_Union[MessageId, _Mapping]] = ..., topic: _Optional[str] = ..., attributes: _Optional[_Mapping[str, Value]] = ..., payload: _Optional[bytes] = ..., ordering_key: _Optional[str] = ..., publish_time_unix_nanos: _Optional[int] = ...) -> None: ...

class AclRule(_message.Message):
    __slots__ = ("principal", "pattern", "rights", "caps")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    RIGHTS_FIELD_NUMBER: _ClassVar[int]
    CAPS_FIELD_NUMBER: _ClassVar[int]
    principal: str
    pattern: str
    rights: _containers.RepeatedScalarFieldContainer[str]
    caps: IdentityCaps
    def __init__(self, principal: _Optional[str] = ..., pattern: _Optional[str] = ..., rights: _Optional[_Iterable[str]] = ..., caps: _Optional[_Union[IdentityCaps, _Mapping]] = ...) -> None: ...

class IdentityCaps(_message.Message):
    __slots__ = ("subscriptions", "durable_subscriptions", "durable_max_messages", "durable_max_bytes", "durable_max_idle_seconds", "durable_max_replicas")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_MAX_IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DURABLE_MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: int
    durable_subscriptions: int
    durable_max_messages: int
    durable_max_bytes: int
    durable_max_idle_seconds: int
    durable_max_replicas: int
    def __init__(self, subscriptions: _Optional[int] = ..., durable_subscriptions: _Optional[int] = ..., durable_max_messages: _Optional[int] = ..., durable_max_bytes: _Optional[int] = ..., durable_max_idle_seconds: _Optional[int] = ..., durable_max_replicas: _Optional[int] = ...) -> None: ...
