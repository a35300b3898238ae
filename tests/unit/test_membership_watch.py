"""The Watch stream of a replica, driven directly (no network): a watcher that falls
behind gets a snapshot instead of the deltas it missed, and the member ignores replays."""

from __future__ import annotations

import time

from echelon.core.detector import MemberRecord
from echelon.membership.server import MembershipNode
from echelon.membership.servicers import MembershipServicer
from echelon.runtime.member import MemberClient
from echelon.runtime.node import NodeConfig
from echelon.v1 import membership_pb2 as mpb


async def test_a_watcher_that_falls_behind_gets_a_snapshot_and_replays_are_harmless():
    node = MembershipNode(NodeConfig(id="m0"), watch_queue=2, keepalive=0.1)
    node.peers.ready.set()
    stream = MembershipServicer(node).Watch(mpb.WatchRequest(member_id="w"), None)
    member = MemberClient(mpb.Member(id="w", role=mpb.ROLE_AGENT, address="w:1"), ["m0:1"])
    member.watching = "m0:1"
    try:
        first = await anext(stream)
        assert first.WhichOneof("kind") == "snapshot" and member._apply(first)
        for i in range(4):  # the queue holds 2: the third change overflows it, the fourth follows
            node.replica.join(MemberRecord(id=f"a{i}", role="ROLE_AGENT", address=f"a{i}:1", incarnation=1),
                              time.monotonic())
        resync = await anext(stream)
        assert resync.WhichOneof("kind") == "snapshot" and len(resync.snapshot.members) == 4
        assert member._apply(resync) and member.version == node.replica.log.version
        replay = await anext(stream)  # queued after the overflow, already in the snapshot
        assert replay.WhichOneof("kind") == "delta" and member._apply(replay)
        assert member.version == node.replica.log.version and len(member.members) == 4
        idle = await anext(stream)
        assert idle.WhichOneof("kind") == "keepalive" and member._apply(idle)
    finally:
        await stream.aclose()
    assert not node.streams.watching
