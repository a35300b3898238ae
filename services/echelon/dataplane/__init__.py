"""The data plane agents and routers share: LBDD trees, frames, holds, links and relays,
the root's side of a publish, parking, slices of bulk payloads, the region gateway.

It sits between `runtime` and the services: it imports `core`, `runtime` and `v1` only,
and the agent and the router are peers over it (docs/architecture.md, "Layers").
"""
