"""Emulated hosts on one machine: network namespaces on a bridge, with shaped uplinks.

    with Network(3) as net:                       # hosts 198.18.K.2 .. .4, bridge 198.18.K.1
        net.shape(net.hosts[0], rate_mbit=40)     # the host's upload: tbf 40 Mbit/s
        p = net.popen(net.hosts[1], [sys.executable, "-m", "http.server", "--bind", net.hosts[1].address])
        net.partition([net.hosts[0]], [net.hosts[1]])   # silent drops both ways
        net.heal()
    # namespaces, links, qdiscs and every process started through `net` are gone

`NetnsPlacement(net)` is where the launcher (`echelon.launch.Cluster`) runs a cluster on
the hosts: agent i in host i, the rest in the root namespace on the bridge's address.

Layout. Host i is the namespace `ech-<pid>-<i>` holding `eth0`, one end of a veth pair
whose other end (`ech<pid>v<i>`) is a port of the bridge `ech<pid>br` in the root
namespace. The bridge holds the subnet's .1, so services in the root namespace bound to
it reach every host; there is no default route anywhere, so nothing leaves the subnet.
Subnets are /24s taken from 198.18.0.0/15 (RFC 2544 benchmarking space): the first one
no interface of this machine uses, chosen under a file lock, so parallel runs do not
collide.

Egress of each host's `eth0` (its upload), and of the bridge-side end (its download):

    root htb 1: (default 1:10)
      class 1:10  pass-through  -> leaf: tbf (rate, burst, latency), under netem if asked
      class 1:99  drop          -> leaf: pfifo limit 0 (drops every packet)
    u32 filters on the destination (egress) or source (ingress) address -> 1:99

The drop class is there because this kind of kernel often lacks the `gact` drop action
and `nft`: a zero-length FIFO drops silently, as a partitioned network does, unlike a
blackhole route (which fails `connect()` at once). netem needs CONFIG_NET_SCH_NETEM;
without it `shape(delay_ms=...)` raises `Unsupported`.

Teardown is idempotent and runs on exit of the `with` block, on SIGTERM/SIGHUP (turned
into SystemExit while the block runs) and at interpreter exit. It stops every process
started through `popen` (SIGTERM, then SIGKILL, by pid), kills what else runs inside our
namespaces (`ip netns pids`: only our code can have started it), then deletes the
namespaces, veths and the bridge.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from echelon.launch.placement import Site, layout, stop_processes

SPACE = ipaddress.ip_network("198.18.0.0/15")
LOCK = Path("/run/lock/echelon-netns.lock")
HOST_IF = "eth0"
PASS, DROP = "1:10", "1:99"
ROOT_HANDLE = "1:"
FILTER_PRIO = 1
MAX_HOSTS = 250


class NetnsError(RuntimeError):
    """A namespace, link or qdisc command failed."""


class Unsupported(NetnsError):
    """The kernel or the user lacks what a feature needs (root, netns, netem)."""


@dataclass(frozen=True)
class Host:
    index: int
    name: str  # the network namespace
    address: str  # IPv4 address of eth0
    veth: str  # bridge-side end of the pair, in the root namespace
    ifname: str = HOST_IF

    def exec_args(self, argv: Sequence[str]) -> list[str]:
        """argv run inside this host: `ip netns exec NAME ...` (same pid: ip execs)."""
        return ["ip", "netns", "exec", self.name, *argv]


@dataclass
class Shaping:
    """One host's egress: tbf rate/burst/latency, optionally netem delay/jitter/loss."""

    rate_mbit: float | None = None
    burst_bytes: int | None = None
    latency_ms: float = 50.0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    def __post_init__(self) -> None:
        if self.rate_mbit is not None and not 0.01 <= self.rate_mbit <= 100_000:
            raise ValueError(f"rate {self.rate_mbit} Mbit/s is not in [0.01, 100000]")
        if not 0 <= self.loss_pct <= 100:
            raise ValueError(f"loss {self.loss_pct}% is not in [0, 100]")
        if min(self.latency_ms, self.delay_ms, self.jitter_ms) < 0:
            raise ValueError("latency, delay and jitter must not be negative")

    @property
    def netem(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.loss_pct)

    @property
    def burst(self) -> int:
        """Default: 5 ms at the rate, at least 32 KiB (a few full-size GSO segments)."""
        if self.burst_bytes:
            return self.burst_bytes
        return max(32 << 10, int((self.rate_mbit or 0) * 1e6 / 8 * 0.005))

    def leaf_commands(self, dev: str) -> list[list[str]]:
        """tc commands that hang this shaping under class 1:10 of `dev`."""
        cmds: list[list[str]] = []
        parent = PASS
        if self.netem:
            netem = ["tc", "qdisc", "add", "dev", dev, "parent", parent, "handle", "20:", "netem", "limit", "100000"]
            if self.delay_ms or self.jitter_ms:
                netem += ["delay", f"{self.delay_ms}ms"] + ([f"{self.jitter_ms}ms"] if self.jitter_ms else [])
            if self.loss_pct:
                netem += ["loss", f"{self.loss_pct}%"]
            cmds.append(netem)
            parent = "20:1"
        if self.rate_mbit is not None:
            cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", parent, "handle", "30:", "tbf",
                         "rate", f"{int(self.rate_mbit * 1000)}kbit", "burst", str(self.burst),
                         "latency", f"{self.latency_ms}ms"])
        return cmds


def run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a command; NetnsError with its stderr when it fails and `check`."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise Unsupported(f"{argv[0]} is not installed (iproute2 provides ip and tc)") from e
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"{' '.join(argv)}: no answer in {timeout}s") from e
    if check and r.returncode:
        raise NetnsError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def check_available() -> None:
    """Raise Unsupported with the reason when namespaces cannot be created here."""
    if os.geteuid() != 0:
        raise Unsupported("network namespaces need root (run as root, or with CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    for tool in ("ip", "tc"):
        run([tool, "-V"])
    probe = f"ech-{os.getpid()}-probe"
    try:
        run(["ip", "netns", "add", probe])
    except NetnsError as e:
        raise Unsupported(f"`ip netns add` failed: {e}") from None
    finally:
        run(["ip", "netns", "del", probe], check=False)


def used_subnets() -> set[ipaddress.IPv4Network]:
    """The /24s of 198.18.0.0/15 that an interface of the root namespace already holds."""
    out = json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]")
    used = set()
    for link in out:
        for a in link.get("addr_info", []):
            ip = ipaddress.ip_address(a["local"])
            if ip in SPACE:
                used.add(ipaddress.ip_network(f"{ip}/24", strict=False))
    return used


def pick_subnet(used: Iterable[ipaddress.IPv4Network], wanted: str | None = None) -> ipaddress.IPv4Network:
    """`wanted` if given (it must be a free /24 of 198.18.0.0/15), else the first free /24."""
    used = set(used)
    if wanted:
        net = ipaddress.ip_network(wanted, strict=False)
        if net.prefixlen != 24 or not net.subnet_of(SPACE):
            raise ValueError(f"{wanted}: subnets are /24s inside {SPACE}")
        if net in used:
            raise NetnsError(f"{net} is already in use on this machine")
        return net
    for net in SPACE.subnets(new_prefix=24):
        if net not in used:
            return net
    raise NetnsError(f"every /24 of {SPACE} is in use")


@dataclass
class Network:
    """N hosts on one bridge; a context manager that removes everything it made."""

    n: int
    suffixes: Sequence[int] | None = None  # last octet of each host; default 2..n+1
    subnet: str | None = None  # a /24 inside 198.18.0.0/15; default: the first free one
    prefix: str = field(default_factory=lambda: f"ech-{os.getpid()}")
    handle_signals: bool = True
    hosts: list[Host] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MAX_HOSTS:
            raise ValueError(f"{self.n} hosts: between 1 and {MAX_HOSTS}")
        suffixes = list(self.suffixes) if self.suffixes is not None else list(range(2, self.n + 2))
        if len(suffixes) != self.n or len(set(suffixes)) != self.n or not all(2 <= s <= 254 for s in suffixes):
            raise ValueError(f"suffixes {suffixes}: {self.n} distinct values in [2, 254] (.1 is the bridge)")
        self.suffixes = suffixes
        tag = self.prefix.replace("-", "")[:10]  # interface names: at most 15 characters
        self.bridge = f"{tag}br"
        self._veth = lambda i: f"{tag}v{i}"
        self.net: ipaddress.IPv4Network | None = None
        self._shaping: dict[tuple[str, str], Shaping] = {}  # (namespace or "", dev) -> shaping
        self._drops: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (ns, dev) -> {(match, addr)}
        self._created: list[str] = []  # namespaces
        self._lock = threading.Lock()
        self._torn_down = False
        self._old_handlers: dict[int, object] = {}

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def gateway(self) -> str:
        """The bridge's address: where root-namespace services listen."""
        return str(self.net.network_address + 1)

    def __enter__(self) -> "Network":
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, _raise_exit)
            # Python leaves SIGINT ignored when it started ignored (a background job of a
            # non-interactive shell, as under CI): Ctrl-C must still tear down.
            if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
                self._old_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            self.create()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.teardown()
        finally:
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            self._old_handlers.clear()

    def create(self) -> "Network":
        check_available()
        atexit.register(self.teardown)
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a") as lock:
            # Held until the bridge holds its address, so a parallel run sees it as used.
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.net = pick_subnet(used_subnets(), self.subnet)
            self._ip("link", "add", self.bridge, "type", "bridge")
            _sysctl(None, f"net.ipv6.conf.{self.bridge}.disable_ipv6", "1")
            self._ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
        for i, suffix in enumerate(self.suffixes):
            self.hosts.append(self._add_host(i, suffix))
        return self

    def _add_host(self, i: int, suffix: int) -> Host:
        host = Host(i, f"{self.prefix}-{i}", str(self.net.network_address + suffix), self._veth(i))
        run(["ip", "netns", "add", host.name])
        self._created.append(host.name)
        peer = f"{host.veth}p"
        self._ip("link", "add", host.veth, "type", "veth", "peer", "name", peer, "netns", host.name)
        _sysctl(None, f"net.ipv6.conf.{host.veth}.disable_ipv6", "1")
        self._ip("link", "set", host.veth, "master", self.bridge, "up")
        for key in ("all", "default"):
            _sysctl(host.name, f"net.ipv6.conf.{key}.disable_ipv6", "1")
        self._ip("link", "set", peer, "name", HOST_IF, ns=host.name)
        self._ip("addr", "add", f"{host.address}/24", "dev", HOST_IF, ns=host.name)
        self._ip("link", "set", "lo", "up", ns=host.name)
        self._ip("link", "set", HOST_IF, "up", ns=host.name)
        for ns, dev in ((host.name, HOST_IF), ("", host.veth)):
            self._install_root_qdisc(ns, dev)
        return host

    def teardown(self) -> None:
        """Stop our processes, delete our namespaces, veths and bridge. Safe to call twice."""
        with self._lock:
            if self._torn_down:
                return
            self._torn_down = True
        # A second Ctrl-C or SIGTERM must not cut the teardown short: hold them until it is done.
        main = threading.current_thread() is threading.main_thread()
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self._remove_all()
        finally:
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)

    def _remove_all(self) -> None:
        stop_processes(self.processes)
        for name in self._created:
            leftovers = run(["ip", "netns", "pids", name], check=False).stdout.split()
            for pid in leftovers:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            run(["ip", "netns", "del", name], check=False)
        for i in range(self.n):
            if Path(f"/sys/class/net/{self._veth(i)}").exists():
                run(["ip", "link", "del", self._veth(i)], check=False)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            run(["ip", "link", "del", self.bridge], check=False)
        with contextlib.suppress(Exception):
            atexit.unregister(self.teardown)

    # -- processes -------------------------------------------------------------------------

    def popen(self, host: Host | None, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv inside `host` (None: the root namespace); teardown stops it.

        In a new session, so a Ctrl-C at the terminal reaches only the caller, which then
        tears down in order."""
        args = host.exec_args(argv) if host else list(argv)
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(args, **kw)
        self.processes.append(p)
        return p

    def run(self, host: Host | None, argv: Sequence[str], check: bool = True,
            timeout: float = 30.0) -> subprocess.CompletedProcess:
        return run(host.exec_args(argv) if host else argv, check, timeout)

    def sysctl(self, host: Host, key: str, value: str | int) -> None:
        """Set a namespaced sysctl inside the host (e.g. net.ipv4.tcp_notsent_lowat)."""
        _sysctl(host.name, key, value, check=True)

    # -- shaping ---------------------------------------------------------------------------

    def shape(self, host: Host, rate_mbit: float | None = None, burst_bytes: int | None = None,
              latency_ms: float = 50.0, delay_ms: float = 0.0, jitter_ms: float = 0.0, loss_pct: float = 0.0,
              direction: str = "egress") -> Shaping:
        """Shape the host's upload (egress) or download (ingress: the bridge-side egress)."""
        s = Shaping(rate_mbit, burst_bytes, latency_ms, delay_ms, jitter_ms, loss_pct)
        if s.netem and not _has_netem():
            raise Unsupported("netem (delay/jitter/loss) is not available: the kernel lacks CONFIG_NET_SCH_NETEM")
        ns, dev = self._side(host, direction)
        self.unshape(host, direction)
        for cmd in s.leaf_commands(dev):
            self._tc(ns, cmd)
        self._shaping[(ns, dev)] = s
        return s

    def unshape(self, host: Host, direction: str = "egress") -> None:
        ns, dev = self._side(host, direction)
        if self._shaping.pop((ns, dev), None) is not None:
            self._tc(ns, ["tc", "qdisc", "del", "dev", dev, "parent", PASS], check=False)

    def qdisc_stats(self, host: Host, direction: str = "egress") -> list[dict]:
        """`tc -s qdisc show` of the host's side, as JSON (bytes, packets, drops, overlimits)."""
        ns, dev = self._side(host, direction)
        out = self._tc(ns, ["tc", "-s", "-j", "qdisc", "show", "dev", dev]).stdout
        return json.loads(out or "[]")

    # -- links and partitions -------------------------------------------------------------

    def link(self, host: Host, up: bool) -> None:
        """Cable in or out: the host's eth0 goes up or down (its address stays)."""
        self._ip("link", "set", HOST_IF, "up" if up else "down", ns=host.name)

    def drop(self, src: Host, dst: Host | str) -> None:
        """Silently drop IPv4 packets from src to dst (a host or an address, e.g. the gateway)."""
        addr = dst.address if isinstance(dst, Host) else str(ipaddress.ip_address(dst))
        self._drops.setdefault((src.name, HOST_IF), set()).add(("dst", addr))
        self._apply_drops(src.name, HOST_IF)

    def undrop(self, src: Host, dst: Host | str) -> None:
        addr = dst.address if isinstance(dst, Host) else str(ipaddress.ip_address(dst))
        self._drops.get((src.name, HOST_IF), set()).discard(("dst", addr))
        self._apply_drops(src.name, HOST_IF)

    def partition(self, side_a: Iterable[Host], side_b: Iterable[Host]) -> None:
        """No packet crosses between the two sides, in either direction."""
        side_a, side_b = list(side_a), list(side_b)
        for a in side_a:
            for b in side_b:
                self.drop(a, b)
                self.drop(b, a)

    def heal(self) -> None:
        """Remove every drop rule."""
        for ns, dev in list(self._drops):
            self._drops[(ns, dev)] = set()
            self._apply_drops(ns, dev)

    def _apply_drops(self, ns: str, dev: str) -> None:
        self._tc(ns, ["tc", "filter", "del", "dev", dev, "parent", ROOT_HANDLE, "prio", str(FILTER_PRIO)],
                 check=False)
        for match, addr in sorted(self._drops.get((ns, dev), ())):
            self._tc(ns, ["tc", "filter", "add", "dev", dev, "parent", ROOT_HANDLE, "protocol", "ip", "prio",
                          str(FILTER_PRIO), "u32", "match", "ip", match, f"{addr}/32", "flowid", DROP])

    # -- counters --------------------------------------------------------------------------

    def counters(self, host: Host) -> dict[str, int]:
        """Bytes and packets the host sent (tx) and received (rx) on its link, read on the
        bridge side (its rx is the host's tx): kernel counters, independent of our code."""
        stats = Path(f"/sys/class/net/{host.veth}/statistics")
        read = lambda k: int((stats / k).read_text())  # noqa: E731
        return {"tx_bytes": read("rx_bytes"), "rx_bytes": read("tx_bytes"),
                "tx_packets": read("rx_packets"), "rx_packets": read("tx_packets")}

    # -- helpers ---------------------------------------------------------------------------

    def _side(self, host: Host, direction: str) -> tuple[str, str]:
        if direction == "egress":
            return host.name, HOST_IF
        if direction == "ingress":
            return "", host.veth
        raise ValueError(f"direction {direction!r}: egress or ingress")

    def _install_root_qdisc(self, ns: str, dev: str) -> None:
        for cmd in (
            ["tc", "qdisc", "add", "dev", dev, "root", "handle", ROOT_HANDLE, "htb", "default", "10"],
            # Pass-through: far above any rate we shape to; tbf below it does the shaping.
            ["tc", "class", "add", "dev", dev, "parent", ROOT_HANDLE, "classid", PASS, "htb",
             "rate", "10gbit", "quantum", "200000"],
            ["tc", "class", "add", "dev", dev, "parent", ROOT_HANDLE, "classid", DROP, "htb",
             "rate", "8kbit", "quantum", "1514"],
            ["tc", "qdisc", "add", "dev", dev, "parent", DROP, "handle", "99:", "pfifo", "limit", "0"],
        ):
            self._tc(ns, cmd)

    def _ip(self, *args: str, ns: str = "") -> subprocess.CompletedProcess:
        return run(["ip", *(["-n", ns] if ns else []), *args])

    def _tc(self, ns: str, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return run(["ip", "netns", "exec", ns, *cmd] if ns else cmd, check=check)


@dataclass
class NetnsPlacement:
    """Where the launcher (`echelon.launch.Cluster`) runs a cluster on a Network: agent i
    in host i's namespace on its address, every other process in the root namespace on
    the bridge's. Ports follow the launcher's layout above `base_port`; each agent has
    an address of its own, so every agent takes the layout's first agent port."""

    net: Network
    base_port: int = 7000
    kind: str = "netns"

    def site(self, role: str, index: int) -> Site:
        if role != "agent":
            return Site(self.net.gateway)
        if index >= len(self.net.hosts):
            raise ValueError(f"agent {index}: the network has {len(self.net.hosts)} hosts")
        host = self.net.hosts[index]
        return Site(host.address, host)

    def ports(self, role: str, index: int) -> tuple[int, int]:
        return layout(self.base_port, role, 0 if role == "agent" else index)

    def popen(self, site: Site, argv: Sequence[str], **kw) -> subprocess.Popen:
        return self.net.popen(site.host, argv, **kw)


def _sysctl(ns: str | None, key: str, value: str | int, check: bool = False) -> None:
    """Set a sysctl in the root namespace (None) or in `ns`; best effort unless `check`."""
    if ns is None:
        try:
            Path("/proc/sys/" + key.replace(".", "/")).write_text(str(value))
        except OSError as e:
            if check:
                raise NetnsError(f"sysctl {key}={value}: {e}") from None
    else:
        run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}"], check=check)


_NETEM: bool | None = None


def _has_netem() -> bool:
    """Probe once: add a netem qdisc to the loopback of a throwaway namespace."""
    global _NETEM
    if _NETEM is None:
        probe = f"ech-{os.getpid()}-netem"
        try:
            run(["ip", "netns", "add", probe])
            _NETEM = run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                          "delay", "1ms"], check=False).returncode == 0
        finally:
            run(["ip", "netns", "del", probe], check=False)
    return _NETEM


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll predicate() until truthy, at most `timeout` seconds; TimeoutError names `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
