"""The agent's topic cache: a schema is parsed once per topic version."""

from echelon.agent.topics import Topics
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.contract.wire import schema_to_pb
from echelon.v1 import common_pb2 as pb


def test_a_schema_is_parsed_once_per_topic_version():
    topics = Topics(lambda: None, None)
    first = pb.Topic(name="t", schema=schema_to_pb(Schema((Attribute("n", AttrType.INT),))), created_unix_ms=1)
    parsed = topics.schema(first)
    assert topics.schema(first) is parsed and topics.schema(pb.Topic(name="t", schema=first.schema,
                                                                     created_unix_ms=1)) is parsed
    again = pb.Topic(name="t", schema=schema_to_pb(Schema((Attribute("s", AttrType.STRING),))), created_unix_ms=2)
    assert topics.schema(again) == Schema((Attribute("s", AttrType.STRING),))
