"""The publish rate of one request's events checked at once (Access.publish_checker: the
tokens taken for the whole request, given back for events refused before the rate)
against a token taken per event from a bucket of its own, over random requests."""

import random

import pytest
from prometheus_client import CollectorRegistry

from echelon.core.acl import Acl, Identity, Rule
from echelon.runtime.auth import CALLER, Access, AuthConfig, Caller
from echelon.contract.errors import PermissionDenied, ResourceExhausted
from echelon.runtime.limits import Limits


@pytest.mark.parametrize("seed", range(4))
def test_a_request_checked_at_once_refuses_the_events_a_token_per_event_refuses(seed):
    """Events of a topic the caller may publish on, of one it may not (denied before the
    rate) and bad elements (refused before the checks), at steps of time that refill the
    bucket or not: each event's answer, and the tokens held after each request."""
    rnd = random.Random(seed)
    limits = Limits(publish_rate=rnd.choice((0.5, 3.0, 10.0)), publish_burst=rnd.choice((1, 4, 9)))
    access = Access(AuthConfig(limits=limits), CollectorRegistry())
    rules = Acl([Rule("user:ann", "quotes", frozenset({"publish"}))])
    access.acl = lambda: rules
    caller = CALLER.set(Caller(Identity("ann"), "user:ann", "peer", True))
    try:
        reference = _PerEvent(limits.publish_rate, limits.publish_burst)
        now = 0.0
        for step in range(400):
            now += rnd.choice((0.0, 0.1, 0.3, 1.0))
            topics = [rnd.choice(("quotes", "quotes", "news", "bad")) for _ in range(rnd.randrange(1, 8))]
            check, end = access.publish_checker(now, len(topics))
            got, want = [], []
            for topic in topics:
                if topic == "bad":  # a bad batch element: refused before the checks, takes no token
                    got.append("bad")
                    want.append("bad")
                    continue
                try:
                    check(topic)
                    got.append("ok")
                except PermissionDenied:
                    got.append("denied")
                except ResourceExhausted:
                    got.append("over")
                want.append("denied" if topic == "news" else "ok" if reference.take(now) else "over")
            end()
            assert got == want, (step, topics)
            bucket = access.quotas.publish_bucket("user:ann", now)
            assert abs(_held(bucket, now) - _held(reference, now)) < 1e-9, step  # the unused tokens given back
    finally:
        CALLER.reset(caller)  # the tests after this one run in the same context


class _PerEvent:
    """The rate as a token bucket taking one token per event."""

    def __init__(self, rate, burst):
        self.rate, self.burst, self.tokens, self.at = rate, burst, float(burst), 0.0

    def take(self, now):
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def _held(bucket, now):
    """The tokens `bucket` holds at `now`."""
    return min(bucket.burst, bucket.tokens + (now - bucket.at) * bucket.rate)


async def test_the_agents_receive_limit_holds_the_largest_request_a_client_or_member_sends():
    """The SDK's largest publish request (a batch closed past MAX_BATCH_BYTES with one more
    event of SLICE_BYTES, attributes at the schema's ceiling) and a relay frame fit under
    the agent's receive limit; a Subscribe of 8 MiB does not (docs/security.md, "The
    agent's receive limit")."""
    from echelon.agent.server import AgentNode
    from echelon.client.outbox import MAX_BATCH_BYTES, SLICE_BYTES
    from echelon.contract.schema import MAX_MAX_ATTRIBUTE_BYTES
    from echelon.dataplane.root import FRAME_BYTES
    from echelon.runtime.node import NodeConfig

    framing = 4096  # the request's and each event's own fields, generously
    publish = MAX_BATCH_BYTES + SLICE_BYTES + MAX_MAX_ATTRIBUTE_BYTES + framing
    for slice_bytes in (1024, 65536, 16 << 20):
        limit = AgentNode(NodeConfig(id="a"), slice_bytes=slice_bytes).server.receive_bytes
        frame = FRAME_BYTES + slice_bytes + MAX_MAX_ATTRIBUTE_BYTES + framing
        assert publish <= limit and frame <= limit, (slice_bytes, limit)
    assert AgentNode(NodeConfig(id="a")).server.receive_bytes < 8 << 20
    # An operator's lower server-wide bound wins.
    config = NodeConfig(id="a", auth=AuthConfig(limits=Limits(max_message_bytes=1 << 20)))
    assert AgentNode(config).server.receive_bytes == 1 << 20
