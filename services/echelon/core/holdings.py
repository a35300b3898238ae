"""Reconciling an agent's subscriptions with the matcher tier's copies: a digest per
bucket first, then the entries of the buckets that differ.

Each side holds a set of (subscription id, version). Ids go to buckets by
crc32(id) mod n; a bucket's digest is the first 8 bytes of BLAKE2b over its sorted
`id\\0version\\n` lines, so equal sets give equal digests whatever the order, and only
the buckets that differ travel in full. `diff` says what to fix on each side.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping

BUCKETS = 64
MAX_BUCKETS = 4096
DIGEST_BYTES = 8

Holding = tuple[str, int]  # (subscription id, version)


def bucket_of(sid: str, n: int) -> int:
    return zlib.crc32(sid.encode()) % n


def digests(holdings: Iterable[Holding], n: int = BUCKETS) -> list[bytes]:
    """One digest per bucket (an empty bucket has the digest of nothing)."""
    lines: dict[int, list[str]] = defaultdict(list)
    for sid, version in holdings:
        lines[bucket_of(sid, n)].append(f"{sid}\0{version}\n")
    return [hashlib.blake2b("".join(sorted(lines.get(b, ()))).encode(), digest_size=DIGEST_BYTES).digest()
            for b in range(n)]


def differing(ours: list[bytes], theirs: Iterable[Holding]) -> tuple[list[int], list[Holding]]:
    """The buckets where `theirs` does not give the digest `ours` has, and their entries."""
    theirs = list(theirs)
    mine = digests(theirs, len(ours))
    buckets = [b for b in range(len(ours)) if mine[b] != ours[b]]
    wanted = set(buckets)
    return buckets, [h for h in theirs if bucket_of(h[0], len(ours)) in wanted]


@dataclass(frozen=True)
class Diff:
    extra: list[Holding]  # held by the tier, not by the agent (at that version): remove them there
    missing: list[Holding]  # held by the agent, not by the tier: register them again


def diff(agent: Mapping[str, int], tier: Iterable[Holding], buckets: Iterable[int], n: int) -> Diff:
    """Compare within `buckets` only: the agent's {id: version} with the tier's entries."""
    buckets = set(buckets)
    tier = list(tier)
    held = {(sid, v) for sid, v in tier}
    extra = sorted(h for h in held if agent.get(h[0]) != h[1])
    missing = sorted((sid, v) for sid, v in agent.items() if bucket_of(sid, n) in buckets and (sid, v) not in held)
    return Diff(extra, missing)
