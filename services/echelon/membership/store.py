"""A membership replica's durable state: SQLite in WAL mode with `synchronous=FULL`
(every commit fsynced), one file `<data dir>/membership.sqlite3`.

What is kept: the replicated state -- every topic and ACL entry with its stamp
(tombstones too, so a delete still beats the put it removed after a restart), the
current routing plan with its stamp -- and the time of the routing job's last good run.
The view's topics and ACLs are rebuilt from these; members and their liveness are not
kept (every member beats again and rejoins, and a verdict from before the restart
would be stale anyway). docs/operations.md, "Membership state", says how to back it up.

A write is committed (and fsynced) before the call that made it returns, so a topic or
ACL a client was told exists survives a power cut of every replica at once. Rows are
one-entry `ReplicaState` messages, the replication contract's own encoding, so a
loaded state merges exactly as a peer's pull does (`Replica.merge_state`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from echelon.core.replication import Entry
from echelon.membership.wire import state_from_pb, state_to_pb
from echelon.v1 import membership_pb2 as mpb

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (kind TEXT NOT NULL, key TEXT NOT NULL, state BLOB NOT NULL,
    PRIMARY KEY (kind, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value REAL NOT NULL);
"""
KINDS = ("topic", "acl", "plan")


class StateStore:
    def __init__(self, data_dir: str | Path):
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(data_dir) / "membership.sqlite3"
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # WAL: every commit fsyncs the log
        self.db.executescript(SCHEMA)

    def save(self, kind: str, key: str, entry: Entry) -> None:
        """One entry (a tombstone too), committed before returning."""
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {KINDS}")
        if kind == "plan":
            state = state_to_pb("", {}, entry)
        elif kind == "topic":
            state = state_to_pb("", {key: entry}, None)
        else:
            state = state_to_pb("", {}, None, {key: entry})
        self.db.execute("INSERT OR REPLACE INTO entries (kind, key, state) VALUES (?, ?, ?)",
                        (kind, key, state.SerializeToString()))

    def save_meta(self, key: str, value: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def load(self) -> tuple[dict[str, Entry], Entry | None, dict[str, Entry], dict[str, float]]:
        """(topics, plan, acls, meta): the first three are `Replica.merge_state`'s arguments."""
        whole = mpb.ReplicaState()
        for (blob,) in self.db.execute("SELECT state FROM entries ORDER BY kind, key"):
            one = mpb.ReplicaState.FromString(blob)
            whole.topics.extend(one.topics)
            whole.acls.extend(one.acls)
            if one.HasField("plan"):
                whole.plan.CopyFrom(one.plan)
        topics, plan, acls = state_from_pb(whole)
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        return topics, plan, acls, meta

    def close(self) -> None:
        self.db.close()
