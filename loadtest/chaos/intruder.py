"""An intruder in the fault run (docs/security.md): a process of its own,
beside the workload, that every second tries to get in with credentials it should not
have, and what it got.

Credentials (directories in the layout of `contract.transport.TlsDir`, made by `prepare`):
  no-cert          TLS trusting the cluster's CA, no client certificate (a stranger)
  foreign-ca       a certificate naming a real agent, signed by a CA of its own
  client-as-agent  the cluster's CA, `spiffe://echelon/client/intruder`, claiming to be a member
  agent-as-other   the cluster's CA, `agent/intruder-agent`, claiming a real agent's id
and where the cluster runs with tokens and ACLs (`--auth`, runtime/auth.py) and its agents
open a port for token clients (`open_client_ports`):
  no-rights        the `client/intruder` certificate: an authenticated user granted nothing
  no-token         the agents' client port (no certificate asked), no token
  bad-token        the agents' client port, a token of its own making
Actions:
  subscribe  open a subscription to everything on the run's topic, read for READ_SECONDS
  publish    one event of the run's schema (so only the credentials can refuse it)
  join       Membership.Join as a member (a new id, or the real agent's id at a higher incarnation)
  relay      Relay.Stream posing as the real agent, one frame for the dialled agent's subscribers
  plan       Control.PushPlan of an empty plan (every zone gone) at a version above any real one
`attempts` pairs them: every action for the first two; for the next two what a member
identity is checked on (under `--no-auth` any certificate of the CA may publish, subscribe
and push plans: every caller is an admin); for the user without rights what ACLs guard
(subscribe, publish, plan); on the client port the client API and a relay.

Bounded: every pair is one loop, one attempt a second, each with a deadline, until
`--seconds` or `--rounds`; then the counts go to `--out` (JSON) and the process exits.

What it got, counted twice. The intruder counts per pair the attempts, the status each
ended with, deliveries it read and writes a call accepted (OK). And independently of
what the calls returned, the runner looks for the marks an intruder write leaves
(`evidence`): an event whose producer id starts with MARK in any real subscription's log,
a member named MARK... or at an incarnation from JOIN_INCARNATION up in any replica's
watched view, a plan at PLAN_VERSION or above (or from origin MARK...) on any replica
(plan versions only rise, so the end shows whether one was ever adopted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from echelon.launch import free_port, stop_process
from echelon.runtime.certs import Authority
from echelon.contract.transport import MEMBER_KEY, PLAIN, TLS_DIR_ENV, TOKEN_ENV, TlsDir, Transport
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc
from loadtest.chaos.workload import TOPIC

MARK = "intruder"
JOIN_INCARNATION = 9 * 10**18  # real ones are (ms since 1970) * 1000, about 1.8e15
PLAN_VERSION = 10**17  # real plans count up from 1; the intruder's: this + microseconds since 1970
READ_SECONDS = 3.0
CALL_TIMEOUT = 5.0
EVENT = {"kind": "a", "v": 50.0, "n": 1}  # valid for workload.SCHEMA, matched by the "" filter

ACTIONS = ("subscribe", "publish", "join", "relay", "plan")
ATTEMPTS = [*((c, a) for c in ("no-cert", "foreign-ca") for a in ACTIONS),
            ("client-as-agent", "join"), ("client-as-agent", "relay"),
            ("agent-as-other", "join"), ("agent-as-other", "relay")]
AUTH_ATTEMPTS = [("no-rights", "subscribe"), ("no-rights", "publish"), ("no-rights", "plan"),
                 *((c, a) for c in ("no-token", "bad-token") for a in ("subscribe", "publish", "relay"))]
TOKEN_PORT = ("no-token", "bad-token")  # credentials tried on the agents' client port
DIRS = {"no-rights": "client-as-agent", "no-token": "no-cert", "bad-token": "no-cert"}  # shared directories

WRITES = ("publish", "join", "relay", "plan")
REFUSALS = ("UNAVAILABLE", "UNAUTHENTICATED", "PERMISSION_DENIED")
_CODES = {c.value[0]: c for c in grpc.StatusCode}  # an in-band ack's code -> its status


def attempts(auth: bool) -> list[tuple[str, str]]:
    """The (credential, action) pairs; `auth`: the cluster has tokens, ACLs and client ports."""
    return ATTEMPTS + AUTH_ATTEMPTS if auth else ATTEMPTS


def prepare(root: Path, ca_pem: bytes, issue, victim: str) -> Path:
    """The credentials' directories under `root`. `issue(role, name)` returns a directory
    with a certificate from the cluster's CA (the launcher's); `victim` is a real agent's id."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "no-cert").mkdir(exist_ok=True)
    (root / "no-cert" / "ca.crt").write_bytes(ca_pem)
    Authority.create("the intruder's own CA").write(root / "foreign-ca", "agent", victim)
    (root / "foreign-ca" / "ca.crt").write_bytes(ca_pem)  # it trusts the servers; they must not trust it
    for name, (role, ident) in (("client-as-agent", ("client", MARK)), ("agent-as-other", ("agent", f"{MARK}-agent"))):
        src = Path(issue(role, ident))
        (root / name).mkdir(exist_ok=True)
        for f in ("tls.crt", "tls.key", "ca.crt"):
            (root / name / f).write_bytes((src / f).read_bytes())
    return root


@dataclass
class Tally:
    """One (credential, action) pair's counts."""

    attempts: int = 0
    accepted: int = 0  # writes a call returned OK for (subscribe: streams that stayed open)
    deliveries: int = 0
    codes: Counter = field(default_factory=Counter)
    details: dict[str, str] = field(default_factory=dict)  # the first message per code, for the log


@dataclass
class Target:
    agents: dict[str, str]  # id -> address
    replicas: list[str]
    victim: str  # the real agent the intruder claims to be
    client_ports: dict[str, str] = field(default_factory=dict)  # id -> the agent's port for token clients


class Intruder:
    def __init__(self, creds: Path | None, target: Target):
        self.creds, self.target = creds, target
        self.attempts = attempts(bool(target.client_ports))
        self.tallies = {f"{c}/{a}": Tally() for c, a in self.attempts}

    def transport(self, cred: str) -> Transport:
        if not self.creds:
            return PLAIN
        token = f"{MARK}-{secrets.token_urlsafe(16)}" if cred == "bad-token" else ""
        return Transport(TlsDir(self.creds / DIRS.get(cred, cred)), token=token)

    def claim(self, cred: str) -> str:
        """The member id a Join claims: the victim's where the certificate names an agent."""
        return self.target.victim if cred in ("foreign-ca", "agent-as-other") else f"{MARK}-{cred}"

    async def once(self, cred: str, action: str, k: int) -> None:
        t = self.tallies[f"{cred}/{action}"]
        t.attempts += 1
        agent_ids = sorted(self.target.agents)
        agent = agent_ids[k % len(agent_ids)]
        address = self.target.replicas[k % len(self.target.replicas)] if action in ("join", "plan") \
            else self.target.client_ports[agent] if cred in TOKEN_PORT else self.target.agents[agent]
        try:
            async with self.transport(cred).dial(address) as ch:
                code = await getattr(self, f"_{action}")(ch, t, cred, agent, k)
        except grpc.aio.AioRpcError as e:
            code = e.code().name
            t.details.setdefault(code, e.details() or "")
        except asyncio.TimeoutError:
            code = "TIMEOUT"
        except Exception as e:  # noqa: BLE001 - counted and shown; the intruder goes on
            code = f"ERROR {type(e).__name__}"
            t.details.setdefault(code, str(e))
        t.codes[code] += 1
        t.accepted += code == "OK"

    async def _subscribe(self, ch, t: Tally, cred: str, agent: str, k: int) -> str:
        opening = ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic=TOPIC, filter_text="", credits=1000))
        call = pgrpc.PubSubStub(ch).Subscribe(_held(opening), timeout=READ_SECONDS + CALL_TIMEOUT)
        deadline = time.monotonic() + READ_SECONDS
        try:
            while (left := deadline - time.monotonic()) > 0:
                d = await asyncio.wait_for(call.read(), left)
                if d is grpc.aio.EOF:
                    break
                t.deliveries += len(d.batch) or 1
        except asyncio.TimeoutError:
            pass  # read the whole window: the stream stayed open
        finally:
            call.cancel()
        code = await call.code()  # CANCELLED: ours, after the window
        if code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED):
            return code.name
        # Open the whole window: kept open by the server, or never answered (a paused one)?
        return "OK" if ch.get_state() == grpc.ChannelConnectivity.READY else "NO_ANSWER"

    async def _publish(self, ch, t: Tally, cred: str, agent: str, k: int) -> str:
        event = ppb.PublishRequest(topic=TOPIC, attributes=attributes_to_pb(EVENT), ordering_key=MARK,
                                   producer_id=f"{MARK}-{cred}", sequence=k + 1, ack_level=ppb.ACK_LEVEL_ACCEPTED)
        call = pgrpc.PubSubStub(ch).Publish(_held(event), timeout=CALL_TIMEOUT)
        ack = await call.read()
        call.cancel()
        return "EOF" if ack is grpc.aio.EOF else _CODES[ack.code].name if ack.code in _CODES else str(ack.code)

    async def _join(self, ch, t: Tally, cred: str, agent: str, k: int) -> str:
        member = mpb.Member(id=self.claim(cred), role=mpb.ROLE_AGENT, address="198.18.255.254:9", region="local",
                            incarnation=JOIN_INCARNATION + k)
        await mgrpc.MembershipStub(ch).Join(mpb.JoinRequest(member=member), timeout=CALL_TIMEOUT)
        return "OK"

    async def _relay(self, ch, t: Tally, cred: str, agent: str, k: int) -> str:
        victim = self.target.victim
        event = pb.Event(id=pb.MessageId(producer_id=f"{MARK}-{cred}", sequence=k + 1), topic=TOPIC,
                         attributes=attributes_to_pb(EVENT), ordering_key=MARK,
                         publish_time_unix_nanos=time.time_ns())
        frame = rpb.RelayFrame(seq=k + 1, source=victim, source_key=self.target.agents.get(victim, victim),
                               messages=[rpb.RelayMessage(event=event, destinations=[agent])])
        call = rgrpc.RelayStub(ch).Stream(_held(frame), metadata=((MEMBER_KEY, victim),), timeout=CALL_TIMEOUT)
        ack = await call.read()
        call.cancel()
        return "OK" if ack is not grpc.aio.EOF and frame.seq in ack.seqs else "NO_ACK"

    async def _plan(self, ch, t: Tally, cred: str, agent: str, k: int) -> str:
        # Rising with the clock, so one credential's push never makes another's stale.
        plan = mpb.RoutingPlan(version=PLAN_VERSION + time.time_ns() // 1000, origin=f"{MARK}-{cred}")
        await mgrpc.ControlStub(ch).PushPlan(plan, timeout=CALL_TIMEOUT)
        return "OK"

    async def loop(self, cred: str, action: str, until: list[float], rounds: int) -> None:
        for k in range(rounds):
            start = time.monotonic()
            if start >= until[0]:
                return
            try:
                await asyncio.wait_for(self.once(cred, action, k), READ_SECONDS + 2 * CALL_TIMEOUT)
            except asyncio.TimeoutError:
                self.tallies[f"{cred}/{action}"].codes["TIMEOUT"] += 1
            await asyncio.sleep(max(0.0, start + 1.0 - time.monotonic()))

    async def run(self, seconds: float, rounds: int) -> dict:
        until = [time.monotonic() + seconds]  # SIGUSR1 ends it sooner: the schedule ran (`Spawned.finish`)
        with contextlib.suppress(NotImplementedError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, lambda: until.__setitem__(0, 0.0))
        await asyncio.gather(*(self.loop(c, a, until, rounds) for c, a in self.attempts))
        return {k: {"attempts": t.attempts, "accepted": t.accepted, "deliveries": t.deliveries,
                    "codes": dict(t.codes), "details": t.details} for k, t in self.tallies.items()}


async def _held(message):
    """A request stream of one message, held open (a half-close would be an answer of its
    own). A refused stream still ends, now and then, with INTERNAL "Internal error from
    Core" on the client instead of the server's status (about 1 in 20 under the fault
    run): counted as it came, it is no acceptance either."""
    yield message
    await asyncio.sleep(READ_SECONDS + 2 * CALL_TIMEOUT)


# -- the runner's side: what the cluster shows, and the report's rows -----------------------

@dataclass
class Evidence:
    """Intruder writes seen by the cluster, whatever the intruder's calls returned."""

    events_delivered: int = 0  # deliveries of an intruder event to a real subscription
    members_seen: list[str] = field(default_factory=list)  # intruder Joins in a replica's view
    plans: list[str] = field(default_factory=list)  # replicas whose plan is an intruder's

    @property
    def total(self) -> int:
        return self.events_delivered + len(self.members_seen) + len(self.plans)


def evidence(subscribers, changes, plans: dict[str, mpb.RoutingPlan]) -> Evidence:
    """`subscribers`: anything with a `log` of workload.Received; `changes`: the
    observer's; `plans`: replica address -> its current plan at the end."""
    e = Evidence()
    e.events_delivered = sum(x.d.producer.startswith(MARK) for s in subscribers for x in s.log)
    e.members_seen = sorted({f"{c.member}@{c.incarnation}" for c in changes
                             if c.member.startswith(MARK) or c.incarnation >= JOIN_INCARNATION})
    e.plans = sorted(f"{a}: v{p.version} from {p.origin!r}" for a, p in plans.items()
                     if p.version >= PLAN_VERSION or p.origin.startswith(MARK))
    return e


def report(counts: dict | None, ev: Evidence, why_not: str = "") -> tuple[list[str], dict[str, tuple[bool, str]]]:
    """The intruder's table and its three targets (attempts made must be > 0: an intruder
    that never tried proves nothing)."""
    counts = counts or {}
    lines = ["", "Intruder (no or wrong credentials, every second; loadtest/chaos/intruder.py):"]
    rows = [("credential/action", "attempts", "accepted", "deliveries", "ended with")]
    for k, c in counts.items():
        codes = ", ".join(f"{n} {code}" for code, n in sorted(c["codes"].items(), key=lambda x: -x[1]))
        rows.append((k, str(c["attempts"]), str(c["accepted"]), str(c["deliveries"]), codes))
    if counts:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]
    else:
        lines.append(f"  no counts: {why_not or 'the intruder wrote none'}")
    for k, c in counts.items():  # endings other than a refusal or an unreachable server, for a post-mortem
        for code, text in c.get("details", {}).items():
            if code not in REFUSALS:
                lines.append(f"  {k} {code}: {text[:160]}")
    lines.append(f"  seen by the cluster: intruder events delivered to real subscriptions {ev.events_delivered}, "
                 f"intruder members in a view {ev.members_seen or 0}, intruder plans adopted {ev.plans or 0}")
    attempts = sum(c["attempts"] for c in counts.values())
    deliveries = sum(c["deliveries"] for c in counts.values())
    accepted = sum(c["accepted"] for k, c in counts.items() if k.split("/")[1] in WRITES)
    tried = attempts > 0
    targets = {
        "intruder: attempts made > 0": (tried, f"{attempts} in {len(counts)} kinds"),
        "intruder: 0 deliveries": (tried and deliveries == 0, str(deliveries)),
        "intruder: 0 writes accepted": (tried and accepted == 0 and ev.total == 0,
                                        f"{accepted} by the calls, {ev.total} seen by the cluster"),
    }
    return lines, targets


async def current_plans(replicas: list[str], transport: Transport) -> dict[str, mpb.RoutingPlan]:
    """Every replica's plan (an unreachable one is left out)."""
    out = {}
    for a in replicas:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async with transport.dial(a) as ch:
                out[a] = await mgrpc.ControlStub(ch).GetPlan(mpb.GetPlanRequest(), timeout=CALL_TIMEOUT)
    return out


class Spawned:
    """The intruder process the runner started (stopped by its pid only)."""

    def __init__(self, popen: subprocess.Popen, out: Path, log: Path):
        self.popen, self.out, self.log = popen, out, log

    def finish(self) -> None:
        """Stop its attempts now (the schedule ran its rounds); it writes its counts and exits."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGUSR1)

    async def counts(self, grace: float = 30.0) -> dict | None:
        """Its counts once it has stopped by itself (None if it did not, or wrote none)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(self.popen.wait, grace)
        if self.popen.poll() is None or not self.out.exists():
            return None
        return json.loads(self.out.read_text())

    def why_not(self) -> str:
        code = self.popen.poll()
        return f"it {'is still running' if code is None else f'exited with {code}'}; log {self.log}"

    def stop(self) -> None:
        stop_process(self.popen, 5.0)


CLIENT_PORT = "--client-port"


def open_client_ports(cluster) -> None:
    """Give every agent of `cluster` (planned, not started) a port for token clients,
    as a deployment that serves clients without certificates would: the intruder's."""
    for p in cluster.by_role("agent"):
        p.argv += [CLIENT_PORT, str(free_port())]


def client_ports(cluster) -> dict[str, str]:
    return {p.id: f"{p.site.ip}:{p.argv[p.argv.index(CLIENT_PORT) + 1]}"
            for p in cluster.by_role("agent") if CLIENT_PORT in p.argv}


def launch(cluster, victim: str, out: Path, seconds: float) -> Spawned:
    """Start the intruder beside `cluster` (echelon.launch.Cluster) where the runner runs
    (the root namespace), for `seconds`; its credentials from the cluster's CA."""
    creds = None
    if cluster.tls:
        ca = (cluster.client_tls / "ca.crt").read_bytes()
        issue = lambda role, name: cluster._certificates(role, name, ("localhost",))  # noqa: E731, SLF001
        creds = prepare(out / "intruder-creds", ca, issue, victim)
    agents = ",".join(f"{p.id}={p.address}" for p in cluster.by_role("agent"))
    path, log = out / "intruder.json", cluster.log_dir / "intruder.log"
    path.unlink(missing_ok=True)
    # Not `-m loadtest.chaos.intruder`: the package imports this module first (runpy warns).
    argv = [sys.executable, "-c", "from loadtest.chaos.intruder import main; main()", "--agents", agents, "--replicas",
            ",".join(cluster.replicas), "--victim", victim, "--seconds", f"{max(seconds, 1.0):.1f}", "--out", str(path)]
    if creds:
        argv += ["--creds", str(creds)]
    if client_ports(cluster):
        argv += ["--client-ports", ",".join(f"{i}={a}" for i, a in client_ports(cluster).items())]
    env = {k: v for k, v in os.environ.items() if k not in (TLS_DIR_ENV, TOKEN_ENV)}  # no credentials but its own
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        popen = cluster.placement.popen(cluster.by_role("membership")[0].site, argv, stdout=f,
                                        stderr=subprocess.STDOUT, env=env)
    return Spawned(popen, path, log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", required=True, help="id=host:port,...")
    ap.add_argument("--replicas", required=True, help="host:port,...")
    ap.add_argument("--victim", required=True, help="a real agent's id, to claim")
    ap.add_argument("--creds", type=Path, help="prepare()'s directory (none: plain text)")
    ap.add_argument("--client-ports", default="", help="id=host:port,...: the agents' ports for token clients "
                    "(given: the cluster runs with tokens and ACLs, and the token attempts are made)")
    ap.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--rounds", type=int, default=3600)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    agents = dict(x.split("=", 1) for x in a.agents.split(","))
    ports = dict(x.split("=", 1) for x in a.client_ports.split(",") if x)
    intruder = Intruder(a.creds, Target(agents, a.replicas.split(","), a.victim, ports))
    counts = asyncio.run(intruder.run(min(a.seconds, 7200.0), min(a.rounds, 7200)))
    a.out.write_text(json.dumps(counts, indent=2))


if __name__ == "__main__":
    main()
