"""OctopiA's control plane as Echelon's routers run it between regions: a region's
subgroup, its CIB_SET / CIB_CLEAR, and the cluster bits of an event at the router that
receives it from a publishing agent (OctopiA sections VI, VII-A; docs/event-path.md,
"Regions that stand alone"; `scot_control.py` holds the paper's own tables).

OctopiA's cluster is a region and its broker a router. Differences from the paper, each
on the safe side (a region may get an event it does not want, never miss one it does):

- Every router is the host of every topic its agents publish, over the whole content
  space: the advertisement is implicit, so there is no ADV / UNADV, and a secondary router
  sends its region's subgroups to every router of the other regions.
- The region's subgroup is the region's subscriptions grouped by (topic, filter):
  identical filters are one entry. A CIB_SET names a group when its first subscription
  appears, a CIB_CLEAR when its last one leaves, so the host keeps the groups, not a bit,
  and sets the region's bit per event: the bit of region R is set when a group of R on
  the event's topic matches it (the SCB evaluated per event, exact).
- A region is sent everything (its bit always set) unless the host holds a *complete*
  summary of it: from a router that has heard the full state of every live agent of its
  region. A summary is dropped when the stream that carried it ends, so a restarted
  router or a reset link falls back to "everything" until the full state is sent again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from echelon.contract.filters import Expression
from echelon.core.filter_code import Matcher, compile_filters

Key = tuple[str, bytes]  # (topic, the filter's canonical bytes): one subgroup


class Subgroups:
    """A router's own region: each agent's subscriptions by id, and the groups they make.
    Every change returns (groups that appeared, groups that emptied): the CIB_SET and
    CIB_CLEAR to send."""

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
    """At a router: the other regions' groups, by the router that sent them, and which
    senders' summaries are complete. `wants(region, topic, attributes)` is region R's bit
    of the CIV for an event (module doc)."""

    def __init__(self, wire: bool = False) -> None:
        """`wire`: `wants` is given an event's attributes as received (filter_code.py)."""
        self.wire = wire
        self.region_of: dict[str, str] = {}  # sender -> its region
        self.groups: dict[str, dict[Key, Expression]] = {}  # sender -> its region's groups
        self.complete: set[str] = set()
        # (region, topic) -> its groups' filters compiled into one function (None: no group),
        # made again only for the (region, topic) a change touches.
        self._index: dict[tuple[str, str], Matcher | None] = {}

    def _touched(self, sender: str, keys: Iterable[Key] | None = None) -> None:
        region = self.region_of.get(sender)
        topics = None if keys is None else {k[0] for k in keys}
        for rt in [rt for rt in self._index if rt[0] == region and (topics is None or rt[1] in topics)]:
            del self._index[rt]

    def known(self, region: str) -> bool:
        return any(self.region_of[s] == region for s in self.complete)

    def replace(self, sender: str, region: str, groups: Mapping[Key, Expression], complete: bool) -> None:
        self._touched(sender)
        self.region_of[sender] = region
        self.groups[sender] = dict(groups)
        (self.complete.add if complete else self.complete.discard)(sender)
        self._touched(sender)

    def set(self, sender: str, groups: Mapping[Key, Expression]) -> None:
        self.groups.setdefault(sender, {}).update(groups)
        self._touched(sender, groups)

    def clear(self, sender: str, keys: Iterable[Key]) -> None:
        keys = list(keys)
        mine = self.groups.get(sender, {})
        for k in keys:
            mine.pop(k, None)
        self._touched(sender, keys)

    def lost(self, sender: str) -> None:
        """The stream from `sender` ended: what it said may go stale from here on."""
        self._touched(sender)
        self.region_of.pop(sender, None)
        self.groups.pop(sender, None)
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

    def wants(self, region: str, topic: str, attributes) -> bool:
        if not self.known(region):
            return True
        if (region, topic) not in self._index:
            filters = self.filters(region, topic)
            self._index[region, topic] = compile_filters(filters, self.wire) if filters else None
        match = self._index[region, topic]
        return match is not None and any(match([attributes]))
