"""LBDD: the load-balancing dissemination tree (Li et al., section 3; docs/papers.md, "LBDD").

Every node derives the same tree from the same view -- the source and the set of
subscribers -- so the tree itself is never sent: a relay computes its own targets, and
which destinations lie behind each of them, from the membership it already holds.

Choices where the paper is silent:
- inside a bucket nodes are ordered by (digest, key): equal digests break ties by key;
- the source never counts as a member (a publisher subscribing to its own topic already
  holds the data);
- a member whose digest equals the source's (distance 0) joins bucket 1, so the source is
  alone in bucket 0 and bucket numbers strictly increase along every edge;
- a node that is neither the source nor a member is not in the tree: it has no targets.

Bucket hints (load-aware LBDD, from the routing plan's `bucket_hints`): a member named in
`leaves` (a congested or slow agent) leaves its digest bucket and joins one extra bucket,
number LEAF_BUCKET = 33, above every XOR bucket (distances have at most 32 bits). Inside it
members keep the (digest, key) order. That bucket is always the last non-empty one, so its
members have no targets: they receive but relay nothing. Algorithm 2 is unchanged: the
bucket below it (or the source, when every member is hinted) splits it into disjoint,
covering slices, so every member still has exactly one parent and bucket numbers still
strictly increase along every edge. The other members keep their buckets; only the slice
boundaries of the bucket just below the leaves move. Every agent applies the same plan,
so they all derive the same tree; during the switch a relay whose view differs sends the
destinations outside its subtree directly (dataplane/trees.py), so nothing is lost.

Out-degree bound (an option, off by default and for the paper's experiment): the paper's
out-degree is unbounded -- a small bucket below a large one makes a few nodes send many
copies (docs/papers.md). With `max_degree = D`, the tree's levels are the non-empty buckets
as before, but a level keeps only its first D * |level below| members in (digest, key)
order; the rest are pushed one level down (merged into the next level, re-sorted), and what
is left past the last bucket forms extra levels of the same capacity. Algorithm 2 then runs
unchanged between consecutive levels, so every member still has exactly one parent and each
slice holds at most ceil(|next| / |self|) <= D nodes. Levels strictly increase along every
edge (bucket numbers need no longer); depth <= non-empty buckets + ceil(log_D n), since
pushes only join existing levels and the extra levels grow by a factor D. Hinted leaves
stay the last level and are exempt: the hint (relay nothing) wins over the bound.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import groupby

LEAF_BUCKET = 33  # above every XOR bucket: the hinted members' bucket


def digest(key: str) -> int:
    """Section 3.2: the highest 32 bits of MD5(key)."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


def distance(a: int, b: int) -> int:
    """Section 3.2: distance(Ni, Nj) = digest_i XOR digest_j."""
    return a ^ b


def bucket(source_digest: int, node_digest: int) -> int:
    """Section 3.2: bucket m holds distances in [2^(m-1), 2^m); the source alone is bucket 0."""
    return distance(source_digest, node_digest).bit_length()


def _bounds(pos: int, n_self: int, n_next: int) -> tuple[int, int]:
    """Algorithm 2: the slice [lo, hi) of B_next taken by rank pos + 1 of B_self.

    The floor form partitions B_next exactly; for a run of positions [a, b) of B_self
    the union of slices is [a*n_next//n_self, b*n_next//n_self), which `route` relies on.
    """
    return pos * n_next // n_self, (pos + 1) * n_next // n_self


@dataclass(frozen=True)
class Buckets:
    """Algorithm 1 for every node of one view: the non-empty buckets relative to `source`.

    Build once per (source, members) with `buckets()` and ask it for any node's rank,
    targets or routes; the module-level functions are one-shot shorthands.
    """

    source: str
    numbers: tuple[int, ...]  # each level's (highest) bucket number; unbounded: one bucket per level
    members: tuple[tuple[str, ...], ...]  # each level's members sorted by (digest, key)
    where: dict[str, tuple[int, int]] = field(repr=False)  # key -> (level, 0-based position)
    own: dict[str, int] = field(default_factory=dict, repr=False)  # key -> its bucket number

    def _at(self, key: str) -> tuple[int, int] | None:
        # The source is a bucket of its own, of size one, just below level 0.
        return (-1, 0) if key == self.source else self.where.get(key)

    def _size(self, level: int) -> int:
        return 1 if level < 0 else len(self.members[level])

    def _place(self, key: str) -> tuple[int, int]:
        if (at := self._at(key)) is None:
            raise KeyError(f"{key!r} is neither the source nor a member")
        return at

    def rank(self, key: str) -> int:
        """Algorithm 1: 1 + the number of nodes in key's bucket before it in (digest, key) order."""
        return self._place(key)[1] + 1

    def bucket_of(self, key: str) -> int:
        """Section 3.2: key's bucket number (0 for the source)."""
        level = self._place(key)[0]
        return 0 if level < 0 else self.own.get(key, self.numbers[level])

    def targets(self, key: str) -> list[str]:
        """Algorithm 2: key's slice of the next non-empty bucket above its own."""
        at = self._at(key)
        if at is None or at[0] + 1 >= len(self.members):
            return []
        level, pos = at
        lo, hi = _bounds(pos, self._size(level), self._size(level + 1))
        return list(self.members[level + 1][lo:hi])

    def route(self, key: str, destinations: Iterable[str]) -> dict[str, set[str]]:
        """Map each of key's targets to the destinations inside that target's subtree.

        A contiguous run of one bucket feeds a contiguous run of the next, so the subtrees
        of key's targets cut every higher bucket into adjacent ranges; a destination is
        placed by bisecting those boundaries. Destinations outside key's subtree (unknown
        keys, key itself, lower buckets) are left out, and so are targets with none.
        """
        at = self._at(key)
        if at is None or at[0] + 1 >= len(self.members):
            return {}
        level, pos = at
        lo, hi = _bounds(pos, self._size(level), self._size(level + 1))
        heads = self.members[level + 1][lo:hi]
        wanted = sorted(p for d in set(destinations) if (p := self.where.get(d)) and p[0] > level)
        bounds, cur = list(range(lo, hi + 1)), level + 1
        out: dict[str, set[str]] = {}
        for lvl, p in wanted:
            while cur < lvl:
                n_self, n_next = self._size(cur), self._size(cur + 1)
                bounds = [b * n_next // n_self for b in bounds]
                cur += 1
            i = bisect_right(bounds, p) - 1
            if 0 <= i < len(heads):
                out.setdefault(heads[i], set()).add(self.members[lvl][p])
        return out

    def tree(self) -> Tree:
        """Every node's targets at once: the whole tree, O(n)."""
        nodes = [self.source, *(k for level in self.members for k in level)]
        children = {k: self.targets(k) for k in nodes}
        return Tree(
            source=self.source,
            parent={c: p for p in nodes for c in children[p]},
            children=children,
            bucket={k: self.bucket_of(k) for k in nodes},
            rank={k: self.rank(k) for k in nodes},
            depth=len(self.members),
        )


@dataclass(frozen=True)
class Tree:
    """The whole dissemination tree (section 3.5.1, Theorem 1), for tools and tests."""

    source: str
    parent: dict[str, str]  # every member -> its one parent
    children: dict[str, list[str]]  # every node, source included -> its targets
    bucket: dict[str, int]  # source: 0
    rank: dict[str, int]  # source: 1
    depth: int  # edges on the longest path = number of levels (unbounded: non-empty buckets)

    @property
    def out_degree(self) -> dict[str, int]:
        return {k: len(c) for k, c in self.children.items()}

    @property
    def edges(self) -> list[tuple[str, str]]:
        """(parent, child) pairs, level by level, each level in digest order."""
        return [(p, c) for p, cs in self.children.items() for c in cs]

    def subtree(self, key: str) -> set[str]:
        """key and every node below it."""
        out, todo = set(), [key]
        while todo:
            k = todo.pop()
            out.add(k)
            todo.extend(self.children.get(k, ()))
        return out


def _bounded(levels: list[list[tuple[int, int, str]]], max_degree: int) -> list[list[tuple[int, int, str]]]:
    """The out-degree bound (module doc): push each level's overflow one level down."""
    out: list[list[tuple[int, int, str]]] = []
    above, carry = 1, []  # the source is the level below the first
    for level in levels:
        merged = sorted(carry + level, key=lambda t: t[1:]) if carry else level
        cap = max_degree * above
        out.append(merged[:cap])
        carry, above = merged[cap:], len(out[-1])
    while carry:
        cap = max_degree * above
        out.append(carry[:cap])
        carry, above = carry[cap:], len(out[-1])
    return out


def buckets(
    source_key: str, member_keys: Iterable[str], leaves: Iterable[str] = (), max_degree: int | None = None
) -> Buckets:
    """Algorithm 1 over a whole view; sorts once, O(n log n). Members in `leaves` go to
    LEAF_BUCKET (bucket hints); `max_degree` bounds every node's targets (both in the
    module doc)."""
    if max_degree is not None and max_degree < 2:
        raise ValueError(f"max_degree {max_degree}: at least 2 (1 would make a chain)")
    s = digest(source_key)
    leaves = frozenset(leaves)
    keyed = []
    for k in set(member_keys) - {source_key}:
        d = digest(k)
        keyed.append((LEAF_BUCKET if k in leaves else max(1, bucket(s, d)), d, k))
    keyed.sort()
    levels = [list(g) for _, g in groupby(keyed, key=lambda t: t[0])]
    if max_degree is not None:
        hinted = levels.pop() if levels and levels[-1][0][0] == LEAF_BUCKET else None
        levels = _bounded(levels, max_degree) + ([hinted] if hinted else [])
    members = tuple(tuple(k for _, _, k in level) for level in levels)
    where = {k: (lvl, pos) for lvl, ks in enumerate(members) for pos, k in enumerate(ks)}
    own = {k: b for b, _, k in keyed}
    numbers = tuple(max(b for b, _, _ in level) for level in levels)
    return Buckets(source_key, numbers, members, where, own)


def bucket_sequence(
    source_key: str, self_key: str, member_keys: Iterable[str]
) -> list[tuple[int, list[str]]]:
    """Algorithm 1's local output at self: the non-empty buckets above SelfNo, in order."""
    b = buckets(source_key, member_keys)
    self_no = 0 if self_key == source_key else max(1, bucket(digest(source_key), digest(self_key)))
    return [(n, list(ks)) for n, ks in zip(b.numbers, b.members) if n > self_no]


def rank(source_key: str, self_key: str, member_keys: Iterable[str]) -> int:
    """Algorithm 1: self's rank in its bucket (self must be the source or a member)."""
    return buckets(source_key, member_keys).rank(self_key)


def targets(source_key: str, self_key: str, member_keys: Iterable[str]) -> list[str]:
    """Algorithm 2: where self sends a copy, in digest order."""
    return buckets(source_key, member_keys).targets(self_key)


def route(
    source_key: str, self_key: str, member_keys: Iterable[str], destinations: Iterable[str]
) -> dict[str, set[str]]:
    """Each of self's targets -> the destinations in its subtree (see `Buckets.route`)."""
    return buckets(source_key, member_keys).route(self_key, destinations)


def path_update(
    source_key: str, self_key: str, old_members: Iterable[str], new_members: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Algorithm 3: recompute from the new view; return (targets gained, targets lost).

    A failure counts as the node unsubscribing (section 3.4). Frames not yet acknowledged
    by a lost target are re-routed with `route` over the new view; gained targets are
    where they go.
    """
    old = targets(source_key, self_key, old_members)
    new = targets(source_key, self_key, new_members)
    return [t for t in new if t not in old], [t for t in old if t not in new]


def build_tree(
    source_key: str, member_keys: Iterable[str], leaves: Iterable[str] = (), max_degree: int | None = None
) -> Tree:
    """The tree every node's local view implies (Theorem 1), for tools, simulation and tests."""
    return buckets(source_key, member_keys, leaves, max_degree).tree()
