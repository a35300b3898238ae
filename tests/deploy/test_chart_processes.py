"""The chart's containers run as real processes: the commands and arguments the real Helm
engine renders (minimal scenario: one membership replica, one matcher, one agent) are
started with `python -m echelon`, the chart's `helm test` script publishes and receives
through the agent, and SIGTERM ends every process within its terminationGracePeriodSeconds.

What is not real: Kubernetes. Cluster DNS names and the pod IP become 127.0.0.1 and each
service gets a free loopback port (values the chart takes), since this machine has no
kube-apiserver, kubelet or cluster DNS; the agent's data volume is a temporary directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.launch.placement import free_port
from tests.deploy.chart import CHART, ci_values, objects, of_kind, service_containers

ROLES = ("membership", "matcher", "agent")


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


def _wait(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _on_loopback(arg: str, pod: str) -> str:
    """What Kubernetes would give the process: DNS names and the pod IP as loopback."""
    for k, v in {"$(POD_NAME)": pod, "$(NODE_NAME)": pod, "$(POD_IP)": "127.0.0.1",
                 "0.0.0.0": "127.0.0.1"}.items():
        arg = arg.replace(k, v)
    return ",".join(("127.0.0.1:" + a.rsplit(":", 1)[1]) if ".svc." in a else a for a in arg.split(","))


def test_rendered_services_serve_and_pass_the_helm_test(tmp_path):
    ports = {r: (free_port(), free_port()) for r in ROLES}
    values = ci_values(CHART / "ci" / "minimal-values.yaml")
    for role, (port, metrics) in ports.items():
        values.setdefault(role, {}).update(port=port, metricsPort=metrics, grace=1)
    objs = objects(values)
    procs: list[tuple[str, subprocess.Popen, int]] = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        for role in ROLES:  # membership first, as its readiness gates the others' joins
            (o, c), = [(o, c) for o, c in service_containers(objs) if c["args"][0] == role]
            args = [_on_loopback(a, f"{o['metadata']['name']}-0").replace("/var/lib/echelon", str(tmp_path / "data"))
                    for a in c["args"]]
            assert "command" not in c  # the image's entrypoint, `echelon`
            log = open(tmp_path / f"{role}.log", "wb")
            p = subprocess.Popen([sys.executable, "-m", "echelon", *args], stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
            procs.append((role, p, o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]))
            _wait(lambda: _serving(f"127.0.0.1:{ports[role][0]}") or p.poll() is not None, f"{role} SERVING")
            assert p.poll() is None, (tmp_path / f"{role}.log").read_text()

        (pod,) = of_kind(objs, "Pod")
        (c,) = pod["spec"]["containers"]
        test_env = dict(env, **{e["name"]: e["value"] for e in c["env"]})
        assert test_env["AGENT"] == f"echelon-agent.pubsub.svc.cluster.local:{ports['agent'][0]}"
        test_env["AGENT"] = _on_loopback(test_env["AGENT"], "")
        result = subprocess.run([sys.executable, *c["command"][1:], *c["args"]], env=test_env,
                                capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "published and received" in result.stdout
    finally:
        for role, p, _ in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for role, p, grace in reversed(procs):
            try:
                code = p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                pytest.fail(f"{role} did not stop within terminationGracePeriodSeconds={grace}")
            assert code == 0, (role, code, (tmp_path / f"{role}.log").read_text()[-2000:])
