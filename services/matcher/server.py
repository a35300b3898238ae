"""The matcher service: holds subscriptions, answers `Match` for batches of events.

Agents own their subscriptions and register them here; a matcher that restarts is
refilled by the agents when it reappears in the view, so the index is soft state.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from prometheus_client import Counter, Gauge, Histogram

from echelon.core.filters import Filter
from echelon.core.schema import Schema, SchemaError
from echelon.runtime.errors import InvalidArgument
from echelon.runtime.metrics import LATENCY_BUCKETS
from echelon.runtime.node import Node, NodeConfig
from echelon.runtime.wire import attributes_from_pb, filter_from_pb, schema_from_pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.matcher")


class BruteForceIndex:
    """Every filter evaluated against every event of its topic: the reference index."""

    def __init__(self) -> None:
        self.by_topic: dict[str, dict[str, tuple[str, Filter]]] = defaultdict(dict)
        self.topic_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.topic_of)

    def add(self, sub_id: str, agent: str, topic: str, flt: Filter) -> None:
        self.remove(sub_id)
        self.by_topic[topic][sub_id] = (agent, flt)
        self.topic_of[sub_id] = topic

    def remove(self, sub_id: str) -> bool:
        topic = self.topic_of.pop(sub_id, None)
        if topic is None:
            return False
        del self.by_topic[topic][sub_id]
        return True

    def match(self, topic: str, attributes: dict) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for sub_id, (agent, flt) in self.by_topic.get(topic, {}).items():
            if flt.matches(attributes):
                out[agent].append(sub_id)
        return out


class MatcherServicer(xgrpc.MatcherServicer):
    def __init__(self, node: "MatcherNode"):
        self.node = node
        self.index = BruteForceIndex()
        r = node.registry
        self.subscriptions = Gauge("echelon_matcher_subscriptions", "Subscriptions held.", registry=r)
        self.events = Counter("echelon_matcher_events_total", "Events matched.", registry=r)
        self.matches = Counter("echelon_matcher_matches_total", "(event, subscription) matches produced.",
                               registry=r)
        self.latency = Histogram("echelon_matcher_batch_seconds", "Time to match one batch.",
                                 buckets=LATENCY_BUCKETS, registry=r)

    def _schema(self, topic: str) -> Schema | None:
        t = self.node.membership.topics.get(topic) if self.node.membership else None
        return schema_from_pb(t.schema) if t is not None else None

    async def Register(self, request: xpb.RegisterRequest, context) -> xpb.RegisterResponse:
        parsed = []
        for s in request.subscriptions:  # validate all before changing anything
            if not s.id or not s.agent or not s.topic:
                raise InvalidArgument(f"subscription {s.id!r}: id, agent and topic are required")
            flt = filter_from_pb(s.filter)
            schema = self._schema(s.topic)
            try:
                flt.validate(schema or Schema())
            except SchemaError as e:
                raise InvalidArgument(f"subscription {s.id!r}: {e}") from None
            parsed.append((s.id, s.agent, s.topic, flt))
        for args in parsed:
            self.index.add(*args)
        self.subscriptions.set(len(self.index))
        return xpb.RegisterResponse(registered=len(parsed))

    async def Remove(self, request: xpb.RemoveRequest, context) -> xpb.RemoveResponse:
        removed = sum(self.index.remove(i) for i in request.ids)
        self.subscriptions.set(len(self.index))
        return xpb.RemoveResponse(removed=removed)

    async def Match(self, request_iterator, context):
        async for batch in request_iterator:
            start = time.perf_counter()
            response = xpb.MatchResponse(batch_id=batch.batch_id)
            for event in batch.events:
                result = response.results.add()
                matched = self.index.match(event.topic, attributes_from_pb(event.attributes))
                for agent in sorted(matched):
                    result.agents.add(agent=agent, subscriptions=matched[agent])
                    self.matches.inc(len(matched[agent]))
            self.events.inc(len(batch.events))
            self.latency.observe(time.perf_counter() - start)
            yield response


class MatcherNode(Node):
    role = mpb.ROLE_MATCHER

    def __init__(self, config: NodeConfig):
        super().__init__(config)
        self.matcher = MatcherServicer(self)
        self.server.add(xgrpc.add_MatcherServicer_to_server, self.matcher,
                        xpb.DESCRIPTOR.services_by_name["Matcher"].full_name)
