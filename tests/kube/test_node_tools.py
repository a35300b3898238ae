"""The kubelet trial's helpers (docs/operations.md, "The chart on a real node"): the OCI
archive `ctr images import` reads, and the stand-in cluster DNS."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import struct
import tarfile

from tests.kube.node import cluster_dns, oci_image


def test_oci_archive_names_the_image_and_every_blob_matches_its_digest(tmp_path):
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    out = tmp_path / "image.tar"
    oci_image.build(root, "docker.io/library/hello:1.0", {"Entrypoint": ["/bin/hello"]}, out)
    with tarfile.open(out) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    index = json.loads(files["index.json"])["manifests"][0]
    assert index["annotations"]["io.containerd.image.name"] == "docker.io/library/hello:1.0"
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files["blobs/sha256/" + index["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
    layer = files["blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]]
    with tarfile.open(fileobj=io.BytesIO(layer)) as lt:
        assert "bin/hello" in lt.getnames()


def _query(name: str, qtype: int = 1) -> bytes:
    return (struct.pack(">HHHHHH", 7, 0x100, 1, 0, 0, 0)
            + b"".join(bytes([len(x)]) + x.encode() for x in name.split(".")) + b"\0" + struct.pack(">HH", qtype, 1))


def test_cluster_dns_answers_stateful_names_and_services_and_nothing_else():
    pods = [{"metadata": {"namespace": "ns", "labels": {"app": "m"}}, "status": {"podIP": "10.0.0.5"},
             "spec": {"hostname": "m-0", "subdomain": "m"}},
            {"metadata": {"namespace": "ns", "labels": {"app": "a"}}, "status": {"podIP": "10.0.0.6"}, "spec": {}},
            {"metadata": {"namespace": "ns", "labels": {"app": "a"}}, "status": {}, "spec": {}}]  # no IP yet
    services = [{"metadata": {"namespace": "ns", "name": "m"}, "spec": {"selector": {"app": "m"}}},
                {"metadata": {"namespace": "other", "name": "a"}, "spec": {"selector": {"app": "a"}}}]
    cluster_dns.NAMES.clear()
    cluster_dns.NAMES.update(cluster_dns.names(pods, services))
    assert cluster_dns.NAMES == {"m-0.m.ns.svc.cluster.local": ["10.0.0.5"], "m.ns.svc.cluster.local": ["10.0.0.5"]}
    reply = cluster_dns.answer(_query("m-0.m.ns.svc.cluster.local"))
    assert reply[:2] == struct.pack(">H", 7) and reply[3] & 15 == 0 and struct.unpack(">H", reply[6:8])[0] == 1
    assert socket.inet_ntoa(reply[-4:]) == "10.0.0.5"
    missing = cluster_dns.answer(_query("a.ns.svc.cluster.local"))  # another namespace's service
    assert missing[3] & 15 == 3 and struct.unpack(">H", missing[6:8])[0] == 0
    aaaa = cluster_dns.answer(_query("m-0.m.ns.svc.cluster.local", 28))
    assert aaaa[3] & 15 == 0 and struct.unpack(">H", aaaa[6:8])[0] == 0
