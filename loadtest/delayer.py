"""netem where the kernel has none: tc redirects, a userspace delayer re-sends.

Packets leaving a device are redirected (cls_bpf + mirred) into a private veth pair, read
there by `delay_packets` (AF_PACKET), held 100 +- 50 ms each (uniform, independently, so
they reorder as under netem), 5 % dropped, and sent out of the device again with a socket
mark that the redirect lets through. Virtio-net headers keep GSO packets whole.

`loadtest.chaos.network` starts it: `python -m loadtest.delayer RX TX SECONDS` (a module
of its own, outside the chaos package, so the delayer imports nothing of the runner).
"""

from __future__ import annotations

import contextlib
import heapq
import random
import select
import signal
import socket
import sys
import time

MARK = 0xEC0
SKF_AD_MARK = 0xFFFFF000 + 20  # classic BPF: load skb->mark
BYPASS_MARKED = f"4,32 0 0 {SKF_AD_MARK},21 0 1 {MARK},6 0 0 0,6 0 0 4294967295"  # marked: pass; else match
DELAY_PRIO = "3"


def delay_packets(rx_if: str, tx_if: str, delay: float, jitter: float, loss: float, seconds: float) -> None:
    """Forward frames from rx_if to tx_if, each after delay +- jitter, dropping `loss` of them."""
    packet_vnet_hdr, eth_p_all = 15, 0x0003
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(eth_p_all))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    for sock in (rx, tx):
        sock.setsockopt(263, packet_vnet_hdr, 1)  # SOL_PACKET
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
    rx.bind((rx_if, 0))
    tx.bind((tx_if, 0))
    rng = random.Random()
    queue: list[tuple[float, int, bytes]] = []
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            with contextlib.suppress(OSError):
                tx.send(heapq.heappop(queue)[2])
        timeout = min(0.2, max(0.0, queue[0][0] - now)) if queue else 0.2
        if select.select([rx], [], [], timeout)[0]:
            data, addr = rx.recvfrom(1 << 17)
            if addr[2] == socket.PACKET_OUTGOING or rng.random() < loss:
                continue
            n += 1
            heapq.heappush(queue, (time.monotonic() + rng.uniform(delay - jitter, delay + jitter), n, data))


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":  # rx tx seconds
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGTERM, _exit)
        delay_packets(sys.argv[1], sys.argv[2], 0.1, 0.05, 0.05, float(sys.argv[3]))
