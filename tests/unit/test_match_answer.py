"""matcher/answer.py: the Match answer's bytes parse as the MatchResponse built field by
field with the protobuf library (the oracle), for agent sets and subscription maps."""

from __future__ import annotations

import random

from echelon.matcher.answer import KEPT, Answers
from echelon.v1 import matcher_pb2 as xpb


def oracle(batch_id: int, results, agents_only: bool, entry: str = "") -> xpb.MatchResponse:
    out = xpb.MatchResponse(batch_id=batch_id, entry=entry)
    for r in results:
        res = out.results.add()
        if agents_only:
            for agent in r:
                res.agents.add(agent=agent)
            continue
        by_agent: dict[str, list[str]] = {}
        for sid, agent in r.items():
            by_agent.setdefault(agent, []).append(sid)
        for agent, sids in by_agent.items():
            res.agents.add(agent=agent, subscriptions=sids)
    return out


def canonical(m: xpb.MatchResponse):
    """Order-free: agents of an event as a set, each agent's subscriptions as a set."""
    return (m.batch_id, m.entry, m.stale,
            [{(a.agent, frozenset(a.subscriptions)) for a in r.agents} for r in m.results])


def test_agent_sets_and_subscription_maps_parse_as_the_oracle():
    rnd = random.Random(7)
    agents = [f"agent-{i}" for i in range(6)] + ["é-agent", "x" * 200]  # non-ASCII, a length past one byte
    answers = Answers()
    for round_ in range(200):
        n = rnd.choice([0, 1, 5, 300])
        sets = [rnd.choice([set, frozenset])(rnd.sample(agents, rnd.choice([0, 0, 1, 1, 2, 3]))) for _ in range(n)]
        entry = rnd.choice(["", "matcher-2"])
        batch_id = rnd.choice([0, 1, 1 << 40])
        got = xpb.MatchResponse.FromString(answers.response(batch_id, sets, True, entry))
        assert canonical(got) == canonical(oracle(batch_id, sets, True, entry))
        maps = [{f"s{rnd.randrange(10**6)}-{k}": rnd.choice(agents) for k in range(rnd.choice([0, 1, 4]))}
                for _ in range(n)]
        got = xpb.MatchResponse.FromString(answers.response(batch_id, maps, False))
        assert canonical(got) == canonical(oracle(batch_id, maps, False))


def test_kept_sets_are_bounded():
    answers = Answers()
    names = [f"a{i}" for i in range(KEPT + 50)]
    pairs = [{names[i], names[i + 1]} for i in range(KEPT + 40)]
    got = xpb.MatchResponse.FromString(answers.response(3, pairs + [{n} for n in names], True))
    assert canonical(got) == canonical(oracle(3, pairs + [{n} for n in names], True))
    assert len(answers._sets) <= KEPT
