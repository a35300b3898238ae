"""Topic administration: stored by membership; the agent forwards, failing over."""

from __future__ import annotations

from typing import Callable

import grpc

from echelon.runtime.auth import Access
from echelon.contract.errors import NotFound
from echelon.runtime.member import MemberClient
from echelon.contract.transport import PLAIN, Transport, call_any, unavailable
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc


class AdminProxy(pgrpc.AdminServicer):
    def __init__(self, replicas: list[str], membership: Callable[[], MemberClient], transport: Transport = PLAIN,
                 access: Access | None = None):
        self.access = access  # describe rights (runtime/auth.py `sees`); None: everything seen
        self.replicas = replicas
        self.membership = membership  # whose topics a change updates at once
        self.transport = transport

    async def call(self, method: str, request):
        async def one(address: str):
            async with self.transport.dial(address) as ch:
                return await getattr(pgrpc.AdminStub(ch), method)(request, timeout=5.0)

        return await call_any(self.replicas, one, retry=unavailable)

    async def _forward(self, method: str, request, context):
        try:
            response = await self.call(method, request)
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details())
        member = self.membership()
        if method == "CreateTopic":
            member.topics[response.name] = response
        elif method == "DeleteTopic":
            member.topics.pop(request.name, None)
        return response

    async def CreateTopic(self, request, context):
        return await self._forward("CreateTopic", request, context)

    async def GetTopic(self, request, context):
        if self.access is not None and not self.access.sees(request.name):
            raise NotFound(f"topic {request.name[:200]!r} does not exist")
        return await self._forward("GetTopic", request, context)

    async def ListTopics(self, request, context):
        listed = await self._forward("ListTopics", request, context)
        if self.access is None:
            return listed
        return ppb.ListTopicsResponse(topics=[t for t in listed.topics if self.access.sees(t.name)])

    async def DeleteTopic(self, request, context):
        return await self._forward("DeleteTopic", request, context)

    async def GrantAcl(self, request, context):
        return await self._forward("GrantAcl", request, context)

    async def RevokeAcl(self, request, context):
        return await self._forward("RevokeAcl", request, context)

    async def ListAcls(self, request, context):
        return await self._forward("ListAcls", request, context)

    async def SetCaps(self, request, context):
        return await self._forward("SetCaps", request, context)

    async def ListCaps(self, request, context):
        return await self._forward("ListCaps", request, context)
