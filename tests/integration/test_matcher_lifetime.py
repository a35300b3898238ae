"""Layouts follow matcher process lifetimes, not SWIM incarnations (runtime.member).

Real membership, three matcher processes in the harness. A matcher reported suspect
refutes with a higher incarnation: it is the same process holding the same copies, so no
matcher may adopt a new layout (before the fix every refutation started a handoff of the
whole tier, and a loaded tier never settled). A matcher that really restarts
lost its copies: every matcher adopts a new layout and the restarted one is refilled with
every subscription the layout gives it (the oracle: the layout's own placement, read at
the matchers that survived).
"""

from __future__ import annotations

from echelon.matcher.server import MatcherNode
from echelon.runtime.member import lifetime
from echelon.v1 import membership_pb2 as mpb
from loadtest import stock
from tests.harness import Cluster, wait_for

TOPIC = "quotes"


def layout(node: MatcherNode):
    ts = node.tier.layouts.topics.get(TOPIC)
    return None if ts is None or ts.pending is not None else ts.active


def incarnation_seen(nodes: list[MatcherNode], mid: str) -> set[int]:
    return {m.incarnation for n in nodes for m in n.membership.alive(mpb.ROLE_MATCHER) if m.id == mid}


async def test_a_refuted_suspicion_keeps_the_layout_and_a_restart_replaces_it():
    c = Cluster(agents=1, matchers=3)
    try:
        await c.start()
        client = c.client(0)
        await client.create_topic(TOPIC, stock.STOCK_SCHEMA)
        subs = [client.subscribe(TOPIC, f, name=f"s{i}") for i, f in enumerate(stock.subscriptions(60, seed=3))]
        for s in subs:
            await s.start()
        nodes = c.matcher_nodes
        await wait_for(lambda: all(layout(n) is not None for n in nodes)
                       and len({layout(n).key for n in nodes}) == 1, 15, what="one layout at every matcher")
        before = layout(nodes[0]).key

        # Suspected by a peer (the evidence a failed peer call reports), matcher-1 refutes.
        victim = nodes[1]
        old = victim.membership.member.incarnation
        await nodes[0].membership.report(victim.config.id, "test: evidence")
        await wait_for(lambda: victim.membership.member.incarnation > old, 10, what="matcher-1 refutes")
        refuted = victim.membership.member.incarnation
        assert lifetime(refuted) == lifetime(old)
        await wait_for(lambda: incarnation_seen(nodes, victim.config.id) == {refuted}, 10,
                       what="every matcher sees the refuted incarnation")
        # Views are applied to the tier as they arrive (on_view): nothing is pending.
        assert [layout(n) and layout(n).key for n in nodes] == [before] * 3

        # matcher-2 dies with its copies and a new process takes its id.
        await c.crash(nodes[2])
        fresh = MatcherNode(c.config(nodes[2].config.id))
        await fresh.start()
        c.matcher_nodes.append(fresh)
        live = [nodes[0], nodes[1], fresh]
        assert fresh.lifetime() > lifetime(old)

        def switched() -> bool:
            return all(layout(n) is not None and layout(n).key != before
                       and layout(n).lifetimes.get(fresh.config.id) == fresh.lifetime() for n in live)

        await wait_for(switched, 20, what="a new layout with the restarted matcher")
        owed = set()
        for n in live[:2]:
            L = layout(n)
            owed |= {sid for sid in n.tier.store.copies if L.placed(sid) and fresh.config.id in L.targets(sid)}
        assert owed, "the layout gives the restarted matcher some subscriptions"
        await wait_for(lambda: owed <= set(fresh.tier.store.copies), 20, what="the restarted matcher refilled")
        for s in subs:
            await s.close()
    finally:
        await c.stop()
