"""Named (durable) subscriptions: their records, backlogs and acks on disk (store.py), a
replica on another agent, and the Durable RPCs. `Durables` is the one entry point the
agent holds (docs/guarantees.md, "Durable subscriptions"); it receives what it uses of the
agent (`durables.Host`, the access rights, the transport), never the agent itself. Its
helpers (acks, peers, copies, upkeep, rpc) are parts of that one object and take it whole:
they share its subscriptions, store and peers, and splitting those into protocols would
only restate `Durables` field by field.
"""

from echelon.agent.durable.durables import Defaults, Durables

__all__ = ["Defaults", "Durables"]
