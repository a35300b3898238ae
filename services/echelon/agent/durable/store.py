"""The agent's on-disk log for durable subscriptions: SQLite in WAL mode (the stdlib's
embedded store; one file per agent, `<data dir>/durable.sqlite3`).

Tables: `events` is the agent's log of the events it received for topics it holds
durable subscriptions of (each once, in arrival order: `pos`), which is also the topic's
retained history for replay; `backlog` names, per subscription, the logged events it
still owes, in delivery order `ord` (a row goes when it is acknowledged); `subs` holds each subscription's record
(durable_pb2.DurableSubscription). Every change is one transaction, committed before the
call returns, except the events logged as they arrive under `batch` and `never`: those of
one event-loop tick (a received frame) share one commit at its end (group commit).

Fsync policy (what a crash can cost; a process crash -- kill -9 -- costs nothing committed
under any policy, since a committed WAL frame is in the OS's page cache; under `batch` and
`never` the events of the tick being run when it dies, which the replica holds too; acks
are always committed before their credits return):

| policy | how | loss window on power loss / kernel crash |
|---|---|---|
| `always` | `synchronous=FULL`: every commit fsyncs the WAL | none |
| `batch` (default) | `synchronous=NORMAL`, the WAL fsynced every `batch_ms` (`flush`) | the last `batch_ms` |
| `never` | `synchronous=NORMAL`, fsync left to the OS and SQLite's checkpoints | the OS's writeback delay (Linux: ~30 s) |

The replica agent narrows every window to "both agents lose power within it".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Callable, Collection, Iterable, Iterator

from echelon.v1 import common_pb2 as pb

FSYNC_POLICIES = ("always", "batch", "never")

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    pos INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL, producer TEXT NOT NULL, seq INTEGER NOT NULL,
    time_ns INTEGER NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL,
    UNIQUE (topic, producer, seq));
CREATE INDEX IF NOT EXISTS events_time ON events (topic, time_ns);
CREATE INDEX IF NOT EXISTS events_pos ON events (topic, pos);
CREATE TABLE IF NOT EXISTS backlog (sub TEXT NOT NULL, pos INTEGER NOT NULL, ord INTEGER NOT NULL,
    PRIMARY KEY (sub, pos)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS backlog_pos ON backlog (pos);
CREATE INDEX IF NOT EXISTS backlog_ord ON backlog (sub, ord);
CREATE TABLE IF NOT EXISTS subs (name TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS deleted (name TEXT PRIMARY KEY, at_ns INTEGER NOT NULL);
"""

Key = tuple[str, int]  # (producer id, sequence)


def key_of(event: pb.Event) -> Key:
    return event.id.producer_id, event.id.sequence


class Store:
    def __init__(self, data_dir: str | Path | None, fsync: str = "batch"):
        """The log in `data_dir`; None: in memory (nothing survives the process)."""
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy {fsync!r}: one of {', '.join(FSYNC_POLICIES)}")
        if data_dir is not None:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(data_dir) / "durable.sqlite3" if data_dir is not None else None
        self.fsync = fsync if data_dir is not None else "never"
        self.db = sqlite3.connect(self.path or ":memory:", isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if fsync == 'always' else 'NORMAL'}")
        self.db.executescript(SCHEMA)
        self._wal: int | None = None
        self._group = False  # a transaction of appends is open (committed at the end of the tick)
        self._bytes: dict[str, int] = {}  # topic -> bytes logged (retention), summed once per process
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a tool, a test): every change commits at once
            self._loop = None
        self.flushes = 0
        self._synced = self.db.total_changes  # changes made when the last fsync began
        # Set by every commit: the `batch` fsync loop sleeps on it, so an agent that writes
        # nothing does not wake every period (it woke 100 times a second for nothing).
        self.committed = asyncio.Event()

    @contextlib.contextmanager
    def _tx(self, group: bool = False) -> Iterator[sqlite3.Connection]:
        """One change, atomic. `group` (appends, under batch/never): it joins a transaction
        committed once at the end of this event-loop tick (one commit per frame received,
        not per event); any other change commits that transaction with its own."""
        if not self._group:
            self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("SAVEPOINT change")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK TO change")
            self.db.execute("RELEASE change")
            self._bytes.clear()  # counted what was rolled back: summed again when next asked
            if not self._group:
                self.db.execute("COMMIT")
            raise
        self.db.execute("RELEASE change")
        if group and self.fsync != "always" and self._loop is not None:
            if not self._group:
                self._group = True
                self._loop.call_soon(self.commit)
            return
        self._group = False
        self.db.execute("COMMIT")
        self.committed.set()

    def commit(self) -> None:
        """The grouped appends, committed (the end of the tick, or before any other change)."""
        if self._group:
            self._group = False
            self.db.execute("COMMIT")
            self.committed.set()

    def dirty(self) -> bool:
        """Has anything been committed since the last `flush` began (or is a transaction
        still open, counted again at the next)? An agent without durable subscriptions
        then does no fsync at all: a periodic fsync of nothing still costs a busy disk's time.
        Reads the connection: call it on the event loop."""
        if self.db.in_transaction:
            return True
        changes = self.db.total_changes
        if changes == self._synced:
            return False
        self._synced = changes
        return True

    def flush(self) -> None:
        """The `batch` policy's periodic fsync of the WAL (commits since the last one
        become safe from power loss), when `dirty`. Run in a worker thread: it touches
        only the WAL's descriptor, never the connection."""
        if self._wal is None:
            wal = f"{self.path}-wal"
            if self.path is None or not os.path.exists(wal):
                return
            self._wal = os.open(wal, os.O_RDONLY)
        os.fsync(self._wal)
        self.flushes += 1

    def close(self) -> None:
        self.commit()
        if self._wal is not None:
            os.close(self._wal)
            self._wal = None
        self.db.close()

    # -- records -------------------------------------------------------------------------

    def records(self) -> dict[str, bytes]:
        return dict(self.db.execute("SELECT name, record FROM subs"))

    def delete(self, name: str, at_ns: int) -> None:
        """Gone, with a tombstone: a holder that was down when it was deleted learns it."""
        with self._tx() as db:
            db.execute("DELETE FROM subs WHERE name = ?", (name,))
            db.execute("DELETE FROM backlog WHERE sub = ?", (name,))
            db.execute("INSERT OR REPLACE INTO deleted (name, at_ns) VALUES (?, ?)", (name, at_ns))

    def deleted(self, name: str) -> bool:
        return self.db.execute("SELECT 1 FROM deleted WHERE name = ?", (name,)).fetchone() is not None

    def put_record(self, name: str, record: bytes) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM deleted WHERE name = ?", (name,))  # created again
            db.execute("INSERT OR REPLACE INTO subs (name, record) VALUES (?, ?)", (name, record))

    # -- the log and the backlogs ----------------------------------------------------------

    def _insert(self, db: sqlite3.Connection, event: pb.Event) -> int:
        """The event's position in the log (logged now, or already)."""
        producer, seq = key_of(event)
        data = event.SerializeToString()
        cur = db.execute("INSERT OR IGNORE INTO events (topic, producer, seq, time_ns, size, data) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (event.topic, producer, seq, event.publish_time_unix_nanos,
                                                       len(data), data))
        if cur.rowcount:
            if event.topic in self._bytes:
                self._bytes[event.topic] += len(data)
            return cur.lastrowid
        return db.execute("SELECT pos FROM events WHERE topic = ? AND producer = ? AND seq = ?",
                          (event.topic, producer, seq)).fetchone()[0]

    def append(self, event: pb.Event, subs: Iterable[str], drop: list[tuple[str, Key]] | None = None) -> None:
        """Log `event` as owed to `subs`; in the same transaction, forget the backlog entries
        `drop` (sub, key) that a backlog policy evicted."""
        with self._tx(group=True) as db:
            pos = self._insert(db, event)
            db.executemany("INSERT OR IGNORE INTO backlog (sub, pos, ord) VALUES (?, ?, ?)",
                           [(s, pos, pos) for s in subs])
            if drop:
                self._forget(db, event.topic, drop)

    def _forget(self, db: sqlite3.Connection, topic: str, entries: Iterable[tuple[str, Key]]) -> None:
        db.executemany("DELETE FROM backlog WHERE sub = ? AND pos = "
                       "(SELECT pos FROM events WHERE topic = ? AND producer = ? AND seq = ?)",
                       [(sub, topic, p, s) for sub, (p, s) in entries])

    def ack(self, sub: str, topic: str, keys: Iterable[Key]) -> None:
        with self._tx() as db:
            self._forget(db, topic, ((sub, k) for k in keys))

    def backlog(self, sub: str) -> list[pb.Event]:
        """What `sub` is owed, in log order."""
        rows = self.db.execute("SELECT e.data FROM backlog b JOIN events e ON e.pos = b.pos WHERE b.sub = ? "
                               "ORDER BY b.ord", (sub,))
        return [pb.Event.FromString(data) for (data,) in rows]

    def replace(self, sub: str, events: Iterable[pb.Event], keep: Collection[Key]) -> None:
        """A holder's adopted copy: `sub` is owed `events`, in the copy's order, then those
        of its own entries whose key is in `keep` (what this process received itself while
        it synced), in their order. Its other entries go: the copy knows better what
        happened to them while this process was away."""
        events = list(events)
        with self._tx() as db:
            own = db.execute("SELECT b.pos, b.ord, e.producer, e.seq FROM backlog b JOIN events e ON e.pos = b.pos "
                             "WHERE b.sub = ? ORDER BY b.ord", (sub,)).fetchall()
            # Below every order given so far and every position still to come, so that
            # what arrives after the copy is served after it.
            base = min([o for _, o, _, _ in own] + [self.next_pos()])
            db.execute("DELETE FROM backlog WHERE sub = ?", (sub,))
            copied = [self._insert(db, e) for e in events]
            in_copy = set(copied)
            # Kept even when the copy lacks them: its holder may not have received them yet
            # (this agent can be ahead of it in the event's dissemination tree).
            kept = [pos for pos, _, p, q in own if (p, q) in keep and pos not in in_copy]
            positions = copied + kept
            db.executemany("INSERT OR REPLACE INTO backlog (sub, pos, ord) VALUES (?, ?, ?)",
                           [(sub, pos, base - len(positions) + i) for i, pos in enumerate(positions)])

    def next_pos(self) -> int:
        row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return (row[0] if row else 0) + 1

    def seek(self, sub: str, topic: str, match: Callable[[pb.Event], bool], time_ns: int | None = None,
             key: Key | None = None) -> list[pb.Event] | None:
        """Owe `sub` every logged event of `topic` from a time or a message on (matching);
        None (nothing changed) when the message is not in the log."""
        with self._tx() as db:
            if key is not None:
                row = db.execute("SELECT pos FROM events WHERE topic = ? AND producer = ? AND seq = ?",
                                 (topic, *key)).fetchone()
                if row is None:
                    return None
                rows = db.execute("SELECT pos, data FROM events WHERE topic = ? AND pos >= ? ORDER BY pos",
                                  (topic, row[0]))
            else:
                rows = db.execute("SELECT pos, data FROM events WHERE topic = ? AND time_ns >= ? ORDER BY pos",
                                  (topic, time_ns or 0))
            owed = [(pos, e) for pos, e in ((pos, pb.Event.FromString(d)) for pos, d in rows) if match(e)]
            db.execute("DELETE FROM backlog WHERE sub = ?", (sub,))
            db.executemany("INSERT INTO backlog (sub, pos, ord) VALUES (?, ?, ?)", [(sub, pos, pos) for pos, _ in owed])
        return [e for _, e in owed]

    def retained(self, topic: str) -> Iterator[tuple[int, int, int, bool]]:
        """The topic's logged events, oldest first: (pos, time ns, size, owed by some backlog);
        read lazily (the retention sweep stops at the first one it keeps): close it before
        the next change."""
        for pos, t, size, owed in self.db.execute(
                "SELECT e.pos, e.time_ns, e.size, EXISTS (SELECT 1 FROM backlog b WHERE b.pos = e.pos) "
                "FROM events e WHERE e.topic = ? ORDER BY e.pos", (topic,)):
            yield pos, t, size, bool(owed)

    def logged_bytes(self, topic: str) -> int:
        """The bytes of the topic's logged events (kept up to date from the first call on)."""
        if topic not in self._bytes:
            self._bytes[topic] = self.db.execute("SELECT COALESCE(SUM(size), 0) FROM events WHERE topic = ?",
                                                 (topic,)).fetchone()[0]
        return self._bytes[topic]

    def drop_events(self, topic: str, up_to_pos: int) -> None:
        """Retention: the topic's events up to `up_to_pos` (none of them owed) are let go."""
        with self._tx() as db:
            gone = db.execute("DELETE FROM events WHERE topic = ? AND pos <= ? AND pos NOT IN (SELECT pos FROM backlog) "
                              "RETURNING size", (topic, up_to_pos)).fetchall()
            if topic in self._bytes:
                self._bytes[topic] -= sum(size for (size,) in gone)

    def topics(self) -> list[str]:
        """The topics with logged events: one index probe per topic (not a scan of the log)."""
        out: list[str] = []
        while row := self.db.execute("SELECT topic FROM events WHERE topic > ? ORDER BY topic LIMIT 1",
                                     (out[-1] if out else "",)).fetchone():
            out.append(row[0])
        return out
