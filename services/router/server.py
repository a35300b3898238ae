"""The router: a region's gateway on the inter-region overlay (OctopiA SCOT).

A skeleton for now: it joins membership, accepts `Attach` from its region's agents and
answers `Relay` with UNIMPLEMENTED, so nothing is acknowledged that is not carried.
"""

from __future__ import annotations

from echelon.runtime.errors import InvalidArgument, Unimplemented
from echelon.runtime.node import Node, NodeConfig
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc


class RouterServicer(ogrpc.RouterServicer):
    def __init__(self, node: "RouterNode"):
        self.node = node

    async def Attach(self, request, context):
        if not request.member_id:
            raise InvalidArgument("member_id is required")
        self.node.attached[request.member_id] = request.region or self.node.config.region
        return opb.AttachResponse(router_id=self.node.config.id)

    async def Relay(self, request_iterator, context):
        raise Unimplemented("inter-region relaying is not implemented yet")
        yield  # pragma: no cover - makes this an async generator


class RouterNode(Node):
    role = mpb.ROLE_ROUTER

    def __init__(self, config: NodeConfig):
        super().__init__(config)
        self.attached: dict[str, str] = {}
        self.server.add(ogrpc.add_RouterServicer_to_server, RouterServicer(self),
                        opb.DESCRIPTOR.services_by_name["Router"].full_name)
