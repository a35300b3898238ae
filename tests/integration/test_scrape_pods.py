"""The pod-annotation scrape job (deploy/prometheus/scrape-pods.yaml) on a real Prometheus:
its relabel rules must give the labels the dashboards, rules and the routing job read --
job (role), member (the member id: the node's name for an agent that takes it), region
(the node's label for an agent that takes it), namespace, pod.

Debian's Prometheus is built without Kubernetes service discovery, so the job's
`kubernetes_sd_configs` is replaced by static targets that carry the `__meta_kubernetes_*`
labels pod discovery would give (the chart's annotations and pod labels); the relabel
rules are the file's own, applied by Prometheus, scraping real /metrics endpoints."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from echelon.launch.placement import free_port
from echelon.observe.prometheus import PrometheusAPI
from tests.deploy.chart import ROOT, objects, of_kind

SNIPPET = ROOT / "deploy" / "prometheus" / "scrape-pods.yaml"


def meta(pod: dict, namespace: str, pod_name: str, node: str, node_zone: str, port: int) -> dict:
    """The discovery labels of one rendered pod template (its labels and annotations)."""
    out = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod_name,
           "__meta_kubernetes_pod_node_name": node,
           "__meta_kubernetes_node_label_topology_kubernetes_io_zone": node_zone}
    for k, v in pod["metadata"].get("labels", {}).items():
        out["__meta_kubernetes_pod_label_" + k.replace(".", "_").replace("/", "_").replace("-", "_")] = v
    for k, v in pod["metadata"].get("annotations", {}).items():
        out["__meta_kubernetes_pod_annotation_" + k.replace(".", "_").replace("/", "_").replace("-", "_")] = v
    out["__meta_kubernetes_pod_annotation_prometheus_io_port"] = str(port)  # where this test serves it
    return out


@pytest.mark.skipif(not shutil.which("prometheus"), reason="prometheus (Debian package) is not installed")
@pytest.mark.timeout(120)
def test_pod_annotation_mode_labels_series_as_the_service_monitor_does(tmp_path):
    objs = objects({"agent": {"regionFromNode": {"enabled": True}}})
    pods = {o["metadata"]["name"]: o["spec"]["template"] for o in of_kind(objs, "StatefulSet", "DaemonSet")}
    servers, ports = [], []
    for _ in range(2):
        registry = CollectorRegistry()
        Gauge("echelon_membership_plan_version", "x", registry=registry).set(3)
        port = free_port()
        servers.append(start_http_server(port, "127.0.0.1", registry))
        ports.append(port)
    job = yaml.safe_load(SNIPPET.read_text())[0]
    job.pop("kubernetes_sd_configs")
    job["scrape_interval"] = "1s"
    job["static_configs"] = [
        {"targets": ["127.0.0.1:1"],
         "labels": meta(pods["echelon-agent"], "prod", "echelon-agent-x7k2p", "node-a", "zone-1", ports[0])},
        {"targets": ["127.0.0.1:1"],
         "labels": meta(pods["echelon-matcher"], "prod", "echelon-matcher-1", "node-b", "zone-2", ports[1])},
    ]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"},
                                                             "scrape_configs": [job]}))
    web = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    try:
        api = PrometheusAPI(f"http://127.0.0.1:{web}")
        deadline, got = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            try:
                got = api.query("echelon_membership_plan_version")
            except Exception:  # noqa: BLE001 - not up yet
                got = []
            if len(got) == 2:
                break
            time.sleep(0.5)
        labels = sorted((r["metric"] for r in got), key=lambda m: m["job"])
        for m in labels:
            m.pop("__name__")
            m.pop("instance")
        assert labels == [
            {"job": "agent", "member": "node-a", "region": "zone-1", "namespace": "prod", "pod": "echelon-agent-x7k2p"},
            {"job": "matcher", "member": "echelon-matcher-1", "namespace": "prod", "pod": "echelon-matcher-1"},
        ], (tmp_path / "prometheus.log").read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(15)
        for s in servers:
            if isinstance(s, tuple):  # prometheus_client >= 0.17 returns (server, thread)
                s[0].shutdown()
