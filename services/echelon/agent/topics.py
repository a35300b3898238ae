"""Topics as the agent sees them: from the membership view, or asked of membership when
the view has not caught up; and each topic's parsed schema, cached by topic version.

A topic's version is its creation time: membership refuses CreateTopic with another
schema for an existing name, so a schema changes only by deleting and creating the
topic again, which gives it a new `created_unix_ms`. Publishes validate against the
cached `Schema` instead of parsing the protobuf each time.
"""

from __future__ import annotations

from typing import Awaitable, Callable

import grpc

from echelon.contract.schema import Schema
from echelon.contract.errors import InvalidArgument, NotFound, Unavailable
from echelon.runtime.member import MemberClient
from echelon.contract.wire import schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb


class Topics:
    def __init__(self, membership: Callable[[], MemberClient], admin: Callable[[str, object], Awaitable]):
        self.membership = membership
        self.admin = admin  # (method, request) -> response, from membership (admin.py)
        self._schemas: dict[str, tuple[int, Schema]] = {}  # name -> (version, schema)

    async def get(self, name: str) -> pb.Topic:
        """The topic from the view, or from membership when the view has not caught up."""
        if not name:
            raise InvalidArgument("topic is required")
        topics = self.membership().topics
        t = topics.get(name)
        if t is None:
            try:
                t = await self.admin("GetTopic", ppb.GetTopicRequest(name=name))
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFound(f"topic {name!r} does not exist") from None
                raise Unavailable(f"membership unreachable: {e.details()}") from None
            topics.setdefault(name, t)
        return t

    def schema(self, topic: pb.Topic) -> Schema:
        """The parsed schema of this version of the topic."""
        cached = self._schemas.get(topic.name)
        if cached is None or cached[0] != topic.created_unix_ms:
            cached = self._schemas[topic.name] = (topic.created_unix_ms, schema_from_pb(topic.schema))
        return cached[1]
