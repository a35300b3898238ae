"""Removal propagation: a removed (or replaced) subscription leaves every matcher, and no
copy still travelling brings it back (tier.py has the whole protocol).

Remove is sent to every matcher; each drops the copy if it is not newer, keeps a
tombstone (store.py), and tells the copy's holders the sender did not know of (a matcher
that just joined, pushed to by this one). A matcher that cannot be reached is told again
until it leaves the view.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Callable, Sequence

from echelon.matcher.adoption import RETRY, Layouts
from echelon.matcher.peers import PeerUnavailable, Transport
from echelon.matcher.store import CopyStore

Drops = dict[str, list[tuple[str, int]]]  # peer -> (id, version) to drop there


class Removal:
    def __init__(self, me: str, layouts: Layouts, store: CopyStore, transport: Transport,
                 spawn: Callable[..., asyncio.Task]):
        self.me = me
        self.layouts = layouts
        self.store = store
        self.transport = transport
        self.spawn = spawn

    async def everywhere(self, items: list[tuple[str, int]]) -> set[str]:
        """Drop each (id, version) at every matcher; the ids dropped somewhere."""
        peers = self.layouts.peers()
        removed = set(await self.drop(items, self.me, [self.me, *peers]))
        results = await asyncio.gather(*(self.transport.drop(p, items, [self.me, *peers]) for p in peers),
                                       return_exceptions=True)
        for p, r in zip(peers, results):
            if isinstance(r, BaseException):
                self.spawn(self._drop_later(p, items))
            else:
                removed.update(r)
        return removed

    async def _drop_later(self, peer: str, items: list[tuple[str, int]]) -> None:
        while peer in self.layouts.view.matchers:
            await asyncio.sleep(RETRY * 5)
            try:
                await self.transport.drop(peer, items, [self.me])
                return
            except PeerUnavailable:
                continue

    async def drop(self, items: Sequence[tuple[str, int]], sender: str = "", sent_to: Sequence[str] = ()) -> list[str]:
        """Drop each (id, version): its copy if not newer, keeping the version as a tombstone.
        A dropped copy's holders under this matcher's layouts that the sender did not reach
        (a matcher it did not know yet, pushed to by this one) are told too."""
        now = time.monotonic()
        self.store.expire(now)
        out = []
        tell: Drops = defaultdict(list)
        skip = {self.me, sender, *sent_to}
        for sid, version in items:
            self.store.bury(sid, version, now)
            c = self.store.copies.get(sid)
            if c is not None and c.version <= version:
                for p in self.layouts.holders(c) - skip:
                    tell[p].append((sid, version))
                self.store.uninstall(sid)
                out.append(sid)
        await self.tell(tell, list(skip))
        return out

    async def tell(self, tell: Drops, told: list[str]) -> None:
        """Drops for holders the sender did not reach; best effort (their push may be gone)."""
        peers = list(tell)
        told = [*told, *peers]
        await asyncio.gather(*(self.transport.drop(p, tell[p], told) for p in peers), return_exceptions=True)
