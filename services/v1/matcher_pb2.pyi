from echelon.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Subscription(_message.Message):
    __slots__ = ("id", "agent", "topic", "filter")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent: str
    topic: str
    filter: _common_pb2.Filter
    def __init__(self, id: _Optional[str] = ..., agent: _Optional[str] = ..., topic: _Optional[str] = ..., filter: _Optional[_Union[_common_pb2.Filter, _Mapping]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("registered",)
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: int
    def __init__(self, registered: _Optional[int] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    def __init__(self, removed: _Optional[int] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("batch_id", "events")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.Event]
    def __init__(self, batch_id: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_common_pb2.Event, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("batch_id", "results")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    results: _containers.RepeatedCompositeFieldContainer[MatchResult]
    def __init__(self, batch_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[MatchResult, _Mapping]]] = ...) -> None: ...
