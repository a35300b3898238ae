"""A stand-in for cluster DNS in the kubelet trial (there is no CoreDNS image to run):
A records read from the API server every 2 s, on UDP port 53 of ADDRESS.

- `HOST.SUBDOMAIN.NS.svc.cluster.local`: the pod with that hostname and subdomain (the
  StatefulSets' stable names, which the chart's services use to find membership);
- `SERVICE.NS.svc.cluster.local`: the IPs of the pods its selector matches, as if every
  service were headless (there is no kube-proxy, so a ClusterIP would lead nowhere).

Anything else is NXDOMAIN; other query types get an empty answer.

    python tests/kube/node/cluster_dns.py KUBECTL KUBECONFIG ADDRESS
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time

NAMES: dict[str, list[str]] = {}


def _get(kubectl: str, kubeconfig: str, kind: str) -> list[dict]:
    out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "get", kind, "-A", "-o", "json"], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return json.loads(out)["items"]


def names(pods: list[dict], services: list[dict]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in pods:
        ip, ns, spec = p["status"].get("podIP"), p["metadata"]["namespace"], p["spec"]
        if not ip:
            continue
        if spec.get("hostname") and spec.get("subdomain"):
            out.setdefault(f"{spec['hostname']}.{spec['subdomain']}.{ns}.svc.cluster.local", []).append(ip)
        labels = p["metadata"].get("labels", {})
        for s in services:
            selector = s["spec"].get("selector")
            if s["metadata"]["namespace"] == ns and selector and all(labels.get(k) == v for k, v in selector.items()):
                out.setdefault(f"{s['metadata']['name']}.{ns}.svc.cluster.local", []).append(ip)
    return out


def refresh(kubectl: str, kubeconfig: str) -> None:
    while True:
        try:
            table = names(_get(kubectl, kubeconfig, "pods"), _get(kubectl, kubeconfig, "services"))
            NAMES.clear()
            NAMES.update(table)
        except (subprocess.SubprocessError, ValueError, KeyError) as e:
            print(f"refresh: {e}", flush=True)
        time.sleep(2)


def answer(query: bytes) -> bytes:
    tid = struct.unpack(">H", query[:2])[0]
    i, labels = 12, []
    while query[i]:
        labels.append(query[i + 1:i + 1 + query[i]].decode())
        i += 1 + query[i]
    qtype = struct.unpack(">H", query[i + 1:i + 3])[0]
    question = query[12:i + 5]
    ips = NAMES.get(".".join(labels).lower(), []) if qtype == 1 else []
    if qtype == 1 and not ips:
        return struct.pack(">HHHHHH", tid, 0x8183, 1, 0, 0, 0) + question  # NXDOMAIN
    records = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip) for ip in ips)
    return struct.pack(">HHHHHH", tid, 0x8180, 1, len(ips), 0, 0) + question + records


def main() -> None:
    kubectl, kubeconfig, address = sys.argv[1:4]
    threading.Thread(target=refresh, args=(kubectl, kubeconfig), daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 53))
    while True:
        data, peer = sock.recvfrom(512)
        try:
            sock.sendto(answer(data), peer)
        except (IndexError, struct.error, UnicodeDecodeError) as e:
            print(f"bad query from {peer}: {e}", flush=True)


if __name__ == "__main__":
    main()
