"""The report: what the checker (`loadtest.checker`) finds in every subscription's log,
attributed to the fault during (or after) which each message was sent; the verdicts the
replicas reached; a table per fault, a summary by kind, and the targets.

Counting. Every subscription is named, and is owed every acked message its filter
matches, with no window around a kill: the killed agent's named subscriptions are kept on
its disk and what they were sent is kept upstream until their clients settle it
(agent/named.py, agent/subscriptions.py), so the restarted process has them again and is
sent it again; their clients reopen them by name. Only with `wipe_disk` (the node lost its
disk) does a named subscription on the killed agent die with it: then messages sent from
KILL_MAYBE_BEFORE (10 s) before the kill until the reopened subscription exists are
"maybe" (allowed, not owed). The partitioned and the paused agents keep their
subscriptions, so everything is owed to them. A DEAD
verdict is expected for the killed agent and, when the partition outlasts the
detector's silence timeout (7 s), for the partitioned one; any other is false.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from loadtest import checker
from loadtest.chaos.config import KILL_MAYBE_BEFORE, Config
from loadtest.chaos.network import Hosts
from loadtest.chaos.observer import DEAD, SUSPECT, Observer
from loadtest.chaos.schedule import Fault
from loadtest.chaos.workload import Producer, Subscriber


@dataclass
class Row:
    fault: str
    target: str
    at: float
    detection: str
    dead_expected: int
    dead_false: list[str]
    suspects: list[str]
    sent: int
    lost: int = 0
    unexpected: int = 0
    duplicated: int = 0
    redelivered: int = 0
    reordered: int = 0
    publish_errors: int = 0
    seconds: float | None = None  # detection's number: see `detection`


@dataclass
class Result:
    mode: str
    reason: str
    rows: list[Row]
    totals: dict
    targets: dict[str, tuple[bool, str]]
    notes: list[str]
    text: str = ""

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.targets.values())

    def add(self, lines: list[str], targets: dict[str, tuple[bool, str]]) -> None:
        """A section of its own (durable subscriptions, the intruder): its lines, then its targets."""
        self.targets.update(targets)
        self.text += "\n" + "\n".join(lines) + "\n" + "\n".join(
            f"  [{'PASS' if ok else 'FAIL'}] {name}: {v}" for name, (ok, v) in targets.items())


def detection(f: Fault, obs: Observer) -> tuple[str, float | None]:
    """What the replicas made of the fault, and the one number that sums it up (seconds)."""
    target = f.targets[0]
    dead = obs.first(target, DEAD, f.start, f.end + (30 if f.kind == "kill" else 5))
    since = lambda d: sorted(t - f.start for t in d.values())  # noqa: E731
    if f.kind == "kill":
        if not dead:
            return "not declared", None
        ts = since(dead)
        return f"{ts[0]:.2f}s ({len(ts)}/3, last {ts[-1]:.2f}s)", ts[-1] if len(ts) == 3 else None
    if f.kind in ("partition", "pause"):
        if dead:
            return f"dead after {since(dead)[0]:.1f}s", since(dead)[0]
        sus = obs.first(target, SUSPECT, f.start, f.end + 2)
        return (f"suspect after {since(sus)[0]:.1f}s, not dead", since(sus)[0]) if sus else ("not suspected", None)
    if f.kind == "plan":
        return ("refused" if f.refused else "ACCEPTED"), None
    if f.kind in ("replica", "members"):
        back = f"members back +{f.rejoined:.1f}s" if f.rejoined is not None else "members NOT back"
        return f"served after {f.end - f.start:.1f}s, {back}", f.end - f.start
    return "-", None


SUMMARY = {"kill": "DEAD on all replicas in {}s", "partition": "DEAD after {}s of silence",
           "pause": "suspected after {}s, never DEAD", "replica": "restarted, served in {}s", "netem": "never DEAD",
           "matcher": "restarted empty, refilled", "members": "every replica restarted, served in {}s",
           "plan": "bad clique pushed"}


def build_report(cfg: Config, hosts: Hosts, faults: list[Fault], obs: Observer, producers: list[Producer],
                 subscribers: list[Subscriber], roles: dict, t0: float, metrics: dict) -> Result:
    starts = [f.start for f in faults]

    def window(t: float) -> int:  # -1: before the first fault
        return bisect.bisect_right(starts, t) - 1

    rows = [Row("baseline", "-", 0.0, "-", 0, [], [], 0)]
    for f in faults:
        text, seconds = detection(f, obs)
        rows.append(Row(f.kind, ",".join(f.targets), f.start - t0, text, 0, [], [], 0, seconds=seconds))
    row = lambda t: rows[window(t) + 1]  # noqa: E731

    sent_at: dict[tuple[str, int], float] = {}
    acked: dict[tuple[str, int], dict] = {}
    maybe: dict[tuple[str, int], dict] = {}
    for p in producers:
        for seq, s in p.sent.items():
            k = (p.id, seq)
            sent_at[k] = s.at
            row(s.at).sent += 1
            (acked if s.acked else maybe)[k] = s.attrs
            if s.failed:
                row(s.at).publish_errors += 1

    notes = []
    kills = [f for f in faults if f.kind == "kill"]
    exempt = kills if cfg.wipe_disk else []  # the module doc
    named = {"owed": 0, "received": 0, "lost": 0}
    for sub in subscribers:
        owed, allowed = dict(acked), dict(maybe)
        for f in exempt:
            if sub.agent not in f.targets:
                continue
            reopened = next((t for t in sub.opened if t >= f.start), float("inf"))
            gap = {k for k in owed if f.start - KILL_MAYBE_BEFORE <= sent_at[k] <= reopened}
            for k in gap:
                allowed[k] = owed.pop(k)
            notes.append(f"{sub.name} on {sub.agent} died with the process at the kill: "
                         f"{sum(sub.filter.matches(acked[k]) for k in gap)} matching messages sent "
                         f"from {KILL_MAYBE_BEFORE:.0f}s before the kill until it was reopened "
                         f"{reopened - f.start:.1f}s after it were not owed to it")
        overflows = [t - t0 for t, how in sub.ended if how == "RESOURCE_EXHAUSTED"]
        if overflows:  # the agent closed it past its backlog bound and dropped that backlog
            notes.append(f"{sub.name} on {sub.agent} overflowed its backlog bound (RESOURCE_EXHAUSTED) at "
                         + ", ".join(f"+{t:.0f}s" for t in overflows))
        [r] = checker.check(owed, {sub.name: sub.filter}, {sub.name: [x.d for x in sub.log]}, allowed)
        named["owed"] += r.expected
        named["received"] += len({(x.d.producer, x.d.sequence) for x in sub.log})
        named["lost"] += len(r.lost)
        for k in r.lost:
            row(sent_at[k]).lost += 1
        for k in r.unexpected:
            row(sent_at.get(k, 0.0)).unexpected += 1
        for k in r.duplicated:
            row(sent_at[k]).duplicated += 1
        for _, k in r.reordered:
            row(sent_at[k]).reordered += 1
        redelivered = [x for x in sub.log if x.d.redelivery]
        for x in redelivered:
            row(sent_at.get((x.d.producer, x.d.sequence), 0.0)).redelivered += 1

    # Verdicts: a member DEAD on any replica, once per (member, incarnation).
    seen = set()
    for c in obs.changes:
        if c.at < t0 or (c.member, c.incarnation, c.state) in seen:
            continue
        if c.state in (DEAD, SUSPECT):
            seen.add((c.member, c.incarnation, c.state))
            r, w = row(c.at), window(c.at)
            if c.state == SUSPECT:
                if c.member not in r.suspects:
                    r.suspects.append(c.member)
                continue
            f = faults[w] if w >= 0 else None
            expected = f is not None and c.member in f.expected_dead and c.at <= f.end + 5
            if expected:
                r.dead_expected += 1
            else:
                r.dead_false.append(c.member)

    totals = {k: sum(getattr(r, k) for r in rows) for k in
              ("sent", "lost", "unexpected", "duplicated", "redelivered", "reordered", "publish_errors",
               "dead_expected")}
    totals["suspected"] = sum(len(r.suspects) for r in rows)
    totals["dead_false"] = sum(len(r.dead_false) for r in rows)
    totals["received"] = sum(len(s.log) for s in subscribers)
    totals["acked"] = len(acked)
    kill_times = []
    for f in kills:
        dead = obs.first(f.targets[0], DEAD, f.start, f.end + 30)
        kill_times.append(max(dead.values()) - f.start if dead else float("inf"))
    pause_false = [m for r in rows if r.fault in ("pause", "netem") for m in r.dead_false]
    ran_kill = any(f.kind == "kill" for f in faults)
    targets = {
        "0 lost": (totals["lost"] == 0, str(totals["lost"])),
        "0 unexpected": (totals["unexpected"] == 0, str(totals["unexpected"])),
        "0 duplicates to a client": (totals["duplicated"] == 0, str(totals["duplicated"])),
        "0 false dead (delay/loss, pause)": (not pause_false, ", ".join(pause_false) or "0"),
        "0 false dead (whole run)": (totals["dead_false"] == 0, str(totals["dead_false"])),
        "crash detected < 2 s": (ran_kill and max(kill_times) < 2.0,
                                 ", ".join(f"{t:.2f}s (all 3 replicas)" for t in kill_times) or "no kill ran"),
        "every acked message was checked": (totals["acked"] > 0, f"{totals['acked']} acked"),
    }
    window = "a window around each kill not owed (wipe_disk)" if cfg.wipe_disk else "no window around a kill"
    targets["named subscriptions: every acked message owed, 0 lost"] = (
        named["lost"] == 0, f"{named['lost']} lost of {named['owed']} owed ({window}), "
                            f"{named['received']} distinct received")
    if cfg.reorder_target:
        targets["0 reordered"] = (totals["reordered"] == 0, str(totals["reordered"]))
    else:
        notes.append(f"order per key: {totals['reordered']} reordered (measured, not a target in this run: "
                     "docs/guarantees.md, \"What is not promised\")")
    for f in faults:
        if f.kind == "plan":
            targets["a plan with a clique no router serves is refused"] = (bool(f.refused), f.note[:120])
    res = Result(hosts.mode, hosts.reason, rows, totals, targets, notes)
    res.text = render(cfg, res, roles, metrics, faults, t0)
    return res


def columns(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return [fmt(table[0]), fmt(tuple("-" * w for w in widths)), *(fmt(row) for row in table[1:])]


def render(cfg: Config, res: Result, roles: dict, metrics: dict, faults: list[Fault], t0: float) -> str:
    lines = []
    mode = ("network namespaces (each agent on its own host, 198.18.0.0/15)" if res.mode == "netns" else
            f"loopback processes, no partitions and no netem ({res.reason})")
    lines.append(f"Echelon chaos run: {mode}")
    lines.append(f"agents {cfg.agents}, producers {len(roles['producers'])} x {cfg.rate:g}/s on "
                 f"{', '.join(roles['producers'])}, 3 membership replicas, 1 matcher, "
                 f"{'mTLS everywhere' if cfg.tls else 'plain text'}{', tokens and ACLs' if cfg.auth else ''}; "
                 f"LBDD tree of producer-0: {roles['tree']}")
    head = ("fault", "target", "at", "detection", "dead ok", "false dead", "suspected", "sent", "lost",
            "unexp", "dup", "redeliv", "reorder", "pub err")
    table = [head]
    for r in res.rows:
        table.append((r.fault, r.target, f"+{r.at:.0f}s", r.detection, str(r.dead_expected),
                      ",".join(r.dead_false) or "0", ",".join(r.suspects) or "-", str(r.sent), str(r.lost),
                      str(r.unexpected), str(r.duplicated), str(r.redelivered), str(r.reordered),
                      str(r.publish_errors)))
    lines.append("")
    lines.append("Per fault (messages counted in the window from the fault's start to the next fault):")
    lines += columns(table)
    kinds = list(dict.fromkeys(r.fault for r in res.rows[1:]))
    if len(kinds) < len(res.rows) - 1:
        summary = [("fault", "runs", "detection", "dead ok", "false dead", "sent", "lost", "unexp", "dup",
                    "redeliv", "reorder")]
        for kind in kinds:
            rs = [r for r in res.rows if r.fault == kind]
            total = lambda k: str(sum(getattr(r, k) for r in rs))  # noqa: E731
            secs = [r.seconds for r in rs if r.seconds is not None]
            span = f"{min(secs):.2f}-{max(secs):.2f}" if secs else "?"
            how = "with FALSE DEAD verdicts" if any(r.dead_false for r in rs) else SUMMARY[kind].format(span)
            summary.append((kind, str(len(rs)), how,
                            total("dead_expected"), str(sum(len(r.dead_false) for r in rs)), total("sent"),
                            total("lost"), total("unexpected"), total("duplicated"), total("redelivered"),
                            total("reordered")))
        lines.append("")
        lines.append("By fault:")
        lines += columns(summary)
    lines.append("")
    lines.append("Faults as run:")
    lines += [f"  +{f.start - t0:5.1f}s {f.kind:9} {','.join(f.targets)}: {f.note}" for f in faults]
    t = res.totals
    lines.append("")
    lines.append(f"Totals: sent {t['sent']}, acked {t['acked']}, deliveries {t['received']}, lost {t['lost']}, "
                 f"unexpected {t['unexpected']}, duplicated {t['duplicated']}, redelivered {t['redelivered']}, "
                 f"reordered {t['reordered']}, publish errors {t['publish_errors']}, "
                 f"DEAD verdicts expected {t['dead_expected']} / false {t['dead_false']}, suspected {t['suspected']}")
    if metrics:
        lines.append("Agents' counters (processes alive at the end): " + ", ".join(
            f"{k.removeprefix('echelon_agent_')} {v:g}" for k, v in metrics.items()))
    for n in res.notes:
        lines.append(f"Note: {n}")
    lines.append("")
    lines.append("Targets:")
    for name, (ok, detail) in res.targets.items():
        lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    return "\n".join(lines)
