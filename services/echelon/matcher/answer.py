"""A `Match` answer serialized as it is built: the MatchResponse's bytes, not a
message of one MatchResult and AgentMatches object per event that gRPC then serializes
(building them was a share of the matching matcher's CPU at saturation worth saving,
their serialization part of the native rest).

Protobuf concatenation makes this exact: a message's fields, each serialized apart and
written side by side, parse as that message (contract/wire.py `length_delimited`). An
event's MatchResult depends only on its set of agents (when only the agents are asked
for, as publishing agents do), and a topic's events meet few sets, so each set's bytes
are made once and kept (`Answers`, bounded). The receiver parses what it always did:
`Match` is registered with a serializer that passes these bytes through (server.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from echelon.matcher.peers import Agents, Matches
from echelon.contract.wire import length_delimited
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import tags

AGENT, SUBSCRIPTIONS = tags.AgentMatches.agent, tags.AgentMatches.subscriptions
AGENTS = tags.MatchResult.agents
RESULTS = tags.MatchResponse.results
EMPTY = length_delimited(RESULTS, b"")  # an event that matched nothing
KEPT = 4096  # agent sets whose bytes are kept; past it, forgotten and made again


def _agent_matches(agent: str, subscriptions: Sequence[str] = ()) -> bytes:
    """One AgentMatches as a MatchResult.agents field."""
    inner = length_delimited(AGENT, agent.encode())
    if subscriptions:
        inner += b"".join(length_delimited(SUBSCRIPTIONS, s.encode()) for s in subscriptions)
    return length_delimited(AGENTS, inner)


class Answers:
    """MatchResponse bytes; the MatchResult of each agent set made once (see the module doc)."""

    def __init__(self) -> None:
        self._sets: dict[frozenset[str], bytes] = {frozenset(): EMPTY}

    def response(self, batch_id: int, results: list[Matches] | list[Agents], agents_only: bool,
                 entry: str = "") -> bytes:
        """An answer with per event its matches (`{subscription: agent}`) or its agents."""
        head = xpb.MatchResponse(batch_id=batch_id, entry=entry).SerializeToString()  # once per batch
        if not agents_only:
            return head + b"".join(map(self._matches, results))
        # Looked up in C, no Python step per event (a frozenset is its own frozenset, its
        # hash kept); only a set not seen yet is made here.
        keys = list(map(frozenset, results))
        parts = list(map(self._sets.get, keys))
        if None in parts:
            sets = self._sets
            for i, part in enumerate(parts):
                if part is None:
                    part = sets.get(keys[i])
                    if part is None:
                        if len(sets) >= KEPT:
                            sets.clear()
                            sets[frozenset()] = EMPTY
                        part = sets[keys[i]] = length_delimited(
                            RESULTS, b"".join(_agent_matches(a) for a in sorted(keys[i])))
                    parts[i] = part
        return head + b"".join(parts)

    @staticmethod
    def _matches(matches: Matches) -> bytes:
        """One event's MatchResult field, its subscriptions grouped by agent."""
        by_agent: dict[str, list[str]] = defaultdict(list)
        for sid, agent in matches.items():
            by_agent[agent].append(sid)
        return length_delimited(RESULTS, b"".join(_agent_matches(a, s) for a, s in by_agent.items()))
