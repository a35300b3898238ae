"""A node's outgoing relay links, one per peer (links.py), with their per-peer series; and
`PlaneHost`, the node as its data planes see it (agents and routers alike).

A link is made on first use and dropped when its peer leaves the view (or comes back on
another address): its unacknowledged frames come back at once to `on_abandon`, the data
planes' path update, ahead of anything routed on the new view.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from prometheus_client import Counter, Gauge

from echelon.dataplane.links import Link, LinkMetrics
from echelon.core.dedup import DedupWindow
from echelon.contract.transport import PLAIN, Transport
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb


class LinkSet:
    def __init__(self, me: str, window_bytes: int, registry, undelivered: Counter,
                 on_break: Callable[[str], None], on_abandon: Callable[[list[asyncio.Future]], None],
                 transport: Transport = PLAIN):
        self.me = me
        self.transport = transport
        self.window_bytes = window_bytes
        self.undelivered = undelivered
        self.on_break = on_break
        self.on_abandon = on_abandon
        self.links: dict[str, Link] = {}
        self.queue = Gauge("echelon_link_queue_length", "Unacknowledged frames per outgoing link.", ["peer"],
                           registry=registry)
        self.enqueued = Counter("echelon_link_enqueued_total", "Frames enqueued per outgoing link.", ["peer"],
                                registry=registry)
        self.dequeued = Counter("echelon_link_dequeued_total", "Frames acknowledged per outgoing link.", ["peer"],
                                registry=registry)
        self.sent_bytes = Counter("echelon_relay_sent_bytes_total", "Bytes sent per peer.", ["peer"],
                                  registry=registry)
        self.received_bytes = Counter("echelon_relay_received_bytes_total", "Bytes received per peer.", ["peer"],
                                      registry=registry)

    def __contains__(self, peer: str) -> bool:
        return peer in self.links

    def link(self, peer: mpb.Member) -> Link:
        link = self.links.get(peer.id)
        if link is None or link.address != peer.address:
            if link is not None:  # the peer came back on another address
                self.drop(peer.id)
            link = self.links[peer.id] = Link(
                self.me, peer.id, peer.address, self.window_bytes, on_break=self.on_break,
                metrics=LinkMetrics(self.enqueued.labels(peer.id), self.dequeued.labels(peer.id),
                                    self.sent_bytes.labels(peer.id)), transport=self.transport)
            self.queue.labels(peer.id).set_function(lambda: link.queue_length)
        return link

    def drop(self, peer: str) -> None:
        """The peer left the view: its unacknowledged frames come back and are re-routed."""
        link = self.links.pop(peer, None)
        if link:
            self.undelivered.inc(len(link.unacked))
            try:
                self.queue.remove(peer)
            except KeyError:
                pass
            self.on_abandon(link.abandon())
            asyncio.create_task(link.close())

    def keep(self, alive: set[str]) -> None:
        """Drop the links of peers not in `alive`."""
        for peer in [p for p in self.links if p not in alive]:
            self.drop(peer)

    def received(self, peer: str, known: bool):
        """The received-bytes series of a peer (`known`: in the view; else one "unknown" series)."""
        return self.received_bytes.labels(peer if known else "unknown")

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links.values()), return_exceptions=True)


@dataclass
class PlaneHost:
    """A node as its data planes see it (dataplane.Host): who it is, its links, local
    delivery and the data plane's counters; not the node."""

    id: str
    address: str
    metrics: object  # copies (labelled "as"), rerouted, lost, parked, unparked
    links: LinkSet
    dedup: DedupWindow  # message ids delivered here
    deliver_local: Callable[..., int]  # a frame's whole events, in order (and their bytes as received)
    # (head event, payload size) -> the local subscriptions' slices.ChunkStreams; a router has none
    open_stream: Callable[[pb.Event, int], list] = lambda head, size: []
    # holds of local subscriptions past their bound that the last deliveries went to: the
    # frame that brought them is acknowledged once they are released (back-pressure)
    local_full: Callable[[], list] = lambda: []
    stopping: bool = False  # from then on nothing is acknowledged or re-routed

    def link(self, member: mpb.Member) -> Link:
        return self.links.link(member)
