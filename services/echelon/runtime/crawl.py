"""One step of CRAWL, served by every member (docs/papers.md, CBDLO): the members its
view holds alive, as access points for the role asked for and as neighbours to walk
on. The walk itself is core/crawl.py, moved by the member looking (agent/crawl.py)."""

from __future__ import annotations

from typing import Callable

from echelon.contract.errors import InvalidArgument
from echelon.runtime.member import MemberClient
from echelon.v1 import crawl_pb2 as cpb
from echelon.v1 import membership_pb2 as mpb

ROLES = (mpb.ROLE_AGENT, mpb.ROLE_MATCHER, mpb.ROLE_ROUTER)


class CrawlServicer:
    def __init__(self, membership: Callable[[], MemberClient | None]):
        self._membership = membership  # set once the node has joined

    async def Step(self, request: cpb.CrawlStepRequest, context) -> cpb.CrawlStepResponse:
        if request.role not in ROLES:
            raise InvalidArgument(f"role {request.role}: one of agent, matcher, router")
        member = self._membership()
        if member is None:
            return cpb.CrawlStepResponse()
        alive = [m for role in ROLES for m in member.alive(role) if m.id != member.id]
        return cpb.CrawlStepResponse(holders=[m for m in alive if m.role == request.role],
                                     neighbours=[m for m in alive if m.role != request.role],
                                     view_age_seconds=min(member.view_age(), 1e9))
