"""IDR: OctopiA's inter-cluster dynamic routing around congested iLinks
(OctopiA section VII-B; docs/papers.md, "OctopiA").

Congestion of an output queue over an interval: the congestion element
CE = enqueued / dequeued (frames put into the queue / frames that left it, i.e. were
acknowledged, in the interval) and the queue length q at its end. The link is congested
when CE >= 1 and q > delta (the paper's equation 10 did not survive extraction; this is
our reading, docs/papers.md "OctopiA"). With no dequeues in the interval CE is infinite if q > 0: a
queue that moves nothing is as congested as it gets.

IDR at B(a, c) for the regions still to serve (the CIV minus c; the caller serves c):

  (i)   some target iLink is uncongested: every uncongested target iLink gets its region's
        copy; the regions behind congested target iLinks ride as a CIV-N on the
        uncongested target iLink with the smallest q (none goes on a congested one);
  (ii)  all target iLinks congested, a target aLink is not: one CIV-N carrying every target
        down the uncongested aLink with the smallest q;
  (iii) all target iLinks congested and no target aLink: one CIV-N on the least congested
        target iLink (smallest q, then CE);
  (iv)  all target iLinks and all target aLinks congested: the same as (iii).

Target aLinks are this router's aLinks except the one the notification came in on, so a
CIV-N walks away from where it entered the region's tree and never returns. Every iLink
hop enters a region whose bit it then clears, so a CIV strictly shrinks across iLinks:
no loops, and each send carries a disjoint part of the CIV, so each region is served
exactly once. Nothing congested: the same sends as SNR (rule "none").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from echelon.core.scot import Router, Scot, Send, bits, snr

RULES = ("none", "i", "ii", "iii", "iv")


def congestion_element(enqueued: int, dequeued: int, q: int) -> float:
    """CE over one interval: enqueued / dequeued; infinite with no dequeues and q > 0."""
    if enqueued < 0 or dequeued < 0 or q < 0:
        raise ValueError("counts must be >= 0")
    if dequeued == 0:
        return math.inf if q > 0 else float(enqueued > 0)
    return enqueued / dequeued


def congested(ce: float, q: int, delta: int) -> bool:
    return ce >= 1.0 and q > delta


@dataclass(frozen=True)
class LinkState:
    """An output queue as last measured: length, congestion element, verdict."""

    q: int = 0
    ce: float = 0.0
    congested: bool = False

    @property
    def order(self) -> tuple[int, float]:
        """Smaller is less congested."""
        return (self.q, self.ce)


IDLE = LinkState()


class CongestionMeter:
    """Turns a link's running counters, sampled once per interval, into its LinkState."""

    def __init__(self, delta: int):
        if delta < 0:
            raise ValueError("delta must be >= 0")
        self.delta = delta
        self._enqueued = 0
        self._dequeued = 0
        self.state = IDLE

    def sample(self, enqueued_total: int, dequeued_total: int, q: int) -> LinkState:
        ce = congestion_element(enqueued_total - self._enqueued, dequeued_total - self._dequeued, q)
        self._enqueued, self._dequeued = enqueued_total, dequeued_total
        self.state = LinkState(q, ce, congested(ce, q, self.delta))
        return self.state


@dataclass(frozen=True)
class Decision:
    sends: tuple[Send, ...]
    rule: str  # one of RULES


def idr(scot: Scot, here: Router, v: int, states: Mapping[Router, LinkState],
        came_from: Iterable[Router] = ()) -> Decision:
    """IDR's sends at `here` for CIV `v` (the own bit is ignored: served by the caller).

    `states` holds the output queues by the router at their far end (absent: idle);
    `came_from` the aLink neighbours not to use (the one the notification arrived from).
    """
    a, c = here
    targets = [o for o in bits(v) if o != c]
    if not targets:
        return Decision((), "none")
    links = {o: scot.ilink(a, c, o) for o in targets}
    state = lambda r: states.get(r, IDLE)  # noqa: E731
    hot = [o for o in targets if state(links[o]).congested]
    if not hot:
        return Decision(tuple(snr(scot, here, v)), "none")
    cool = [o for o in targets if o not in hot]
    if cool:
        carrier = min(cool, key=lambda o: (state(links[o]).order, o))
        piggy = sum(1 << o for o in hot)
        return Decision(tuple(Send(links[o], (1 << o) | (piggy if o == carrier else 0)) for o in cool), "i")
    rest = sum(1 << o for o in targets)
    skip = set(came_from)
    alinks = [r for r in scot.alink(a, c) if r not in skip]
    free = [r for r in alinks if not state(r).congested]
    if free:
        return Decision((Send(min(free, key=lambda r: (state(r).order, r)), rest),), "ii")
    best = min(targets, key=lambda o: (state(links[o]).order, o))
    return Decision((Send(links[best], rest),), "iv" if alinks else "iii")
