"""Named (durable) subscriptions: their records, backlogs and acks on disk (store.py), a
replica on another agent, and the Durable RPCs. `Durables` is the one entry point the
agent holds (docs/guarantees.md, "Durable subscriptions").
"""

from echelon.agent.durable.durables import Defaults, Durables

__all__ = ["Defaults", "Durables"]
