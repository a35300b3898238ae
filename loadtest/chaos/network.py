"""Where the run happens, and the faults only a network of its own allows.

`make_hosts` gives the launcher its placement: every agent in a network namespace of its
own (`loadtest.netns`), or, where namespaces cannot be created, loopback processes
(then partition and delay/loss cannot be made, and the report says so). On namespaces
`Hosts` makes the network faults on one host's link:
  netem      delay 100 ms +- 50 ms, 5 % loss, both directions (tc netem; on a kernel
             without it a tc redirect into the userspace delayer, `loadtest.delayer`)
  partition  every packet to and from the host dropped (tc filters on both ends of its veth)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

from echelon.launch import Loopback, Placement, stop_process
from loadtest.delayer import BYPASS_MARKED, DELAY_PRIO
from loadtest.netns import Host, Network, NetnsError, NetnsPlacement, Unsupported, check_available, run as sh

PARTITION_PRIO = "2"  # our tc filters; loadtest.netns manages prio 1


class Hosts:
    """The run's placement and the network faults it allows (none without `net`)."""

    def __init__(self, placement: Placement, reason: str = "", net: Network | None = None):
        self.placement, self.reason, self.net = placement, reason, net
        self.delayers: dict[int, list[subprocess.Popen]] = {}

    @property
    def mode(self) -> str:
        return self.placement.kind

    def supports(self, kind: str) -> bool:
        return self.net is not None or kind not in ("netem", "partition")

    def netem(self, host: Host, on: bool, seconds: float = 600.0) -> str:
        """Delay 100 +- 50 ms and 5 % loss on both directions of the host's link: netem, or
        where the kernel lacks it the userspace delayer. Returns which."""
        if not on:
            if host.index in self.delayers:
                self._emulate(host, False, seconds)
                return "emulated"
            for direction in ("egress", "ingress"):
                self.net.unshape(host, direction)
            return "netem"
        try:
            for direction in ("egress", "ingress"):
                self.net.shape(host, delay_ms=100, jitter_ms=50, loss_pct=5, direction=direction)
        except Unsupported:
            self._emulate(host, True, seconds)
            return "emulated"
        return "netem"

    def _emulate(self, host: Host, on: bool, seconds: float) -> None:
        i = host.index
        tag = self.net.bridge.removesuffix("br")[:9]
        # (namespace, device whose egress is delayed, the redirect veth pair's two ends)
        sides = [(host.name, host.ifname, "dxe0", "dxe1"), ("", host.veth, f"{tag}d{i}a", f"{tag}d{i}b")]
        for p in self.delayers.pop(i, []):
            stop_process(p, 2.0)
        for ns, dev, a, b in sides:
            pre = ["ip", "netns", "exec", ns] if ns else []
            sh([*pre, "tc", "filter", "del", "dev", dev, "parent", "1:", "prio", DELAY_PRIO], check=False)
            sh([*pre, "ip", "link", "del", a], check=False)
        if not on:
            return
        for ns, dev, a, b in sides:
            pre = ["ip", "netns", "exec", ns] if ns else []
            sh([*pre, "ip", "link", "add", a, "type", "veth", "peer", "name", b])
            for end in (a, b):
                sh([*pre, "sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1"], check=False)
                sh([*pre, "ip", "link", "set", end, "up"])
            argv = [sys.executable, "-m", "loadtest.delayer", b, dev, str(seconds)]
            self.delayers.setdefault(i, []).append(self.net.popen(host if ns else None, argv,
                                                                   stdout=subprocess.DEVNULL))
            sh([*pre, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", DELAY_PRIO,
                "bpf", "bytecode", BYPASS_MARKED, "action", "mirred", "egress", "redirect", "dev", a])

    def partition(self, host: Host, on: bool) -> None:
        """Drop every IPv4 packet the host sends and every one sent to it (both ends of its veth)."""
        for ns, dev in ((host.name, host.ifname), ("", host.veth)):
            prefix = ["ip", "netns", "exec", ns] if ns else []
            sh([*prefix, "tc", "filter", "del", "dev", dev, "parent", "1:", "prio", PARTITION_PRIO], check=False)
            if on:
                sh([*prefix, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                    PARTITION_PRIO, "u32", "match", "ip", "dst", "0.0.0.0/0", "flowid", "1:99"])

    def close(self) -> None:
        """Delayers off, then the namespaces and whatever still runs in them gone."""
        if self.net is None:
            return
        for i in list(self.delayers):
            with contextlib.suppress(NetnsError):
                self._emulate(self.net.hosts[i], False, 0)
        self.net.__exit__(None, None, None)


def make_hosts(agents: int, loopback: bool) -> Hosts:
    """Namespaces where they can be made (unless `loopback`), else loopback processes."""
    if loopback:
        return Hosts(Loopback(0), "asked for (--loopback)")
    try:
        check_available()
        net = Network(agents).__enter__()
    except (Unsupported, NetnsError) as e:
        return Hosts(Loopback(0), f"network namespaces unavailable: {e}")
    return Hosts(NetnsPlacement(net), net=net)
