"""OctopiA's control plane as Echelon's routers run it between regions: a region's
subgroup, its CIB_SET / CIB_CLEAR, and the cluster bits of an event at the router that
receives it from a publishing agent (OctopiA sections VI, VII-A; docs/event-path.md,
"Regions that stand alone"; `scot_control.py` holds the paper's own tables).

OctopiA's cluster is a region and its broker a router. Advertisements (docs/papers.md,
"OctopiA's advertisements in Echelon"): an agent advertises the topics its producers
publish (`Advertisement`: a topic, and bounds when declared) to every router of its region,
each of which may be the host broker of its events. A router sends its region's
advertisements to its secondary routers (OctopiA's region of the publisher: one router per
other region, `core/scot.py` `ilinks`), never further; a secondary router answers them
with the subgroups of its region that overlap them (`answer`: the SCB, kept per group),
so a region that publishes nothing a far subscription overlaps is sent nothing of it and
stores nothing of it. Differences from the paper, each on the safe side (a region may get
an event it does not want, never miss one it does):

- The region's subgroup is the region's subscriptions grouped by (topic, filter):
  identical filters are one entry. A CIB_SET names a group when it first overlaps an
  advertisement of the receiver, a CIB_CLEAR when it no longer does, so the host keeps the
  groups, not a bit, and sets the region's bit per event: the bit of region R is set when
  a group of R on the event's topic matches it (the SCB evaluated per event, exact).
- A region is sent everything (its bit always set) unless the host holds a *complete*
  summary of it that *answers* the event's advertisement: from a router that has heard the
  full state of every live agent of its region, and has answered an advertisement of the
  host that covers the event (an event of a topic not yet advertised, or advertised
  but not yet answered, goes everywhere). A summary is dropped when the stream that
  carried it ends, so a restarted router or a reset link falls back to "everything" until
  the full state is sent again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from echelon.contract.filters import Expression, overlaps
from echelon.contract.schema import Schema
from echelon.core.filter_code import Matcher, compile_filters

Key = tuple[str, bytes]  # (topic, the filter's canonical bytes): one subgroup, or one advertisement
_ANY = Schema()  # overlap over the values' own domains: a router holds no topic's schema


def answer(groups: Mapping[Key, Expression], advertisements: Mapping[Key, Expression]) -> set[Key]:
    """The groups that overlap an advertisement (same topic, and the filter overlaps the
    bounds: `contract/filters.py` `overlaps`, never a false negative): what a secondary
    router sends the host of `advertisements`."""
    by_topic: dict[str, list[Expression]] = {}
    for (topic, _), bounds in advertisements.items():
        by_topic.setdefault(topic, []).append(bounds)
    return {k for k, f in groups.items() if any(overlaps(b, f, _ANY) for b in by_topic.get(k[0], ()))}


class Subgroups:
    """A router's own region: each agent's subscriptions by id, and the groups they make
    (also each agent's advertisements, by their own key). Every change returns (groups
    that appeared, groups that emptied): the CIB_SET and CIB_CLEAR (ADV and UNADV) to send."""

    def __init__(self) -> None:
        self.by_agent: dict[str, dict[str, Key]] = {}
        self.count: Counter[Key] = Counter()

    def groups(self) -> list[Key]:
        return list(self.count)

    def _diff(self, before: Counter[Key], after: Counter[Key]) -> tuple[set[Key], set[Key]]:
        return {k for k in after if k not in before}, {k for k in before if k not in after}

    def replace(self, agent: str, subs: Mapping[str, Key]) -> tuple[set[Key], set[Key]]:
        """`agent`'s full state."""
        old = self.by_agent.get(agent, {})
        self.by_agent[agent] = dict(subs)
        return self._apply(Counter(old.values()), Counter(subs.values()))

    def put(self, agent: str, subs: Mapping[str, Key]) -> tuple[set[Key], set[Key]]:
        """Subscriptions added or replaced (a filter changed: its old group may empty)."""
        mine = self.by_agent.setdefault(agent, {})
        out, into = Counter(), Counter()
        for i, k in subs.items():
            if i in mine:
                out[mine[i]] += 1
            mine[i] = k
            into[k] += 1
        return self._apply(out, into)

    def drop(self, agent: str, ids: Iterable[str]) -> tuple[set[Key], set[Key]]:
        mine = self.by_agent.get(agent, {})
        out = Counter(mine.pop(i) for i in ids if i in mine)
        return self._apply(out, Counter())

    def forget(self, agent: str) -> tuple[set[Key], set[Key]]:
        """The agent left the cluster: its subscriptions went with it."""
        return self._apply(Counter(self.by_agent.pop(agent, {}).values()), Counter())

    def _apply(self, out: Counter[Key], into: Counter[Key]) -> tuple[set[Key], set[Key]]:
        touched = set(out) | set(into)
        before = {k for k in touched if self.count[k] > 0}
        self.count.update(into)
        self.count.subtract(out)
        after = set()
        for k in touched:
            if self.count[k] > 0:
                after.add(k)
            else:
                del self.count[k]
        return after - before, before - after


class Summaries:
    """At a router: the other regions' groups, by the router that sent them, which
    senders' summaries are complete, and which of this router's advertisements each
    sender's groups answer. `wants(region, topic, attributes)` is region R's bit of the
    CIV for an event (module doc)."""

    def __init__(self, wire: bool = False) -> None:
        """`wire`: `wants` is given an event's attributes as received (filter_code.py)."""
        self.wire = wire
        self.region_of: dict[str, str] = {}  # sender -> its region
        self.groups: dict[str, dict[Key, Expression]] = {}  # sender -> its region's groups
        self.complete: set[str] = set()
        # sender -> the advertisements its groups answer (None: every event, a sender that
        # answers no advertisement in particular)
        self.answered: dict[str, dict[Key, Expression] | None] = {}
        # (region, topic) -> (does an answered advertisement cover the event: True for any
        # event, None for none, else a function of the attributes; the groups' filters as
        # one function, None: no group), made again only for the (region, topic) a change
        # touches.
        self._index: dict[tuple[str, str], tuple[object, Matcher | None]] = {}

    def _touched(self, sender: str, keys: Iterable[Key] | None = None) -> None:
        region = self.region_of.get(sender)
        topics = None if keys is None else {k[0] for k in keys}
        for rt in [rt for rt in self._index if rt[0] == region and (topics is None or rt[1] in topics)]:
            del self._index[rt]

    def known(self, region: str) -> bool:
        return any(self.region_of[s] == region for s in self.complete)

    def replace(self, sender: str, region: str, groups: Mapping[Key, Expression], complete: bool,
                answered: Mapping[Key, Expression] | None = None) -> None:
        self._touched(sender)
        self.region_of[sender] = region
        self.groups[sender] = dict(groups)
        self.answered[sender] = None if answered is None else dict(answered)
        (self.complete.add if complete else self.complete.discard)(sender)
        self._touched(sender)

    def set(self, sender: str, groups: Mapping[Key, Expression],
            answered: Mapping[Key, Expression] | None = None) -> None:
        self.groups.setdefault(sender, {}).update(groups)
        mine = self.answered.get(sender)
        if answered and mine is not None:
            mine.update(answered)
        self._touched(sender, [*groups, *(answered or ())])

    def clear(self, sender: str, keys: Iterable[Key], answered: Iterable[Key] = ()) -> None:
        keys, answered = list(keys), list(answered)
        mine = self.groups.get(sender, {})
        for k in keys:
            mine.pop(k, None)
        self.unanswer(answered, sender)
        self._touched(sender, keys)

    def unanswer(self, keys: Iterable[Key], sender: str | None = None) -> None:
        """These advertisements are answered no more (by `sender`, or by anyone: this router
        withdrew them, so an answer to them may be stale when they come back)."""
        keys = list(keys)
        for s in [sender] if sender is not None else list(self.answered):
            mine = self.answered.get(s)
            if mine is not None:
                for k in keys:
                    mine.pop(k, None)
                self._touched(s, keys)

    def lost(self, sender: str) -> None:
        """The stream from `sender` ended: what it said may go stale from here on."""
        self._touched(sender)
        self.region_of.pop(sender, None)
        self.groups.pop(sender, None)
        self.answered.pop(sender, None)
        self.complete.discard(sender)

    def filters(self, region: str, topic: str) -> list[Expression]:
        """The filters of `region`'s groups on `topic`: the union over its senders (any of
        them may be behind another by a few changes; the union never misses)."""
        seen: dict[Key, Expression] = {}
        for s, r in self.region_of.items():
            if r == region:
                seen.update((k, f) for k, f in self.groups.get(s, {}).items() if k[0] == topic)
        return list(seen.values())

    def keys(self, region: str, topic: str | None = None) -> set[Key]:
        return {k for s, r in self.region_of.items() if r == region for k in self.groups.get(s, {})
                if topic is None or k[0] == topic}

    def answers(self, region: str) -> set[Key]:
        """The advertisements a complete summary of `region` answers (Describe)."""
        return {k for s in self.complete if self.region_of[s] == region for k in (self.answered.get(s) or {})}

    def _cover(self, region: str, topic: str):
        bounds = []
        for s in self.complete:
            if self.region_of[s] != region:
                continue
            mine = self.answered.get(s)
            if mine is None:
                return True
            for k, b in mine.items():
                if k[0] == topic:
                    if any(not t.predicates for t in b.terms):  # the topic's whole content space
                        return True
                    bounds.append(b)
        return compile_filters(bounds, self.wire) if bounds else None

    def wants(self, region: str, topic: str, attributes) -> bool:
        if not self.known(region):
            return True
        if (region, topic) not in self._index:
            filters = self.filters(region, topic)
            self._index[region, topic] = (self._cover(region, topic),
                                          compile_filters(filters, self.wire) if filters else None)
        cover, match = self._index[region, topic]
        if cover is None or cover is not True and not any(cover([attributes])):
            return True  # an advertisement not answered yet (or an event outside every one)
        return match is not None and any(match([attributes]))
