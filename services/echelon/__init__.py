"""Echelon: a content-based publish/subscribe cluster.

The import package `echelon` is this `services/echelon/` folder: `core/` holds the pure
algorithms, `runtime/` the shared service plumbing, and one folder per service.

Importing it (before grpc) picks gRPC's transport for the process: gRPC's own
GRPC_EXPERIMENTS when set (empty: gRPC's default), else TRANSPORT.
"""

import os

__version__ = "0.1.0"

# grpc.aio's EventEngine does each socket's I/O on threads of its own and hands every
# message on to the poller thread that wakes the event loop: at low rates, where each event
# travels alone, those handoffs were about a third of each service's CPU per event. gRPC's
# iomgr path does the I/O on the poller thread itself (docs/performance.md, "gRPC's
# transport"). gRPC reads this once, when it is first imported: later, it changes nothing.
TRANSPORT = "-event_engine_client,-event_engine_listener"
os.environ.setdefault("GRPC_EXPERIMENTS", TRANSPORT)
