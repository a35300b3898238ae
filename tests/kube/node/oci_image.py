"""An OCI image archive (one uncompressed layer) from a directory, for `ctr images import`:
how the kubelet trial gets images with no registry to pull from (docs/operations.md).

    python tests/kube/node/oci_image.py ROOTFS NAME OUT.tar ['{"Entrypoint": [...], "User": "10001:10001"}']
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _blob(tf: tarfile.TarFile, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    _file(tf, f"blobs/sha256/{digest}", data)
    return "sha256:" + digest, len(data)


def _file(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def build(rootfs: Path, name: str, config: dict, out: Path) -> None:
    """`name` (e.g. docker.io/library/echelon:0.1.0) holding `rootfs`, run as `config` says."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as lt:
        for p in sorted(rootfs.iterdir()):
            lt.add(p, arcname=p.name)
    with tarfile.open(out, "w") as tf:
        layer_digest, layer_size = _blob(tf, layer.getvalue())
        cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": config,
                          "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}).encode()
        cfg_digest, cfg_size = _blob(tf, cfg)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": cfg_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest,
                        "size": layer_size}]}).encode()
        man_digest, man_size = _blob(tf, manifest)
        _file(tf, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _file(tf, "index.json", json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": MANIFEST, "digest": man_digest, "size": man_size,
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}).encode())


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}, Path(sys.argv[3]))
