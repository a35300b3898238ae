"""Named subscriptions kept on the agent's disk (`--data-dir`), so that a process restarted
after a crash (kill -9) holds them again: detached, with their filter, owner and creation
time, registered on the matcher tier as before. What was sent to one while its stream was
attached is kept upstream until its client settles it (subscriptions.py), so the restarted
process is sent it again (parked for it meanwhile: dataplane/parking.py) and its client,
reopening it by name, gets it: a named subscription is owed everything published from its
creation on, across a kill of its agent (docs/guarantees.md, "At-least-once delivery").

Only the definitions are kept (written at each open that creates one, filter change and
removal, replaced whole: a few hundred bytes each); the backlog stays in memory, and
upstream. Without a data dir nothing is kept, as before: the subscription ends with the
process.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from pathlib import Path
from typing import Iterable

from echelon.contract.wire import filter_from_pb, filter_to_pb
from echelon.v1 import common_pb2 as pb

log = logging.getLogger("echelon.agent.named")

FILE = "named-subscriptions.json"


class Saved:
    """One named subscription's definition as kept on disk."""

    __slots__ = ("name", "topic", "filter", "owner", "created_ns")

    def __init__(self, name: str, topic: str, flt, owner: str, created_ns: int):
        self.name, self.topic, self.filter, self.owner, self.created_ns = name, topic, flt, owner, created_ns


class NamedFile:
    """The file of the named subscriptions in `data_dir` (None: nothing kept)."""

    def __init__(self, data_dir: str | Path | None):
        self.path = Path(data_dir) / FILE if data_dir is not None else None

    def load(self) -> list[Saved]:
        """What the previous process kept; an unreadable file is logged and ignored (its
        subscriptions are then new ones for their clients, as without a data dir)."""
        if self.path is None or not self.path.exists():
            return []
        try:
            rows = json.loads(self.path.read_text())
            return [Saved(r["name"], r["topic"], filter_from_pb(pb.Filter.FromString(base64.b64decode(r["filter"]))),
                          r.get("owner", ""), int(r["created_ns"])) for r in rows]
        except Exception as e:  # noqa: BLE001 - a damaged file must not stop the agent
            log.error("named subscriptions in %s not restored: %s", self.path, e)
            return []

    def save(self, subs: Iterable) -> None:
        """Replace the file with `subs` (the registry's named, non-durable ones)."""
        if self.path is None:
            return
        rows = [{"name": s.name, "topic": s.topic, "owner": s.owner, "created_ns": s.created_ns,
                 "filter": base64.b64encode(filter_to_pb(s.filter).SerializeToString()).decode()} for s in subs]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(rows, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
